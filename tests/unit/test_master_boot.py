"""A new master's boot step (node_setup/supervisor/boot.py) and the run store it reads: the cluster key and the
unfinished run whose spec verifies with the controller's public key, its supervisor's directory written from the
signed hand-off. Against the local store double (node_setup/local/run_store_double.py, a test double of SSM
Parameter Store named as one) in a temporary data directory, and against SSM and S3 as moto serves them
(node_setup/aws/run_secrets.py); the supervisor itself is not started here (`start=False`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from cluster.inventory import Inventory
from cluster.job import request as rq
from cluster.job.train_options import request_from_options
from cluster.node.boot_script import master_boot_script
from cluster.node.render import RenderError
from cluster.run import runspec
from cluster.run import supervision as sv
from node_setup.local.run_store_double import LocalStoreDouble
from node_setup.supervisor import boot
from node_setup.tasks import managed
from tests.spec_key import made_spec_key

KEY = made_spec_key()
OTHER_KEY = made_spec_key()  # another controller's
RUN, OLDER = "20261123-101500-ab12", "20261122-090000-cd34"
CLUSTER = "lab"
CLUSTER_KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nAAAA\n-----END OPENSSH PRIVATE KEY-----\n"


def _inventory(root: Path) -> Inventory:
    return Inventory.from_mapping({"name": CLUSTER, "user": "root", "shared_output_root": str(root),
                                   "sockets": 1, "physical_cores": 4,
                                   "hosts": ["10.0.0.2", "10.0.0.3"]}, default_name=CLUSTER, kind="local")


def _request(root: Path, run_id: str = RUN) -> rq.RunRequest:
    options = dict(nodes=2, synthetic_examples=200, max_steps=100, output_dir=str(root / run_id), managed=True,
                   env="FI_PROVIDER=tcp HF_TOKEN=hf_s3cr3t")
    return request_from_options(options, _inventory(root), run_id=run_id)[0]


def published(tmp_path: Path, *, run_id: str = RUN, status: str = sv.RUNNING, key=KEY, change=None) -> LocalStoreDouble:
    """What `fab train --managed` leaves on a local cluster's shared disk and in the store double: the signed
    spec (`change`: then altered by someone else), the supervisor's mirrored state, the run record."""
    root = tmp_path / "runs"
    request = _request(root, run_id)
    inventory = _inventory(root)
    handoff, secrets = runspec.handoff(request, kind="local", run_nodes=inventory.to_mapping(),
                                       cluster=inventory.to_mapping(), instance_ids={},
                                       context={"local_data_dir": str(tmp_path / "data")})
    data = json.loads(runspec.signed_text(request, "local", key, cluster=CLUSTER, handoff=handoff))
    if change is not None:
        change(data)
    spec_at = Path(runspec.spec_path(str(request.output_dir)))
    spec_at.parent.mkdir(parents=True)
    spec_at.write_text(json.dumps(data))
    state = sv.state_record(run_id=run_id, status=status, job_id=run_id, nodes=["node0", "node1"], recoveries=[],
                            output_dir=str(request.output_dir), at=1000.0)
    Path(runspec.state_path(str(request.output_dir))).write_text(json.dumps(state))
    store = LocalStoreDouble(tmp_path / "data", CLUSTER)
    store.put(runspec.CLUSTER_KEY_NAME, CLUSTER_KEY)
    store.put(runspec.run_record_name(run_id), runspec.run_record(run_id, str(spec_at),
                                                                  {**secrets, "LD_PRELOAD": "/tmp/x.so"}))
    return store


def run_boot(tmp_path: Path, store, lines: list[str]) -> str | None:
    return boot.boot("local", CLUSTER, KEY.public, home=tmp_path / "home", store=store, start=False,
                     say=lines.append)


def test_the_unfinished_run_whose_spec_verifies_gets_its_supervisor_directory_from_the_signed_hand_off(tmp_path):
    store = published(tmp_path)
    lines: list[str] = []
    assert run_boot(tmp_path, store, lines) == RUN
    run_dir = tmp_path / "home" / sv.RUN_ROOT / RUN
    spec = json.loads((run_dir / sv.SPEC_FILE).read_text())
    request = rq.RunRequest.from_mapping(spec["request"])
    # the same run, resumed: its id, its request as signed (the secret still withheld in the spec), --resume
    assert request == dataclasses.replace(_request(tmp_path / "runs").with_env({"HF_TOKEN": runspec.WITHHELD}),
                                          resume=True)
    assert spec["kind"] == "local" and spec["inventory"]["hosts"][1]["address"] == "10.0.0.3"
    assert spec["takeover"] == {"run": RUN, "status": sv.RUNNING, "job": RUN, "updated": 1000.0, "replaced": []}
    # only the spec's withheld names get a value: a name the record adds is not the run's
    secrets = run_dir / sv.SECRETS_FILE
    assert json.loads(secrets.read_text()) == {"HF_TOKEN": "hf_s3cr3t"} and secrets.stat().st_mode & 0o777 == 0o600
    key = tmp_path / "home" / ".ssh" / f"{CLUSTER}_ed25519"
    assert key.read_text() == CLUSTER_KEY and key.stat().st_mode & 0o777 == 0o600
    assert lines[-1].endswith(f"run {RUN} (running, job {RUN}) continued by its supervisor here")


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d["request"]["env"].append(["PYTHONWARNINGS", "ignore"]), "does not match"),
    (lambda d: d[runspec.HANDOFF]["inventory"]["hosts"][1].update(address="203.0.113.9"), "does not match"),
    (lambda d: d.pop(runspec.SIGNATURE), "it is not signed"),
])
def test_a_spec_changed_or_unsigned_is_skipped_in_one_line_and_nothing_is_written(tmp_path, change, said):
    store = published(tmp_path, change=change)
    lines: list[str] = []
    assert run_boot(tmp_path, store, lines) is None
    skipped = [line for line in lines if "skipped" in line]
    assert len(skipped) == 1 and said in skipped[0] and "\n" not in skipped[0]
    assert not (tmp_path / "home").exists()  # no cluster key placed, no supervisor directory


def test_a_spec_another_controller_signed_is_skipped(tmp_path):
    lines: list[str] = []
    assert run_boot(tmp_path, published(tmp_path, key=OTHER_KEY), lines) is None
    assert any("signature does not match" in line for line in lines)


def test_a_run_that_ended_is_not_continued_and_the_newest_unfinished_one_is(tmp_path):
    published(tmp_path, run_id=OLDER)
    store = published(tmp_path, status=sv.COMPLETED)
    lines: list[str] = []
    assert run_boot(tmp_path, store, lines) == OLDER  # RUN completed: left alone
    (tmp_path / "home").rename(tmp_path / "first-home")
    older_state = Path(runspec.state_path(str(tmp_path / "runs" / OLDER)))
    older_state.write_text(older_state.read_text().replace(sv.RUNNING, sv.STOPPED))  # the user stopped it
    assert run_boot(tmp_path, store, lines) is None and lines[-1].endswith("no unfinished supervised run; nothing "
                                                                           "to continue")


def test_the_master_boot_script_passes_every_value_quoted_and_refuses_what_is_not_one(tmp_path):
    script = master_boot_script(signer=KEY.public + " comment", cluster=CLUSTER, kind="local", ssh_user="ubuntu",
                                python="/opt/xeon-cluster/venv/bin/python", store=str(tmp_path))
    assert f"SIGNER='{KEY.public}'" in script and "node_setup.supervisor.boot" in script
    for bad in (dict(signer="ssh-rsa AAAA"), dict(signer=KEY.public + "'; rm -rf /"), dict(region="us-east-1; x"),
                dict(ssh_user="root;x"), dict(python="python"), dict(store="../x"), dict(kind="local;x")):
        values = dict(signer=KEY.public, cluster=CLUSTER, kind="local", ssh_user="ubuntu",
                      python="/opt/xeon-cluster/venv/bin/python", store=str(tmp_path), region="") | bad
        with pytest.raises(RenderError):
            master_boot_script(**values)


# ---------------------------------------------------------------- AWS: SSM Parameter Store and S3, as moto serves them


BUCKET = "xc-checkpoints"
URI = f"s3://{BUCKET}/runs/qa"


@pytest.fixture
def aws(aws_credentials):
    moto = pytest.importorskip("moto")
    import boto3

    with moto.mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield s3, boto3.client("ssm", region_name="us-east-1")


def test_on_aws_the_secrets_are_secure_strings_and_a_new_master_finds_the_run_beside_its_checkpoints(aws, tmp_path,
                                                                                                   monkeypatch):
    from node_setup.aws.run_secrets import SsmStore

    s3, ssm = aws
    inventory = Inventory.from_mapping({"name": CLUSTER, "user": "ubuntu", "sockets": 1, "physical_cores": 4,
                                        "hosts": ["10.0.0.2", "10.0.0.3"]}, default_name=CLUSTER, kind="aws")
    options = dict(nodes=2, synthetic_examples=200, max_steps=100, checkpoint_uri=URI, output_dir="runs/qa",
                   managed=True, env="HF_TOKEN=hf_s3cr3t")
    request = request_from_options(options, inventory, run_id=RUN)[0]
    handoff, secrets = runspec.handoff(request, kind="aws", run_nodes=inventory.to_mapping(),
                                       cluster=inventory.to_mapping(), instance_ids={}, context={})
    monkeypatch.setattr("node_setup.ssh.keys.ensure_cluster_key",
                        lambda name: type("K", (), {"private_key": CLUSTER_KEY})())
    store = SsmStore(CLUSTER, "us-east-1", client=ssm)
    said = managed.store_run(inventory, request, secrets, handoff, store=store)
    assert said == [f"a new master continues the run by itself: its secrets are in ssm:/xeon-cluster/{CLUSTER}/runs"]
    parameter = ssm.get_parameter(Name=f"/xeon-cluster/{CLUSTER}/runs/{RUN}", WithDecryption=True)["Parameter"]
    assert parameter["Type"] == "SecureString" and "hf_s3cr3t" in parameter["Value"]
    assert ssm.get_parameter(Name=f"/xeon-cluster/{CLUSTER}/{runspec.CLUSTER_KEY_NAME}",
                             WithDecryption=True)["Parameter"]["Type"] == "SecureString"
    # the spec beside the checkpoints (`fab train --managed`), the state the supervisor mirrors there
    s3.put_object(Bucket=BUCKET, Key=f"runs/qa/{runspec.RUN_FOLDER}/{sv.SPEC_FILE}",
                  Body=runspec.signed_text(request, "aws", KEY, cluster=CLUSTER, handoff=handoff).encode())
    state = sv.state_record(run_id=RUN, status=sv.MASTER_LEAVING, job_id=RUN, nodes=["node0", "node1"],
                            recoveries=[], output_dir="runs/qa", at=1000.0)
    store.write(runspec.state_uri(URI), json.dumps(state))
    lines: list[str] = []
    assert boot.boot("aws", CLUSTER, KEY.public, home=tmp_path, store=store, start=False, say=lines.append) == RUN
    spec = json.loads((tmp_path / sv.RUN_ROOT / RUN / sv.SPEC_FILE).read_text())
    assert spec["takeover"]["status"] == sv.MASTER_LEAVING and spec["kind"] == "aws"
    store.delete(runspec.run_record_name(RUN))
    assert store.names(runspec.RUNS_FOLDER) == []


def test_on_aws_the_cluster_keys_from_is_the_masters_subnet_as_ec2_says(aws):
    """`fab distribute` names the subnet in `from=` (node_setup/backends/aws.py's cluster_subnet), so that the
    workers accept a new master at an address of its own; EC2 as moto serves it."""
    import boto3

    from node_setup.backends.aws import AwsBackend

    ec2 = boto3.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.20.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.20.16.0/20")["Subnet"]["SubnetId"]
    image = ec2.describe_images()["Images"][0]["ImageId"]
    master = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, SubnetId=subnet)["Instances"][0]
    inventory = Inventory.from_mapping({"name": CLUSTER, "hosts": [master["PrivateIpAddress"]]},
                                       default_name=CLUSTER, kind="aws")
    inventory = dataclasses.replace(inventory, nodes=(dataclasses.replace(inventory.master,
                                                                          instance_id=master["InstanceId"]),))
    assert AwsBackend().cluster_network(inventory, ec2) == ("10.20.16.0/20", ())
    unknown = dataclasses.replace(inventory.master, instance_id="i-0123456789abcdef0")
    gone = dataclasses.replace(inventory, nodes=(unknown,))
    assert AwsBackend().cluster_network(gone, ec2) is None


def test_the_rendered_master_boot_script_runs_the_boot_step_as_the_user_in_its_home(tmp_path):
    """The script itself, run here as cloud-init would run it (as root, for the user root): with a store that holds
    no cluster key yet, the boot step says there is nothing to continue and writes nothing."""
    import getpass
    import subprocess
    import sys

    user = getpass.getuser()
    script = master_boot_script(signer=KEY.public, cluster=CLUSTER, kind="local", ssh_user=user, python=sys.executable,
                                store=str(tmp_path / "data"))
    checkout = str(Path(__file__).resolve().parents[2])  # this checkout's modules, as a node venv holds them
    done = subprocess.run(["/bin/sh", "-c", script, "xeon-cluster-boot"], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": checkout})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("no cluster key at "
                                        f"{tmp_path}/data/secret-store-double/xeon-cluster/{CLUSTER}/cluster-key; "
                                        "nothing to continue"), done.stdout
    assert not (tmp_path / "data").exists()
