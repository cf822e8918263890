"""`fab bench`, decided before anything is touched (pure): options checked, the launch of
`python -m training.bench` on one rank per node, and the calibration made from its figures.

The launch is `fab train`'s (cluster/job/jobplan.py: the node's layout and share of a local machine,
cluster/job/launch.py: mpirun, the rank wrapper, the job's environment); only the program differs.

With `--layouts`, the real job (`python -m training` on the offline demo, fab train's launch) runs once per
candidate layout the node allows (`layout_candidates`: 1 rank per node, one per socket, 2 and 4 per
socket) for a few steps; the calibration keeps each candidate's mean step and the fastest
(cluster/cost/calibration.py's layout block), which `fab train` and `fab plan` then use on that node.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace

from cluster.cost import calibration as calib
from cluster.cost import timemodel as tm
from cluster.inventory import Inventory
from cluster.job.demo import SYNTHETIC_ARGS, SYNTHETIC_BATCH_SIZE, SYNTHETIC_SEQ_LENGTHS, synthetic_data
from cluster.job.job_args import parse_extra
from cluster.job.jobplan import DEFAULT_OUTPUT_ROOT, JobPlan, machine_for, new_job_id, plan
from cluster.job.launch import plan_launch
from cluster.job.layout import LayoutError, plan_layout
from cluster.job.request import BuiltinJob, LayoutRequest, RunRequest
from cluster.node.profiles import get_profile, venv_dir

SYNTHETIC_MODEL = "synthetic"  # training/bench.py's name for the offline demo's tiny model
SYNTHETIC_SEQ_LEN = SYNTHETIC_SEQ_LENGTHS["qa"]  # the demo's --max_seq_length for the job's default task
DEFAULT_BATCH = SYNTHETIC_BATCH_SIZE  # the demo's batch per rank
DEFAULT_STEPS = 10
DEFAULT_REPEATS = 5
LIMITS = {"batch": (1, 4096), "seq-len": (8, 8192), "steps": (1, 1000), "repeats": (1, 100)}
# A model directory on the nodes: an absolute path of plain characters (it reaches the nodes' shell).
_MODEL_DIR_RE = re.compile(r"/[A-Za-z0-9._/+-]{1,255}")  # a whole match (fullmatch)


@dataclass(frozen=True)
class BenchOptions:
    nodes: int = 0  # 0: every node
    model: str = SYNTHETIC_MODEL
    batch: int = DEFAULT_BATCH
    seq_len: int = SYNTHETIC_SEQ_LEN
    steps: int = DEFAULT_STEPS
    repeats: int = DEFAULT_REPEATS
    bucket_mb: float = tm.DDP_BUCKET_BYTES / 2**20
    compile: bool = False  # also time the job compiled (rank 0 alone)
    layouts: bool = False  # also time the real job in each candidate layout


def check_options(o: BenchOptions) -> BenchOptions:
    """The options, or ValueError naming the option, the value and what is allowed."""
    if o.model != SYNTHETIC_MODEL and not _MODEL_DIR_RE.fullmatch(o.model or "") or ".." in o.model.split("/"):
        raise ValueError(f"--model: {o.model!r} is not allowed; allowed: {SYNTHETIC_MODEL} (the offline demo's "
                         "tiny model) or the absolute path of a model directory on the nodes (nothing is downloaded)")
    for name, value in (("batch", o.batch), ("seq-len", o.seq_len), ("steps", o.steps), ("repeats", o.repeats)):
        low, high = LIMITS[name]
        if not low <= value <= high:
            raise ValueError(f"--{name}: {value!r} is not allowed; give {low} to {high}")
    low, high = tm.BUCKET_MB_RANGE
    if not low <= o.bucket_mb <= high:
        raise ValueError(f"--ddp-bucket-mb: {o.bucket_mb!r} is not allowed; give {low} to {high}")
    if o.nodes < 0:
        raise ValueError(f"--nodes: {o.nodes!r} is not allowed; give 2 or more (0: every node)")
    return o


def bench_args(o: BenchOptions, out: str) -> list[str]:
    return ["--out", out, "--model", o.model, "--batch", str(o.batch), "--seq_len", str(o.seq_len),
            "--steps", str(o.steps), "--repeats", str(o.repeats), "--bucket_mb", f"{o.bucket_mb:g}",
            *(["--compile"] if o.compile else [])]


def plan_bench(inventory: Inventory, o: BenchOptions, *, job_id: str | None = None) -> JobPlan:
    """The launch of the bench on the first `o.nodes` nodes, one rank per node (ValueError if impossible)."""
    nodes = o.nodes or len(inventory.nodes)
    least = 1 if o.layouts else 2
    if not least <= nodes <= len(inventory.nodes):
        raise ValueError(f"--nodes: {nodes} is not possible; allowed {least} to {len(inventory.nodes)} (the cluster's "
                         "nodes)" + ("" if o.layouts else ": an all-reduce needs two (with --layouts: 1 or more)"))
    inv = inventory.first(nodes)
    profile = get_profile(inv.profile)
    machine, pin, notes = machine_for(inventory, nodes)
    layout = plan_layout(machine, backend=profile.backend, ranks_per_node=1, pin=pin)
    job_id = job_id or new_job_id()
    output_dir = f"{inventory.shared_output_root or DEFAULT_OUTPUT_ROOT}/bench-{job_id}"
    venv = venv_dir(profile)
    args = bench_args(o, f"{output_dir}/bench.json")
    program = [f"{venv}/bin/python", "-m", "training.bench", *args]
    launch = plan_launch(flavour=profile.launcher, job_id=job_id, hosts=[n.name for n in inv.nodes],
                         master_addr=inv.master.private_address, layout=layout, program=program, venv=venv,
                         run_as_root=inv.user == "root")
    return JobPlan(inventory=inv, layout=layout, launch=launch, training_args=tuple(args), output_dir=output_dir,
                   notes=tuple(notes) + layout.notes)


def layout_candidates(machine, backend: str) -> list[int]:
    """Ranks per node worth timing on `machine`: 1, one per socket, 2 and 4 per socket, where the node has the
    cores (cluster/job/layout.py's plan_layout accepts them)."""
    found = []
    for ranks in sorted({1, machine.sockets, 2 * machine.sockets, 4 * machine.sockets}):
        try:
            plan_layout(machine, backend=backend, ranks_per_node=ranks, pin=False)
        except LayoutError:
            continue
        found.append(ranks)
    return found


def layout_request(o: BenchOptions, nodes: int, ranks_per_node: int, python: str,
                   shared_root: str | None = None) -> tuple[RunRequest, str]:
    """(the run request of one layout run, the command that writes the offline demo's data first): the built-in
    job on the demo's data with the demo's model (or `o.model`), `o.batch` per rank, `o.steps` + 1 steps,
    `o.seq_len` tokens, eager, no evaluation (only the steps are timed), `ranks_per_node` ranks per node.
    `shared_root`: the nodes' shared output root, where the demo's model is made once (as fab train's)."""
    demo = synthetic_data("qa", None, python, shared_root)
    data = demo.options
    _, extra = parse_extra([*SYNTHETIC_ARGS[demo.task], "--max_seq_length", str(o.seq_len),
                            "--doc_stride", str(max(1, o.seq_len // 4))])
    job = BuiltinJob(task=demo.task, model=data["model"] if o.model == SYNTHETIC_MODEL else o.model,
                     train_file=data["train_file"], batch_size=o.batch, max_steps=o.steps + 1, compile="off",
                     extra=tuple({arg.flag: arg for arg in extra}.values()))  # the bench's seq len, not the demo's
    return RunRequest(new_job_id(), nodes, job, layout=LayoutRequest(ranks_per_node=ranks_per_node)), demo.prepare


def plan_layout_runs(inventory: Inventory, o: BenchOptions) -> tuple[str, list[JobPlan]]:
    """(the node's machine name, one launch of the real job per candidate layout), each `o.steps` + 1 steps of
    the offline demo (or `o.model` on its data) at `o.batch` per rank, eager, on the first `o.nodes` nodes."""
    nodes = o.nodes or len(inventory.nodes)
    machine = machine_for(inventory, nodes)[0]
    profile = get_profile(inventory.profile)
    plans = []
    for ranks in layout_candidates(machine, profile.backend):
        request, write_demo = layout_request(o, nodes, ranks, f"{venv_dir(profile)}/bin/python",
                                             inventory.shared_output_root)
        plans.append(replace(plan(request, inventory), prepare=(write_demo,)))
    return machine.name, plans


def layout_choice(machine: str, plans: list[JobPlan], step_s: list[float], batch: int, created: str
                  ) -> calib.LayoutChoice:
    """The calibration's layout block from each layout run's mean step (same order as `plans`)."""
    return calib.LayoutChoice(machine=machine, nodes=len(plans[0].launch.hosts), batch=batch, created=created,
                              step_s={p.layout.ranks_per_node: s for p, s in zip(plans, step_s)})


def calibration_from(figures: dict, inventory: Inventory, *, link: str = "", measured_type: str = "",
                     created: float | None = None) -> calib.Calibration:
    """The calibration of `inventory`'s cluster from training/bench.py's figures; `measured_type`: the instance
    type it measured, where the backend names one (AWS's), else "" (the CPU model and cores say)."""
    data = {**figures, "version": calib.VERSION, "cluster": inventory.name, "kind": inventory.kind,
            "instance_type": measured_type,
            "link": link, "ranks_per_node": 1,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created))}
    return calib.from_mapping(data, "fab bench")


def render_table(cal: calib.Calibration) -> str:
    """What `fab bench` prints: compute per node count, then each all-reduce."""
    lines = [f"cluster {cal.cluster} ({cal.kind}; {cal.link or 'link not limited'}), backend {cal.backend}, "
             f"CPU {cal.cpu or 'unknown'}",
             f"model {cal.model} ({cal.params} params), batch {cal.batch}, seq {cal.seq_len}, "
             f"DDP buckets {cal.bucket_mb:g} MB",
             f"{'nodes':>5}  {'samples/s/node':>14}  {'fp32 ms':>8}  {'fp32 Gbit/s':>11}  {'bf16 ms':>8}  "
             f"{'bf16 Gbit/s':>11}  {'latency us':>10}"]
    for n in sorted(set(cal.compute) | set(cal.allreduce)):
        fits = cal.allreduce.get(n, {})
        fp32, bf16 = fits.get("fp32"), fits.get("bf16")

        def cell(fit, what):
            if fit is None:
                return "-"
            return f"{fit.seconds * 1e3:.1f}" if what == "ms" else f"{fit.gbps:.3f}"

        latency = f"{fp32.latency_s * 1e6:.0f}" if fp32 else "-"
        rate = f"{cal.compute[n]:.1f}" if n in cal.compute else "-"
        lines.append(f"{n:>5}  {rate:>14}  {cell(fp32, 'ms'):>8}  {cell(fp32, 'g'):>11}  {cell(bf16, 'ms'):>8}  "
                     f"{cell(bf16, 'g'):>11}  {latency:>10}")
    if cal.compile:
        c = cal.compile
        lines.append(f"compile (one node): step {c['eager_step_s'] * 1e3:.1f} ms eager, "
                     f"{c['compiled_step_s'] * 1e3:.1f} ms compiled, {c['compile_s']:.1f} s to compile")
    if cal.layout:
        lay = cal.layout
        lines.append(f"layouts (the job on {lay.nodes} node(s) of {lay.machine}, batch {lay.batch} per rank):")
        lines.append(f"{'ranks/node':>10}  {'step ms':>8}  {'samples/s/node':>14}")
        for r in sorted(lay.step_s):
            mark = "  fastest" if r == lay.ranks_per_node else ""
            lines.append(f"{r:>10}  {lay.step_s[r] * 1e3:>8.1f}  {lay.samples_per_s(r):>14.1f}{mark}")
    noisy = calib.noisy_counts(cal)
    if noisy:
        lines.append(f"not stable: at {', '.join(map(str, noisy))} node(s) it measured more samples/s per node than "
                     f"one node alone ({cal.compute[1]:.1f}), which is noise; rerun with more --steps and --repeats "
                     "(fab plan flags such figures)")
    return "\n".join(lines)
