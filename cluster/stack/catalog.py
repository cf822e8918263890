"""Facts about the EC2 instance types the toolkit knows.

Sources, per figure:
- vCPUs, memory, network bandwidth, EFA support and bare metal: the AWS "Amazon EC2 instance type
  specifications" pages (docs.aws.amazon.com/ec2/latest/instancetypes/: co.html for C6i/C6in/C7i,
  mo.html for R7iz, gp.html for M7i), which are also what `describe_instance_types` returns
  (VCpuInfo, MemoryInfo, NetworkInfo.NetworkPerformance, NetworkInfo.EfaSupported, BareMetal).
- physical cores: "Default CPU cores" on the same pages (DefaultCores in the API).
- sockets: not published by AWS; taken from the processor model and `lscpu` on the instance.
  r7iz.metal-16xl (2 x 16) and c6i.16xlarge (1 x 32, a half of a 2-socket c6i.32xlarge) were read
  with `lscpu` for the Hugging Face/Intel multi-CPU fine-tuning recipe this project started from;
  the others are the processor's core count per socket (Xeon 8375C Ice Lake: 32 cores; Xeon 8488C
  Sapphire Rapids: 48 cores; Xeon 6455B SPR: 32 cores) divided into the instance's cores. Rows
  marked `sockets_inferred=True` were not read on a live instance: override with config
  `coresPerSocket`/`sockets` if `lscpu` disagrees.
- AMX and AVX512-BF16: Sapphire Rapids (R7iz, C7i, M7i, R7i) has both; Ice Lake (C6i, C6in, M6i, R6i)
  has neither (Intel ARK; `lscpu` flags amx_bf16, avx512_bf16).
- clock_ghz: the all-core turbo frequency the AWS instance type pages state (R7iz 3.9 GHz, C7i and
  M7i/R7i 3.2 GHz, C6i, C6in, M6i and R6i 3.5 GHz); the peak FLOP/s of cluster/cost/flops.py multiply it in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    name: str
    sockets: int
    physical_cores: int
    vcpus: int
    memory_gib: int
    network_gbps: float
    efa: bool
    amx: bool
    avx512_bf16: bool
    bare_metal: bool
    processor: str
    sockets_inferred: bool = False
    clock_ghz: float = 0.0  # all-core turbo; 0: not known

    @property
    def cores_per_socket(self) -> int:
        return self.physical_cores // self.sockets

    @property
    def threads_per_core(self) -> int:
        return self.vcpus // self.physical_cores

    @property
    def bf16(self) -> bool:
        """The CPU runs bf16 matrix maths natively (AMX or AVX512-BF16)."""
        return self.amx or self.avx512_bf16


_SPR = "Intel Xeon Sapphire Rapids"
_ICX = "Intel Xeon Ice Lake (8375C)"

CATALOG: dict[str, InstanceType] = {
    t.name: t
    for t in (
        InstanceType("r7iz.metal-16xl", 2, 32, 64, 512, 25, False, True, True, True, _SPR + " (6455B)",
                     clock_ghz=3.9),
        InstanceType("r7iz.metal-32xl", 2, 64, 128, 1024, 50, True, True, True, True, _SPR + " (6455B)",
                     sockets_inferred=True, clock_ghz=3.9),
        InstanceType("c6i.16xlarge", 1, 32, 64, 128, 25, False, False, False, False, _ICX, clock_ghz=3.5),
        InstanceType("c6i.32xlarge", 2, 64, 128, 256, 50, True, False, False, False, _ICX,
                     sockets_inferred=True, clock_ghz=3.5),
        InstanceType("c6in.32xlarge", 2, 64, 128, 256, 200, True, False, False, False, _ICX,
                     sockets_inferred=True, clock_ghz=3.5),
        InstanceType("c7i.16xlarge", 1, 32, 64, 128, 25, False, True, True, False, _SPR + " (8488C)",
                     sockets_inferred=True, clock_ghz=3.2),
        InstanceType("c7i.metal-24xl", 1, 48, 96, 192, 37.5, False, True, True, True, _SPR + " (8488C)",
                     sockets_inferred=True, clock_ghz=3.2),
        InstanceType("c7i.metal-48xl", 2, 96, 192, 384, 50, True, True, True, True, _SPR + " (8488C)",
                     sockets_inferred=True, clock_ghz=3.2),
        InstanceType("m7i.48xlarge", 2, 96, 192, 768, 50, True, True, True, False, _SPR + " (8488C)",
                     sockets_inferred=True, clock_ghz=3.2),
        # The compute, general purpose and memory optimized siblings of one size: one shape (`shape`) with
        # the rows above, so a stack may list them together in instanceTypes.
        InstanceType("c7i.48xlarge", 2, 96, 192, 384, 50, True, True, True, False, _SPR + " (8488C)",
                     sockets_inferred=True, clock_ghz=3.2),
        InstanceType("r7i.48xlarge", 2, 96, 192, 1536, 50, True, True, True, False, _SPR + " (8488C)",
                     sockets_inferred=True, clock_ghz=3.2),
        InstanceType("m7i.metal-48xl", 2, 96, 192, 768, 50, True, True, True, True, _SPR + " (8488C)",
                     sockets_inferred=True, clock_ghz=3.2),
        InstanceType("r7i.metal-48xl", 2, 96, 192, 1536, 50, True, True, True, True, _SPR + " (8488C)",
                     sockets_inferred=True, clock_ghz=3.2),
        InstanceType("m6i.16xlarge", 1, 32, 64, 256, 25, False, False, False, False, _ICX,
                     sockets_inferred=True, clock_ghz=3.5),
        InstanceType("r6i.16xlarge", 1, 32, 64, 512, 25, False, False, False, False, _ICX,
                     sockets_inferred=True, clock_ghz=3.5),
        InstanceType("m6i.32xlarge", 2, 64, 128, 512, 50, True, False, False, False, _ICX,
                     sockets_inferred=True, clock_ghz=3.5),
        InstanceType("r6i.32xlarge", 2, 64, 128, 1024, 50, True, False, False, False, _ICX,
                     sockets_inferred=True, clock_ghz=3.5),
    )
}

# The memory per physical core every catalog type has at least (the compute optimized families' 2 GiB per
# vCPU): a type with less would be another memory class, whose ranks could not hold what the others' do.
MIN_GIB_PER_CORE = 4


@dataclass(frozen=True)
class Shape:
    """What one rank layout and one image need to be the same across instance types: sockets, physical
    cores and hardware threads, the memory class, the CPU's bf16 support (AMX, AVX512-BF16) and bare metal
    (one boot wait). Memory within the class, network bandwidth and price may differ."""
    sockets: int
    physical_cores: int
    vcpus: int
    memory_class: str
    amx: bool
    avx512_bf16: bool
    bare_metal: bool

    def words(self) -> str:
        bf16 = "AMX bf16" if self.amx else ("AVX512-BF16" if self.avx512_bf16 else "no bf16")
        metal = ", bare metal" if self.bare_metal else ""
        return (f"{self.sockets} x {self.physical_cores // self.sockets} cores, {self.vcpus} vCPUs, "
                f"{self.memory_class}, {bf16}{metal}")


def shape(t: InstanceType) -> Shape:
    memory = ("at least" if t.memory_gib >= MIN_GIB_PER_CORE * t.physical_cores else "under") + \
        f" {MIN_GIB_PER_CORE} GiB per core"
    return Shape(t.sockets, t.physical_cores, t.vcpus, memory, t.amx, t.avx512_bf16, t.bare_metal)


def same_shape(name: str) -> list[str]:
    """The catalog's types of `name`'s shape, itself included, by name ([] for a type it does not know)."""
    known = lookup(name)
    return sorted(t.name for t in CATALOG.values() if known and shape(t) == shape(known))


# How long a node of a type may take from launch until its sshd answers and its console lists its host keys:
# what the setup step waits for the master's SSH, the run supervisor for a replacement's host keys and
# `pulumi up`/`fab up` for the workers' group. Metal instances boot far slower than virtual ones ("AWS EC2
# metal instances can take over 20 minutes to start or restart": Canonical's cloud test library, which
# waits up to 40 minutes for them); AWS documents no bound.
BOOT_WAIT_S = 900
METAL_BOOT_WAIT_S = 2400


def is_metal(instance_type: str) -> bool:
    """A bare-metal type by its name (`.metal` in it), known to the catalog or not."""
    return ".metal" in instance_type


# How long a node of a type typically takes from launch until its sshd answers: what `fab plan` prices a boot at
# (the wait budgets above are the longest the program waits, the plan's worst case). Metal: medians a public CI
# team measured on 77 EC2 metal guests, launch to reachable after a power cycle: Intel 7th generation (c7i,
# m7i) 531 s, Intel 5th (c5, m5, z1d ...) 792 s, Graviton 6th 751 s, 7th 316 s; all of them from 202 to 820 s.
# So a metal type of generation 7 or later 540 s, an older or unknown one 800 s. Virtual: a cold launch reaches
# `running` in about 26 s, then the OS boots and cloud-init starts sshd: about two minutes, leaning long.
TYPICAL_BOOT_S = 120
METAL_TYPICAL_BOOT_S = 540  # generation >= METAL_FAST_GENERATION
OLD_METAL_TYPICAL_BOOT_S = 800
METAL_FAST_GENERATION = 7


def generation(instance_type: str) -> int | None:
    """A type's generation by its name: the digits after the family letters (`r7iz.metal-16xl`: 7; None when the
    name has none)."""
    found = re.match(r"[a-z]+(\d+)", instance_type)
    return int(found.group(1)) if found else None


def typical_boot_s(instance_type: str) -> int:
    """How long a node of this type typically takes to boot (a metal type, or one not known, by its generation:
    METAL_TYPICAL_BOOT_S from METAL_FAST_GENERATION on, OLD_METAL_TYPICAL_BOOT_S before or unknown)."""
    if not is_metal(instance_type) and instance_type:
        return TYPICAL_BOOT_S
    gen = generation(instance_type)
    return METAL_TYPICAL_BOOT_S if gen is not None and gen >= METAL_FAST_GENERATION else OLD_METAL_TYPICAL_BOOT_S


def boot_wait_s(instance_type: str) -> int:
    """How long a node of this type may take to boot (METAL_BOOT_WAIT_S for metal types, and for a type not
    known: the longer wait only costs time, the shorter one a node)."""
    return METAL_BOOT_WAIT_S if is_metal(instance_type) or not instance_type else BOOT_WAIT_S


def known_types() -> list[str]:
    return sorted(CATALOG)


def lookup(name: str) -> InstanceType | None:
    return CATALOG.get(name)


def custom(name: str, sockets: int, physical_cores: int, *, vcpus: int | None = None,
           network_gbps: float = 25, bf16: bool = False) -> InstanceType:
    """An instance type the catalog does not know, described by the user's own core counts."""
    return InstanceType(name, sockets, physical_cores, vcpus or physical_cores * 2, 0, network_gbps,
                        efa=False, amx=bf16, avx512_bf16=bf16, bare_metal=False,
                        processor="user-described", sockets_inferred=False)
