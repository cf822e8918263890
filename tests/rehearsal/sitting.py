"""A user's whole sitting with the AWS path, rehearsed with only the EC2 API and the Pulumi engine
replaced: local-up, `fab preflight`, `pulumi up` of a stack that keeps its image (`keepImage`), the
stack's security groups applied to the nodes' SSH, `fab train`, `fab status`, a worker terminated and
replaced by the workers' Auto Scaling group (`fab status` shows the replacement), `pulumi destroy`
(the bucket and the image kept), `fab sweep`, then a second stack that boots every node from the kept
image (`fab preflight` says so; no install, no image made), `fab images` and its `--remove`, then a third
stack whose destroy leaves its image behind, caught and removed by `fab sweep --delete --yes`.

- The account is a moto server on 127.0.0.1 (tests/rehearsal/account.py); every `fab` is the
  unmodified one, run as `python -m fabric --search-root <repository> ...`, reaching the server
  through boto3's standard `AWS_ENDPOINT_URL`, with fake credentials and `AWS_REGION`.
- The stack file is written where a user keeps theirs, next to where `fab` runs, but in the
  rehearsal's own temporary directory, not in the repository: `fab preflight` and `fab sweep`
  read `Pulumi.<stack>.yaml` from their working directory, and a stack file left in the checkout
  would change what every other `fab` run there sees.
- `pulumi up` / `pulumi destroy` run the real infra/__main__.py under Pulumi's mocks backed by that
  server (tests/rehearsal/engine.py); the setup step runs for real over SSH against the master.
- The instances are the nodes of a local cluster: the stack's subnet has the local bridge's
  network, each instance is created with its node's address (the master by the engine, the
  group's workers by GroupLaunchDouble, tests/rehearsal/group_launches.py, on the nodes after the
  master's; a replacement on the node of the worker it replaces) and none gets a public address, so
  `fab` reaches the nodes by private address as a controller inside the VPC would: the master
  directly and the workers through it, because the stack's security groups, enforced at the
  nodes' sshd (tests/rehearsal/security_groups.py), admit SSH from outside the cluster on the
  master only. The stack's
  `sshUser` is root and `privateKeyPath` the local cluster's controller key, which `fab` is given
  as `XEON_CLUSTER_SSH_KEY`.

Run it with `bash scripts/rehearse-aws.sh` (or `python -m tests.rehearsal.sitting`) as root, or
through pytest (tests/rehearsal/test_sitting.py). Each step prints one line with its result; a
step that fails raises `RehearsalFailed` with the command's output, after cleaning up.

Why this module is longer than about 400 lines (about 680): the sitting is one object, `Sitting`,
whose steps run in order on the same state (the local cluster, the moto account, the stack file,
the controller's config directory) and each reads what the one before left; the account, the
engine and the security groups are already modules of their own.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import yaml

from cluster.job.jobplan import LOCAL_OUTPUT_ROOT
from cluster.node.profiles import get_profile, venv_dir
from cluster.node.setup_script import PROFILE_MARKER, fingerprint_digest
from cluster.stack.tags import (BASE_IMAGE_KEY, CLUSTER_KEY, FINGERPRINT_KEY, KEEP_KEY, ROLE_KEY, ROLE_MASTER)
from node_setup.aws.sweep import LIVE_INSTANCE_STATES
from node_setup.discovery import KEY_ENV
from node_setup.local import state as local_state
from node_setup.local.console import console_path
from node_setup.ssh import keys as ssh_keys
from tests.infra.conftest import RELEASE
from tests.rehearsal.account import REGION, UBUNTU_IMAGE_ID, ZONE, Account
from tests.rehearsal.engine import Stack, environ_set
from tests.rehearsal.group_launches import GROUP_NAME_TAG
from tests.rehearsal.security_groups import SshIngressDouble
from tests.ssh.conftest import FAB, REPO_ROOT, local_cluster_unavailable
from tests.ssh.warm_nodes import WarmNodes

NODES = 3
INSTANCE_TYPE = "r7iz.metal-16xl"  # Pulumi.example.yaml's; the local nodes stand in for it
# The nodes are 2-core namespaces standing in for r7iz.metal-16xl: one rank per node, one thread,
# unpinned, ranks that wait instead of busy-polling (what a local cluster's layout picks by itself),
# and no spot watcher (it would ask 169.254.169.254 on an EC2 machine).
TRAIN_ARGS = ("--synthetic-examples", "200", "--max-steps", "6", "--ranks-per-node", "1", "--threads", "1",
              "--pin", "off", "--env", "I_MPI_WAIT_MODE=1", "--extra", "--spot_watch off")


def host_keys() -> dict[str, bytes]:
    """This machine's own SSH host keys (which nothing the sitting runs may touch)."""
    return {p.name: p.read_bytes() for p in Path("/etc/ssh").glob("ssh_host_*")}


class RehearsalFailed(AssertionError):
    """A step of the sitting did not do what the user needs; the message has its output."""


@dataclass
class StepResult:
    number: int
    name: str
    summary: str
    seconds: float


@dataclass
class Sitting:
    workdir: Path
    out: Callable[[str], None] = print
    verbose: bool = False
    tag: str = field(default_factory=lambda: secrets.token_hex(3))
    steps: list[StepResult] = field(default_factory=list)
    warm: WarmNodes | None = None  # the tests' warm starts for the nodes' jobs (tests/ssh/warm_nodes.py)

    def __post_init__(self):
        self.local_name = f"rh-{self.tag}"
        self.cluster = f"rehearsal-{self.tag}"
        self.leak_cluster = f"{self.cluster}-leak"
        self.reuse_cluster = f"{self.cluster}-again"
        self.stack_name = f"rehearsal-{self.tag}"
        self.stack_dir = self.workdir / "stack"  # fab's working directory: where it reads the stack file
        self.stack_file = self.stack_dir / f"Pulumi.{self.stack_name}.yaml"
        self.config_home = self.workdir / "config"
        self.cache_home = self.workdir / "cache"  # the project wheels the setup step builds
        self.data_root = self.workdir / "data"
        self.account = Account()
        self.local_started = False
        self.state: local_state.ClusterState | None = None
        self.env: dict[str, str] = {}

    # ------------------------------------------------------------------------------ plumbing

    def say(self, line: str) -> None:
        self.out(line)

    @contextmanager
    def step(self, name: str) -> Iterator[dict]:
        number = len(self.steps) + 1
        self.say(f"[{number:>2}] {name}")
        result: dict = {"summary": ""}
        start = time.monotonic()
        try:
            yield result
        except BaseException as exc:
            first = (str(exc).splitlines() or [""])[0]
            self.say(f"     FAILED ({time.monotonic() - start:.1f} s): {type(exc).__name__}: {first}")
            raise
        seconds = time.monotonic() - start
        self.steps.append(StepResult(number, name, result["summary"], seconds))
        self.say(f"     ok ({seconds:.1f} s): {result['summary']}")

    def fab(self, *args: str, timeout: float = 300, expect: int = 0) -> str:
        """`python -m fabric <args>` from the repository root; its output, or RehearsalFailed."""
        shown = " ".join(a if re.fullmatch(r"[\w./:=@,+-]+", a) else repr(a) for a in args)
        self.say(f"     $ fab {shown}")
        run = subprocess.run(self.fab_command(*args), cwd=self.stack_dir, env=self.env, capture_output=True,
                             text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        output = run.stdout + run.stderr
        if self.verbose:
            for line in output.rstrip().splitlines():
                self.say(f"     | {line}")
        if run.returncode != expect:
            raise RehearsalFailed(f"`fab {shown}` exited {run.returncode} (expected {expect}):\n{output}")
        return output

    def fab_command(self, *args: str) -> list[str]:
        """The unmodified `fab`, run from the stack's directory with the repository's fabfile."""
        return [*FAB, "--search-root", str(REPO_ROOT), *args]

    def check(self, condition: bool, message: str, detail: str = "") -> None:
        if not condition:
            raise RehearsalFailed(message + (f"\n{detail}" if detail else ""))

    # ------------------------------------------------------------------------------ the sitting

    def run(self) -> list[StepResult]:
        reason = local_cluster_unavailable()
        if reason:
            raise RehearsalFailed(f"cannot rehearse here: {reason}")
        self.stack_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, **self.controller_places(),
                    local_state.DATA_ROOT_ENV: str(self.data_root)}
        try:
            self.local_up()
            self.open_account()
            self.write_stack_file()
            self.preflight()
            stack = self.pulumi_up()
            self.security_groups()
            self.train()
            self.status()
            self.worker_replaced()
            self.pulumi_destroy(stack)
            kept = self.sweep_finds_only_kept()
            self.second_stack_boots_the_kept_image(kept)
            self.fab_images_lists_and_removes(kept)
            leaky = self.third_stack_with_a_forgetful_destroy()
            self.sweep_catches_and_removes(leaky)
        finally:
            self.cleanup()
        return self.steps

    def local_up(self) -> None:
        with self.step(f"local-up ({NODES} nodes)") as result:
            self.local_started = True
            self.fab("local-up", "--nodes", str(NODES), "--name", self.local_name, timeout=120)
            paths = local_state.paths_for(self.local_name, config=self.config_home / "xeon-cluster",
                                          data=self.data_root)
            self.state = local_state.load_state(paths)
            self.check(self.state is not None and len(self.state.nodes) == NODES, "local-up recorded no state")
            # The key `fab` uses for an AWS cluster: the local cluster's controller key (the stack's privateKeyPath).
            self.env[KEY_ENV] = self.state.key_path
            result["summary"] = (f"{self.state.subnet} on bridge {self.state.bridge}: "
                                 + ", ".join(f"{n.name} {n.address}" for n in self.state.nodes))
        self.venv_ready()
        if self.warm and self.state:
            self.warm.mark(self.state.data_dir)

    def venv_ready(self) -> None:
        """The nodes have no internet: the setup step (which installs from PyPI on AWS) needs the shared
        venv to hold the profile already; on a fresh machine the local cluster's `fab setup` fills it
        from the wheelhouse first."""
        profile = get_profile("stock")
        marker = Path(venv_dir(profile)) / PROFILE_MARKER

        def ready() -> bool:
            return marker.is_file() and marker.read_text().strip() == fingerprint_digest(profile)

        if ready():
            return
        with self.step("prepare: the shared venv from the wheelhouse (the nodes have no internet)") as result:
            self.fab("setup", "--cluster", f"local:{self.local_name}", timeout=1800)
            self.check(ready(), f"after `fab setup` {marker} does not name profile stock's fingerprint")
            result["summary"] = f"{venv_dir(profile)} holds profile stock"

    def open_account(self) -> None:
        with self.step("account: moto server on 127.0.0.1, the stack's VPC and subnet") as result:
            self.account.start()
            self.env.update(self.account.fab_env(self.env))
            self.vpc, self.subnet = self.account.make_network(self.state.subnet, self.cluster)
            # GetConsoleOutput answers with each node's console file: `fab` verifies new nodes' host keys there
            self.account.server.doubles.console.consoles = {n.address: str(console_path(n)) for n in self.state.nodes}
            result["summary"] = (f"{self.account.url}; {self.vpc}, {self.subnet} {self.state.subnet} in {ZONE} "
                                 "(no public addresses on launch); Ubuntu 24.04 image " + UBUNTU_IMAGE_ID)

    def stack_config(self, *, cluster: str, subnet: str, vpc: str, workers: int, keep: bool = False) -> dict:
        """A stack like Pulumi.example.yaml's, on the local network (camelCase keys)."""
        public_key = Path(f"{self.state.key_path}.pub").read_text().strip()
        return {"publicKey": public_key, "adminCidrs": [f"{self.state.bridge_address}/32"],
                "privateKeyPath": self.state.key_path, "clusterName": cluster, "instanceType": INSTANCE_TYPE,
                "workerCount": workers, "masterSpot": True, "workerSpot": True, "softwareProfile": "stock",
                "bake": True, "keepImage": keep, "rootVolumeGib": 100, "destroyBucket": False, "tags": ["team=ml"],
                "vpcId": vpc, "subnetId": subnet, "sshUser": "root", "placementGroup": True}

    def write_stack_file(self) -> None:
        with self.step(f"stack file Pulumi.{self.stack_name}.yaml (like Pulumi.example.yaml), where fab runs") \
                as result:
            self.config = self.stack_config(cluster=self.cluster, subnet=self.subnet, vpc=self.vpc, workers=NODES - 1,
                                            keep=True)
            self.write_stack(self.stack_file, self.config)
            result["summary"] = (f"in {self.stack_dir}: {INSTANCE_TYPE}, workerCount {NODES - 1}, spot, "
                                 f"subnetId {self.subnet}, sshUser root, privateKeyPath {self.state.key_path}, "
                                 "placementGroup true, keepImage true")

    def write_stack(self, path: Path, config: dict) -> None:
        doc = {"config": {"aws:region": REGION, **{f"xeon-cluster:{k}": v for k, v in config.items()}}}
        path.write_text("# written by tests/rehearsal/sitting.py in its temporary directory\n"
                        + yaml.safe_dump(doc, sort_keys=False))

    def preflight(self) -> None:
        with self.step("fab preflight") as result:
            out = self.fab("preflight", "--stack", self.stack_name, "--no-ip-check")
            self.check("launch should succeed" in out, "preflight did not pass", out)
            self.check(re.search(r"^\[\s*ok\] image\s+bakes a new image: no kept image in ", out, re.M) is not None,
                       "preflight did not say the first stack bakes its image", out)
            findings = re.findall(r"^\[\s*(\w+)\] (\S+)", out, re.M)
            result["summary"] = "launch should succeed; " + ", ".join(f"{check} {status}" for status, check in findings)

    def pulumi_up(self) -> Stack:
        addresses = [n.address for n in self.state.nodes]
        with self.step("pulumi up (the real program under moto-backed mocks; the setup step over SSH)") as result:
            before = host_keys()
            stack = Stack(self.stack_name, self.account, addresses)
            started = time.monotonic()
            with self.controller_env():
                outputs = stack.up(self.config)
            setup = stack.aws.setup_inputs
            self.check(setup.get("host") == addresses[0] and setup.get("user") == "root"
                       and setup.get("private_key_path") == self.state.key_path,
                       f"the setup step was registered for {setup.get('user')}@{setup.get('host')} with key "
                       f"{setup.get('private_key_path')}, not root@{addresses[0]} with {self.state.key_path}")
            groups = self.account.client("autoscaling").describe_auto_scaling_groups(
                Filters=[{"Name": f"tag:{CLUSTER_KEY}", "Values": [self.cluster]}])["AutoScalingGroups"]
            self.check(outputs["masterPrivateAddress"] == addresses[0] and outputs["masterPublicAddress"] == ""
                       and outputs["workerCount"] == NODES - 1
                       and sorted(g["AutoScalingGroupName"] for g in groups) == sorted(
                           [outputs["masterGroupName"], outputs["workerGroupName"]])
                       and outputs["sshUser"] == "root" and outputs["subnetId"] == self.subnet
                       and outputs["baseAmiId"] == UBUNTU_IMAGE_ID, f"stack outputs: {outputs}; groups {groups}")
            self.group_name = outputs["workerGroupName"]
            self.check_instances(outputs)
            self.check(host_keys() == before, "this machine's /etc/ssh host keys changed")
            runs = Path(LOCAL_OUTPUT_ROOT) / self.state.name  # local-up made it; every local cluster has one there
            self.check(runs.is_dir(), f"{runs} is gone: something removed this machine's local runs")
            # No node that runs jobs was imaged: the image was made from the build's own instance, and the setup
            # step only checked the master (installing at most this project's wheel).
            (built_on,) = stack.aws.build_instances
            self.check(built_on not in {i["InstanceId"] for i in self.running_in_discovery_order()},
                       f"the image was made from {built_on}, a node of the cluster")
            installed = str(stack.aws.setup_outputs.get("installed"))
            image_id = outputs["amiId"]
            self.check(installed.startswith((f"from kept image {image_id}: nothing to install",
                                             f"from kept image {image_id}: installed what differed (xeon-cluster):")),
                       f"the setup step did more than check the master: {installed}")
            image_tags = {t["Key"]: t["Value"] for t in self.account.client("ec2").describe_images(
                ImageIds=[image_id])["Images"][0].get("Tags", [])}
            self.check(image_tags.get(KEEP_KEY) == "true" and image_tags.get(FINGERPRINT_KEY)
                       and image_tags.get(BASE_IMAGE_KEY) == UBUNTU_IMAGE_ID,
                       f"the kept image's tags do not say what it holds: {image_tags}")
            kinds = Counter(c.type.split(":")[-1] for c in stack.aws.created)
            result["summary"] = (f"{len(stack.aws.created)} resources in the account "
                                 f"({', '.join(f'{n} {kind}' for kind, n in sorted(kinds.items()))}); image "
                                 f"{image_id} built on its own instance {built_on} (kept, tagged with its "
                                 f"fingerprint, region, base); setup step over SSH to root@{addresses[0]}: "
                                 f"{installed}; master group {outputs['masterGroupName']} of 1 on {addresses[0]}, "
                                 f"worker group {self.group_name} of {outputs['workerCount']} on "
                                 f"{', '.join(addresses[1:])}, no public address "
                                 f"({time.monotonic() - started:.0f} s)")
        return stack

    def controller_places(self) -> dict[str, str]:
        """The controller's config (keys, known_hosts, local cluster state) and cache, in the workdir."""
        return {"XDG_CONFIG_HOME": str(self.config_home), "XDG_CACHE_HOME": str(self.cache_home)}

    def controller_env(self):
        """The setup step runs in this process: it keeps the master's host key where `fab` will look,
        builds its project wheel in the rehearsal's cache, and reads the master's console (and, for a new
        master, finds the workers' group) with the caller's credentials: the rehearsal's account's."""
        return environ_set({**self.controller_places(), **{k: v for k, v in self.account.fab_env({}).items()
                                                            if k.startswith("AWS_")}})

    def security_groups(self) -> None:
        with self.step("security groups enforced at the nodes' sshd (SshIngressDouble)") as result:
            sources = SshIngressDouble(self.account.client("ec2"), self.state).apply()
            master, *workers = self.state.nodes
            admin = f"{self.state.bridge_address}/32"
            members = sorted(n.address for n in self.state.nodes)
            self.check(sources == {master.name: sorted([admin, *members]),
                                   **{w.name: members for w in workers}},
                       f"SSH sources by node: {sources}; wanted the admin CIDR {admin} on the master only")
            # The double bites: this machine (the admin CIDR) gets into the master, but not into a worker.
            self.check(self.ssh_directly(master) == 0, f"direct SSH to the master {master.address} failed")
            refused = self.ssh_directly(workers[0])
            self.check(refused != 0, f"direct SSH to the worker {workers[0].address} was let in")
            result["summary"] = (f"SSH to {master.name} from {admin} and the members, to "
                                 f"{', '.join(w.name for w in workers)} from the members only; from here "
                                 f"{master.name} lets the key in, {workers[0].name} refuses it")

    def ssh_directly(self, node: local_state.NodeState) -> int:
        """`ssh` from this machine straight to a node with the stack's key (the local controller key);
        its exit code."""
        known_hosts = self.workdir / "probe_known_hosts"
        known_hosts.write_text("".join(f"{n.address} {n.host_key}\n" for n in self.state.nodes))
        run = subprocess.run(["ssh", "-i", self.state.key_path, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                              "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts}",
                              "-o", "ConnectTimeout=10", "-F", "/dev/null", f"root@{node.address}", "true"],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        return run.returncode

    def instances(self, cluster: str, states: list[str]) -> list[dict]:
        ec2 = self.account.client("ec2")
        found = ec2.describe_instances(Filters=[{"Name": f"tag:{CLUSTER_KEY}", "Values": [cluster]},
                                                {"Name": "instance-state-name", "Values": states}])
        return [i for r in found["Reservations"] for i in r["Instances"]]

    def discovery_order(self) -> list[local_state.NodeState]:
        """The local nodes in the order discovery gives their instances: the master, then the workers by
        private address (node_setup/aws/discovery.py)."""
        master, *workers = self.state.nodes
        return [master, *sorted(workers, key=lambda n: int(ipaddress.ip_address(n.address)))]

    def running_in_discovery_order(self) -> list[dict]:
        def key(instance: dict) -> tuple:
            tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
            return tags.get(ROLE_KEY) != ROLE_MASTER, int(ipaddress.ip_address(instance["PrivateIpAddress"]))

        return sorted(self.instances(self.cluster, ["running"]), key=key)

    def check_instances(self, outputs: dict) -> None:
        running = self.running_in_discovery_order()
        got = [(i["PrivateIpAddress"], i.get("PublicIpAddress"), i["SubnetId"]) for i in running]
        want = [(n.address, None, self.subnet) for n in self.discovery_order()]
        self.check(got == want, f"instances, master first (private, public, subnet): {got}; wanted {want}")
        self.check(all(i["ImageId"] == outputs["amiId"] != UBUNTU_IMAGE_ID for i in running),
                   "the master and the workers boot the built image")
        group = [{t["Key"]: t["Value"] for t in i["Tags"]}.get(GROUP_NAME_TAG) for i in running]
        self.check(group == [outputs["masterGroupName"]] + [outputs["workerGroupName"]] * (NODES - 1)
                   and all(i.get("InstanceLifecycle") == "spot" and i["MetadataOptions"]["HttpTokens"] == "required"
                           for i in running),
                   f"the master and the workers are their groups' spot instances with IMDSv2: groups {group}",
                   json.dumps(running, indent=1, default=str))

    def train(self) -> None:
        with self.step(f"fab train --nodes {NODES} --cluster {self.cluster} (dry run: discovery)") as result:
            out = self.fab("train", "--nodes", str(NODES), "--cluster", self.cluster, *TRAIN_ARGS, "--dry-run")
            self.check(f"on cluster '{self.cluster}' (aws," in out, "discovery did not find the AWS cluster", out)
            nodes = re.findall(r"^  (node\d+)\s+(\S+)\s+private (\S+)", out, re.M)
            want = [(f"node{i}", n.address, n.address) for i, n in enumerate(self.discovery_order())]
            self.check(nodes == want, f"discovered nodes {nodes}, wanted {want} (the master, then the workers by "
                       "private address)", out)
            result["summary"] = "found by tags, the master then the workers by private address: " + ", ".join(
                f"{name} {address}" for name, address, _ in nodes)
        with self.step(f"fab train --nodes {NODES} --cluster {self.cluster} --synthetic-examples 200 --max-steps 6") \
                as result:
            out = self.fab("train", "--nodes", str(NODES), "--cluster", self.cluster, *TRAIN_ARGS, timeout=900)
            self.check("finished: exit code 0" in out and "world_size: 3" in out, "training did not finish", out)
            self.check_known_hosts()
            steps = re.search(r"^\s*steps: (\S+)", out, re.M)
            loss = re.search(r"^\s*train_loss: (\S+)", out, re.M)
            result["summary"] = (f"exit 0, world_size 3, steps {steps.group(1) if steps else '?'}, train_loss "
                                 f"{loss.group(1) if loss else '?'}; workers reached through node0; host keys "
                                 "= the local nodes' own (the master's from the setup step, the workers' verified from "
                                 "their consoles)")

    def check_known_hosts(self) -> None:
        """The controller pinned (setup step, then fab) exactly the local nodes' host keys, by private address."""
        path = self.config_home / "xeon-cluster" / "keys" / self.cluster / "known_hosts"
        self.check(path.is_file(), f"no known_hosts at {path}")
        with self.controller_env():
            self.check(ssh_keys.known_hosts_path(self.cluster) == path,
                       "fab and the setup step use another known_hosts")
        recorded = {}
        for line in path.read_text().splitlines():
            host, keytype, key = line.split()[:3]
            recorded[host] = f"{keytype} {key}"
        want = {n.address: " ".join(n.host_key.split()[:2]) for n in self.state.nodes}
        self.check(recorded == want, f"known_hosts {recorded}, wanted the local nodes' keys {want}")

    def show_status(self) -> tuple[str, dict, str]:
        """`fab status` and `fab status --json`, checked: every node running, reachable, spot, priced, and
        the worker group full; (text, JSON, the group's line)."""
        out = self.fab("status", "--cluster", self.cluster)
        self.check(f"cluster {self.cluster} (aws" in out, "fab status: not the AWS cluster", out)
        shown = json.loads(self.fab("status", "--cluster", self.cluster, "--json"))
        nodes = shown["nodes"]
        self.check([(n["name"], n["address"]) for n in nodes]
                   == [(f"node{i}", n.address) for i, n in enumerate(self.discovery_order())]
                   and all(n["state"] == "running" and n["reachable"] and n["market"] == "spot" for n in nodes)
                   and all(n["usd_per_hour"] is not None and n["uptime_seconds"] >= 0 for n in nodes),
                   "fab status --json: nodes", json.dumps(shown, indent=1))
        group_line = next((line.strip() for line in out.splitlines() if line.startswith("worker group")), "")
        self.check(group_line == f"worker group {self.group_name}: {NODES - 1} of {NODES - 1} worker(s) in service"
                   and not shown["problems"], f"fab status: the worker group's line {group_line!r}", out)
        return out, shown, group_line

    def status(self) -> None:
        with self.step(f"fab status --cluster {self.cluster}") as result:
            out, shown, group_line = self.show_status()
            nodes = shown["nodes"]
            last = [line.strip() for line in out.splitlines() if line.strip().startswith("job ")]
            result["summary"] = (f"{NODES} nodes running and reachable ({nodes[0]['type']}, {nodes[0]['market']}, "
                                 f"{shown['total']['spent_usd']:.2f} USD so far); {group_line}; "
                                 + (last[-1] if last else "no job line"))

    def worker_replaced(self) -> None:
        """A worker lost (terminated, as a spot reclaim ends it): AWS's group launches a replacement from its
        template by itself, and `fab status` shows it. moto launches it within the TerminateInstances call;
        GroupLaunchDouble puts it on the node of the worker it replaces."""
        node = self.discovery_order()[1]
        with self.step(f"terminate the worker on {node.name}: the group replaces it; fab status") as result:
            ec2, autoscaling = self.account.client("ec2"), self.account.client("autoscaling")
            before = {i["PrivateIpAddress"]: i["InstanceId"] for i in self.running_in_discovery_order()}
            lost = before[node.address]
            ec2.terminate_instances(InstanceIds=[lost])
            ec2.get_waiter("instance_terminated").wait(InstanceIds=[lost], WaiterConfig={"Delay": 1, "MaxAttempts": 30})
            group = autoscaling.describe_auto_scaling_groups(
                AutoScalingGroupNames=[self.group_name])["AutoScalingGroups"][0]
            members = {x["InstanceId"] for x in group["Instances"] if x["LifecycleState"] == "InService"}
            after = {i["PrivateIpAddress"]: i["InstanceId"] for i in self.running_in_discovery_order()}
            new = after.get(node.address, "")
            self.check(set(after) == set(before) and new not in ("", lost) and new in members and lost not in members
                       and all(after[a] == before[a] for a in before if a != node.address),
                       f"after terminating {lost}: running {after} (before {before}), group {sorted(members)}")
            _, shown, group_line = self.show_status()  # the replacement is running and reachable, the group full
            result["summary"] = (f"{lost} terminated; the group launched {new} on {node.name} {node.address} "
                                 f"(the others untouched); fab status: {len(shown['nodes'])} nodes running and "
                                 f"reachable, {group_line}")

    def pulumi_destroy(self, stack: Stack) -> None:
        with self.step("pulumi destroy (reverse order; the bucket and the image are kept)") as result:
            done = stack.destroy()
            self.check(not self.instances(self.cluster, LIVE_INSTANCE_STATES), "instances left after destroy")
            bucket = stack.outputs["bucketName"]
            s3 = self.account.client("s3")
            s3.head_bucket(Bucket=bucket)
            settings = [s3.get_public_access_block(Bucket=bucket), s3.get_bucket_encryption(Bucket=bucket),
                        s3.get_bucket_policy(Bucket=bucket), s3.get_bucket_lifecycle_configuration(Bucket=bucket)]
            self.check(s3.get_bucket_versioning(Bucket=bucket).get("Status") == "Enabled" and all(settings),
                       "the kept bucket lost a setting")
            autoscaling = self.account.client("autoscaling")
            self.check(not autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"]
                       and not self.account.client("ec2").describe_launch_templates()["LaunchTemplates"],
                       "a group or launch template left after destroy")
            deleted = sum(1 for d in done if d.outcome in ("deleted", "terminated")
                          or d.outcome.startswith(("dereg", "drained")))
            kept = [d.reg.type for d in done if d.outcome.startswith("kept")]
            image = stack.outputs["amiId"]
            left = self.account.client("ec2").describe_images(ImageIds=[image])["Images"]
            released = next(d.outcome for d in done if d.reg.type == RELEASE)
            self.check(released == "released: the image kept" and left and left[0]["State"] == "available",
                       f"the image {image} was not kept: {released}")
            drained = "; ".join(f"{d.reg.name} {d.outcome}" for d in done if d.outcome.startswith("drained"))
            result["summary"] = (f"{deleted} deleted (both groups: {drained}), {len(kept)} kept (bucket "
                                 f"{bucket} and its 6 settings, still private, encrypted, versioned); image {image} "
                                 f"{released.split(': ', 1)[1]} (keepImage)")

    def sweep(self, *extra: str) -> tuple[str, tuple[int, int, int]]:
        out = self.fab("sweep", "--stack", self.stack_name, *extra)
        counts = re.search(rf"^{REGION}: (\d+) in use, (\d+) leaked, (\d+) kept", out, re.M)
        return out, tuple(int(c) for c in counts.groups()) if counts else (-1, -1, -1)

    def sweep_finds_only_kept(self) -> str:
        """`fab sweep` after the destroy: the bucket, the image and its snapshot kept, none leaked; the image's id."""
        with self.step("fab sweep") as result:
            out, counts = self.sweep()
            kept = dict((kind, ident) for kind, ident in re.findall(r"^\s+kept\s+(\w[\w-]*)\s+(\S+)", out, re.M))
            cost = re.search(r"1 image\(s\) kept by keepImage with their snapshots, (\d+) GiB, at most "
                             r"(\$[\d.]+)/month", out)
            self.check(counts == (0, 0, 3) and set(kept) == {"bucket", "image", "snapshot"} and cost is not None,
                       "fab sweep after destroy: expected the bucket, the image and its snapshot kept", out)
            result["summary"] = (f"0 in use, 0 leaked, 3 kept (the checkpoint bucket, image {kept['image']} and its "
                                 f"snapshot of {self.cluster}: {cost.group(1)} GiB, at most {cost.group(2)}/month)")
        return kept["image"]

    def second_stack_boots_the_kept_image(self, kept: str) -> None:
        """A second stack of the same settings: `fab preflight` says it reuses the kept image, and its `pulumi up`
        boots every node from it: the setup step only checks the master (no install), no image is made."""
        name = f"{self.stack_name}-again"
        with self.step(f"second stack {self.reuse_cluster}: fab preflight, pulumi up from the kept image, pulumi "
                       "destroy") as result:
            vpc, subnet = self.account.make_network(self.state.subnet, self.reuse_cluster)  # moto keeps addresses
            config = self.stack_config(cluster=self.reuse_cluster, subnet=subnet, vpc=vpc, workers=NODES - 1)
            stack_file = self.stack_dir / f"Pulumi.{name}.yaml"
            self.write_stack(stack_file, config)
            try:
                out = self.fab("preflight", "--stack", name, "--no-ip-check")
            finally:
                stack_file.unlink()
            said = re.search(rf"^\[\s*ok\] image\s+reuses kept image {kept} .*no install, no bake: the first "
                             r"`pulumi up` takes about (.+?) and its build", out, re.M)
            self.check(said is not None, f"fab preflight did not say the stack reuses {kept}", out)
            stack = Stack(name, self.account, [n.address for n in self.state.nodes])
            with self.controller_env():
                outputs = stack.up(config)
            made = Counter(c.type.split(":")[-1] for c in stack.aws.created)
            installed = str(stack.aws.setup_outputs.get("installed"))
            ec2 = self.account.client("ec2")
            running = [i for r in ec2.describe_instances(Filters=[
                {"Name": f"tag:{CLUSTER_KEY}", "Values": [self.reuse_cluster]},
                {"Name": "instance-state-name", "Values": ["running"]}])["Reservations"] for i in r["Instances"]]
            self.check(outputs["amiId"] == outputs["imageSource"] == kept and "Image" not in made
                       and "AmiFromInstance" not in made
                       and len(running) == NODES and all(i["ImageId"] == kept for i in running),
                       f"the second stack did not boot every node from {kept}: outputs {outputs}, made {dict(made)}, "
                       f"instances {[(i['InstanceId'], i['ImageId']) for i in running]}")
            # No install: the master holds the profile and this checkout's version. (The nodes' venv is shared by every
            # local cluster of this machine: another one's `fab setup` may have put another version there meanwhile,
            # and then the project's wheel is the one thing installed.)
            self.check(installed.startswith((f"from kept image {kept}: nothing to install",
                                             f"from kept image {kept}: installed what differed (xeon-cluster):")),
                       f"the setup step installed more than nothing: {installed}")
            stack.destroy()
            self.check(bool(ec2.describe_images(ImageIds=[kept])["Images"]), f"the second stack's destroy took {kept}")
            result["summary"] = (f"preflight: reuses kept image {kept}, no install, no bake, the first `pulumi up` "
                                 f"{said.group(1)}; pulumi up: {sum(made.values())} resources, no "
                                 f"image built, the master and {NODES - 1} workers boot {kept}; "
                                 f"setup step {installed}; destroyed, {kept} still kept")

    def fab_images_lists_and_removes(self, kept: str) -> None:
        with self.step("fab images, then fab images --remove --yes") as result:
            out = self.fab("images", "--stack", self.stack_name)
            row = re.search(rf"^  {kept}\s+stock\s.*?(\d+) GiB\s+([\d.]+)\s.*stack {self.stack_name} \(cluster "
                            rf"{self.cluster}\)", out, re.M)
            self.check(row is not None, f"fab images does not list {kept} of profile stock from {self.stack_name}", out)
            out = self.fab("images", "--stack", self.stack_name, "--remove", kept, "--yes")
            self.check(f"removed {kept} and 1 snapshot(s)" in out, f"fab images --remove did not remove {kept}", out)
            left = [i["ImageId"] for i in self.account.client("ec2").describe_images(Owners=["self"])["Images"]]
            self.check(kept not in left, f"{kept} is still registered: {left}")
            result["summary"] = (f"listed {kept} (profile stock, {row.group(1)} GiB, ${row.group(2)}/month, from stack "
                                 f"{self.stack_name}); removed it and its snapshot")

    def third_stack_with_a_forgetful_destroy(self) -> Stack:
        with self.step(f"third stack {self.leak_cluster}: pulumi up, then a destroy that forgets the image") \
                as result:
            # moto keeps a terminated instance's private address taken (AWS frees it): a VPC of its own,
            # again with the local network, so the master gets node0's address once more.
            vpc, subnet = self.account.make_network(self.state.subnet, self.leak_cluster)
            stack = Stack(f"{self.stack_name}-leak", self.account, [self.state.nodes[0].address])
            with self.controller_env():
                outputs = stack.up(self.stack_config(cluster=self.leak_cluster, subnet=subnet, vpc=vpc, workers=0))
            stack.destroy(forget=(RELEASE,))
            ec2 = self.account.client("ec2")
            image = ec2.describe_images(ImageIds=[outputs["amiId"]])["Images"][0]
            snapshot = image["BlockDeviceMappings"][0]["Ebs"]["SnapshotId"]
            self.check(any(t["Key"] == CLUSTER_KEY for t in image.get("Tags", [])), "the left image has no tags")
            result["summary"] = f"left behind: image {outputs['amiId']} (tagged) and its snapshot {snapshot}"
        return stack

    def sweep_catches_and_removes(self, leaky: Stack) -> None:
        image = leaky.outputs["amiId"]
        with self.step("fab sweep (finds the image and its snapshot)") as result:
            out, counts = self.sweep()
            leaked = re.findall(r"^\s+leaked\s+(image|snapshot)\s+(\S+)", out, re.M)
            self.check(counts == (0, 2, 3) and ("image", image) in leaked, "fab sweep did not report the image", out)
            result["summary"] = ("2 leaked (" + ", ".join(f"{k} {i}" for k, i in leaked)
                                 + f" of {self.leak_cluster}), 3 kept (the checkpoint buckets)")
        with self.step("fab sweep --delete --yes") as result:
            out = self.fab("sweep", "--stack", self.stack_name, "--delete", "--yes")
            self.check("removed 2, left 0" in out, "fab sweep --delete did not remove both", out)
            self.check(not self.account.client("ec2").describe_images(Owners=["self"])["Images"], "an image is left")
            result["summary"] = "removed 2, left 0"
        with self.step("fab sweep (after the delete)") as result:
            out, counts = self.sweep()
            self.check(counts == (0, 0, 3), "fab sweep after --delete", out)
            result["summary"] = "0 leaked, 3 kept (the three checkpoint buckets)"

    def cleanup(self) -> None:
        problems = []
        self.stack_file.unlink(missing_ok=True)
        if self.local_started:  # also after a local-up that failed half-way
            run = subprocess.run(self.fab_command("local-down", "--name", self.local_name), cwd=self.stack_dir,
                                 env=self.env, capture_output=True, text=True, timeout=120)
            if run.returncode != 0 and self.state is not None:
                problems.append(f"fab local-down --name {self.local_name}: {run.stdout}{run.stderr}")
        if self.account.url:
            self.account.stop()
        if problems:
            raise RehearsalFailed("; ".join(problems))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verbose", "-v", action="store_true", help="print every command's output")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    # A terminated run cleans up as an interrupted one does (the local cluster, the moto server, the workdir).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    workdir = Path(tempfile.mkdtemp(prefix="xc-rehearsal-"))
    sitting = Sitting(workdir, out=lambda line: print(line, flush=True), verbose=args.verbose)
    start = time.monotonic()
    try:
        sitting.run()
    except RehearsalFailed as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"rehearsal passed: {len(sitting.steps)} steps in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
