"""The job decided before anything is touched: the plan (cluster/job/jobplan.py), log labels and failure
reports (cluster/job/joblog.py), and the job's arguments (cluster/job/job_args.py)."""


import pytest

from cluster.inventory import Inventory
from cluster.job.job_args import ExtraArg
from cluster.job.joblog import failure_report
from cluster.job.jobplan import JobPlan, plan
from cluster.job.request import BuiltinJob, Launcher, OwnProgram, RequestError, RunRequest

RUN = "20260101-000000-aaaa"


def inventory(kind="file", nodes=4, instance_type="r7iz.metal-16xl", **kw):
    data = {"name": "lab", "instance_type": instance_type,
            "hosts": [{"name": f"node{i}", "address": f"192.0.2.{10 + i}", "private_address": f"10.0.0.{10 + i}"}
                      for i in range(nodes)], **kw}
    return Inventory.from_mapping(data, default_name="lab", kind=kind)


def job_request(nodes: int, *, run_id: str = RUN, program: OwnProgram | None = None, launcher: str = "mpirun",
                min_nodes: int | None = None, env: dict[str, str] | None = None, output_dir: str | None = None,
                **job) -> RunRequest:
    """A run request from a few settings: on `nodes` nodes, the built-in job with `job`'s settings (BuiltinJob's
    fields) or your own `program`."""
    return RunRequest(run_id, nodes, program or BuiltinJob(**job), launcher=Launcher(launcher, min_nodes),
                      env=tuple((env or {}).items()), output_dir=output_dir)


def job_plan(inventory_: Inventory, nodes: int, **settings) -> JobPlan:
    """The job of `job_request(nodes, **settings)` on `inventory_`."""
    return plan(job_request(nodes, **settings), inventory_)


def test_plan_uses_first_nodes_master_private_address_and_default_output_dir():
    job = job_plan(inventory(), 2, task="qa")
    assert [n.name for n in job.inventory.nodes] == ["node0", "node1"]
    assert job.launch.master_addr == "10.0.0.10"
    assert job.launch.world_size == 4  # r7iz.metal-16xl: two sockets, one rank each
    assert job.output_dir == "xeon-cluster-runs/20260101-000000-aaaa"
    assert job.launch.program[-2:] == ("--output_dir", job.output_dir)
    assert job.launch.program[:3] == ("/opt/xeon-cluster/venv-stock/bin/python", "-m", "training")
    text = job.describe()
    assert "node1" in text and "ranks 2,3" in text and "MASTER_ADDR=10.0.0.10" in text
    assert "mpirun -f .xeon-cluster/jobs/20260101-000000-aaaa/hosts -n 4 -ppn 2" in text


def test_user_output_dir_is_kept_and_not_duplicated():
    job = job_plan(inventory(), 1, output_dir="/data/run1")
    assert job.output_dir == "/data/run1" and job.training_args.count("--output_dir") == 1
    assert job.launch.program[-2:] == ("--output_dir", "/data/run1")


def test_local_cluster_nodes_share_the_machine_unpinned():
    inv = inventory(kind="local", nodes=3, instance_type=None, sockets=1, physical_cores=2, shared_cores=True)
    job = job_plan(inv, 3)
    assert job.layout.threads_per_rank == 1 and not job.layout.pin
    assert job.launch.rank_env["I_MPI_PIN"] == "0"
    assert any("share one machine" in n for n in job.notes)
    two = job_plan(inv, 1)
    assert two.layout.threads_per_rank == 2


def test_intel_profile_plans_ccl_workers_and_the_oneccl_launcher():
    job = job_plan(inventory(profile="intel"), 4)
    assert job.launch.flavour == "intel-mpi-oneccl"
    assert job.launch.rank_env["CCL_WORKER_COUNT"] == "2"
    assert job.launch.program[0] == "/opt/xeon-cluster/venv-intel/bin/python"


def test_too_many_nodes_is_a_clear_error():
    with pytest.raises(ValueError, match="allowed 1 to 4"):
        job_plan(inventory(), 5)


HYDRA_KILLED = """[0] step 3
===================================================================================
=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES
=   RANK 3 PID 4242 RUNNING AT ip-10-0-0-11
=   KILLED BY SIGNAL: 9 (Killed)
===================================================================================
"""


def test_failure_report_maps_rank_to_node():
    report = failure_report(HYDRA_KILLED, ["node0", "node0", "node1", "node1"], 255)
    assert report[0] == "rank 3 on node node1 (host ip-10-0-0-11, pid 4242): killed by signal: 9 (killed)"
    assert report[1:] == [next(line for line in report if line.startswith("hint: rank 3 on node node1 was killed"))]


def test_failure_report_without_hydra_banner_names_ranks_with_errors():
    log = "[0] ok\n[2] Traceback (most recent call last):\n[2] ValueError: bad\n"
    assert failure_report(log, ["a", "b", "c"], 1) == [
        "rank 2 on node c reported an error (see its lines above)"]
    assert failure_report(log, ["a", "b", "c"], 0) == []


def test_the_typed_settings_become_the_jobs_flags_and_extra_passes_verbatim():
    run = RunRequest(RUN, 2, BuiltinJob(task="qa", model="m", dataset="squad", epochs=2.0, batch_size=32, bf16="on",
                                        extra=(ExtraArg("--learning_rate", ("3e-5",)),
                                               ExtraArg("--run_name", ("two words",)))),
                     checkpoint_every_s=300.0, checkpoint_uri="s3://ckpt-bucket/p", resume=True, output_dir="o")
    args = list(plan(run, inventory(instance_type=None, sockets=1, physical_cores=2)).training_args)
    assert args == ["--task", "qa", "--model_name_or_path", "m", "--dataset_name", "squad",
                    "--num_train_epochs", "2", "--per_device_train_batch_size", "32", "--bf16", "true",
                    "--checkpoint_minutes", "5", "--checkpoint_uri", "s3://ckpt-bucket/p", "--learning_rate", "3e-5",
                    "--run_name", "two words", "--output_dir", "o", "--resume"]
    assert job_plan(inventory(instance_type=None, sockets=1, physical_cores=2), 2,
                    output_dir="o").training_args == ("--output_dir", "o")
    with pytest.raises(RequestError, match="--bf16"):
        BuiltinJob(bf16="maybe")


def test_fab_options_reach_the_training_parser():
    """Every flag fab train emits is one `python -m training` accepts."""
    args_module = pytest.importorskip("training.args")
    run = RunRequest(RUN, 2, BuiltinJob(task="qa", model="m", dataset="squad", dataset_config="plain_text",
                                        epochs=1.0, batch_size=8, bf16="off", max_steps=3, grad_comm="bf16",
                                        ddp_bucket_mb=12.5, compile="auto", compile_estimate=(1.0, 0.5, 30.0)),
                     checkpoint_every_s=300.0, checkpoint_uri="s3://ckpt-bucket/p", resume=True, output_dir="out")
    args = list(plan(run, inventory()).training_args)
    transformers = pytest.importorskip("transformers")
    parser = transformers.HfArgumentParser((args_module.ModelArguments, args_module.DataArguments,
                                            args_module.JobArguments, transformers.TrainingArguments))
    *_, rest = parser.parse_known_args(args)
    assert rest == []


@pytest.mark.parametrize("uri", ["gs://b/x", "s3://b/x", "s3://My_Bucket/x", "s3://bucket/../other", "bucket/x"])
def test_checkpoint_uris_that_no_node_could_use_are_refused(uri):
    with pytest.raises(RequestError, match=r"--checkpoint-uri: .* is not allowed; allowed: s3://BUCKET/PREFIX"):
        RunRequest(RUN, 2, BuiltinJob(), checkpoint_uri=uri)


def test_reclaim_report_says_what_resumes_the_run():
    from cluster.job.jobreport import reclaim_report

    summary = {"interruption": {"step": 58}, "checkpoints": [{"step": 58, "path": "/out/checkpoint-58"}]}
    plain, managed = reclaim_report(summary, "node0"), reclaim_report(summary, "node0", managed=True)
    assert "checkpoint-58 is saved only on node0's local disk" in plain[0] and "fab train --resume" in plain[0]
    assert "fab train --managed` resumes it" in managed[0] and "fab train --resume" not in managed[0]


def test_a_catalogued_instance_type_reaches_the_job_for_its_peak():
    """The job measures MFU against the catalog's peak of the nodes' type (cluster/cost/flops.py)."""
    args = list(job_plan(inventory(), 2, max_steps=3).training_args)
    assert args[args.index("--instance_type") + 1] == "r7iz.metal-16xl"
    mine = list(job_plan(inventory(), 2, extra=(ExtraArg("--instance_type", ("c6i.16xlarge",)),)).training_args)
    assert mine.count("--instance_type") == 1 and mine[mine.index("--instance_type") + 1] == "c6i.16xlarge"
    local = job_plan(inventory(kind="local", nodes=2, instance_type=None, sockets=1, physical_cores=2), 2)
    assert "--instance_type" not in local.training_args  # no catalogued type: the job reads lscpu
