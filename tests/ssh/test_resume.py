"""`fab train --resume` on the local cluster when the newest checkpoint never reached S3.

Every node keeps its own output directory (relative to its own home, unlike the shared default
under /var/tmp), as on AWS, so a worker can only get a checkpoint it does not have from S3: moto,
served on the cluster bridge's address so that the nodes reach it. The first run uploads
checkpoint-3 and checkpoint-6; checkpoint-6's manifest is then removed from S3 (what an upload cut
short leaves), so only the master has checkpoint-6 whole. `--resume` must continue from
checkpoint-3, the newest one every rank can read, not stop because the workers cannot fetch 6; given
no `--output-dir`, in the newest job's output directory.

Two nodes are enough (a worker that must fetch from S3); the session's cluster has 3, and the third runs nothing.

Budget: two 2-rank runs of the synthetic demo, about 30 seconds.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.cost.spend import COST_KEY

pytestmark = [pytest.mark.ssh, pytest.mark.mpi, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BUCKET, PREFIX = "ckpt", "resume-test"


def fab(cluster, *args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fabric", *args, "--cluster", cluster.cluster_arg], cwd=ROOT,
                          env=cluster.env(), capture_output=True, text=True, timeout=timeout)


def node_home(cluster, index: int) -> Path:
    return Path(cluster.state.nodes[index].dir) / "root"


@pytest.fixture
def s3_on_bridge(installed_cluster):
    """moto's S3 on the bridge address (the nodes' way to this machine); (client, endpoint)."""
    import boto3
    import moto.server

    address = installed_cluster.state.bridge_address
    with socket.socket() as sock:
        sock.bind((address, 0))
        port = sock.getsockname()[1]
    server = moto.server.ThreadedMotoServer(ip_address=address, port=port, verbose=False)
    server.start()
    endpoint = f"http://{address}:{port}"
    client = boto3.client("s3", region_name="us-east-1", endpoint_url=endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    client.create_bucket(Bucket=BUCKET)
    try:
        yield client, endpoint
    finally:
        server.stop()


def test_resume_takes_the_newest_checkpoint_every_node_can_read(installed_cluster, s3_on_bridge):
    cluster = installed_cluster
    s3, endpoint = s3_on_bridge
    output_dir = f"xc-resume-{secrets.token_hex(3)}"  # relative: each node's own home
    env = (f"AWS_ENDPOINT_URL_S3={endpoint} AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing "
           "AWS_DEFAULT_REGION=us-east-1")
    common = ["train", "--nodes", "2", "--synthetic-examples", "200", "--checkpoint-uri", f"s3://{BUCKET}/{PREFIX}",
              "--env", env, "--extra", "--save_steps 3"]
    try:
        first = fab(cluster, *common, "--output-dir", output_dir, "--max-steps", "6")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr
        master_dir = node_home(cluster, 0) / output_dir
        run_id = json.loads((master_dir / "summary.json").read_text())["run_id"]
        manifests = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=PREFIX)["Contents"]
                           if o["Key"].endswith("xeon-checkpoint.json"))
        assert manifests == [f"{PREFIX}/checkpoint-3/xeon-checkpoint.json",
                             f"{PREFIX}/checkpoint-6/xeon-checkpoint.json"]
        # checkpoint-6's upload "failed": S3 has its files but no manifest; the master still has it whole
        s3.delete_object(Bucket=BUCKET, Key=f"{PREFIX}/checkpoint-6/xeon-checkpoint.json")
        assert (master_dir / "checkpoint-6" / "xeon-checkpoint.json").exists()
        # a worker's own folder holds only its RNG state (no manifest): it must fetch checkpoint-3
        assert not (node_home(cluster, 1) / output_dir / "checkpoint-3" / "xeon-checkpoint.json").exists()

        # no --output-dir: --resume continues in the newest job's
        resumed = fab(cluster, *common, "--max-steps", "9", "--resume")
        assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr
        assert f"resuming in {output_dir} (the newest job's output directory)" in resumed.stdout
        summary = json.loads((master_dir / "summary.json").read_text())
        assert summary["resumed_from"]["step"] == 3, summary["resumed_from"]
        assert summary["run_id"] == run_id and summary["start_step"] == 3 and summary["steps"] == 9
        assert summary[COST_KEY]["actual_seconds"] > 0 and summary[COST_KEY]["actual_usd"] == 0  # the resumed run's
        assert re.search(r"resuming from \S*checkpoint-3 \(step 3", resumed.stdout), resumed.stdout[-4000:]
        # the worker fetched checkpoint-3 from S3 into its own output directory
        fetched = node_home(cluster, 1) / output_dir / "checkpoint-3" / "xeon-checkpoint.json"
        assert json.loads(fetched.read_text())["run_id"] == run_id
    finally:
        for i in range(len(cluster.state.nodes)):
            shutil.rmtree(node_home(cluster, i) / output_dir, ignore_errors=True)


def _started(cluster) -> dict[str, list[str]]:
    """Every job and supervised run each node holds (what a launch would add)."""
    found = {}
    for i in range(len(cluster.state.nodes)):
        home = node_home(cluster, i) / ".xeon-cluster"
        found[f"node{i}"] = sorted(str(p.relative_to(home)) for folder in ("jobs", "supervisor")
                                   for p in (home / folder).glob("*"))
    return found


def test_a_spec_anyone_else_wrote_or_changed_is_refused_before_anything_starts(installed_cluster, s3_on_bridge,
                                                                                 monkeypatch):
    """`fab train --managed --resume` on a spec in the bucket (moto) that was changed after fab signed it: an
    added environment variable, an interpreter named, an added training argument, the signature removed. One
    line naming the file, exit 2, no job and no supervisor started on any node; the spec as signed is taken."""
    import copy

    from cluster.job.train_options import request_from_options
    from cluster.run import runspec
    from node_setup.ssh.keys import spec_key

    cluster = installed_cluster
    s3, endpoint = s3_on_bridge
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cluster.config_home))  # fab's key store: the cluster's config home
    uri = f"s3://{BUCKET}/signed-{secrets.token_hex(3)}"
    options = dict(nodes=3, synthetic_examples=200, max_steps=6, checkpoint_uri=uri, managed=True)
    request, _ = request_from_options(options, cluster.inventory, run_id="20261127-101500-ab12")
    signed = json.loads(runspec.signed_text(request, "local", spec_key(), cluster=cluster.inventory.name))
    other, _ = request_from_options({**options, "checkpoint_uri": f"{uri}-other"}, cluster.inventory,
                                    run_id="20261127-101600-cd34")  # another run's spec, validly signed
    key = f"{uri.split('/', 3)[3]}/{runspec.RUN_FOLDER}/spec.json"
    env = {**cluster.env(), "AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def resume(*more):
        return subprocess.run([sys.executable, "-m", "fabric", "train", "--managed", "--resume", "--checkpoint-uri",
                               uri, "--cluster", cluster.cluster_arg, *more], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)

    changes = {
        "an added environment variable": lambda d: d["request"]["env"].append(["PYTHONWARNINGS", "ignore"]),
        "an interpreter named": lambda d: d["request"]["program"].update(python="/tmp/evil/bin/python"),
        "an added training argument": lambda d: d["request"]["program"]["extra"].append(["--push_to_hub"]),
        "the signature removed": lambda d: d.pop(runspec.SIGNATURE),
        "another run's spec copied here": lambda d: d.clear() or d.update(json.loads(runspec.signed_text(
            other, "local", spec_key(), cluster=cluster.inventory.name))),
    }
    before = _started(cluster)
    for what, change in changes.items():
        data = copy.deepcopy(signed)
        change(data)
        s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(data).encode())
        refused = resume()
        lines = refused.stderr.strip().splitlines()
        assert refused.returncode == 2 and len(lines) == 1, (what, refused.stdout, refused.stderr)
        assert lines[0].startswith(f"error: {uri}/{runspec.RUN_FOLDER}/spec.json: "), (what, lines)
        assert _started(cluster) == before, what
    s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(signed).encode())
    taken = resume("--dry-run")
    assert taken.returncode == 0, taken.stdout + taken.stderr
    assert "resuming run 20261127-101500-ab12 from its spec" in taken.stdout and " --resume" in taken.stdout
    assert _started(cluster) == before
