"""`fab train --resume` on the local cluster when the newest checkpoint never reached S3.

Every node keeps its own output directory (relative to its own home, unlike the shared default
under /var/tmp), as on AWS, so a worker can only get a checkpoint it does not have from S3: moto,
served on the cluster bridge's address so that the nodes reach it. The first run uploads
checkpoint-3 and checkpoint-6; checkpoint-6's manifest is then removed from S3 (what an upload cut
short leaves), so only the master has checkpoint-6 whole. `--resume` must continue from
checkpoint-3, the newest one every rank can read, not stop because the workers cannot fetch 6.

Budget: two 3-rank runs of the synthetic demo, about a minute.
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
    common = ["train", "--nodes", "3", "--synthetic-examples", "200", "--output-dir", output_dir,
              "--checkpoint-uri", f"s3://{BUCKET}/{PREFIX}", "--env", env, "--extra", "--save_steps 3"]
    try:
        first = fab(cluster, *common, "--max-steps", "6")
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

        resumed = fab(cluster, *common, "--max-steps", "9", "--resume")
        assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr
        summary = json.loads((master_dir / "summary.json").read_text())
        assert summary["resumed_from"]["step"] == 3, summary["resumed_from"]
        assert summary["run_id"] == run_id and summary["start_step"] == 3 and summary["steps"] == 9
        assert re.search(r"resuming from \S*checkpoint-3 \(step 3", resumed.stdout), resumed.stdout[-4000:]
        for worker in (1, 2):  # the workers fetched checkpoint-3 from S3 into their own output directory
            fetched = node_home(cluster, worker) / output_dir / "checkpoint-3" / "xeon-checkpoint.json"
            assert json.loads(fetched.read_text())["run_id"] == run_id
    finally:
        for i in range(len(cluster.state.nodes)):
            shutil.rmtree(node_home(cluster, i) / output_dir, ignore_errors=True)
