"""ClusterSpec: everything `pulumi up` needs to know, validated before anything is created.

`infra/config.py` reads Pulumi config into a plain dict of these camelCase keys and calls
`ClusterSpec.from_config`; every problem is reported at once in one `ConfigError` whose lines each
name the key, the value and what is allowed.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from cluster import catalog
from cluster.catalog import InstanceType
from cluster.profiles import DEFAULT_PROFILE, PROFILES, Profile

MAX_WORKERS = 128
MAX_ROOT_VOLUME_GIB = 16384
ROOT_VOLUME_TYPES = ("gp3", "gp2", "io1", "io2")
PUBLIC_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                    "ecdsa-sha2-nistp521")
CLUSTER_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]$")
OPEN_CIDRS = ("0.0.0.0/0", "::/0")


class ConfigError(ValueError):
    """Bad stack configuration; the message lists every problem, one per line."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid xeon-cluster configuration:\n  - " + "\n  - ".join(problems))


@dataclass(frozen=True)
class ClusterSpec:
    cluster_name: str
    stack: str
    region: str
    public_key: str
    admin_cidrs: tuple[str, ...]
    instance_type: str = "r7iz.metal-16xl"
    worker_count: int = 3
    master_spot: bool = True
    worker_spot: bool = True
    spot_max_price: float | None = None
    allow_ssh_from_anywhere: bool = False
    base_ami: str | None = None
    ssh_user: str = "ubuntu"
    private_key_path: str = "~/.ssh/id_ed25519"
    root_volume_gib: int = 100
    root_volume_type: str = "gp3"
    placement_group: bool = True
    software_profile: str = DEFAULT_PROFILE
    bake: bool = True
    vpc_id: str | None = None
    subnet_id: str | None = None
    destroy_bucket: bool = False
    sockets: int | None = None
    physical_cores: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def node_count(self) -> int:
        return 1 + self.worker_count

    @property
    def instance(self) -> InstanceType:
        known = catalog.lookup(self.instance_type)
        if known and self.sockets is None and self.physical_cores is None:
            return known
        base = known
        return catalog.custom(
            self.instance_type,
            sockets=self.sockets or (base.sockets if base else 1),
            physical_cores=self.physical_cores or (base.physical_cores if base else 0),
            vcpus=base.vcpus if base else None,
            network_gbps=base.network_gbps if base else 25,
            bf16=base.bf16 if base else False,
        )

    @property
    def profile(self) -> Profile:
        return PROFILES[self.software_profile]

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], *, stack: str, region: str) -> "ClusterSpec":
        """Build and validate a spec from camelCase config values (missing keys take defaults)."""
        problems: list[str] = []
        defaults = cls.__dataclass_fields__

        def get(key: str, attr: str, kind: type) -> Any:
            default = defaults[attr].default
            value = cfg.get(key)
            if value is None:
                return default
            try:
                if kind is bool:
                    if isinstance(value, str) and value.lower() in ("true", "false"):
                        return value.lower() == "true"
                    if isinstance(value, bool):
                        return value
                    raise ValueError
                if kind is int and (isinstance(value, bool) or
                                    isinstance(value, float) and not value.is_integer()):
                    raise ValueError
                return kind(value)
            except (TypeError, ValueError):
                problems.append(f"{key}: {value!r} is not a {kind.__name__}")
                return default

        name = cfg.get("clusterName") or f"xeon-{stack}".lower()
        instance_type = get("instanceType", "instance_type", str)
        workers = get("workerCount", "worker_count", int)
        spot_price = get("spotMaxPrice", "spot_max_price", float)
        profile = get("softwareProfile", "software_profile", str)
        root_gib = get("rootVolumeGib", "root_volume_gib", int)
        root_type = get("rootVolumeType", "root_volume_type", str)
        allow_open = get("allowSshFromAnywhere", "allow_ssh_from_anywhere", bool)
        sockets = get("sockets", "sockets", int)
        cores = get("physicalCores", "physical_cores", int)
        # Read every typed value before the problems are checked, so a bad one is reported.
        master_spot = get("masterSpot", "master_spot", bool)
        worker_spot = get("workerSpot", "worker_spot", bool)
        ssh_user = get("sshUser", "ssh_user", str)
        private_key_path = get("privateKeyPath", "private_key_path", str)
        placement_group = get("placementGroup", "placement_group", bool)
        bake = get("bake", "bake", bool)
        destroy_bucket = get("destroyBucket", "destroy_bucket", bool)
        admin = cfg.get("adminCidrs")
        if isinstance(admin, str):
            admin = [admin]
        admin = tuple(admin or ())
        public_key = (cfg.get("publicKey") or "").strip()
        tags = cfg.get("tags") or {}

        if not CLUSTER_NAME_RE.match(name):
            problems.append(f"clusterName: {name!r} must be 2-32 characters of lowercase letters, "
                            "digits and '-', starting with a letter")
        if not isinstance(workers, int) or not 0 <= workers <= MAX_WORKERS:
            problems.append(f"workerCount: {workers!r} is out of range; allowed 0 to {MAX_WORKERS}")
        if catalog.lookup(instance_type) is None and not (sockets and cores):
            problems.append(
                f"instanceType: {instance_type!r} is not in the catalog ({', '.join(catalog.known_types())}); "
                "to use it anyway set sockets and physicalCores to its socket and physical core counts")
        for key, value in (("sockets", sockets), ("physicalCores", cores)):
            if value is not None and value < 1:
                problems.append(f"{key}: {value!r} must be a positive integer")
        if spot_price is not None and not spot_price > 0:
            problems.append(f"spotMaxPrice: {spot_price!r} must be a positive hourly price in USD "
                            "(leave it unset to pay at most the on-demand price)")
        if profile not in PROFILES:
            problems.append(f"softwareProfile: {profile!r} is unknown; allowed: {', '.join(sorted(PROFILES))}")
        elif not isinstance(root_gib, int) or root_gib < PROFILES[profile].min_root_volume_gib:
            problems.append(f"rootVolumeGib: {root_gib!r} is too small for profile {profile!r}; "
                            f"allowed {PROFILES[profile].min_root_volume_gib} to {MAX_ROOT_VOLUME_GIB}")
        if isinstance(root_gib, int) and root_gib > MAX_ROOT_VOLUME_GIB:
            problems.append(f"rootVolumeGib: {root_gib!r} exceeds the EBS maximum of {MAX_ROOT_VOLUME_GIB}")
        if root_type not in ROOT_VOLUME_TYPES:
            problems.append(f"rootVolumeType: {root_type!r} is not allowed; allowed: {', '.join(ROOT_VOLUME_TYPES)}")
        problems.extend(_cidr_problems(admin, allow_open))
        problems.extend(_public_key_problems(public_key))
        tags, tag_problems = _parse_tags(tags)
        problems.extend(tag_problems)
        if not region:
            problems.append("aws:region: not set; allowed: an AWS region name, e.g. "
                            "`pulumi config set aws:region us-east-1`")
        if problems:
            raise ConfigError(problems)

        return cls(
            cluster_name=name, stack=stack, region=region, public_key=public_key, admin_cidrs=admin,
            instance_type=instance_type, worker_count=workers,
            master_spot=master_spot,
            worker_spot=worker_spot,
            spot_max_price=spot_price, allow_ssh_from_anywhere=allow_open,
            base_ami=cfg.get("baseAmi") or None,
            ssh_user=ssh_user,
            private_key_path=private_key_path,
            root_volume_gib=root_gib, root_volume_type=root_type,
            placement_group=placement_group,
            software_profile=profile, bake=bake,
            vpc_id=cfg.get("vpcId") or None, subnet_id=cfg.get("subnetId") or None,
            destroy_bucket=destroy_bucket,
            sockets=sockets, physical_cores=cores, tags=dict(tags),
        )


def _parse_tags(tags: Any) -> tuple[dict[str, str], list[str]]:
    """Tags as a map, or as a list of `key=value` strings (Pulumi project config has no map type)."""
    if isinstance(tags, (list, tuple)):
        parsed: dict[str, str] = {}
        for item in tags:
            key, sep, value = str(item).partition("=")
            if not sep or not key.strip():
                return {}, [f"tags: {item!r} is not key=value; allowed: a list of key=value strings, "
                            "e.g. `pulumi config set --path 'tags[0]' team=ml`"]
            parsed[key.strip()] = value.strip()
        return parsed, []
    if not isinstance(tags, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in tags.items()):
        return {}, [f"tags: {tags!r} must be a map of string keys to string values "
                    "or a list of key=value strings"]
    return dict(tags), []


def _cidr_problems(cidrs: tuple[str, ...], allow_open: bool) -> list[str]:
    if not cidrs:
        return ["adminCidrs: not set; give the network you SSH from, e.g. "
                "`pulumi config set --path 'adminCidrs[0]' 203.0.113.7/32`"]
    problems = []
    for cidr in cidrs:
        try:
            net = ipaddress.ip_network(str(cidr), strict=True)
        except ValueError as exc:
            problems.append(f"adminCidrs: {cidr!r} is not a CIDR block ({exc}); "
                            "allowed: an address with prefix length such as 203.0.113.7/32")
            continue
        if net.prefixlen == 0 and not allow_open:
            problems.append(f"adminCidrs: {cidr!r} opens SSH to the whole internet; allowed: your own "
                            "network (e.g. your address /32), or set allowSshFromAnywhere: true to insist")
    return problems


def _public_key_problems(key: str) -> list[str]:
    if not key:
        return ["publicKey: not set; give your OpenSSH public key, e.g. "
                "`pulumi config set publicKey \"$(cat ~/.ssh/id_ed25519.pub)\"`"]
    parts = key.split()
    shown = key if len(key) <= 40 else key[:37] + "..."
    if len(parts) < 2 or parts[0] not in PUBLIC_KEY_TYPES:
        return [f"publicKey: {shown!r} is not an OpenSSH public key; allowed types: "
                f"{', '.join(PUBLIC_KEY_TYPES)} (the one-line contents of a .pub file)"]
    try:
        blob = base64.b64decode(parts[1], validate=True)
    except (binascii.Error, ValueError):
        return [f"publicKey: {shown!r} has a body that is not base64; paste the whole .pub line"]
    # The blob starts with a length-prefixed copy of the key type.
    if len(blob) < 4 or blob[4:4 + int.from_bytes(blob[:4], "big")] != parts[0].encode():
        return [f"publicKey: {shown!r} is damaged (its body does not match its type {parts[0]})"]
    return []
