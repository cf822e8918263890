"""A cluster's measured speed, written by `fab bench` and read by `fab plan` (pure data and checks).

The file (JSON, `<config dir>/calibration/<cluster>.json`, see `path_for`) holds::

    cluster, kind, created, cpu, backend, link       where and on what it was measured
    instance_type, cores                              the machine: its AWS instance type ("": a local or
                                                      inventory cluster's), its physical cores
    model, params, batch, seq_len, ranks_per_node     what was measured
    bucket_mb                                         DDP's bucket size the all-reduce was cut into
    compute:   {"<n>": samples/s per node while n nodes train at once, no all-reduce}
    allreduce: {"<n>": {"fp32"|"bf16": {"gbps": payload Gbit/s per node, "latency_s": per ring step,
                                          "seconds": one gradient's all-reduce}}}
    compile:   {"eager_step_s", "compiled_step_s", "compile_s"}  torch.compile on one node (optional,
                                                      `fab bench --compile`)
    layout:    {"machine", "nodes", "batch", "created",     the ranks-per-node layouts timed with the real
                "candidates": {"<ranks>": {"step_s", "samples_per_s"}},   job (optional, `fab bench
                "ranks_per_node": the fastest}                           --layouts`)

`fab plan` takes from it the compute rate for each node count (the nearest measured one below,
else above), and the all-reduce bandwidth and latency for the gradients' dtype
(cluster/cost/timemodel.py, `Network.measured_gbps`). `fab train` and `fab plan` take the measured
layout's ranks per node instead of the rule (one per socket) when the node is the one it was
measured on (`layout_for`).

A calibration applies only to the machine it measured (`foreign_machine`): the same AWS instance type,
or, for a local or inventory cluster, the same CPU model and physical core count; `fab plan` refuses
any other unless asked to apply it anyway. A node count whose measured rate per node is above one
node's would plan an efficiency above 100 %: noise, not scaling (`noisy_counts`).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Mapping

VERSION = 1
DTYPES = ("fp32", "bf16")
_CLUSTER_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}\Z")


class CalibrationError(ValueError):
    """A calibration file that cannot be used; the message names the file and the problem."""


@dataclass(frozen=True)
class LinkFit:
    gbps: float  # payload bandwidth per node
    latency_s: float  # per ring step
    seconds: float  # the whole gradient's all-reduce, as measured


@dataclass(frozen=True)
class LayoutChoice:
    """`fab bench --layouts`: the real job's mean step per ranks-per-node layout, and the fastest."""

    machine: str  # the node the layouts ran on (cluster/job/jobplan.py machine_for's name)
    nodes: int  # nodes the job ran on
    batch: int  # per rank
    step_s: dict[int, float]  # ranks per node -> the job's mean step (its first left out)
    created: str = ""

    def samples_per_s(self, ranks: int) -> float:
        """One node's samples/s with `ranks` ranks on it."""
        return ranks * self.batch / self.step_s[ranks]

    @property
    def ranks_per_node(self) -> int:
        """The fastest layout: the most samples/s per node (the fewer ranks on a tie)."""
        return max(sorted(self.step_s), key=lambda r: (self.samples_per_s(r), -r))

    def summary(self) -> str:
        """`1: 41.2, 2: 55.0 samples/s per node`."""
        return ", ".join(f"{r}: {self.samples_per_s(r):.1f}" for r in sorted(self.step_s)) + " samples/s per node"

    def to_mapping(self) -> dict:
        return {"machine": self.machine, "nodes": self.nodes, "batch": self.batch, "created": self.created,
                "candidates": {str(r): {"step_s": s, "samples_per_s": self.samples_per_s(r)}
                               for r, s in sorted(self.step_s.items())},
                "ranks_per_node": self.ranks_per_node}


@dataclass(frozen=True)
class Calibration:
    cluster: str
    model: str
    params: int
    batch: int
    compute: dict[int, float]  # node count -> samples/s per node
    allreduce: dict[int, dict[str, LinkFit]] = field(default_factory=dict)
    bucket_mb: float = 25.0
    seq_len: int = 0
    ranks_per_node: int = 1
    kind: str = ""
    backend: str = ""
    cpu: str = ""
    link: str = ""
    created: str = ""
    source: str = ""  # the file it was read from
    compile: dict | None = None  # {"eager_step_s", "compiled_step_s", "compile_s"}; None: not measured
    layout: LayoutChoice | None = None  # None: not measured (`fab bench --layouts`)
    instance_type: str = ""  # the AWS instance type it measured ("": a local or inventory cluster's machine)
    cores: int = 0  # the measured node's physical cores, as its /proc/cpuinfo says (0: not recorded)

    def machine(self) -> str:
        """The machine it measured, in words: `c6i.16xlarge`, or `a local cluster's (Intel Xeon ..., 16 cores)`."""
        if self.instance_type:
            return self.instance_type
        return (f"{'an' if (self.kind or 'a')[0] in 'aeiou' else 'a'} {self.kind or 'unknown'} cluster's machine "
                f"({self.cpu or 'CPU unknown'}, {self.cores or 'unknown'} cores)")

    def compile_cost(self):
        """The measured torch.compile figures as cluster.cost.timemodel.CompileCost, or None."""
        from cluster.cost.timemodel import CompileCost

        return CompileCost(**self.compile) if self.compile else None

    def rate(self, nodes: int) -> tuple[float, int]:
        """(samples/s per node, the node count it was measured at) for `nodes`."""
        return self.compute[_nearest(self.compute, nodes)], _nearest(self.compute, nodes)

    def link_fit(self, nodes: int, dtype: str) -> tuple[LinkFit, int] | None:
        """The all-reduce measured for `dtype` at `nodes` (or the nearest count), or None."""
        counts = {n: fits for n, fits in self.allreduce.items() if dtype in fits}
        if not counts:
            return None
        at = _nearest(counts, nodes)
        return counts[at][dtype], at

    def to_mapping(self) -> dict:
        data = asdict(self)
        data.pop("source")
        data["version"] = VERSION
        data["compute"] = {str(n): v for n, v in self.compute.items()}
        data["allreduce"] = {str(n): {d: asdict(f) for d, f in fits.items()} for n, fits in self.allreduce.items()}
        data["layout"] = self.layout.to_mapping() if self.layout else None
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_mapping(), indent=2) + "\n"


def _nearest(table: Mapping[int, object], nodes: int) -> int:
    below = [n for n in table if n <= nodes]
    return max(below) if below else min(table)


def _positive(value, what: str, source: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise CalibrationError(f"calibration {source}: {what} is {value!r}; expected a positive number "
                               "(rerun `fab bench`)")
    return float(value)


def from_mapping(data: dict, source: str = "") -> Calibration:
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise CalibrationError(f"calibration {source}: not a version {VERSION} calibration; rerun `fab bench`")
    try:
        compute = {int(n): _positive(v, f"compute[{n}]", source) for n, v in data["compute"].items()}
        allreduce = {}
        for n, fits in (data.get("allreduce") or {}).items():
            allreduce[int(n)] = {d: LinkFit(_positive(f["gbps"], f"allreduce[{n}][{d}].gbps", source),
                                            _positive(f["latency_s"], f"allreduce[{n}][{d}].latency_s", source),
                                            _positive(f["seconds"], f"allreduce[{n}][{d}].seconds", source))
                                 for d, f in fits.items() if d in DTYPES}
        if not compute:
            raise CalibrationError(f"calibration {source}: no compute measurement; rerun `fab bench`")
        return Calibration(cluster=str(data["cluster"]), model=str(data["model"]),
                           params=int(_positive(data["params"], "params", source)),
                           batch=int(_positive(data["batch"], "batch", source)), compute=compute,
                           allreduce=allreduce, bucket_mb=_positive(data.get("bucket_mb", 25), "bucket_mb", source),
                           seq_len=int(data.get("seq_len") or 0), ranks_per_node=int(data.get("ranks_per_node") or 1),
                           kind=str(data.get("kind", "")), backend=str(data.get("backend", "")),
                           cpu=str(data.get("cpu", "")), link=str(data.get("link") or ""),
                           created=str(data.get("created", "")), source=source,
                           compile=_compile(data.get("compile"), source),
                           layout=_layout(data.get("layout"), source),
                           instance_type=str(data.get("instance_type") or ""), cores=int(data.get("cores") or 0))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, CalibrationError):
            raise
        raise CalibrationError(f"calibration {source}: unreadable ({type(exc).__name__}: {exc}); "
                               "rerun `fab bench`") from None


def _compile(value, source: str) -> dict | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise CalibrationError(f"calibration {source}: compile is {value!r}; expected an object (rerun `fab bench`)")
    return {k: _positive(value.get(k), f"compile.{k}", source)
            for k in ("eager_step_s", "compiled_step_s", "compile_s")}


def _layout(value, source: str) -> LayoutChoice | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("candidates"), dict) or not value["candidates"]:
        raise CalibrationError(f"calibration {source}: layout is {value!r}; expected an object with candidates "
                               "(rerun `fab bench --layouts`)")
    step_s = {int(r): _positive((c or {}).get("step_s"), f"layout.candidates[{r}].step_s", source)
              for r, c in value["candidates"].items()}
    if min(step_s) < 1:
        raise CalibrationError(f"calibration {source}: layout candidate {min(step_s)} ranks per node; expected 1 "
                               "or more (rerun `fab bench --layouts`)")
    return LayoutChoice(machine=str(value.get("machine", "")), nodes=int(_positive(value.get("nodes"), "layout.nodes",
                                                                                   source)),
                        batch=int(_positive(value.get("batch"), "layout.batch", source)), step_s=step_s,
                        created=str(value.get("created", "")))


def layout_for(cal: Calibration | None, machine: str) -> tuple[int | None, str]:
    """(ranks per node measured fastest on `machine`, or None: the rule; the line that says which and why)."""
    if cal is None or cal.layout is None:
        return None, ""
    lay = cal.layout
    when = lay.created[:10] or "an unknown date"
    if lay.machine != machine:
        return None, (f"layout: the rule (one rank per socket): fab bench --layouts measured {lay.machine!r} on "
                      f"{when}, not this node ({machine!r})")
    return lay.ranks_per_node, (f"layout: {lay.ranks_per_node} rank(s) per node, measured fastest by fab bench on "
                                f"{when} ({lay.summary()}; {cal.source or 'the calibration'})")


def foreign_machine(cal: Calibration, *, instance_type: str = "", cpu: str = "", cores: int = 0) -> str:
    """Why `cal` does not apply to the machine a plan is for ("" when it does): an AWS `instance_type`, or
    (no instance type) a local or inventory cluster's machine, its `cpu` model and physical `cores`."""
    if instance_type:
        if cal.instance_type == instance_type:
            return ""
        return f"it measured {cal.machine()}, not {instance_type}"
    if not cal.instance_type and cal.cpu and cal.cpu == cpu and cal.cores and cal.cores == cores:
        return ""
    return f"it measured {cal.machine()}, not this machine ({cpu or 'CPU unknown'}, {cores or 'unknown'} cores)"


def noisy_counts(cal: Calibration) -> list[int]:
    """The node counts whose measured samples/s per node are above one node's: with n nodes each node cannot
    train faster than one alone, so such a figure is measurement noise."""
    if 1 not in cal.compute:
        return []
    return sorted(n for n, rate in cal.compute.items() if n > 1 and rate > cal.compute[1])


def parse(text: str, source: str = "") -> Calibration:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CalibrationError(f"calibration {source}: not JSON ({exc}); rerun `fab bench`") from None
    return from_mapping(data, source)


def cluster_file_name(cluster: str) -> str:
    """`<cluster>.json` for a cluster's name (node_setup/discovery.py's `cluster_name` of a `--cluster`);
    ValueError for anything else."""
    if not _CLUSTER_FILE_RE.match(cluster or ""):
        raise CalibrationError(f"--cluster: {cluster!r} is not a cluster name a calibration can be kept under; "
                               "allowed: letters, digits, '.', '_' and '-' (e.g. local, demo, my-cluster)")
    return f"{cluster}.json"


def path_for(config_root: Path | str, cluster: str) -> Path:
    """Where `fab bench` keeps the calibration of the cluster named `cluster`: `<config dir>/calibration/
    <name>.json`."""
    return Path(config_root) / "calibration" / cluster_file_name(cluster)
