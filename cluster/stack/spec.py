"""ClusterSpec: everything `pulumi up` needs to know, validated before anything is created.

`infra/config.py` (and node_setup/stack_config.py, without the CLI) reads the stack's settings into
a plain dict of camelCase keys (cluster/stack/config_keys.py) and calls `ClusterSpec.from_config`:
each value is read in its key's type, then checked; every problem is reported at once in one
`ConfigError` whose lines each name the key, the value and what is allowed.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import math
from dataclasses import MISSING, dataclass, field
from typing import Any, Mapping, Sequence

from cluster.stack import catalog
from cluster import names
from cluster.stack.catalog import InstanceType
from cluster.stack.config_keys import CONFIG_KEYS, is_unset
from cluster.durations import parse_duration
from cluster.node.profiles import DEFAULT_PROFILE, PROFILES, Profile

MAX_WORKERS = 128
MAX_ROOT_VOLUME_GIB = 16384
ROOT_VOLUME_TYPES = ("gp3", "gp2")
# Provisioned-IOPS types: RunInstances refuses them without an IOPS value, and no setting gives one.
PROVISIONED_IOPS_TYPES = ("io1", "io2")
PUBLIC_KEY_TYPES = ("ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384",
                    "ecdsa-sha2-nistp521")
# An availability zone's name: its region's name and a letter ("us-east-1a"; Local Zones: "us-west-2-lax-1a").
ZONE_RE = re.compile(r"^[a-z]{2}(-[a-z0-9]+)+[a-z]\Z")
CLUSTER_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}[a-z0-9]\Z")
# The widest admin network accepted without allowSshFromAnywhere, per IP version. An IPv4 /8 is the
# largest block ever assigned to a single holder, and an IPv6 /32 is the usual allocation to a whole
# ISP (an end site gets a /48 or /56): a shorter prefix spans many unrelated networks, so it is
# "the internet" in all but name (0.0.0.0/1 plus 128.0.0.0/1 is exactly the internet).
MIN_ADMIN_PREFIX = {4: 8, 6: 32}


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
    instance_type: str = "r7iz.metal-16xl"  # with instanceTypes: the first of them
    # instanceTypes: the types of one shape the workers' group may launch, in order of preference; () when
    # the stack names one instanceType (`types` gives either form as a list).
    instance_types: tuple[str, ...] = ()
    worker_count: int = 3
    master_spot: bool = True
    worker_spot: bool = True
    spot_max_price: float | None = None
    # onDemandFallback: "off", or how long the workers' group may lack spot capacity before `fab up` fills the
    # missing workers on demand (cluster/stack/worker_group.py); `on_demand_fallback_s` in seconds.
    on_demand_fallback: str = "off"
    allow_ssh_from_anywhere: bool = False
    base_ami: str | None = None
    ssh_user: str = "ubuntu"
    private_key_path: str = "~/.ssh/id_ed25519"
    root_volume_gib: int = 100
    root_volume_type: str = "gp3"
    placement_group: bool = True
    software_profile: str = DEFAULT_PROFILE
    bake: bool = True
    keep_image: bool = False  # `pulumi destroy` keeps the baked image for the next stack (cluster/stack/image_reuse.py)
    vpc_id: str | None = None
    subnet_id: str | None = None
    availability_zone: str | None = None
    # zoneMove: availabilityZone decides the subnet both groups keep (infra/placement.py): changing it replaces the
    # master's and the workers' groups together, where otherwise the stack keeps the subnet it has.
    zone_move: bool = False
    destroy_bucket: bool = False
    sockets: int | None = None
    physical_cores: int | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def types(self) -> tuple[str, ...]:
        """Every type a node may be, in order of preference: instanceTypes, or instanceType alone."""
        return self.instance_types or (self.instance_type,)

    @property
    def on_demand_fallback_s(self) -> float | None:
        """onDemandFallback's wait in seconds; None when off."""
        return fallback_seconds(self.on_demand_fallback)

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
        """Build and validate a spec from camelCase config values (missing keys take defaults).

        Every problem is collected and raised at once in one ConfigError.
        """
        values, problems = _typed_values(cfg)
        values["cluster_name"] = values["cluster_name"] or f"xeon-{stack}".lower()
        values["admin_cidrs"], _ = unique_cidrs([values["admin_cidrs"]] if isinstance(values["admin_cidrs"], str)
                                                else values["admin_cidrs"] or ())
        values["public_key"] = (values["public_key"] or "").strip()
        values["tags"], tag_problems = _parse_tags(values["tags"] or {})
        problems += _instance_types(values, cfg.get("instanceType")) + _value_problems(values) + tag_problems
        problems += _fallback_problems(values)
        if not region:
            problems.append("aws:region: not set; allowed: an AWS region name, e.g. "
                            "`pulumi config set aws:region us-east-1`")
        problems += zone_problems(values.get("availability_zone"), region, values.get("subnet_id"))
        if values["zone_move"] and not values.get("availability_zone"):
            problems.append("zoneMove: true without availabilityZone; allowed: set availabilityZone to the zone "
                            "to move to (`fab up --zone auto` picks the best-ranked one and sets both)")
        if problems:
            raise ConfigError(problems)
        return cls(stack=stack, region=region, **values)


def _typed_values(cfg: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """attr -> value for every key of the table: the config's value in the key's type, or the default."""
    defaults = ClusterSpec.__dataclass_fields__
    values: dict[str, Any] = {}
    problems: list[str] = []
    for entry in CONFIG_KEYS:
        default = defaults[entry.attr].default
        if default is MISSING:  # fields without a plain default (tags)
            default = None
        raw = cfg.get(entry.key)
        if is_unset(entry.key, raw) or entry.kind is list:
            values[entry.attr] = default if is_unset(entry.key, raw) else raw
            continue
        try:
            values[entry.attr] = _convert(raw, entry.kind)
        except (TypeError, ValueError):
            problems.append(f"{entry.key}: {raw!r} is not {_KIND_WORDS[entry.kind]}")
            values[entry.attr] = default
    return values, problems


_KIND_WORDS = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}


def _convert(raw: Any, kind: type) -> Any:
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise ValueError(raw)
    if kind is int and (isinstance(raw, bool) or isinstance(raw, float) and not raw.is_integer()):
        raise ValueError(raw)
    value = kind(raw)
    if kind is float and not math.isfinite(value):
        raise ValueError(raw)
    return value


FALLBACK_OFF = "off"


def next_master_type(types: Sequence[str]) -> str:
    """What to change when the master's type has no capacity and the stack lists several: the master is one
    instance of the first of instanceTypes (infra/node_group.py), so listing another first moves it; '' for one."""
    if len(types) < 2:
        return ""
    return f"list another type first in instanceTypes (the master takes the first; next: {types[1]})"


def fallback_seconds(value: str) -> float | None:
    """onDemandFallback: `off` (None), or a duration such as 20m (seconds); ValueError names the setting."""
    if str(value).strip().lower() == FALLBACK_OFF:
        return None
    try:
        return parse_duration(value, "onDemandFallback", bare_seconds=False)
    except ValueError as exc:
        raise ValueError(f"{exc} (or {FALLBACK_OFF})") from None


def _fallback_problems(v: dict[str, Any]) -> list[str]:
    try:
        wait = fallback_seconds(v["on_demand_fallback"])
    except ValueError as exc:
        return [str(exc)]
    if wait is not None and not v["worker_spot"]:
        return [f"onDemandFallback: {v['on_demand_fallback']!r} with workerSpot: false, whose workers are on demand "
                f"already; allowed: {FALLBACK_OFF}, or workerSpot: true"]
    return []


def _instance_types(v: dict[str, Any], given_type: Any) -> list[str]:
    """instanceTypes: a list of catalog types of one shape (cluster/stack/catalog.py `shape`), each once; the
    first becomes instance_type (the master's and the plan's). Sets v["instance_types"] to a tuple (or ())."""
    listed = v["instance_types"]
    v["instance_types"] = ()
    if not listed:  # unset, or Pulumi.yaml's default []
        return []
    if isinstance(listed, str) or not isinstance(listed, (list, tuple)) or not all(
            isinstance(t, str) and t for t in listed):
        return [f"instanceTypes: {listed!r} is not a list of instance type names; allowed: a list such as "
                "[m7i.48xlarge, c7i.48xlarge, r7i.48xlarge] (`pulumi config set --path 'instanceTypes[0]' ...`)"]
    types = tuple(listed)
    if len(set(types)) != len(types):
        return [f"instanceTypes: {', '.join(types)} names a type more than once; allowed: each type once"]
    unknown = [t for t in types if catalog.lookup(t) is None]
    if unknown:
        return [f"instanceTypes: {', '.join(unknown)} not in the catalog, whose shapes it compares; allowed: "
                f"{', '.join(catalog.known_types())} (one type outside it: instanceType with sockets and "
                "physicalCores)"]
    if v["sockets"] is not None or v["physical_cores"] is not None:
        return ["instanceTypes: set together with sockets/physicalCores, which describe one type outside the "
                "catalog; allowed: instanceTypes of catalog types alone, or instanceType with sockets and "
                "physicalCores"]
    first = catalog.shape(catalog.CATALOG[types[0]])
    differing = [t for t in types if catalog.shape(catalog.CATALOG[t]) != first]
    if differing:
        other = catalog.shape(catalog.CATALOG[differing[0]])
        return [f"instanceTypes: {', '.join(types)} are of more than one shape: {', '.join(differing)} "
                f"({other.words()}) against {types[0]} ({first.words()}); allowed: types of one shape, so one "
                f"rank layout and one image fit every node ({types[0]}'s: {', '.join(catalog.same_shape(types[0]))})"]
    if not is_unset("instanceType", given_type) and given_type not in (types[0], ClusterSpec.instance_type):
        return [f"instanceType: {given_type!r} is set together with instanceTypes, whose first type "
                f"({types[0]}) is every node's first choice; allowed: one of the two"]
    v["instance_types"], v["instance_type"] = types, types[0]
    return []


def _value_problems(v: dict[str, Any]) -> list[str]:
    """What is wrong with the typed values, one line per problem."""
    problems = []
    if not CLUSTER_NAME_RE.match(v["cluster_name"]):
        problems.append(f"clusterName: {v['cluster_name']!r} must be 2-32 characters of lowercase letters, "
                        "digits and '-', starting with a letter")
    if not 0 <= v["worker_count"] <= MAX_WORKERS:
        problems.append(f"workerCount: {v['worker_count']!r} is out of range; allowed 0 to {MAX_WORKERS}")
    if catalog.lookup(v["instance_type"]) is None and not (v["sockets"] and v["physical_cores"]):
        problems.append(
            f"instanceType: {v['instance_type']!r} is not in the catalog ({', '.join(catalog.known_types())}); "
            "to use it anyway set sockets and physicalCores to its socket and physical core counts")
    for key, attr in (("sockets", "sockets"), ("physicalCores", "physical_cores")):
        if v[attr] is not None and v[attr] < 1:
            problems.append(f"{key}: {v[attr]!r} must be a positive integer")
    if v["spot_max_price"] is not None and not v["spot_max_price"] > 0:
        problems.append(f"spotMaxPrice: {v['spot_max_price']!r} must be a positive hourly price in USD "
                        "(leave it unset to pay at most the on-demand price)")
    profile, root_gib = v["software_profile"], v["root_volume_gib"]
    if profile not in PROFILES:
        problems.append(f"softwareProfile: {profile!r} is unknown; allowed: {', '.join(sorted(PROFILES))}")
    elif root_gib < PROFILES[profile].min_root_volume_gib:
        problems.append(f"rootVolumeGib: {root_gib!r} is too small for profile {profile!r}; "
                        f"allowed {PROFILES[profile].min_root_volume_gib} to {MAX_ROOT_VOLUME_GIB}")
    if root_gib > MAX_ROOT_VOLUME_GIB:
        problems.append(f"rootVolumeGib: {root_gib!r} exceeds the EBS maximum of {MAX_ROOT_VOLUME_GIB}")
    if v["root_volume_type"] in PROVISIONED_IOPS_TYPES:
        problems.append(f"rootVolumeType: {v['root_volume_type']!r} needs provisioned IOPS, which no setting "
                        f"gives (AWS refuses the launch without them); allowed: {', '.join(ROOT_VOLUME_TYPES)}")
    elif v["root_volume_type"] not in ROOT_VOLUME_TYPES:
        problems.append(f"rootVolumeType: {v['root_volume_type']!r} is not allowed; "
                        f"allowed: {', '.join(ROOT_VOLUME_TYPES)}")
    problems.extend(_cidr_problems(v["admin_cidrs"], v["allow_ssh_from_anywhere"]))
    problems.extend(_public_key_problems(v["public_key"]))
    try:  # the login user reaches the nodes' tags, the master's ssh config and remote commands
        names.user(v["ssh_user"], "sshUser")
    except names.UnsafeValue as exc:
        problems.append(str(exc))
    return problems


def zone_problems(zone: str | None, region: str, subnet_id: str | None = None) -> list[str]:
    """availabilityZone: a zone name of the stack's region, and not together with subnetId (whose zone wins)."""
    if not zone:
        return []
    if not ZONE_RE.match(zone) or (region and not zone.startswith(region)):
        return [f"availabilityZone: {zone!r} is not a zone of aws:region {region or '(not set)'}; allowed: "
                f"a zone name such as {region or 'us-east-1'}a (`fab preflight --pick-zone` ranks them)"]
    if subnet_id:
        return [f"availabilityZone: {zone!r} is set together with subnetId {subnet_id!r}, whose zone decides; "
                "allowed: one of the two"]
    return []


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


def _network(cidr: Any) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
    try:
        return ipaddress.ip_network(str(cidr), strict=True)
    except ValueError:
        return None


def unique_cidrs(cidrs: Any) -> tuple[tuple[str, ...], list[str]]:
    """(the CIDRs with later duplicates of the same network dropped, one note per dropped one).

    AWS refuses two identical rules in one security group, so a repeated network would fail the
    launch; `2001:DB8::/48` and `2001:db8::/48` are the same network. Unparseable entries are kept
    (as given) for `_cidr_problems` to report.
    """
    kept: list[str] = []
    seen: dict[Any, str] = {}
    notes = []
    for cidr in cidrs:
        key = _network(cidr) or str(cidr)
        if key in seen:
            same = "" if str(cidr) == seen[key] else f" (the same network as {seen[key]!r})"
            notes.append(f"adminCidrs: {cidr!r} is listed more than once{same}; the duplicate is dropped "
                         "(a security group cannot hold two identical rules)")
            continue
        seen[key] = str(cidr)
        kept.append(cidr)
    return tuple(kept), notes


_ADMIN_ALLOWED = (f"allowed: your own networks, IPv4 /{MIN_ADMIN_PREFIX[4]} to /32 or IPv6 /{MIN_ADMIN_PREFIX[6]} "
                  "to /128 (e.g. your address /32), or set allowSshFromAnywhere: true to insist")


def _cidr_problems(cidrs: tuple[str, ...], allow_open: bool) -> list[str]:
    """Malformed CIDRs, and (unless allow_open) networks too wide to be anyone's own, alone or together."""
    if not cidrs:
        return ["adminCidrs: not set; give the network you SSH from, e.g. "
                "`pulumi config set --path 'adminCidrs[0]' 203.0.113.7/32`"]
    problems = []
    networks = []
    for cidr in cidrs:
        try:
            networks.append((cidr, ipaddress.ip_network(str(cidr), strict=True)))
        except ValueError as exc:
            problems.append(f"adminCidrs: {cidr!r} is not a CIDR block ({exc}); "
                            "allowed: an address with prefix length such as 203.0.113.7/32")
    if allow_open:
        return problems
    too_wide = set()
    for cidr, net in networks:
        if net.prefixlen == 0:
            problems.append(f"adminCidrs: {cidr!r} opens SSH to the whole internet; {_ADMIN_ALLOWED}")
        elif net.prefixlen < MIN_ADMIN_PREFIX[net.version]:
            problems.append(f"adminCidrs: {cidr!r} is wider than /{MIN_ADMIN_PREFIX[net.version]} (it spans "
                            f"2^{net.max_prefixlen - net.prefixlen} addresses), so it is no one's own network; "
                            f"{_ADMIN_ALLOWED}")
        else:
            continue
        too_wide.add(net.version)
    for version, everything in ((4, "0.0.0.0/0"), (6, "::/0")):
        family = [(cidr, net) for cidr, net in networks if net.version == version]
        if not family or version in too_wide:
            continue
        collapsed = ipaddress.collapse_addresses(net for _, net in family)  # type: ignore[type-var]  # one family
        if list(collapsed) == [ipaddress.ip_network(everything)]:
            shown = [repr(cidr) for cidr, _ in family]
            listed = ", ".join(shown if len(shown) <= 4 else shown[:3] + [f"... ({len(shown)} networks)"])
            problems.append(f"adminCidrs: {listed} together cover every IPv{version} address (SSH from the "
                            f"whole internet); {_ADMIN_ALLOWED}")
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
