"""`fab train --script`, `fab exec`, `fab get` on a local cluster: real sshd, real Intel MPI, the
user's own programs written here (plain PyTorch with its requirements, one failing on one rank), unchanged;
`train_through_a_notice` for tests/ssh/test_script_shapes.py's Trainer script (the shapes of accelerate and
Trainer scripts are that file's).

Budget: about 2 minutes on a 2-core machine (one cluster, four short jobs).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from cluster.node.profiles import PROFILES, venv_dir
from cluster.job.launch import JOBS_DIR
from tests.ssh.jobs_on_nodes import newest_job, node_home
from tests.ssh.shared_venv import marker_restored, setup_lock_held

REPO_ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

FAB = [sys.executable, "-m", "fabric"]
VENV = venv_dir(PROFILES["stock"])
ONE_THREAD = ["--threads", "1"]

PLAIN_TORCH = '''
import hashlib, json, os, sys
import torch
import torch.distributed as dist
import cluster  # the workdir's own cluster.py, not the toolkit's
import tinypkg

assert cluster.WHOSE == "user", cluster.__file__
dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"]) == 3
assert os.environ["LOCAL_RANK"] == "0" and os.environ["LOCAL_WORLD_SIZE"] == "1"
assert os.environ["NODE_RANK"] == os.environ["GROUP_RANK"] == str(rank)
total = torch.tensor([rank])
dist.all_reduce(total)
token = hashlib.sha256(os.environ.get("HF_TOKEN", "").encode()).hexdigest()[:16]  # the --env secret, never printed
print(f"rank {rank} of {world}: sum {int(total)}, tinypkg {tinypkg.VERSION}, args {sys.argv[1:]}, token {token}",
      flush=True)
if rank == 0:
    out = os.environ["XEON_CLUSTER_OUTPUT_DIR"]
    with open(os.path.join(out, "result.json"), "w") as f:
        json.dump({"sum": int(total), "world": world, "args": sys.argv[1:],
                   "job": os.environ["XEON_CLUSTER_JOB"]}, f)
dist.barrier()  # no rank tears gloo down while another still uses it
dist.destroy_process_group()
'''

# A fake metadata service (IMDSv2) for one node's namespace: the interruption notice appears once
# the flag file exists (the test creates it when training has started).
FAKE_IMDS = '''
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
flag = sys.argv[2]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def reply(self, code, body=""):
        data = body.encode(); self.send_response(code); self.send_header("Content-Length", str(len(data)))
        self.end_headers(); self.wfile.write(data)
    def do_PUT(self): self.reply(200, "token")
    def do_GET(self):
        if self.headers.get("X-aws-ec2-metadata-token") != "token": return self.reply(401)
        if self.path.endswith("/spot/instance-action") and os.path.exists(flag):
            soon = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
            return self.reply(200, json.dumps({"action": "terminate", "time": soon}))
        self.reply(404)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''


def fab(cluster, *args, timeout=300, env=None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([*FAB, *args, "--cluster", cluster.cluster_arg], cwd=REPO_ROOT,
                              env={**cluster.env(), **(env or {})}, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:  # what the job was doing, so that the failure says why
        job = newest_job(cluster)
        log = node_home(cluster) / JOBS_DIR / job / "log" if job else None
        tail = log.read_text(errors="replace")[-8000:] if log and log.is_file() else "(no job log)"
        said = b"".join(o if isinstance(o, bytes) else o.encode() for o in (exc.stdout, exc.stderr) if o)
        pytest.fail(f"fab {args[0]} ran past {timeout} s; the newest job ({job}) on the master logged:\n{tail}\n"
                    f"fab printed:\n{said.decode(errors='replace')[-4000:]}")


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(textwrap.dedent(text))
    return folder


def job_id_of(output: str) -> str:
    line = next(line for line in output.splitlines() if line.startswith("job ") and " started on " in line)
    return line.split()[1]


@pytest.fixture(scope="module")
def cluster(installed_cluster):
    yield installed_cluster
    shutil.rmtree(Path(LOCAL_OUTPUT_ROOT) / installed_cluster.name, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny_wheel(tmp_path_factory) -> tuple[Path, str]:
    """A pure-Python wheel built here (no network), with a version new to this session."""
    src = tmp_path_factory.mktemp("tinypkg")
    version = f"1.0.{int(time.time())}"
    write(src, {"pyproject.toml": f'[project]\nname = "xc-test-tinypkg"\nversion = "{version}"\n'
                                  '[tool.setuptools]\npy-modules = ["tinypkg"]\n'
                                  '[build-system]\nrequires = ["setuptools"]\n'
                                  'build-backend = "setuptools.build_meta"\n',
                "tinypkg.py": f'VERSION = "{version}"\n'})
    dist = tmp_path_factory.mktemp("wheels")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist),
                    str(src)], check=True, capture_output=True)
    return dist, version


def test_plain_pytorch_script_with_requirements_then_fab_get(cluster, tmp_path, tiny_wheel):
    wheels, version = tiny_wheel
    work = write(tmp_path / "work", {"train.py": PLAIN_TORCH, "cluster.py": 'WHOSE = "user"\n',
                                     "training/__init__.py": 'raise ImportError("the user\'s own training package")\n',
                                     ".gitignore": "big.bin\n", "big.bin": "x" * 1000,
                                     "requirements.txt": f"xc-test-tinypkg=={version}\ntorch>=2.10\n"})
    pip_offline = {"PIP_FIND_LINKS": str(wheels), "PIP_NO_INDEX": "1"}
    secret = "hf_" + "Xy7" * 12
    result = fab(cluster, "train", "--nodes", "3", *ONE_THREAD, "--script", str(work / "train.py"),
                 "--requirements", str(work / "requirements.txt"), "--args", "--name 'a b'",
                 "--env", f"HF_TOKEN={secret}", env=pip_offline)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert out.count("requirements installed") == 1 and out.count("requirements unchanged") == 2, out
    token = hashlib.sha256(secret.encode()).hexdigest()[:16]
    for rank in range(3):
        # (mpirun may glue two ranks' lines together, so the rank's own line is looked for, not its label)
        assert f"rank {rank} of 3: sum 3, tinypkg {version}, args ['--name', 'a b'], token {token}" in out, out
    job = job_id_of(out)
    # every rank got the --env secret from the job's 0600 env file on the master: not in run.sh nor the log
    job_dir = Path(cluster.state.nodes[0].dir) / "root" / ".xeon-cluster" / "jobs" / job
    assert (job_dir / "env").stat().st_mode & 0o777 == 0o600 and secret in (job_dir / "env").read_text()
    assert secret not in (job_dir / "run.sh").read_text() and secret not in (job_dir / "log").read_text()

    again = fab(cluster, "train", "--nodes", "3", *ONE_THREAD, "--script", str(work / "train.py"),
                "--requirements", str(work / "requirements.txt"), env=pip_offline)
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count("requirements unchanged") == 3 and "sent 0 new file(s)" in again.stdout, again.stdout

    got = fab(cluster, "get", "--job", job, "--path", "result.json", "--to", str(tmp_path / "got"), timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    result_file = json.loads((tmp_path / "got" / job / "result.json").read_text())
    assert result_file == {"sum": 3, "world": 3, "args": ["--name", "a b"], "job": job}
    home = Path(cluster.state.nodes[1].dir) / "root" / ".xeon-cluster" / "jobs" / job / "workdir"
    assert (home / "train.py").is_file() and not (home / "big.bin").exists()  # .gitignore respected


def train_through_a_notice(cluster, tmp_path, port: int, train_args: list[str], *, nodes: int = 3) -> tuple[int, str]:
    """`fab train --nodes NODES ... TRAIN_ARGS` with a fake metadata service on the master (loopback `port`, inside
    its namespace) that announces a spot interruption once the job logs "training step 3": (exit code, output)."""
    fake, flag = tmp_path / "fake_imds.py", tmp_path / "announce"
    fake.write_text(FAKE_IMDS)
    server = subprocess.Popen(["ip", "netns", "exec", cluster.state.nodes[0].namespace, sys.executable, str(fake),
                               str(port), str(flag)])
    lines: list[str] = []
    try:
        run = subprocess.Popen([*FAB, "train", "--nodes", str(nodes), *ONE_THREAD, "--cluster", cluster.cluster_arg,
                                "--env",
                                f"XEON_IMDS_ENDPOINT=http://127.0.0.1:{port} XEON_CLUSTER_NOTICE_POLL_SECONDS=0.5",
                                *train_args],  # last: they may end with `-- PROGRAM ARGS`
                               cwd=REPO_ROOT, env=cluster.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)

        def read():
            for line in run.stdout:
                lines.append(line)
                if "training step 3" in line:
                    flag.touch()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        code = run.wait(timeout=300)
        reader.join(10)
    finally:
        server.kill()
        server.wait()
    return code, "".join(lines)


def test_a_script_failing_on_one_rank_fails_the_job_and_leaves_no_rank(cluster, tmp_path):
    work = write(tmp_path / "work", {"fail.py": "import os, sys, time\n"
                                                "if os.environ['RANK'] == '1':\n    sys.exit(7)\ntime.sleep(120)\n"})
    result = fab(cluster, "train", "--nodes", "3", *ONE_THREAD, "--script", str(work / "fail.py"))
    out = result.stdout + result.stderr
    assert "failed: exit code 255" in out, out  # what Intel MPI's mpirun returns for a dead rank
    # the rank wrapper's line names the rank, its node and the program's own code, which fab passes on
    assert re.search(r"^  rank 1 on node node1 \(host node1, pid \d+\): exit code 7$", out, re.M), out
    assert result.returncode == 7, out
    assert "no rank of the job is left on any node" in out, out


def test_nodes_running_an_older_toolkit_are_named_and_the_job_still_runs(cluster, tmp_path):
    """The warning compares the nodes' project marker with this checkout's version, a digest of its sources.
    Both move under a test on a shared machine: others edit the checkout (a new version) and another session's
    `fab setup` rewrites the shared venv's marker. So the test holds the setup lock and writes the marker
    itself, the checkout's version as it computes it for the run that must see no warning; should the sources
    change during that run, the warning, if any, must name that marker as the nodes' and another version as
    this checkout's."""
    from cluster.node.setup_script import PROJECT_MARKER  # the venv is shared by the local nodes
    from node_setup.controller import project_version

    marker = Path(VENV) / PROJECT_MARKER
    work = write(tmp_path / "work", {"hi.py": "print('hi', flush=True)\n"})
    hello = ("train", "--nodes", "3", *ONE_THREAD, "--script", str(work / "hi.py"), "--independent-ranks")  # no world
    with setup_lock_held("tests/ssh/test_user_script.py, pinning the project marker"), marker_restored(marker):
        marker.write_text("0.0.1+src.older\n")
        older = fab(cluster, *hello)
        pinned = project_version()
        marker.write_text(f"{pinned}\n")
        same = fab(cluster, *hello)
        changed = project_version() != pinned  # this checkout's sources were edited during the run
    assert older.returncode == 0, older.stdout + older.stderr
    assert re.search(r"^warning: the nodes' xeon-cluster is not this checkout's \(\S+\): node0 0\.0\.1\+src\.older, "
                     r"node1 0\.0\.1\+src\.older, node2 0\.0\.1\+src\.older;", older.stdout, re.M), older.stdout
    assert same.returncode == 0, same.stdout + same.stderr
    warned = re.search(r"^warning: the nodes' xeon-cluster is not this checkout's \((\S+)\): node0 (\S+),", same.stdout,
                       re.M)
    assert warned is None or (changed and warned.group(2) == pinned and warned.group(1) != pinned), same.stdout


def test_exec_runs_everywhere_and_reports_the_failing_node(cluster):
    result = fab(cluster, "exec", 'echo "on $(hostname)"; case $(hostname) in *1) exit 4;; esac', timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    for rank in range(3):
        assert f"[node{rank}] on node{rank}" in result.stdout
    table = result.stdout.split("exec on 3 node(s):")[1]
    assert "node1  FAILED  exit 4" in table and "node0  ok" in table and "node2  ok" in table, table
