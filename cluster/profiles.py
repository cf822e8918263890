"""The software profiles a node can run, as data (docs/design.md, "Profiles").

A profile is a pinned, tested set: the OS packages, the pip pins with their indexes, the DDP
backend the training job initialises and the MPI that launches it. Installing, checking and the
Pulumi setup step all read these pins, so changing one here re-runs setup and re-bakes the image.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INTEL_WHEEL_INDEX = "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/"

TCMALLOC_PATH = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
# The tcmalloc package was renamed in Ubuntu 24.04 (64-bit time_t transition); setup installs the
# first name that the node's apt knows.
TCMALLOC_PACKAGES = ("libgoogle-perftools4t64", "libgoogle-perftools4")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    pip_pins: tuple[str, ...]
    extra_index_urls: tuple[str, ...]
    backend: str  # torch.distributed backend the job initialises
    launcher: str  # key of cluster.launch's MPI flavours
    apt_packages: tuple[str, ...] = ("python3-venv", "python3-dev", "numactl")
    min_root_volume_gib: int = 40
    end_of_life: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def pin_of(self, package: str) -> str | None:
        """The pinned version of `package` (`torch` -> `2.13.0`), or None if not pinned."""
        for pin in self.pip_pins:
            name, _, version = pin.partition("==")
            if name.lower() == package.lower():
                return version
        return None

    def fingerprint(self) -> str:
        """A stable text of everything that decides what setup installs (a change re-bakes)."""
        return "|".join((self.name, *self.apt_packages, *TCMALLOC_PACKAGES, *self.pip_pins,
                         *self.extra_index_urls))


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            name="stock",
            description="current CPU PyTorch; AMX/bf16 through oneDNN; gloo over Intel MPI (impi-rt)",
            pip_pins=(
                "torch==2.13.0",
                "transformers==5.23.0",
                "accelerate==1.15.0",
                "datasets==5.2.0",
                "impi-rt==2021.18.1",  # 2021.19 needs a libfabric that PyPI lacks
                "boto3>=1.35",
            ),
            extra_index_urls=(TORCH_CPU_INDEX,),
            backend="gloo",
            launcher="intel-mpi",
        ),
        Profile(
            name="intel",
            description="the recipe's stack: IPEX 2.8 + oneCCL bindings 2.8 (end-of-life), ccl backend",
            pip_pins=(
                "torch==2.8.0",
                "intel-extension-for-pytorch==2.8.0",
                "oneccl_bind_pt==2.8.0",
                # transformers 4.57 removed use_ipex and 5.1 the ccl backend; the job wires both
                # itself, and these are the last releases tested with torch 2.8.
                "transformers==4.56.2",
                "accelerate==1.10.1",
                "datasets==4.0.0",
                "boto3>=1.35",
            ),
            extra_index_urls=(TORCH_CPU_INDEX, INTEL_WHEEL_INDEX),
            backend="ccl",
            launcher="intel-mpi-oneccl",
            min_root_volume_gib=60,
            end_of_life=True,
            notes=("IPEX and oneccl_bind_pt stopped at 2.8 and get no fixes",),
        ),
    )
}

DEFAULT_PROFILE = "stock"
NODE_ROOT = "/opt/xeon-cluster"


def venv_dir(profile: Profile) -> str:
    """Where a node keeps the profile's Python environment (outside any home directory)."""
    return f"{NODE_ROOT}/venv-{profile.name}"


def get_profile(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(
            f"softwareProfile: unknown profile {name!r}; allowed: {', '.join(sorted(PROFILES))}"
        ) from None
