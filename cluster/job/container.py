"""What the training image installs, from the profile's own facts (cluster/node/profiles.py), for
docker/Dockerfile: `python3 -m cluster.job.container {apt|index-requirements|requirements|venv|tcmalloc} [PROFILE]`.

The image has what a node has after `fab setup`, minus what only mpirun over SSH needs (no
OpenSSH; the profile's MPI package stays, unused): the profile's OS packages, the first tcmalloc
package the base image's apt knows, the pinned Python packages (the index-only ones each from its
own index alone, then the rest from PyPI alone) in a venv at
the nodes' path, so the manifest's `<venv>/bin/torchrun` (cluster/job/k8s.py) is the same path on a
node and in a pod.
"""

from __future__ import annotations

import sys

from cluster.node.profiles import DEFAULT_PROFILE, TCMALLOC_PACKAGES, TCMALLOC_PATH, get_profile, venv_dir


def apt_packages(profile_name: str) -> list[str]:
    """The profile's OS packages (tcmalloc is chosen in the Dockerfile: the first of TCMALLOC_PACKAGES apt knows)."""
    return list(get_profile(profile_name).apt_packages)


def index_requirements(profile_name: str) -> str:
    """The index-only packages (cluster/node/profiles.py), one a line: `INDEX_URL REQUIREMENT [--hash=...]`;
    the Dockerfile installs each from its index alone (`--index-url`, `--no-deps`), first."""
    return "".join(f"{p.index_url} {p.requirement()}\n" for p in get_profile(profile_name).index_pins)


def requirements(profile_name: str) -> str:
    """A pip requirements file of the profile's pins, for PyPI alone (no index options: the
    index-only packages are installed by then, and pip keeps them)."""
    return "".join(f"{pin}\n" for pin in get_profile(profile_name).pip_pins)


def main(argv: list[str]) -> int:
    what, profile = (argv + [DEFAULT_PROFILE])[:2] if argv else ("", DEFAULT_PROFILE)
    answers = {
        "apt": lambda: "\n".join(apt_packages(profile)) + "\n",
        "tcmalloc-packages": lambda: "\n".join(TCMALLOC_PACKAGES) + "\n",
        "tcmalloc": lambda: TCMALLOC_PATH + "\n",
        "index-requirements": lambda: index_requirements(profile),
        "requirements": lambda: requirements(profile),
        "venv": lambda: venv_dir(get_profile(profile)) + "\n",
    }
    if what not in answers:
        print(f"usage: python3 -m cluster.job.container {{{'|'.join(answers)}}} [PROFILE]", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(answers[what]())
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
