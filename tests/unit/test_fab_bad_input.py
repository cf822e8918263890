"""Bad input to a `fab` task: one line naming the option, the value and what is allowed, exit code 2,
before any node or resource is touched. Each row runs the tasks in this process through the
`xeon-cluster` program (node_setup/tasks/program.py: the same tasks and parser wrap as `fab`) against
an inventory file of documentation addresses (192.0.2.0/24, never reached: every case stops before
connecting); a few rows run the real console commands (`python -m fabric`, `xeon-cluster`) as processes."""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fab_run import Ran, fab_in_process

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = "name: lab\nuser: ubuntu\ninstance_type: r7iz.metal-16xl\nhosts: [192.0.2.10, 192.0.2.11]\n"


def fab(*argv: str, cwd: Path = ROOT, env: dict | None = None) -> Ran:
    return fab_in_process(*argv, cwd=cwd, env=env)


def fab_process(command: list[str], *argv: str) -> subprocess.CompletedProcess:
    """A console command (`python -m fabric` or `xeon-cluster`) run as its own process from the root."""
    return subprocess.run([*command, *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.fixture
def inventory(tmp_path, monkeypatch) -> str:
    path = tmp_path / "lab.yaml"
    path.write_text(INVENTORY)
    return str(path)


CASES = {
    "nodes not a number": (["train", "--nodes", "four"], "--nodes: 'four' is not a whole number"),
    "batch not a number": (["train", "--batch-size", "lots"], "--batch-size: 'lots' is not a whole number"),
    "plan epochs": (["plan", "--epochs", "two"], "--epochs: 'two' is not a whole number"),
    "train nodes zero": (["train", "--nodes", "0", "--dry-run", "-c", "{inv}"],
                         "--nodes: 0 is not allowed; give 1 or more (leave --nodes out for the default: all nodes)"),
    "exec nodes zero": (["exec", "true", "--nodes", "0", "-c", "{inv}"], "--nodes: 0 is not allowed; give 1 or more"),
    "autostop poll without a unit": (["autostop", "--poll", "30"], "--poll: '30' has no unit; add a unit: 30s"),
    "plan batch is "
    "batch-size": (["plan", "--batch", "8"], "no option '--batch' of `plan`; did you mean '--batch-size'?"),
    "k8s-job one restart limit": (["k8s-job", "--image", "reg.example.com/xc:1", "--restart-limit", "2"],
                                  "no option '--restart-limit' of `k8s-job`; did you mean '--max-restarts'?"),
    "plan price": (["plan", "--hourly-usd", "abc"], "--hourly-usd: 'abc' is not a number"),
    "plan negative price": (["plan", "--hourly-usd", "-1"], "--hourly-usd: -1.0 is not allowed"),
    "plan profile": (["plan", "--profile", "intl", "--hourly-usd", "5"], "--profile: 'intl' is unknown"),
    "plan nodes list": (["plan", "--nodes", "1;2", "--hourly-usd", "5"], "--nodes: '1;2' is not a list"),
    "unknown task": (["train", "--task", "translation", "--dry-run", "-c", "{inv}"],
                     "--task: 'translation' is not allowed; choose qa or classification"),
    "injected task": (["train", "--task", "qa$(touch /tmp/x)", "--dry-run", "-c", "{inv}"],
                      "--task: 'qa$(touch /tmp/x)' is not allowed"),
    "report without a folder": (["report", "--job", "lr-small", "-c", "{inv}"],
                                "--to: missing; give the folder report.html goes into"),
    "job name": (["train", "--name", "lr 3e-5;x", "--dry-run", "-c", "{inv}"],
                 "--name: 'lr 3e-5;x' is not allowed; allowed: letters, digits, '.', '_' and '-' (up to 64), "
                 "starting with a letter"),
    "job name that is an id": (["train", "--name", "20261123-101500-ab12", "--dry-run", "-c", "{inv}"],
                               "--name: '20261123-101500-ab12' is not allowed"),
    "gs checkpoint uri": (["train", "--checkpoint-uri", "gs://b/x", "--dry-run", "-c", "{inv}"],
                          "--checkpoint-uri: 'gs://b/x' is not allowed; allowed: s3://BUCKET/PREFIX"),
    "bad bucket": (["train", "--checkpoint-uri", "s3://My_Bucket/x", "--dry-run", "-c", "{inv}"],
                   "--checkpoint-uri: 's3://My_Bucket/x' is not allowed"),
    "pin": (["train", "--pin", "maybe", "-c", "{inv}"], "--pin: 'maybe' is not allowed; choose on or off"),
    "bf16": (["train", "--bf16", "yes", "--dry-run", "-c", "{inv}"], "--bf16: 'yes' is not allowed"),
    "extra quotes": (["train", "--extra", "--x 'open", "--dry-run", "-c", "{inv}"], "--extra: cannot split"),
    "ccl workers": (["train", "--ccl-workers", "x", "--dry-run", "-c", "{inv}"],
                    "--ccl-workers: 'x' is not a whole number"),
    "env": (["train", "--env", "NOEQUALS", "--dry-run", "-c", "{inv}"], "--env: 'NOEQUALS' is not KEY=VALUE"),
    "too many nodes": (["train", "--nodes", "3", "--dry-run", "-c", "{inv}"], "--nodes: 3 is not possible"),
    "logs lines": (["logs", "--lines", "x"], "--lines: 'x' is not a whole number"),
    "remainder on a task without --extra": (["setup", "--", "x"], "setup takes no arguments after `--`"),
    "forget without a cluster": (["forget"], "--cluster: not given"),
    "local-up nodes": (["local-up", "--nodes", "many"], "--nodes: 'many' is not a whole number"),
    "k8s-job unknown instance type": (["k8s-job", "--image", "reg.example.com/xc:1", "--instance-type", "r7iz.large"],
                                      "--instance-type: 'r7iz.large' is unknown; allowed: c6i.16xlarge"),
    "k8s-job more cores than the type has": (["k8s-job", "--image", "reg.example.com/xc:1", "--cores", "40"],
                                             "--cores: 40 is more than a pod can have on r7iz.metal-16xl"),
    "k8s-job missing image": (["k8s-job", "--nodes", "2"], "--image: not given; allowed: the training image's"),
    "k8s-job bad image": (["k8s-job", "--image", "Reg/X Y"], "--image: 'Reg/X Y' is not an image reference"),
    "k8s-job bad "
    "claim": (["k8s-job", "--image", "reg.example.com/xc:1", "--pvc", "a;b"], "--pvc: 'a;b' is not allowed"),
    "k8s-job min above nodes": (["k8s-job", "--image", "reg.example.com/xc:1", "--nodes", "2", "--min-nodes", "3"],
                                "--min-nodes: 3 is not allowed; allowed 1 to 2"),
    "missing script": (["train", "--script", "{tmp}/nope.py", "--dry-run", "-c", "{inv}"],
                       "--script: '{tmp}/nope.py' is not a file on this machine"),
    "script outside the workdir": (["train", "--script", "{tmp}/w/train.py", "--workdir", "{tmp}/other", "--dry-run",
                                    "-c", "{inv}"], "--script: {tmp}/w/train.py is outside the workdir {tmp}/other"),
    "workdir over the limit": (["train", "--script", "{tmp}/w/train.py", "--workdir-limit-mb", "1", "--dry-run",
                                "-c", "{inv}"], "over the limit of 1.0 MB; largest: weights.bin (2.0 MB)"),
    "unparsable args": (["train", "--script", "{tmp}/w/train.py", "--args", "--name 'open", "--dry-run", "-c", "{inv}"],
                        "--args: cannot split"),
    "script with a built-in option": (["train", "--script", "{tmp}/w/train.py", "--task", "qa", "--dry-run", "-c",
                                       "{inv}"], "--task: an option of the built-in job, not allowed with --script"),
    "script with a dataset": (["train", "--script", "{tmp}/w/train.py", "--dataset", "squad", "--dry-run", "-c",
                               "{inv}"], "--dataset: an option of the built-in job"),
    "requirements that do not parse": (["train", "--script", "{tmp}/w/train.py", "--requirements", "{tmp}/bad.txt",
                                        "--dry-run", "-c", "{inv}"], "--requirements: {tmp}/bad.txt line 1"),
    "requirements moving a pin": (["train", "--script", "{tmp}/w/train.py", "--requirements", "{tmp}/pin.txt",
                                   "--dry-run", "-c", "{inv}"], "would change torch, pinned to"),
    "notice signal": (["train", "--script", "{tmp}/w/train.py", "--notice-signal", "KILL", "--dry-run", "-c", "{inv}"],
                      "--notice-signal: 'KILL' is not allowed"),
    "args without a script": (["train", "--args", "--x", "--dry-run", "-c", "{inv}"],
                              "--args: only with --script or --module"),
    "bad module": (["train", "--module", "my-pkg", "--dry-run", "-c", "{inv}"], "--module: 'my-pkg' is not a module"),
    "exec on too many nodes": (["exec", "true", "--nodes", "3", "-c", "{inv}"], "--nodes: 3 is not possible"),
    "status with no job id": (["status", "--job", "bogus", "-c", "{inv}"], "--job: 'bogus' is not a job id"),
    "get outside the output": (["get", "--path", "../secrets", "-c", "{inv}"], "--path: '../secrets' is not allowed"),
    "local-up link rate": (["local-up", "--link-mbit", "0.5"], "--link-mbit: 0.5 is not allowed; allowed 1 to 100000"),
    "local-up delay alone": (["local-up", "--link-delay-ms", "5"], "--link-delay-ms: 5 given without --link-mbit"),
    "plan grad comm": (["plan", "--grad-comm", "fp16", "--hourly-usd", "5"], "--grad-comm: 'fp16' is not allowed"),
    "plan bucket": (["plan", "--ddp-bucket-mb", "5000", "--hourly-usd", "5"], "--ddp-bucket-mb: 5000.0 is not allowed"),
    "plan missing calibration": (["plan", "--calibration", "{tmp}/none.json", "--hourly-usd", "5"],
                                 "--calibration: '{tmp}/none.json' is not a file"),
    "train grad comm": (["train", "--grad-comm", "fp16", "--dry-run", "-c", "{inv}"],
                        "--grad-comm: 'fp16' is not allowed; choose fp32 or bf16"),
    "train bucket not positive": (["train", "--ddp-bucket-mb", "0", "--dry-run", "-c", "{inv}"],
                                  "--ddp-bucket-mb: 0.0 is not allowed; give a positive number of MB"),
    "train bucket not a number": (["train", "--ddp-bucket-mb", "big", "--dry-run", "-c", "{inv}"],
                                  "--ddp-bucket-mb: 'big' is not a number"),
    "grad comm with a script": (["train", "--script", "{tmp}/w/train.py", "--grad-comm", "bf16", "--dry-run", "-c",
                                 "{inv}"], "--grad-comm: an option of the built-in job"),
    "launcher": (["train", "--launcher", "srun", "--dry-run", "-c", "{inv}"],
                 "--launcher: 'srun' is not allowed; choose mpirun or torchrun"),
    "min nodes under mpirun": (["train", "--min-nodes", "1", "--dry-run", "-c", "{inv}"],
                               "--min-nodes: only with --launcher torchrun"),
    "min nodes above nodes": (["train", "--launcher", "torchrun", "--min-nodes", "3", "--dry-run", "-c", "{inv}"],
                              "--min-nodes: 3 is not allowed; allowed 1 to 2"),
    "max restarts without min nodes": (["train", "--launcher", "torchrun", "--max-restarts", "2", "--dry-run", "-c",
                                        "{inv}"], "--max-restarts: 2 is only for an elastic run; give --min-nodes too"),
    "torchrun env sets the node": (["train", "--launcher", "torchrun", "--env", "XEON_CLUSTER_NODE=x", "--dry-run",
                                    "-c", "{inv}"], "--env: XEON_CLUSTER_NODE is set by the launch itself"),
    "k8s-job env": (["k8s-job", "--image", "reg.example.com/xc:1", "--env", "NOEQUALS"],
                    "--env: 'NOEQUALS' is not KEY=VALUE"),
    "bench model from the hub": (["bench", "--model", "bert-base-uncased", "-c", "{inv}"],
                                 "--model: 'bert-base-uncased' is not allowed"),
    "bench one node": (["bench", "--nodes", "1", "--dry-run", "-c", "{inv}"], "--nodes: 1 is not possible; allowed 2 "
                                                                              "to 2"),
    "bench steps": (["bench", "--steps", "0", "-c", "{inv}"], "--steps: 0 is not allowed; give 1 or more"),
    "local-reclaim notice not a number": (["local-reclaim", "node1", "--notice", "soon"],
                                          "--notice: 'soon' is not a duration"),
    "local-reclaim notice without a unit": (["local-reclaim", "node1", "--notice", "5"],
                                            "--notice: '5' has no unit; add a unit: 5s, 5m or 5h (durations are "
                                            "written like 90s, 30m, 2h or 1h30m) (or 0 for none)"),  # not "(or off)"
    "local-reclaim notice too long": (["local-reclaim", "node1", "--notice", "3h"],
                                      "--notice: 10800.0 is not possible; allowed 0 to 3600 seconds"),
    "local-reclaim not a local cluster": (["local-reclaim", "node1", "--cluster", "{tmp}/lab.yaml"],
                                          "--cluster: '{tmp}/lab.yaml' is not allowed; allowed: local or local:NAME"),
    "local-reclaim bad cluster name": (["local-reclaim", "node1", "--cluster", "local:Bad;Name"],
                                       "--cluster: 'local:Bad;Name' is not allowed"),
    "preflight write without pick-zone": (["preflight", "--write"], "--write: only with --pick-zone"),
    "train epochs two": (["train", "--epochs", "two", "--dry-run", "-c", "{inv}"],
                         "--epochs: 'two' is not a whole number"),
    "train epochs zero": (["train", "--epochs", "0", "--dry-run", "-c", "{inv}"], "--epochs: 0 is not allowed; give 1 "
                                                                                  "or more"),
    "train checkpoint every nan": (["train", "--checkpoint-every", "nan", "--dry-run", "-c", "{inv}"],
                                   "--checkpoint-every: 'nan' is not a duration"),
    "k8s-job epochs inf": (["k8s-job", "--image", "reg.example.com/xc:1", "--epochs", "inf"],
                           "--epochs: 'inf' is not a whole number"),
    "k8s-job checkpoint every": (["k8s-job", "--image", "reg.example.com/xc:1", "--checkpoint-every", "often"],
                                 "--checkpoint-every: 'often' is not a duration"),
    "plan epochs inf": (["plan", "--epochs", "inf", "--hourly-usd", "5"],
                        "--epochs: 'inf' is not a whole number"),
    "plan price inf": (["plan", "--hourly-usd", "inf"], "--hourly-usd: inf is not allowed; give a price of 0 or more"),
    "plan price nan": (["plan", "--hourly-usd", "nan"], "--hourly-usd: nan is not allowed"),
    "exec --help as the command": (["exec", "--help"], "command: '--help' is an option, not a shell command; "
                                                      "allowed: a shell command"),
    "local-reclaim --help as the node": (["local-reclaim", "--help"], "node: '--help' is an option, not a node"),
}


@pytest.fixture(scope="module")
def case_results(tmp_path_factory) -> tuple[Path, dict[str, Ran]]:
    """Every row of CASES run once, in this process (the rows only read the files made here); each
    row's test then checks its own result."""
    tmp = tmp_path_factory.mktemp("bad-input")
    (tmp / "w").mkdir()
    (tmp / "other").mkdir()
    (tmp / "w" / "train.py").write_text("print(1)\n")
    (tmp / "w" / "weights.bin").write_bytes(b"0" * 2 * 1024 * 1024)
    (tmp / "bad.txt").write_text("peft >=>= 1\n")
    (tmp / "pin.txt").write_text("torch==2.1.0\n")
    (tmp / "lab.yaml").write_text(INVENTORY)

    def run(argv: list[str]) -> Ran:
        return fab(*[a.replace("{inv}", str(tmp / "lab.yaml")).replace("{tmp}", str(tmp)) for a in argv])

    return tmp, {name: run(argv) for name, (argv, _) in CASES.items()}


@pytest.mark.parametrize("name", CASES)
def test_bad_input_is_one_line_and_exit_2(name, case_results):
    tmp, results = case_results
    message, result = CASES[name][1].replace("{tmp}", str(tmp)), results[name]
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


# The console commands themselves, as processes: the rows above run the same tasks and parser wrap in-process.
CONSOLE = {"fab": [sys.executable, "-m", "fabric"],
           "xeon-cluster": [str(Path(sys.executable).with_name("xeon-cluster"))]}


@pytest.mark.parametrize("command", CONSOLE)
@pytest.mark.parametrize("name", ["nodes not a number", "exec nodes zero"])
def test_the_console_commands_refuse_in_one_line_and_exit_2(command, name, inventory):
    argv, message = CASES[name]
    result = fab_process(CONSOLE[command], *[a.replace("{inv}", inventory) for a in argv])
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_fab_finds_the_tasks_with_a_search_root_from_another_directory(tmp_path):
    (tmp_path / "Pulumi.lab.yaml").write_text(STACK.replace("workerCount", "workerCont"))
    result = subprocess.run([*CONSOLE["fab"], "-r", str(ROOT), "plan", "--stack", "lab", "--hourly-usd", "5"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "xeon-cluster:workerCont: not a setting of this project" in result.stderr, result.stderr


@pytest.mark.parametrize("key, value, message", [
    ("usr", "ubuntu", "key 'usr' is unknown; did you mean 'user'?"),
    ("physical_core", "8", "key 'physical_core' is unknown; did you mean 'physical_cores'?"),
    ("sockets", "two", "sockets: 'two' is not allowed"),
])
def test_a_bad_inventory_file_stops_before_connecting(key, value, message, tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(INVENTORY + f"{key}: {value}\n")
    result = fab("train", "--dry-run", "--cluster", str(path))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


STACK_KEY = "ssh-ed25519 " + base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(32)).decode()
STACK = ("config:\n  aws:region: eu-west-1\n  xeon-cluster:workerCount: \"1\"\n"
         f"  xeon-cluster:publicKey: {STACK_KEY}\n  xeon-cluster:adminCidrs:\n    - 198.51.100.0/24\n")


@pytest.mark.parametrize("task", ["preflight", "plan"])
@pytest.mark.parametrize("text, message", [
    (STACK.replace("workerCount", "workerCont"),
     "Pulumi.lab.yaml: xeon-cluster:workerCont: not a setting of this project; did you mean workerCount?"),
    ("- config\n- aws:region\n", "Pulumi.lab.yaml: not Pulumi stack config; allowed: a map with a `config` map"),
    ("config: [aws:region]\n", "Pulumi.lab.yaml: `config` must be a map of keys like xeon-cluster:instanceType"),
    ("config: {aws:region: [eu\n", "Pulumi.lab.yaml: not valid YAML ("),
    (STACK + "  xeon-cluster:instanceTypes: [m7i.48xlarge, c6i.32xlarge]\n",
     "instanceTypes: m7i.48xlarge, c6i.32xlarge are of more than one shape: c6i.32xlarge (2 x 32 cores"),
], ids=["misspelt key", "top level a list", "config a list", "not yaml", "two shapes"])
def test_a_bad_stack_file_stops_before_any_aws_call(task, text, message, tmp_path):
    (tmp_path / "Pulumi.lab.yaml").write_text(text)
    price = ["--hourly-usd", "5"] if task == "plan" else []
    result = fab("-r", str(ROOT), task, "--stack", "lab", *price, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_arguments_after_a_double_dash_reach_the_training_program(inventory):
    result = fab("train", "--dry-run", "-c", inventory, "--", "--learning_rate", "3e-5")
    assert result.returncode == 0, result.stderr
    assert "-m training --output_dir" not in result.stdout  # the job's own arguments come first
    assert "--learning_rate 3e-5" in result.stdout


def test_forget_removes_one_host_or_the_whole_cluster(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    store = tmp_path / "xeon-cluster" / "keys" / "demo"
    store.mkdir(parents=True)
    (store / "known_hosts").write_text("10.0.0.5 ssh-ed25519 AAAA\n10.0.0.6 ssh-ed25519 BBBB\n"
                                       "[10.0.0.5]:2222 ssh-ed25519 CCCC\n[10.0.0.50]:2222 ssh-ed25519 DDDD\n")
    one = fab("forget", "--cluster", "demo", "--host", "10.0.0.5", env=env)
    assert one.returncode == 0 and "forgot 2 recorded host key line(s) of 10.0.0.5" in one.stdout
    assert (store / "known_hosts").read_text() == "10.0.0.6 ssh-ed25519 BBBB\n[10.0.0.50]:2222 ssh-ed25519 DDDD\n"
    port = fab("forget", "--cluster", "demo", "--host", "[10.0.0.50]:2222", env=env)
    assert port.returncode == 0 and "forgot 1 recorded host key line(s)" in port.stdout
    assert (store / "known_hosts").read_text() == "10.0.0.6 ssh-ed25519 BBBB\n"
    assert fab("forget", "-c", "demo", env=env).returncode == 0 and not store.exists()
