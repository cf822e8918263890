"""The run as one typed request (cluster/job/request.py), made from fab train's options once
(cluster/job/train_options.py), and its serialized form read back whole."""

from __future__ import annotations

import dataclasses
import json

import pytest

from cluster.inventory import Inventory
from cluster.job import request as rq
from cluster.job import run_env
from cluster.job.job_args import ExtraArg, JobArgsError, parse_extra
from cluster.job.train_options import request_from_options

RUN = "20261123-101500-ab12"


def inventory(nodes=4, **facts) -> Inventory:
    hosts = [{"name": f"node{i}", "address": f"192.0.2.{10 + i}"} for i in range(nodes)]
    return Inventory.from_mapping({"name": "lab", "instance_type": "r7iz.metal-16xl", **facts, "hosts": hosts},
                                  default_name="lab")


def made(**options):
    return request_from_options(options, inventory(), run_id=RUN)[0]


def builtin_request() -> rq.RunRequest:
    return made(nodes=2, synthetic_examples=300, env="FI_PROVIDER=tcp", checkpoint_every=90.0,
                extra="--learning_rate 3e-5 --logging_steps=3 --debug underflow_overflow",
                checkpoint_uri="s3://ckpt-bucket/p", managed=True, max_recoveries=2, wait_for_capacity=120.0)


def own_request() -> rq.RunRequest:
    own = rq.OwnProgram(script="sub/train.py", args=("--lr", "1e-4"), signal="SIGUSR2", workdir="/home/u/proj",
                        resume_arg="--resume_from_checkpoint {checkpoint}")
    return request_from_options(dict(nodes=3, managed=True, resume_arg=own.resume_arg, script="sub/train.py"),
                                inventory(), run_id=RUN, own=own)[0]


@pytest.mark.parametrize("make", [builtin_request, own_request])
def test_the_serialized_request_reads_back_equal_and_survives_json(make):
    request = make()
    text = json.dumps(request.to_mapping())
    assert rq.RunRequest.from_mapping(json.loads(text)) == request


def _own_with_digest() -> dict:
    own = dataclasses.replace(own_request().own, workdir_files=(("sub/train.py", "a" * 64), ("sub/util.py", "b" * 64)))
    return json.loads(json.dumps(dataclasses.replace(own_request(), program=own).to_mapping()))


def test_your_programs_workdir_digest_is_recorded_and_read_back_checked():
    data = _own_with_digest()
    assert data["program"]["workdir_files"] == [["sub/train.py", "a" * 64], ["sub/util.py", "b" * 64]]
    assert rq.RunRequest.from_mapping(data).own.workdir_files == (("sub/train.py", "a" * 64), ("sub/util.py", "b" * 64))


@pytest.mark.parametrize(("pair", "said"), [
    (["../outside.py", "a" * 64], "workdir digest: '../outside.py' is not allowed; allowed: paths inside the workdir"),
    (["/etc/passwd", "a" * 64], "workdir digest: '/etc/passwd' is not allowed"),
    (["a\nb.py", "a" * 64], "workdir digest: 'a\\nb.py' is not allowed"),
    (["sub/util.py", "A" * 64], "workdir digest sub/util.py: 'AAAA"),
    (["sub/train.py", "c" * 64], "workdir digest: 'sub/train.py' is not allowed; allowed: each path once"),
    (["sub/util.py"], "request program workdir_files: "),
])
def test_a_workdir_digest_not_as_made_is_refused_naming_it(pair, said):
    data = _own_with_digest()
    data["program"]["workdir_files"][1] = pair
    with pytest.raises(rq.RequestError) as caught:
        rq.RunRequest.from_mapping(data)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_resume_with_your_program_is_a_supervised_runs_continuation_only():
    own = own_request()
    assert dataclasses.replace(own, resume=True).resume  # fab train --managed --resume, from the run's spec
    with pytest.raises(rq.RequestError, match=r"^--resume: an option of the built-in job"):
        dataclasses.replace(own, resume=True, managed=None)


def test_fab_trains_options_are_resolved_once_into_typed_values():
    request = builtin_request()
    job = request.builtin
    assert request.nodes == 2 and request.checkpoint_every_s == 90.0 and request.managed.wait_s == 120.0
    assert job.demo == rq.Demo("qa", 300) and (job.epochs, job.batch_size) == (1.0, 16)  # the demo's defaults
    assert job.extra == (ExtraArg("--learning_rate", ("3e-5",)), ExtraArg("--logging_steps", ("3",)),
                         ExtraArg("--debug", ("underflow_overflow",)))
    assert made().nodes == 4  # left out: every node of the inventory
    assert request.output_dir == f"xeon-cluster-runs/{RUN}"


def test_a_flag_fab_train_has_an_option_for_becomes_that_option_and_twice_is_refused():
    request = made(extra="--output_dir /data/run1 --max-steps 7 --bf16 --checkpoint_minutes 1.5")
    assert request.output_dir == "/data/run1" and request.builtin.max_steps == 7
    assert request.builtin.bf16 == "on" and request.checkpoint_every_s == 90.0 and request.builtin.extra == ()
    with pytest.raises(rq.RequestError, match=r"^--extra: --max_steps repeats --max-steps; give it once$"):
        made(max_steps=3, extra="--max_steps 7")


@pytest.mark.parametrize(("words", "said"), [
    (["--learning_rat", "3e-5"], "--extra: --learning_rat is not an argument of `python -m training`; did you mean "
                                 "--learning_rate?"),
    (["--learning_rate"], "--extra: --learning_rate needs a value"),
    (["3e-5"], "--extra: '3e-5' is not allowed here"),
    (["--debug"], "--extra: --debug needs one or more values"),
    (["--learning_rate", "a\nb"], "--extra: --learning_rate: 'a\\nb' is not allowed"),
    (["--help"], "--extra: --help is not an argument"),
])
def test_extra_arguments_the_job_would_refuse_are_one_line_here(words, said):
    with pytest.raises(JobArgsError) as caught:
        parse_extra(words)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_extra_arguments_take_the_jobs_own_forms():
    typed, rest = parse_extra(["--warmup-steps", "5", "--fp16", "--no_remove_unused_columns", "--seed=-1",
                               "--label_names", "a", "b"])
    assert typed == {} and rest == (ExtraArg("--warmup_steps", ("5",)), ExtraArg("--fp16"),
                                    ExtraArg("--no_remove_unused_columns"), ExtraArg("--seed", ("-1",)),
                                    ExtraArg("--label_names", ("a", "b")))


def _changed(change):
    data = json.loads(json.dumps(builtin_request().to_mapping()))
    change(data)
    return data


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d.update(hostile=1), "request: unknown field 'hostile'"),
    (lambda d: d["program"].update(push_to_hub=True), "request program: unknown field 'push_to_hub'"),
    (lambda d: d.update(nodes="2"), "--nodes: '2' is not allowed"),
    (lambda d: d["env"].append(["LD_PRELOAD", "/tmp/evil.so"]), "--env: LD_PRELOAD changes how"),
    (lambda d: d["env"].append(["PYTHONWARNINGS", "ignore"]), "--env: PYTHONWARNINGS changes how"),
    (lambda d: d["program"]["extra"].append(["--output_dir", "/etc/cron.d"]), "--extra: --output_dir is not allowed"),
    (lambda d: d["program"]["extra"].append(["--learning_rat", "1"]), "--extra: --learning_rat is not an argument"),
    (lambda d: d["program"]["demo"].update(task="qa; reboot"), "--task: 'qa; reboot' is not allowed"),
    (lambda d: d["managed"].update(min_nodes=5), "--min-nodes: 5 is not allowed"),
    (lambda d: d.update(output_dir="../../etc"), "--output-dir: '../../etc' is not allowed"),
    (lambda d: d["program"].update(kind="shell"), "request program: 'shell' is not allowed"),
    (lambda d: d.pop("nodes"), "request: "),
])
def test_a_serialized_request_not_as_made_is_refused_naming_the_field(change, said):
    with pytest.raises(rq.RequestError) as caught:
        rq.RunRequest.from_mapping(_changed(change))
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["PYTHONPATH", "PYTHONSTARTUP", "LD_PRELOAD", "LD_LIBRARY_PATH", "BASH_ENV", "ENV",
                                  "BROWSER", "PERL5OPT", "NODE_OPTIONS", "JAVA_TOOL_OPTIONS", "GCONV_PATH", "PATH",
                                  "IFS", "PS4", "SHELLOPTS", "PROMPT_COMMAND", "HOSTALIASES", "RES_OPTIONS",
                                  "GLIBC_TUNABLES", "HOME"])
def test_environment_names_that_change_how_a_program_starts_are_refused_unless_allowed(name):
    with pytest.raises(rq.RequestError, match=rf"^--env: {name} changes how .+ starts on every node, so it is "
                                              rf"refused; .*--allow-env {name}"):
        made(env=f"{name}=x")
    request = made(env=f"{name}=x FI_PROVIDER=tcp", allow_env=name)
    assert request.env == ((name, "x"), ("FI_PROVIDER", "tcp")) and request.allow_env == (name,)
    assert rq.RunRequest.from_mapping(json.loads(json.dumps(request.to_mapping()))) == request  # recorded, allowed


def test_tmpdir_and_ordinary_settings_are_allowed_and_values_are_one_line():
    assert made(env="TMPDIR=/scratch OMP_DISPLAY_ENV=true").env == (("TMPDIR", "/scratch"), ("OMP_DISPLAY_ENV", "true"))
    with pytest.raises(rq.RequestError, match=r"^--env FI_PROVIDER: 'tcp\\n' is not allowed"):
        run_env.check_env({"FI_PROVIDER": "tcp\n"})
    with pytest.raises(rq.RequestError, match=r"^--env: RANK is set by the launch itself"):
        made(env="RANK=3")


def test_a_data_file_of_this_machine_is_copied_and_named_by_its_path_on_the_nodes():
    request, _ = request_from_options(dict(train_file="data/train.json", validation_file="on-node/eval.json"),
                                      inventory(), run_id=RUN,
                                      local_file=lambda p: "/home/u/data/train.json" if p.startswith("data/") else None)
    node = f".xeon-cluster/jobs/{RUN}/data/train_file-train.json"
    assert request.builtin.train_file == node and request.builtin.validation_file == "on-node/eval.json"
    assert request.data_files == (rq.DataFile("/home/u/data/train.json", node),)
    assert "data_files" not in request.to_mapping()  # this controller's files never leave it


def test_offline_nodes_without_a_model_or_data_get_the_offline_demo():
    offline = inventory(offline=True)
    assert request_from_options({}, offline, run_id=RUN)[0].builtin.demo == rq.Demo("qa", None)
    assert request_from_options({"model": "m"}, offline, run_id=RUN)[0].builtin.demo is None
    assert made().builtin.demo is None


@pytest.mark.parametrize(("options", "said"), [
    (dict(detach=True), "--detach: only with --managed"),
    (dict(args="--lr 1"), "--args: only with --script or --module"),
    (dict(launcher="srun"), "--launcher: 'srun' is not allowed"),
    (dict(min_nodes=2), "--min-nodes: only with --launcher torchrun"),
    (dict(managed=True, launcher="torchrun"), "--managed: not with --launcher torchrun"),
    (dict(nodes=9), "--nodes"),
    (dict(pin="maybe"), "--pin: 'maybe' is not allowed"),
    (dict(synthetic_examples=10, model="m"), "--synthetic-examples: the offline demo brings its own"),
    (dict(checkpoint_uri="gs://b/x"), "--checkpoint-uri: 'gs://b/x' is not allowed"),
])
def test_options_that_cannot_make_a_run_are_one_line(options, said):
    with pytest.raises(rq.RequestError) as caught:
        made(**options)
    assert str(caught.value).startswith(said) and "\n" not in str(caught.value)


def test_the_request_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        builtin_request().nodes = 3  # type: ignore[misc]


def test_fab_train_and_a_job_file_refuse_a_start_up_variable_in_one_line_unless_allowed(tmp_path):
    """The environment's entry points on the controller: --env, a job file's env (the spec's: test_runspec.py)."""
    from tests.fab_run import fab_in_process

    inventory = tmp_path / "lab.yaml"
    inventory.write_text("name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10, 192.0.2.11]\n")
    job = tmp_path / "job.yaml"
    job.write_text("env: LD_PRELOAD=/tmp/x.so\nnodes: 2\n")
    for argv in (["--env", "PYTHONPATH=/tmp/evil"], ["-f", str(job)]):
        result = fab_in_process("train", "-c", str(inventory), "--dry-run", *argv)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, result.stdout + result.stderr
        assert "starts on every node, so it is refused" in lines[0]
    allowed = fab_in_process("train", "-c", str(inventory), "--dry-run", "-f", str(job), "--allow-env", "LD_PRELOAD")
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    assert "LD_PRELOAD=<--env, from the job's 0600 env file>" in allowed.stdout, allowed.stdout
    # the file may not lift the refusal itself: allow-env only on the command line
    job.write_text("env: LD_PRELOAD=/tmp/x.so\nallow-env: LD_PRELOAD\nnodes: 2\n")
    itself = fab_in_process("train", "-c", str(inventory), "--dry-run", "-f", str(job))
    assert itself.returncode == 2 and itself.stderr.strip().splitlines() == [
        f"error: {job}: 'allow-env' is not allowed in a job file; give --allow-env on the command line"], \
        itself.stdout + itself.stderr
