"""`fab plan`'s options resolved into what it predicts (pure; the stack and a calibration come in).

    plan_inputs(spec, options[, calibration]) -> PlanInputs   the instance, the workload, the network,
                                                              one node's throughput, the layout, the
                                                              provisioning and the idle tail
    render_sources(inputs)                                    where each input came from

Each input is given (an option), measured (`fab bench`'s calibration, cluster/cost/calibration.py) or
a default (the stack's ClusterSpec, or with none the defaults below; the catalog's, the time model's);
`PlanInputs.sources` says which.
cluster/cost/costplan.py turns the inputs into `fab plan`'s rows and their cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cluster.node import autostop
from cluster.stack import catalog, lifecycle
from cluster.stack.image_reuse import SNAPSHOT_USD_PER_GIB_MONTH
from cluster.cost import models
from cluster.cost import timemodel as tm
from cluster.durations import format_duration, parse_duration
from cluster.cost.calibration import Calibration, foreign_machine, noisy_counts
from cluster.stack.catalog import InstanceType
from cluster.cost import flops
from cluster.job import lora
from cluster.job.job_args import DEFAULT_GRAD_COMM, GRAD_COMM_CHOICES
from cluster.node.profiles import DEFAULT_PROFILE, PROFILES
from cluster.stack.spec import ClusterSpec

DEFAULT_INSTANCE_TYPE = "r7iz.metal-16xl"
DEFAULT_MODEL = "distilbert-base-uncased"
DEFAULT_DATASET = "squad"


@dataclass(frozen=True)
class PlanOptions:
    """`fab plan`'s options, parsed (0 and "" mean "not given")."""

    nodes: str = "1,2,4,8"
    instance_type: str = ""
    model: str = DEFAULT_MODEL  # "": the calibration's model, else DEFAULT_MODEL
    dataset: str = DEFAULT_DATASET
    epochs: float = 1.0
    single_node_time: str = ""
    params: str = ""
    samples: int = 0
    batch: int | None = 32  # None: the calibration's batch, else 32
    profile: str = ""
    ranks_per_node: int = 0
    flows_per_rank: int = 1
    placement_group: bool = True
    on_demand: bool = False
    grad_comm: str = ""  # fp32 or bf16 on the wire; "": the job's default (DEFAULT_GRAD_COMM)
    bucket_mb: float = 0  # DDP's bucket size in MB; 0: DDP's default
    auto_stop_idle: str = ""  # the idle tail: a duration or "off"; "": the stack's autoStopIdle, else the default
    provisioning: bool = True  # count the first `pulumi up` (False: the cluster is already up)
    compile: str = "auto"  # torch.compile: on, off, or auto (when the calibration's measurement says it pays)
    peft: str = ""  # lora: the job's --peft lora at its default rank (only the adapters train, are all-reduced)
    any_machine: bool = False  # apply the calibration even where it measured another machine
    local_machine: tuple[str, int] | None = None  # a local cluster planned: this machine's (CPU model, cores)


Sources = list[tuple[str, str, str]]  # (input, value, where it came from)


@dataclass(frozen=True)
class PlanInputs:
    instance_type: str
    instance: InstanceType
    workload: tm.Workload
    network: tm.Network
    node_counts: list[int]
    samples_per_s: float  # one node's throughput
    ranks_per_node: int
    spot: bool
    header: str
    notes: list[str] = field(default_factory=list)
    rates: dict[int, float] = field(default_factory=dict)  # per node count, when measured per count
    networks: dict[int, tm.Network] = field(default_factory=dict)  # per node count, when measured
    sources: Sources = field(default_factory=list)
    first_up: lifecycle.FirstUp | None = None  # None: not counted (the cluster is up)
    other_up: lifecycle.FirstUp | None = None  # the first up the other way (from a kept image, or with a bake)
    worst_up: lifecycle.FirstUp | None = None  # first_up with every boot its whole wait budget (the worst case)
    kept_image: str = ""  # the kept image the stack's first up boots ("": it bakes)
    idle_tail_s: float | None = None  # None: auto-stop off, the nodes bill until `pulumi destroy`
    compiled: tm.CompileCost | None = None  # the calibration's torch.compile figures, when they apply
    compile: str = "auto"  # PlanOptions.compile

    def rate(self, nodes: int) -> float:
        return self.rates.get(nodes, self.samples_per_s)

    def network_for(self, nodes: int) -> tm.Network:
        return self.networks.get(nodes, self.network)


def plan_inputs(spec: ClusterSpec | None, options: PlanOptions, calibration: Calibration | None = None, *,
                stack_auto_stop_idle: str | None = None, kept_image: str = "", kept_why: str = "") -> PlanInputs:
    """Everything the prediction needs; ValueError naming the option for anything unusable.

    With a `calibration` (`fab bench`), the compute rate per node count and the all-reduce bandwidth
    and latency are the measured ones, and the model and batch default to those measured.
    `stack_auto_stop_idle` is the stack file's autoStopIdle (None: not set there). `kept_image`: the kept image
    the stack's `pulumi up` would boot (cluster/stack/image_reuse.py; "": it bakes), `kept_why` why.
    """
    o = options
    cal = calibration
    batch = _checked_batch(o, cal)
    idle_tail_s, idle_source = _idle_tail(o, stack_auto_stop_idle)
    itype = o.instance_type or (spec.instance_type if spec else DEFAULT_INSTANCE_TYPE)
    instance = spec.instance if spec and spec.instance_type == itype else catalog.lookup(itype)
    if instance is None:
        raise ValueError(f"--instance-type: {itype!r} is not in the catalog ({', '.join(catalog.known_types())})")
    foreign = _foreign(o, cal, itype)
    profile = o.profile or (spec.software_profile if spec else DEFAULT_PROFILE)
    if profile not in PROFILES:
        raise ValueError(f"--profile: {profile!r} is unknown; allowed: {', '.join(sorted(PROFILES))}")
    # the wire: the job's --grad_comm; buckets are filled with the gradients as computed (intel's
    # ipex.optimize keeps bf16 weights, so bf16 gradients; stock computes fp32)
    grad_comm = o.grad_comm or DEFAULT_GRAD_COMM
    grad_bytes = tm.GRADIENT_BYTES[grad_comm]
    bucket_mb = o.bucket_mb or tm.DDP_BUCKET_BYTES / 2**20
    sources = [("gradient communication", f"{grad_comm} ({grad_bytes} bytes/param on the wire)",
                "given (--grad-comm)" if o.grad_comm else "the job's default (--grad_comm)"),
               ("DDP bucket", f"{bucket_mb:g} MB", "given (--ddp-bucket-mb)" if o.bucket_mb else "DDP's default")]
    (model_name, n_params), (data_name, n_samples), size_sources = sizes(o, cal)
    trained, trained_sources = trained_params(o, model_name, n_params)
    size_sources += trained_sources
    workload = tm.Workload(params=trained, samples=n_samples, batch_per_rank=batch, gradient_bytes=grad_bytes,
                           epochs=o.epochs, bucket_bytes=round(bucket_mb * 2**20),
                           bucket_gradient_bytes=tm.GRADIENT_BYTES["bf16" if profile == "intel" else "fp32"])
    node_counts = parse_node_counts(o.nodes)
    rate, rate_source, rates, rate_sources = _compute_rate(o, cal, itype, model_name, data_name, batch, n_samples,
                                                           node_counts, trained)
    network, networks, network_sources = _network(o, cal, instance, itype, grad_comm, node_counts)
    sources += size_sources + rate_sources + network_sources
    ranks, rate, rates, layout_sources = _ranks(o, cal, instance, rate, rates)
    compiled, compile_sources = _compiled(o, cal, rates)
    sources += layout_sources + compile_sources
    build_gib = PROFILES[profile].min_root_volume_gib  # the image's build volume (infra/image.py)
    up, other, worst = (None, None, None) if not o.provisioning else (
        lifecycle.first_up(instance, build_gib, kept_image=bool(kept_image)),
        lifecycle.first_up(instance, build_gib, kept_image=not kept_image),
        lifecycle.first_up(instance, build_gib, kept_image=bool(kept_image), worst_case=True))
    how = f"from kept image {kept_image}" if kept_image else "with the image's build"
    sources += [("provisioning", f"{format_duration(up.seconds)} first `pulumi up` {how} ({up.describe()}), "
                 f"each worker {format_duration(up.worker_seconds)} of it" if up else "not counted",
                 f"{up.source}{'; ' + kept_why if kept_why else ''}" if up else
                 "given (--no-provisioning: the cluster is up)"),
                ("idle tail", "auto-stop off: not counted, the nodes bill until `pulumi destroy`"
                 if idle_tail_s is None else f"{format_duration(idle_tail_s)} until the idle auto-stop",
                 idle_source)]
    notes = [f"throughput: {rate:.1f} samples/s per node, {rate_source}"]
    if up and not kept_image:
        notes.append(f"image storage: the built image's {build_gib} GiB snapshot bills at most "
                     f"${build_gib * SNAPSHOT_USD_PER_GIB_MONTH:.2f}/month while it is kept (keepImage, or another "
                     "stack boots it); `fab images` lists the kept ones with their cost")
    notes += [foreign] if foreign else []
    noisy = noisy_counts(cal) if cal else []
    if cal and noisy:
        notes.append(f"calibration: at {', '.join(map(str, noisy))} node(s) it measured more samples/s per node than "
                     f"one node alone ({cal.compute[1]:.1f}): noise, not scaling, so an efficiency above 100 % "
                     "below is not real; rerun `fab bench`")
    if spec and spec.placement_group != o.placement_group:
        notes.append(f"the stack sets placementGroup {str(spec.placement_group).lower()} but this plan is "
                     f"{'with' if o.placement_group else 'without'} a placement group; "
                     f"{'drop --no-placement-group' if spec.placement_group else 'add --no-placement-group'} "
                     "to plan the stack's cluster")
    where = (f"calibrated on {cal.cluster} ({cal.link or 'link not limited'})" if cal
             else itype)
    lora_text = f", LoRA: {trained / 1e6:.1f}M trained" if trained != n_params else ""
    header = (f"{where}, {model_name} ({n_params / 1e6:.0f}M params{lora_text}, {grad_bytes}-byte gradients "
              f"({grad_comm}), "
              f"{bucket_mb:g} MB buckets, profile {profile}), "
              f"{data_name} ({n_samples} samples) x {o.epochs:g} epoch(s), batch {batch}/rank, {ranks} ranks/node, "
              f"{'in' if o.placement_group else 'no'} placement group")
    return PlanInputs(instance_type=itype, instance=instance, workload=workload, network=network,
                      node_counts=node_counts, samples_per_s=rate, ranks_per_node=ranks,
                      spot=not o.on_demand and (spec.worker_spot if spec else True), header=header, notes=notes,
                      rates=rates, networks=networks, sources=sources, first_up=up, other_up=other, worst_up=worst,
                      kept_image=kept_image if o.provisioning else "", idle_tail_s=idle_tail_s,
                      compiled=compiled, compile=o.compile)


def _foreign(o: PlanOptions, cal: Calibration | None, itype: str) -> str:
    """"" when the calibration measured the machine planned (the instance type, or the local machine); the note
    when --any-machine applies it anyway; ValueError naming --calibration otherwise."""
    if cal is None:
        return ""
    here = o.local_machine
    why = foreign_machine(cal, instance_type="" if here else itype, cpu=here[0] if here else "",
                          cores=here[1] if here else 0)
    if not why:
        return ""
    if o.any_machine:
        return f"calibration {cal.source}: {why}; applied anyway (--any-machine)"
    raise ValueError(f"--calibration: {cal.source or 'the calibration'} does not apply here: {why}; measure this "
                     "machine with `fab bench`, or pass --any-machine to apply it anyway")


def _ranks(o: PlanOptions, cal: Calibration | None, instance: InstanceType, rate: float, rates: dict[int, float]
           ) -> tuple[int, float, dict[int, float], Sources]:
    """(ranks per node, one node's rate, the rate per node count, sources): given, else the layout `fab bench
    --layouts` measured fastest (the measured rates, taken with one rank per node, scaled by its speed-up over
    one rank), else the calibration's, else one per socket."""
    if o.ranks_per_node:
        return o.ranks_per_node, rate, rates, [("ranks per node", str(o.ranks_per_node), "given (--ranks-per-node)")]
    lay = cal.layout if cal else None
    if lay is None:
        ranks = cal.ranks_per_node if cal else instance.sockets
        return ranks, rate, rates, [("ranks per node", str(ranks), "the calibration's" if cal else
                                     f"the rule: one per socket ({instance.name})")]
    best = lay.ranks_per_node
    source = f"measured fastest by fab bench --layouts on {lay.created[:10] or 'an unknown date'} ({lay.summary()})"
    if rates and 1 in lay.step_s and best != 1:
        gain = lay.samples_per_s(best) / lay.samples_per_s(1)
        rates = {n: r * gain for n, r in rates.items()}
        rate *= gain
        source += f"; the measured compute x {gain:.2f}, its speed-up over 1 rank per node"
    return best, rate, rates, [("ranks per node", str(best), source)]


def _compiled(o: PlanOptions, cal: Calibration | None, rates: dict[int, float]
              ) -> tuple[tm.CompileCost | None, Sources]:
    """The calibration's torch.compile figures when the plan uses its measured compute, and the source line."""
    if o.compile not in ("auto", "on", "off"):
        raise ValueError(f"--compile: {o.compile!r} is not allowed; choose auto, on or off")
    cost = cal.compile_cost() if cal else None
    if o.compile == "off":
        return None, [("compile", "off", "given (--compile off)")]
    if cost is None or not rates:
        why = ("no compile measurement (`fab bench --compile` measures one)" if cost is None else
               "measured for another model or batch than this plan's")
        if o.compile == "on":
            raise ValueError(f"--compile: on needs the calibration's compile figures; {why}")
        return None, [("compile", "eager", why)]
    assert cal is not None  # the cost came from it
    return cost, [("compile", f"step {cost.eager_step_s:.3f} s eager, {cost.compiled_step_s:.3f} s compiled, "
                   f"{cost.compile_s:.0f} s to compile", f"measured by fab bench --compile ({cal.source}); "
                   + ("given (--compile on)" if o.compile == "on" else "auto: compiled where the saving over the "
                      "run's steps exceeds the compile time"))]


def _idle_tail(o: PlanOptions, stack_value: str | None) -> tuple[float | None, str]:
    """(seconds the nodes idle after the run before the auto-stop powers them off, or None for off; source)."""
    if o.auto_stop_idle:
        value, setting, source = o.auto_stop_idle, "--auto-stop-idle", "given (--auto-stop-idle)"
    elif stack_value not in (None, ""):
        value, setting, source = stack_value, "autoStopIdle", "the stack's autoStopIdle"
    else:
        value, setting, source = None, "autoStopIdle", f"autoStopIdle's default ({autostop.DEFAULT_IDLE})"
    try:
        seconds = autostop.stack_idle_seconds(value, setting)
    except autostop.AutostopError as exc:
        raise ValueError(str(exc)) from None
    return (None if seconds is None else float(seconds)), source


def _checked_batch(o: PlanOptions, cal: Calibration | None) -> int:
    """The batch per rank, once every number and choice of the options is usable (ValueError naming
    the option otherwise: also for an infinite or not-a-number value)."""
    if not (o.epochs > 0 and _finite(o.epochs)):
        raise ValueError(f"--epochs: {o.epochs!r} is not allowed; give a number above 0, e.g. 1 or 0.5")
    batch = o.batch if o.batch is not None else (cal.batch if cal else 32)
    for name, value in (("batch-size", batch), ("flows-per-rank", o.flows_per_rank)):
        if not (value >= 1 and _finite(value)):
            raise ValueError(f"--{name}: {value!r} is not allowed; give 1 or more")
    for name, value in (("samples", o.samples), ("ranks-per-node", o.ranks_per_node)):
        if not (value >= 0 and _finite(value)):
            raise ValueError(f"--{name}: {value!r} is not allowed; give a positive number (0: the default)")
    if not isinstance(o.placement_group, bool):
        raise ValueError(f"--placement-group: {o.placement_group!r} is not allowed; give --placement-group "
                         "or --no-placement-group")
    if o.grad_comm and o.grad_comm not in GRAD_COMM_CHOICES:
        raise ValueError(f"--grad-comm: {o.grad_comm!r} is not allowed; choose {' or '.join(GRAD_COMM_CHOICES)}")
    low, high = tm.BUCKET_MB_RANGE
    if o.bucket_mb and not low <= o.bucket_mb <= high or o.bucket_mb < 0 or o.bucket_mb != o.bucket_mb:
        raise ValueError(f"--ddp-bucket-mb: {o.bucket_mb!r} is not allowed; give {low} to {high} (0: DDP's 25)")
    return batch


def _finite(value: float) -> bool:
    """Not inf and not nan (a whole number always is)."""
    return isinstance(value, int) or math.isfinite(value)


def sizes(o: PlanOptions, cal: Calibration | None) -> tuple[tuple[str, int], tuple[str, int], Sources]:
    """((model, parameters), (data set, samples per epoch), their sources): given, measured or the catalog's."""
    model_arg = o.model or (cal.model if cal else DEFAULT_MODEL)
    if o.params:
        model_name, n_params = model_arg, models.parse_count(o.params, "--params")
        sources = [("parameters", f"{n_params / 1e6:.2f}M", "given (--params)")]
    elif cal and model_arg == cal.model:
        model_name, n_params = cal.model, cal.params
        sources = [("parameters", f"{n_params / 1e6:.2f}M", f"measured ({cal.model}, {cal.source})")]
    else:
        size = models.lookup_model(model_arg)
        model_name, n_params = size.name, size.params
        sources = [("parameters", f"{n_params / 1e6:.2f}M", f"catalog ({size.source})")]
    if o.samples:
        data_name, n_samples = o.dataset, o.samples
        sources.append(("samples per epoch", str(n_samples), "given (--samples)"))
    else:
        data = models.lookup_dataset(o.dataset)
        data_name, n_samples = data.name, data.train_features
        sources.append(("samples per epoch", str(n_samples), f"catalog ({data.name})"))
    return (model_name, n_params), (data_name, n_samples), sources


# checkpoint bytes: fp32 weights saved, and AdamW's two fp32 moments of every trained parameter
CHECKPOINT_WEIGHT_BYTES = 4
CHECKPOINT_OPTIMIZER_BYTES = 8


def trained_params(o: PlanOptions, model_name: str, n_params: int) -> tuple[int, Sources]:
    """(the parameters that train and are all-reduced, the sources: what LoRA trains, the checkpoint's size):
    every one, or with --peft lora the adapters of the model's attention projections (the catalog's shape)."""
    peft = (o.peft or lora.DEFAULT_PEFT).strip().lower()
    if peft not in lora.PEFT_CHOICES:
        raise ValueError(f"--peft: {o.peft!r} is not allowed; choose {' or '.join(lora.PEFT_CHOICES)}")
    rank = lora.DEFAULT_RANK
    if peft == "none":
        trained, saved, what = n_params, n_params, "every parameter (full fine-tuning)"
    else:
        try:
            shapes = models.lookup_model(model_name).attention_shapes()
        except ValueError:
            shapes = []
        if not shapes:
            raise ValueError(f"--peft lora: the attention shape of {model_name!r} is not in the model catalog "
                             f"(known: {', '.join(m.name for m in models.MODELS.values() if m.attention_shapes())})")
        trained = lora.adapter_parameters(shapes, rank)
        saved, what = trained, f"LoRA rank {rank} on q,k,v,o of {len(shapes) // 4} layers ({trained / n_params:.2%})"
    size = saved * CHECKPOINT_WEIGHT_BYTES + trained * CHECKPOINT_OPTIMIZER_BYTES
    return trained, [("trained parameters", f"{trained / 1e6:.2f}M, all-reduced every step", what),
                     ("checkpoint", f"{size / 2**20:,.0f} MiB per rank's copy",
                      "fp32 weights saved" + (" (the adapter only)" if peft == "lora" else "")
                      + " + AdamW's two fp32 moments of each trained parameter")]


def _flops_scaled(itype: str, model_name: str, data_name: str, trained: int) -> tm.Throughput | None:
    """A model the throughput table lacks, whose shape the catalog knows: DistilBERT's SQuAD rate on this type
    scaled by the FLOPs per sample (the same share of the peak: an estimate; fab bench measures it)."""
    try:
        size, data = models.lookup_model(model_name), models.lookup_dataset(data_name)
        reference = tm.default_throughput(itype, "distilbert-base-uncased", "squad")
    except ValueError:
        return None
    if not size.matmul_params or not size.hidden:
        return None
    base, squad = models.lookup_model("distilbert-base-uncased"), models.lookup_dataset("squad")
    ratio = (flops.train_flops_per_sample(base.matmul_params, base.layers, base.hidden, squad.seq_len)
             / flops.train_flops_per_sample(size.matmul_params, size.layers, size.hidden, data.seq_len,
                                            min(trained, size.matmul_params)))
    return tm.Throughput(reference.samples_per_s * ratio,
                         f"estimate: DistilBERT's SQuAD rate x {ratio:.4f}, its model FLOPs per sample over "
                         f"{size.name}'s at {data.seq_len} tokens (cluster/cost/flops.py); {reference.source}")


def _compute_rate(o: PlanOptions, cal: Calibration | None, itype: str, model_name: str, data_name: str, batch: int,
                  n_samples: int, node_counts: list[int], trained: int = 0
                  ) -> tuple[float, str, dict[int, float], Sources]:
    """(one node's samples/s, where it came from, the measured rate per node count, the sources):
    from --single-node-time, the calibration when it measured this model and batch, else the catalog (for a
    model it has no rate for, its FLOPs-scaled estimate)."""
    rates: dict[int, float] = {}
    if o.single_node_time:
        seconds = parse_duration(o.single_node_time, "--single-node-time")
        rate = tm.throughput_from_single_node_time(seconds, n_samples)
        rate_source = f"single-node time {format_duration(seconds)} (given)"
        return rate, rate_source, rates, [("compute", f"{rate:.1f} samples/s per node", rate_source)]
    if cal and model_name == cal.model and batch == cal.batch:
        rate, _ = cal.rate(1)
        sources = []
        for n in sorted(set(node_counts) | {1}):
            rates[n], at = cal.rate(n)
            sources.append((f"compute, {n} node(s)", f"{rates[n]:.1f} samples/s per node",
                            f"measured with {at} node(s) busy at once"))
        return rate, f"measured by fab bench ({cal.source})", rates, sources
    default = (_flops_scaled(itype, model_name, data_name, trained)
               if (itype, model_name, data_name) not in tm.DEFAULT_THROUGHPUTS else None)
    default = default or tm.default_throughput(itype, model_name, data_name)
    rate, rate_source = default.samples_per_s, default.source
    why = ""
    if cal:
        why = (f"; the calibration measured {cal.model} at batch {cal.batch}, not {model_name} at batch {batch}")
    return rate, rate_source, rates, [("compute", f"{rate:.1f} samples/s per node",
                                       f"catalog default ({rate_source}){why}")]


def _network(o: PlanOptions, cal: Calibration | None, instance: InstanceType, itype: str, grad_comm: str,
             node_counts: list[int]) -> tuple[tm.Network, dict[int, tm.Network], Sources]:
    """(the catalog's network, the measured one per node count, the sources): the calibration's
    all-reduce in this gradient format where it has one, else the instance type's link."""
    network = tm.Network(instance.network_gbps, placement_group=o.placement_group, flows_per_rank=o.flows_per_rank)
    networks: dict[int, tm.Network] = {}
    sources: Sources = []
    measured_link = cal.link_fit(2, grad_comm) if cal else None
    if measured_link:
        for n in node_counts:
            if n < 2:
                continue
            found = cal.link_fit(n, grad_comm) if cal else None
            assert found is not None  # measured_link: the calibration has this dtype at some count
            fit, at = found
            networks[n] = tm.Network(instance.network_gbps, placement_group=o.placement_group,
                                     flows_per_rank=o.flows_per_rank, latency_s=fit.latency_s, measured_gbps=fit.gbps)
            sources.append((f"all-reduce, {n} node(s)", f"{fit.gbps:.3f} Gbit/s per node, {fit.latency_s * 1e6:.0f} us "
                            "per ring step", f"measured in {grad_comm} across {at} node(s)"))
    else:
        ranks_guess = o.ranks_per_node or instance.sockets
        why = f" (the calibration has no {grad_comm} all-reduce)" if cal else ""
        sources.append(("all-reduce", f"{network.node_gbps(ranks_guess):g} Gbit/s per node, "
                        f"{network.latency_s * 1e6:.0f} us per ring step",
                        f"catalog default ({itype}, {'in' if o.placement_group else 'no'} placement group){why}"))
    return network, networks, sources


def render_sources(inputs: PlanInputs) -> str:
    """Where each input came from: measured, given, catalog default."""
    width = max(len(name) for name, _, _ in inputs.sources)
    return "\n".join(["inputs:"] + [f"  {name:<{width}}  {value}  [{source}]"
                                    for name, value, source in inputs.sources])


def parse_node_counts(text: str | int) -> list[int]:
    """`1,2,4,8` -> [1, 2, 4, 8] (sorted, unique)."""
    try:
        counts = sorted({int(part) for part in str(text).split(",") if part.strip()})
    except ValueError:
        raise ValueError(f"--nodes: {text!r} is not a list of node counts; allowed: e.g. 1,2,4,8") from None
    if not counts or counts[0] < 1:
        raise ValueError(f"--nodes: {text!r} needs node counts of 1 or more, e.g. 1,2,4,8")
    return counts
