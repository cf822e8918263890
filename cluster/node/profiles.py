"""The software profiles a node can run, as data (docs/design.md, "Profiles").

A profile is a pinned, tested set: the OS packages, the pip pins, the packages that come from an
index of their own (IndexPin), the DDP backend the training job initialises and the MPI that
launches it. Installing, checking, the image's build and the Pulumi setup step all read these pins, so
changing one here builds a new image.

No index is ever added next to PyPI (`--extra-index-url`): pip takes the best candidate of all
indexes, so anyone who publishes a package of the same name on PyPI (`oneccl_bind_pt` is not
there) could win. A package of another index is installed from that index alone, by exact
version, without dependencies (`--index-url <its index> --no-deps`), with the sha256 of its
files where the profile gives them (pip's hash-checking mode); everything else, the index-only
packages' dependencies included, comes from PyPI alone, with the index-only ones already installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INTEL_WHEEL_INDEX = "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/"

_EXACT_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*\Z")
_INDEX_URL = re.compile(r"(https://[A-Za-z0-9.-]+(:[0-9]+)?|file://)/[A-Za-z0-9._~/+-]*\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")

TCMALLOC_PATH = "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"
# The tcmalloc package was renamed in Ubuntu 24.04 (64-bit time_t transition); setup installs the
# first name that the node's apt knows.
TCMALLOC_PACKAGES = ("libgoogle-perftools4t64", "libgoogle-perftools4")


@dataclass(frozen=True)
class IndexPin:
    """A package taken from its own index only, never from PyPI: `pin` is an exact `name==version`,
    installed with `--index-url index_url --no-deps`. `hashes`: the sha256 of every file the index
    may serve for it (pip then refuses any other file); empty where they are not known."""

    pin: str
    index_url: str
    hashes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not _EXACT_PIN.match(self.pin):
            raise ValueError(f"index pin: {self.pin!r} is not allowed; allowed: an exact NAME==VERSION")
        if not _INDEX_URL.match(self.index_url):
            raise ValueError(f"index pin {self.pin}: index {self.index_url!r} is not allowed; allowed: an https:// "
                             "(or file://) URL of letters, digits and ._~/+-")
        for digest in self.hashes:
            if not _SHA256.match(digest):
                raise ValueError(f"index pin {self.pin}: hash {digest!r} is not allowed; allowed: 64 lower-case "
                                 "hex digits (a sha256)")

    @property
    def name(self) -> str:
        return self.pin.partition("==")[0]

    def requirement(self) -> str:
        """The pin as a requirements-file line, with its hashes (`torch==2.13.0 --hash=sha256:...`)."""
        return " ".join((self.pin, *(f"--hash=sha256:{h}" for h in self.hashes)))


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    pip_pins: tuple[str, ...]
    index_pins: tuple[IndexPin, ...]  # those of pip_pins that come from their own index only
    backend: str  # torch.distributed backend the job initialises
    launcher: str  # key of cluster.job.launch's MPI flavours
    apt_packages: tuple[str, ...] = ("python3-venv", "python3-dev", "numactl")
    min_root_volume_gib: int = 40
    end_of_life: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for index_pin in self.index_pins:
            if index_pin.pin not in self.pip_pins:
                raise ValueError(f"profile {self.name}: index pin {index_pin.pin} is not one of its pip pins")

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
                         *(f"{p.requirement()} from {p.index_url}" for p in self.index_pins)))


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
                "peft==0.21.2",  # --task causal-lm --peft lora
                "datasets==5.2.0",
                "impi-rt==2021.18.1",  # 2021.19 needs a libfabric that PyPI lacks
                "boto3>=1.35",
            ),
            # torch's CPU build; its index also carries third-party packages, so it is never an
            # extra index either. No hashes: PyTorch's index cannot be read from where this was written.
            index_pins=(IndexPin("torch==2.13.0", TORCH_CPU_INDEX),),
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
            # IPEX is Intel's own on PyPI; the oneCCL bindings are only on Intel's index, so a package
            # of that name on PyPI would be someone else's. No hashes: neither index could be read
            # from where this was written.
            index_pins=(IndexPin("torch==2.8.0", TORCH_CPU_INDEX),
                        IndexPin("oneccl_bind_pt==2.8.0", INTEL_WHEEL_INDEX)),
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
