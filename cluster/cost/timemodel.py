"""Predicted epoch time of data-parallel training on N CPU nodes (pure; docs/design.md, "The time model").

The model, step by step (every constant is named below with where it comes from):

1. Compute. A node's training throughput (samples per second, all its cores busy) is taken
   from a measurement: either a single-node epoch time the user measured (`--single-node-time`)
   or a documented default per instance type and model (`DEFAULT_THROUGHPUTS`). A node does the
   same work per sample however many ranks it runs (ranks split its cores), so a step of a
   global batch B spread over N nodes costs (B / N) / throughput seconds of compute. The
   per-step optimizer update is treated as part of the per-sample cost (it is small next to
   forward and backward for these models at batch 32).
2. Communication. Every step all-reduces the gradients: params x bytes per gradient (4 for
   fp32 gradients, as under bf16 autocast in the stock profile; 2 under
   `ipex.optimize(..., dtype=bfloat16)` in the intel profile, or with the job's `--grad_comm bf16`,
   DDP's bf16 compression hook). DDP sends them in buckets (25 MB by default, `--ddp_bucket_mb`). Ranks on one node
   combine over shared memory; between nodes a ring all-reduce sends 2 (N-1)/N of the gradient bytes out of
   every node. The bandwidth a node gets is min(instance bandwidth, per-flow cap x flows):
   AWS caps one TCP flow at 5 Gbps outside a cluster placement group and 10 Gbps inside one,
   and a node's traffic is spread over one flow per rank (gloo) or per CCL worker (ccl). Each
   of the ring's 2 (N-1) steps per gradient bucket also pays one network latency. A calibration
   (`fab bench`, cluster/cost/calibration.py) replaces the bandwidth and latency with the all-reduce
   actually measured on the cluster (payload bytes per second, so no header allowance then).
3. Overlap. DDP starts all-reducing a bucket as soon as backward has produced it, so part of
   the communication hides under backward. On a CPU the communication threads share cores and
   memory bandwidth with compute, and the last bucket (the first layers) cannot overlap at all,
   so by default half of it is taken as hidden, never more than the backward time itself nor
   more than the buckets before the last (nothing, for a gradient that fits in one bucket).
   Predictions with no overlap and with full overlap bound the answer (`Prediction` keeps the
   exposed and total communication apart so a reader can see how much this assumption moves).
4. Fixed start-up: launching the ranks (mpirun over ssh), importing torch and transformers,
   loading the model and initialising the process group; paid once per run, more with more nodes.

Efficiency is the single-node epoch time divided by N times the N-node epoch time (1 on one node).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# --- constants ---------------------------------------------------------------------------------

# AWS: "Amazon EC2 instance network bandwidth" (EC2 user guide): a single flow is limited to
# 5 Gbps when instances are not in the same cluster placement group, 10 Gbps within one.
PER_FLOW_GBPS_OUTSIDE_PLACEMENT_GROUP = 5.0
PER_FLOW_GBPS_IN_CLUSTER_PLACEMENT_GROUP = 10.0

# Fraction of the bytes on the wire that is payload after TCP/IP and Ethernet headers
# (1448 payload bytes of a 1500-byte MTU frame plus 38 bytes of framing; jumbo frames do better).
WIRE_EFFICIENCY = 1448 / 1538

# One TCP round of a ring step between EC2 instances in one region (tens of microseconds).
RING_STEP_LATENCY_S = 50e-6
# torch DDP's default gradient bucket size.
DDP_BUCKET_BYTES = 25 * 2**20

# Backward costs about twice the forward (one matmul for activations' and one for weights'
# gradients), so it is about 2/3 of a step's compute.
BACKWARD_FRACTION = 2 / 3
DEFAULT_OVERLAP = 0.5

# Start-up: process launch, `import torch, transformers`, model load, process-group rendezvous.
# About 6 s of imports and 10 s in all for a tiny job was measured on this project's local
# cluster (docs/benchmarks.md); a 66M-parameter model load and the rendezvous add some more.
STARTUP_BASE_S = 20.0
STARTUP_PER_EXTRA_NODE_S = 2.0  # one more ssh launch and one more rendezvous peer

GRADIENT_BYTES = {"fp32": 4, "bf16": 2}
BUCKET_MB_RANGE = (1, 1024)  # what --ddp-bucket-mb may be


@dataclass(frozen=True)
class Throughput:
    samples_per_s: float  # one node, all cores
    source: str


# Default single-node throughputs (samples/s per node, all cores, batch 32, bf16 where the CPU has
# it), keyed by (instance type, model, dataset). Only the two recipe figures are measurements;
# the rest are estimates derived from them, and say so. Calibrate with --single-node-time.
_SQUAD = 88_524  # training features, see cluster/cost/models.py


def _from_epoch(seconds: float, features: int = _SQUAD) -> float:
    return features / (seconds - STARTUP_BASE_S)


_R7IZ = _from_epoch(26 * 60)  # the recipe: 26 min per epoch on one r7iz.metal-16xl
_C6I = _from_epoch(3.5 * 3600)  # the recipe: 3 h 30 min on one c6i.16xlarge
_MEASURED_R7IZ = "measured: the recipe's 26 min SQuAD epoch on one r7iz.metal-16xl (1 rank, batch 32, bf16)"
_MEASURED_C6I = "measured: the recipe's 3 h 30 min SQuAD epoch on one c6i.16xlarge (1 rank, batch 32, fp32)"
_SCALED = "estimate: {base} x {factor:g} ({why})"


def _build_defaults() -> dict[tuple[str, str, str], Throughput]:
    table: dict[tuple[str, str, str], Throughput] = {}
    # Per physical core figures of the two measured CPUs; other sizes of the same CPU scale by cores.
    per_core = {"spr": (_R7IZ / 32, "r7iz.metal-16xl"), "icx": (_C6I / 32, "c6i.16xlarge")}
    cores = {"r7iz.metal-16xl": ("spr", 32), "r7iz.metal-32xl": ("spr", 64), "c7i.16xlarge": ("spr", 32),
             "c7i.metal-24xl": ("spr", 48),
             "c7i.metal-48xl": ("spr", 96), "m7i.48xlarge": ("spr", 96), "c6i.16xlarge": ("icx", 32),
             "c6i.32xlarge": ("icx", 64), "c6in.32xlarge": ("icx", 64),
             "c7i.48xlarge": ("spr", 96), "r7i.48xlarge": ("spr", 96), "m7i.metal-48xl": ("spr", 96),
             "r7i.metal-48xl": ("spr", 96), "m6i.16xlarge": ("icx", 32), "r6i.16xlarge": ("icx", 32),
             "m6i.32xlarge": ("icx", 64), "r6i.32xlarge": ("icx", 64)}
    for itype, (cpu, ncores) in cores.items():
        rate, base = per_core[cpu]
        if itype == "r7iz.metal-16xl":
            source = _MEASURED_R7IZ
        elif itype == "c6i.16xlarge":
            source = _MEASURED_C6I
        else:
            source = _SCALED.format(base=base, factor=ncores / 32,
                                    why=f"{ncores} vs 32 physical cores, same CPU family")
        distil = Throughput(rate * ncores, source)
        table[(itype, "distilbert-base-uncased", "squad")] = distil
        # BERT-base has twice DistilBERT's transformer layers of the same width: half the rate.
        table[(itype, "bert-base-uncased", "squad")] = Throughput(
            distil.samples_per_s / 2, f"estimate: half of DistilBERT's rate (12 vs 6 layers); {source}")
        # GLUE sentence pairs at 128 tokens instead of 384: about 3x more samples per second
        # (the linear layers dominate at these lengths; attention's quadratic part is ignored).
        for glue in ("glue-mrpc", "glue-qqp", "glue-sst2"):
            for model, rate_model in (("distilbert-base-uncased", distil.samples_per_s),
                                      ("bert-base-uncased", distil.samples_per_s / 2)):
                table[(itype, model, glue)] = Throughput(
                    rate_model * 3, f"estimate: 3x the SQuAD rate (128 vs 384 tokens); {source}")
    return table


DEFAULT_THROUGHPUTS: dict[tuple[str, str, str], Throughput] = _build_defaults()


def default_throughput(instance_type: str, model: str, dataset: str) -> Throughput:
    try:
        return DEFAULT_THROUGHPUTS[(instance_type, model, dataset)]
    except KeyError:
        known = sorted({f"{t} / {m} / {d}" for t, m, d in DEFAULT_THROUGHPUTS})
        raise ValueError(
            f"no default throughput for instance type {instance_type!r}, model {model!r}, dataset "
            f"{dataset!r}; measure one epoch (or a part of one) on a single node and pass "
            f"--single-node-time (e.g. 26m); known defaults: {'; '.join(known[:6])} ...") from None


# --- inputs and outputs ------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    params: int
    samples: int  # training features per epoch
    batch_per_rank: int = 32
    gradient_bytes: int = 4  # per parameter: 4 fp32, 2 bf16
    epochs: float = 1.0
    bucket_bytes: int = DDP_BUCKET_BYTES  # DDP's gradient bucket cap
    # bytes per gradient as DDP buckets them: the parameters' dtype (fp32 even when a bf16 hook
    # compresses each bucket for the wire; 2 under ipex.optimize's bf16 weights); 0: gradient_bytes
    bucket_gradient_bytes: int = 0

    @property
    def buckets(self) -> int:
        per_param = self.bucket_gradient_bytes or self.gradient_bytes
        return max(1, math.ceil(self.params * per_param / self.bucket_bytes))

    def __post_init__(self):
        if self.bucket_gradient_bytes < 0:
            raise ValueError(f"bucket_gradient_bytes: {self.bucket_gradient_bytes!r} must not be negative")
        for name in ("params", "samples", "batch_per_rank", "gradient_bytes", "bucket_bytes"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be positive")
        if self.epochs <= 0:
            raise ValueError(f"epochs: {self.epochs!r} must be positive")


@dataclass(frozen=True)
class Network:
    instance_gbps: float
    placement_group: bool = True
    flows_per_rank: int = 1  # TCP flows a rank's inter-node traffic is spread over (CCL workers)
    latency_s: float = RING_STEP_LATENCY_S
    measured_gbps: float | None = None  # payload all-reduce bandwidth per node measured by `fab bench`

    def node_gbps(self, ranks_per_node: int) -> float:
        """Usable inter-node bandwidth of one node: measured, else min(instance, per-flow cap x flows)."""
        if self.measured_gbps:
            return self.measured_gbps
        cap = (PER_FLOW_GBPS_IN_CLUSTER_PLACEMENT_GROUP if self.placement_group
               else PER_FLOW_GBPS_OUTSIDE_PLACEMENT_GROUP)
        flows = max(1, ranks_per_node * self.flows_per_rank)
        return min(self.instance_gbps, cap * flows)

    @property
    def wire_efficiency(self) -> float:
        """Payload share of the bandwidth: a measured all-reduce bandwidth is payload already."""
        return 1.0 if self.measured_gbps else WIRE_EFFICIENCY


@dataclass(frozen=True)
class Prediction:
    nodes: int
    ranks_per_node: int
    steps: int  # optimizer steps per epoch
    compute_s: float  # per epoch
    comm_s: float  # all-reduce time per epoch, before overlap
    exposed_comm_s: float  # the part not hidden under backward
    startup_s: float  # once per run
    epoch_seconds: float  # compute + exposed communication, one epoch
    run_seconds: float  # startup + epochs x epoch_seconds
    efficiency: float
    node_gbps: float
    buckets: int = 1  # gradient buckets all-reduced per step
    compile_s: float = 0.0  # torch.compile's share of startup_s

    @property
    def step_seconds(self) -> float:
        return self.epoch_seconds / self.steps


def allreduce_seconds(gradient_bytes: float, nodes: int, node_gbps: float,
                      latency_s: float = RING_STEP_LATENCY_S, *, bucket_bytes: int = DDP_BUCKET_BYTES,
                      wire_efficiency: float = WIRE_EFFICIENCY, buckets: int | None = None) -> float:
    """One ring all-reduce of `gradient_bytes` in buckets of `bucket_bytes` (or `buckets` of them)
    across `nodes` nodes (0 on one)."""
    if nodes <= 1:
        return 0.0
    on_wire = 2 * (nodes - 1) / nodes * gradient_bytes
    seconds = on_wire * 8 / (node_gbps * 1e9 * wire_efficiency)
    buckets = buckets or max(1, math.ceil(gradient_bytes / bucket_bytes))
    return seconds + 2 * (nodes - 1) * buckets * latency_s


def ring_fit(nodes: int, payload_bytes: float, seconds: float, small_seconds: float,
             buckets: int = 1) -> tuple[float, float]:
    """(payload Gbps per node, latency per ring step in s) from two timed all-reduces across `nodes`:
    `seconds` for `payload_bytes` sent in `buckets` all-reduces, `small_seconds` for one tiny one.

    The inverse of allreduce_seconds: the tiny all-reduce is all latency, 2 (N-1) ring steps; what
    the big one takes beyond its buckets' latencies is 2 (N-1)/N of its bytes on the wire.
    """
    if nodes < 2:
        raise ValueError(f"nodes: {nodes!r}; an all-reduce needs 2 or more")
    if not (payload_bytes > 0 and seconds > 0 and small_seconds > 0 and buckets >= 1):
        raise ValueError("ring_fit: sizes and times must be positive")
    steps = 2 * (nodes - 1)
    latency = small_seconds / steps
    transfer = max(seconds - buckets * steps * latency, seconds * 0.05)  # the latency can never be all of it
    gbps = steps / nodes * payload_bytes * 8 / transfer / 1e9
    return gbps, latency


def startup_seconds(nodes: int, compile_s: float = 0.0) -> float:
    """Launch, imports, model load and rendezvous; plus `compile_s`, torch.compile's first-step cost
    (every rank compiles at once, so it is paid once per run whatever the node count)."""
    return STARTUP_BASE_S + STARTUP_PER_EXTRA_NODE_S * (nodes - 1) + compile_s


@dataclass(frozen=True)
class CompileCost:
    """What `fab bench` measured of torch.compile on one node: the steady step eager and compiled, and
    the compile itself (the compiled run's first step less the eager run's)."""

    eager_step_s: float
    compiled_step_s: float
    compile_s: float

    @property
    def step_factor(self) -> float:
        """Compiled step over eager step (below 1: compiling pays per step)."""
        return self.compiled_step_s / self.eager_step_s


def compile_pays(steps: int, cost: CompileCost | None) -> tuple[bool, str]:
    """(compile?, why) for `--compile auto`: when the saving over `steps` steps exceeds the compile time."""
    if cost is None:
        return False, "no compile measurement (fab bench measures one): eager"
    saving = steps * (cost.eager_step_s - cost.compiled_step_s)
    verdict = saving > cost.compile_s
    return verdict, (f"{steps} steps x ({cost.eager_step_s:.3f} - {cost.compiled_step_s:.3f}) s = {saving:.0f} s saved "
                     f"{'>' if verdict else '<='} {cost.compile_s:.0f} s to compile: "
                     f"{'compiled' if verdict else 'eager'}")


def throughput_from_single_node_time(seconds: float, samples: int) -> float:
    """Node throughput from a measured single-node run time (its start-up taken out)."""
    compute = seconds - startup_seconds(1)
    if compute <= 0:
        raise ValueError(f"single-node time: {seconds:g} s is not longer than the {startup_seconds(1):g} s "
                         "start-up; give the time of a whole epoch, e.g. 26m")
    return samples / compute


def predict(workload: Workload, network: Network, nodes: int, node_samples_per_s: float, *,
            ranks_per_node: int = 1, overlap: float = DEFAULT_OVERLAP,
            single_node_samples_per_s: float | None = None, compiled: CompileCost | None = None) -> Prediction:
    """Predict one configuration. `node_samples_per_s` is one node's throughput in this configuration;
    `single_node_samples_per_s` the single-node reference for the efficiency (default the same).
    With `compiled`, the compute per step is scaled by its step factor and its compile time is
    added to the start-up (Prediction.compile_s shows it)."""
    if nodes < 1:
        raise ValueError(f"nodes: {nodes!r} must be at least 1")
    if ranks_per_node < 1:
        raise ValueError(f"ranks_per_node: {ranks_per_node!r} must be at least 1")
    if not 0 <= overlap <= 1:
        raise ValueError(f"overlap: {overlap!r} must be between 0 and 1")
    if node_samples_per_s <= 0:
        raise ValueError(f"throughput: {node_samples_per_s!r} samples/s must be positive")
    if nodes == 1:
        ranks_per_node = 1  # the single-node reference run: one process with all cores
    global_batch = workload.batch_per_rank * ranks_per_node * nodes
    steps = math.ceil(workload.samples / global_batch)
    per_node_batch = workload.batch_per_rank * ranks_per_node
    step_compute = per_node_batch / node_samples_per_s * (compiled.step_factor if compiled else 1.0)
    gbps = network.node_gbps(ranks_per_node)
    step_comm = allreduce_seconds(workload.params * workload.gradient_bytes, nodes, gbps, network.latency_s,
                                  wire_efficiency=network.wire_efficiency, buckets=workload.buckets)
    # the last bucket (the first layers' gradients) is ready only when backward ends
    before_last = step_comm * (workload.buckets - 1) / workload.buckets
    hidden = min(overlap * step_comm, before_last, BACKWARD_FRACTION * step_compute)
    step_exposed = step_comm - hidden
    epoch = steps * (step_compute + step_exposed)
    single = (math.ceil(workload.samples / workload.batch_per_rank) * workload.batch_per_rank
              / (single_node_samples_per_s or node_samples_per_s) * (compiled.step_factor if compiled else 1.0))
    efficiency = single / (nodes * epoch)
    compile_s = compiled.compile_s if compiled else 0.0
    startup = startup_seconds(nodes, compile_s)
    return Prediction(compile_s=compile_s, nodes=nodes, ranks_per_node=ranks_per_node, steps=steps,
                      compute_s=steps * step_compute,
                      comm_s=steps * step_comm, exposed_comm_s=steps * step_exposed, startup_s=startup,
                      epoch_seconds=epoch, run_seconds=startup + workload.epochs * epoch,
                      efficiency=efficiency, node_gbps=gbps, buckets=workload.buckets if nodes > 1 else 0)
