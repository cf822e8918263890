"""What this CPU and process can do: bf16 instructions, physical cores, allocator, OpenMP runtime.

Parsing functions take the text of /proc files so they can be tested on any machine's copy.
"""

from __future__ import annotations

import os
from pathlib import Path

BF16_FLAGS = (("amx_bf16", "AMX-BF16"), ("avx512_bf16", "AVX512-BF16"))
REPORTED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _first_cpuinfo_value(name: str, cpuinfo: str | None) -> str | None:
    """The value of the first `name : value` line of /proc/cpuinfo (or the text given), or None."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value
    return None


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The flags of the first processor in /proc/cpuinfo (all cores of a node share them)."""
    return frozenset((_first_cpuinfo_value("flags", cpuinfo) or "").split())


def cpu_model(cpuinfo: str | None = None) -> str:
    value = _first_cpuinfo_value("model name", cpuinfo)
    return "unknown" if value is None else value.strip()


def bf16_support(flags: frozenset[str]) -> tuple[bool, str]:
    """(supported, why): bf16 autocast pays off only with AMX-BF16 or AVX512-BF16 instructions."""
    for flag, name in BF16_FLAGS:
        if flag in flags:
            return True, f"CPU has {name}"
    return False, "CPU has neither AMX-BF16 nor AVX512-BF16"


def ipex_bf16_support(flags: frozenset[str]) -> bool:
    """Whether IPEX's oneDNN kernels run bf16 on this CPU (AVX512BW/VL/DQ or AVX-NE-CONVERT); where
    they do not, ipex.optimize(dtype=bfloat16) refuses (training/accelerators.py)."""
    return "avx_ne_convert" in flags or {"avx512bw", "avx512vl", "avx512dq"} <= flags


def physical_cores(cpuinfo: str | None = None) -> int:
    """Distinct (physical id, core id) pairs; os.cpu_count() when the file does not say."""
    text = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    cores: set[tuple[str, str]] = set()
    physical = core = None
    for line in text.splitlines() + [""]:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "physical id":
            physical = value.strip()
        elif key == "core id":
            core = value.strip()
        elif not key:
            if core is not None:
                cores.add((physical or "0", core))
            physical = core = None
    return len(cores) or (os.cpu_count() or 1)


def loaded_libraries(maps: str | None = None) -> frozenset[str]:
    """Base names of the shared libraries mapped into this process (/proc/self/maps)."""
    text = _read("/proc/self/maps") if maps is None else maps
    names = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 6 and parts[-1].startswith("/"):
            names.add(os.path.basename(parts[-1]))
    return frozenset(names)


def allocator(libraries: frozenset[str]) -> str:
    """The malloc actually in use: what LD_PRELOAD asked for only counts if it got loaded."""
    for prefix, name in (("libtcmalloc", "tcmalloc"), ("libjemalloc", "jemalloc"),
                         ("libmimalloc", "mimalloc")):
        if any(lib.startswith(prefix) for lib in libraries):
            return name
    return "glibc malloc"


def openmp_runtime(libraries: frozenset[str]) -> str:
    for prefix, name in (("libiomp5", "Intel OpenMP (libiomp5)"), ("libgomp", "GNU OpenMP (libgomp)")):
        if any(lib.startswith(prefix) for lib in libraries):
            return name
    return "none loaded"


def on_ec2() -> bool:
    """True on an EC2 instance (Nitro: DMI vendor; Xen: hypervisor uuid). Reads files only."""
    vendor = _read("/sys/devices/virtual/dmi/id/sys_vendor") + _read("/sys/devices/virtual/dmi/id/board_vendor")
    return "Amazon EC2" in vendor or _read("/sys/hypervisor/uuid").lower().startswith("ec2")
