"""How close a run gets to the CPU's limit: model FLOPs per sample, a node's peak FLOP/s, MFU (pure).

Model FLOPs (what the model needs, not what the kernels happen to do): a transformer encoder's
training step costs 6 FLOPs per matmul parameter per token (2 forward, 4 backward) plus, per layer,
attention's two sequence-by-sequence matmuls (QK^T and AV: 4 x seq x hidden per token forward,
12 x seq x hidden with backward). Embedding tables are lookups, not matmuls, and are left out
(Kaplan et al. 2020, "Scaling laws", section 2.1; Chowdhery et al. 2022, PaLM, appendix B).
The 4 backward FLOPs are 2 for the activations' gradient and 2 for the weights' own: a frozen
weight (LoRA's base model) costs 2 forward and 2 backward (the gradient still flows through it to
the adapters below), a trained one (every weight of a full fine-tune, LoRA's adapters) all 6.

A node's peak: physical cores x clock x FLOPs per cycle per core of the precision in use:

    bf16 with AMX (amx_bf16)            1024  one TMUL, 16 x 32 bf16 products per cycle
    bf16 with AVX512-BF16 (avx512_bf16)  128  VDPBF16PS, 32 products (64 FLOPs) on 2 FMA ports
    fp32 with AVX-512 (avx512f)           64  16 lanes x 2 (FMA) x 2 ports
    fp32 with AVX2 (avx2)                 32  8 lanes x 2 (FMA) x 2 ports

(Intel 64 and IA-32 Architectures Optimization Reference Manual: AMX and AVX-512 chapters.) The
cores and clock come from the catalog for a known instance type (AWS's all-core turbo) and from
`lscpu` on the node otherwise (CPU max MHz, else the current clock); every Peak names its source.
Intel CPUs run AVX-512 and AMX below the all-core turbo, so the peak is an upper bound and MFU a
lower one. bf16 on a CPU with neither bf16 instruction set is emulated in fp32: its fp32 peak.
AMD's Zen 4 runs a 512-bit instruction as two halves on 256-bit units: half the AVX-512 figures
for a CPU whose lscpu says AuthenticAMD (AMD Zen 4 software optimization guide).

MFU = achieved model FLOP/s per node / the node's peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

from cluster.stack.catalog import InstanceType

# (FLOPs per cycle per core, the flag that gives it) per precision, fastest first within a dtype
AMX_BF16 = "bf16 (AMX)"
AVX512_BF16 = "bf16 (AVX512-BF16)"
FP32_AVX512 = "fp32 (AVX-512)"
FP32_AVX2 = "fp32 (AVX2)"
FP32_SSE = "fp32 (SSE)"
FLOPS_PER_CYCLE = {AMX_BF16: 1024, AVX512_BF16: 128, FP32_AVX512: 64, FP32_AVX2: 32, FP32_SSE: 8}
HALVED_ON_AMD = (AVX512_BF16, FP32_AVX512)
_FLAG = {AMX_BF16: "amx_bf16", AVX512_BF16: "avx512_bf16", FP32_AVX512: "avx512f", FP32_AVX2: "avx2"}

# 6 FLOPs per matmul parameter per token in training (2 forward, 2 for the activations' gradient, 2 for the
# weight's own gradient); 12 per layer x seq x hidden for attention
TRAIN_FLOPS_PER_PARAM_TOKEN = 6
FROZEN_FLOPS_PER_PARAM_TOKEN = 4
TRAIN_ATTENTION_FLOPS = 12

# the line the job logs as it trains (training/callbacks.py) and `fab status` finds in the log
PROGRESS_MARKER = "model FLOP/s per node"
_PROGRESS_RE = re.compile(r"model FLOP/s per node ([0-9.]+) TFLOP/s, MFU ([0-9.]+)% of ([0-9.]+) TFLOP/s")


def train_flops_per_sample(matmul_params: int, layers: int, hidden: int, seq_len: float,
                           trained_params: int | None = None) -> float:
    """Model FLOPs of one training sample (forward and backward) of `seq_len` tokens; `trained_params`: how many
    of the matmul parameters get a gradient (None: all; LoRA: the adapters', the rest frozen)."""
    trained = matmul_params if trained_params is None else trained_params
    if matmul_params <= 0 or layers < 0 or hidden < 0 or seq_len <= 0 or not 0 <= trained <= matmul_params:
        raise ValueError(f"model FLOPs: parameters {matmul_params!r} ({trained!r} trained), layers {layers!r}, "
                         f"hidden {hidden!r} and sequence length {seq_len!r} must be positive")
    return (TRAIN_FLOPS_PER_PARAM_TOKEN * trained * seq_len
            + FROZEN_FLOPS_PER_PARAM_TOKEN * (matmul_params - trained) * seq_len
            + TRAIN_ATTENTION_FLOPS * layers * hidden * seq_len * seq_len)


def precision(bf16: bool, flags: Iterable[str]) -> str:
    """The precision the matmuls run in: bf16 on AMX or AVX512-BF16, else fp32 on the widest vectors."""
    have = set(flags)
    order = (AMX_BF16, AVX512_BF16, FP32_AVX512, FP32_AVX2) if bf16 else (FP32_AVX512, FP32_AVX2)
    return next((p for p in order if _FLAG[p] in have), FP32_SSE)


def catalog_flags(instance: InstanceType) -> set[str]:
    """The catalog's facts as CPU flags (every catalogued Xeon has AVX-512)."""
    return {"avx2", "avx512f"} | ({"amx_bf16"} if instance.amx else set()) | (
        {"avx512_bf16"} if instance.avx512_bf16 else set())


@dataclass(frozen=True)
class Peak:
    cores: int  # physical cores of one node
    ghz: float
    flops_per_cycle: int  # per core
    precision: str
    source: str

    @property
    def flops_per_s(self) -> float:
        return self.cores * self.ghz * 1e9 * self.flops_per_cycle

    def describe(self) -> str:
        return (f"{self.flops_per_s / 1e12:.2f} TFLOP/s {self.precision}: {self.cores} cores x {self.ghz:.2f} GHz x "
                f"{self.flops_per_cycle} FLOPs/cycle ({self.source})")

    def as_dict(self) -> dict:
        return {"peak_flops_per_s": round(self.flops_per_s), "cores": self.cores, "ghz": round(self.ghz, 3),
                "flops_per_cycle": self.flops_per_cycle, "precision": self.precision, "source": self.source}


def peak_from_catalog(instance: InstanceType, bf16: bool) -> Peak | None:
    """The peak of a catalogued instance type (None when the catalog has no clock for it)."""
    if not instance.clock_ghz:
        return None
    p = precision(bf16, catalog_flags(instance))
    return Peak(instance.physical_cores, instance.clock_ghz, FLOPS_PER_CYCLE[p], p,
                f"catalog: {instance.name}, {instance.processor}, all-core turbo")


def parse_lscpu(text: str) -> dict[str, str]:
    """`lscpu`'s `Name: value` lines as a mapping (LC_ALL=C output)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def _number(text: str | None) -> float:
    try:
        return float(text) if text else 0.0
    except ValueError:
        return 0.0


def peak_from_lscpu(lscpu: str, bf16: bool, *, current_mhz: float = 0.0) -> Peak | None:
    """The peak of the machine `lscpu` described: sockets x cores per socket, CPU max MHz (else the
    model name's "@ x GHz", else `current_mhz`: /proc/cpuinfo's cpu MHz), the flags' precision.
    None when the cores or the clock cannot be told."""
    f = parse_lscpu(lscpu)
    cores = int(_number(f.get("Socket(s)")) * _number(f.get("Core(s) per socket")))
    mhz, where = _number(f.get("CPU max MHz")), "CPU max MHz"
    named = re.search(r"@\s*([0-9.]+)\s*GHz", f.get("Model name", ""))
    if not mhz and named:
        mhz, where = float(named.group(1)) * 1000, "the model name's clock"
    if not mhz and current_mhz > 0:
        mhz, where = current_mhz, "the current clock (no max MHz)"
    if cores <= 0 or mhz <= 0:
        return None
    p = precision(bf16, f.get("Flags", "").split())
    per_cycle = FLOPS_PER_CYCLE[p]
    if f.get("Vendor ID") == "AuthenticAMD" and p in HALVED_ON_AMD:
        per_cycle, where = per_cycle // 2, where + ", AMD: 512-bit operations on 256-bit units"
    return Peak(cores, mhz / 1000, per_cycle, p,
                f"lscpu: {f.get('Model name') or 'unknown CPU'}, {cores} physical cores, {where}")


def mfu(achieved_flops_per_s: float, peak: Peak | None) -> float | None:
    """Model FLOPs utilisation (0..1), None without a peak."""
    if peak is None or peak.flops_per_s <= 0:
        return None
    return achieved_flops_per_s / peak.flops_per_s


def progress_line(step: int, flops_per_s_per_node: float, peak: Peak | None) -> str | None:
    """The line the job logs while it trains, None without a peak."""
    ratio = mfu(flops_per_s_per_node, peak)
    if ratio is None or peak is None:
        return None
    return (f"step {step}: {PROGRESS_MARKER} {flops_per_s_per_node / 1e12:.3f} TFLOP/s, MFU {ratio * 100:.2f}% "
            f"of {peak.flops_per_s / 1e12:.3f} TFLOP/s ({peak.precision}; {peak.source})")


def last_progress(log: str) -> Mapping[str, float | str] | None:
    """The newest progress line in a job's log: {"tflops_per_node", "mfu", "peak_tflops", "line"}."""
    for line in reversed(log.splitlines()):
        match = _PROGRESS_RE.search(line)
        if match:
            achieved, percent, peak = (float(g) for g in match.groups())
            return {"tflops_per_node": achieved, "mfu": percent / 100, "peak_tflops": peak,
                    "line": line[line.find("step "):].strip() if "step " in line else line.strip()}
    return None
