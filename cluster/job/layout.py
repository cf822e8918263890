"""How the training ranks sit on one node: ranks per node, threads per rank, CCL workers, pinning.

The rule (docs/design.md, "The flow"): one rank per socket by default; each rank owns a domain
of physical cores; with the `ccl` backend the first cores of a domain run the oneCCL workers
(`CCL_WORKER_AFFINITY`) and the rest run the rank's OpenMP threads (`I_MPI_PIN_DOMAIN`,
`OMP_NUM_THREADS`); never more threads than the physical cores of the domain. tcmalloc is
preloaded. Every number can be overridden and every override is checked here, with a message that
names the setting, the value and what is allowed.

CPU numbering: Linux on EC2 (and on most two-socket Xeons) numbers the first hardware thread of
every physical core first, socket by socket (socket 0 cores 0..n-1, socket 1 cores n..2n-1), and
the hyper-thread siblings after all of them. Domains therefore use logical CPU ids equal to the
physical core ids, so each OpenMP thread gets a whole core (the recipe's `KMP_HW_SUBSET=1T`).

Pure: no I/O. `launch.py` turns a Layout into the environment of each rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cluster.stack.catalog import InstanceType
from cluster.node.profiles import TCMALLOC_PATH

# oneCCL workers per rank with the ccl backend: the recipe ran 2 per rank on Sapphire Rapids and
# the Hugging Face multi-CPU guide 1 per rank on a 24-core socket; 1 when a domain is small.
DEFAULT_CCL_WORKERS = 2
SMALL_DOMAIN_CORES = 8
# Nodes with at most this many physical cores get MPI ranks that sleep instead of busy-polling
# (I_MPI_WAIT_MODE=1): on a 2-core machine polling made a benchmark 20x slower (docs/design.md,
# "The local cluster").
SMALL_NODE_CORES = 4
# Intel OpenMP (libiomp5, used by the IPEX profile): one thread per core, packed; short spin.
KMP_AFFINITY = "granularity=fine,compact,1,0"
KMP_BLOCKTIME = "1"


class LayoutError(ValueError):
    """An impossible or contradictory layout setting; the message says what is allowed."""


@dataclass(frozen=True)
class RankSlot:
    """What one rank on a node owns. Core ids are logical CPU ids of first hardware threads."""

    local_rank: int
    sockets: tuple[int, ...]  # sockets the domain touches
    compute_cores: tuple[int, ...]  # where the rank's OpenMP threads run
    ccl_cores: tuple[int, ...] = ()  # where its oneCCL workers run

    @property
    def cores(self) -> tuple[int, ...]:
        return tuple(sorted(self.ccl_cores + self.compute_cores))

    @property
    def mask(self) -> str:
        """Hex CPU mask of the compute cores, as I_MPI_PIN_DOMAIN's explicit mask list wants."""
        bits = 0
        for core in self.compute_cores:
            bits |= 1 << core
        return hex(bits)


@dataclass(frozen=True)
class Layout:
    machine: str
    sockets: int
    physical_cores: int
    backend: str
    ranks_per_node: int
    threads_per_rank: int
    ccl_workers: int  # per rank; 0 unless the backend is ccl
    slots: tuple[RankSlot, ...]
    pin: bool = True
    preload: tuple[str, ...] = (TCMALLOC_PATH,)
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def used_cores(self) -> int:
        return sum(len(s.cores) for s in self.slots)

    @property
    def idle_cores(self) -> int:
        return self.physical_cores - self.used_cores

    @property
    def small_node(self) -> bool:
        return self.physical_cores <= SMALL_NODE_CORES

    def pin_domain(self) -> str:
        """I_MPI_PIN_DOMAIN's explicit form: one mask per local rank, in local rank order."""
        return "[" + ",".join(s.mask for s in self.slots) + "]"

    def ccl_worker_affinity(self) -> str:
        """CCL_WORKER_AFFINITY: worker i of local rank j runs on entry j * workers + i."""
        return ",".join(str(c) for s in self.slots for c in s.ccl_cores)

    def rank_env(self) -> dict[str, str]:
        """The environment every rank gets (the same on every node; MPI picks the domain)."""
        env = {"OMP_NUM_THREADS": str(self.threads_per_rank)}
        if self.pin:
            env["I_MPI_PIN"] = "1"
            env["I_MPI_PIN_DOMAIN"] = self.pin_domain()
            env["KMP_AFFINITY"] = KMP_AFFINITY
            env["KMP_BLOCKTIME"] = KMP_BLOCKTIME
        else:
            env["I_MPI_PIN"] = "0"
        if self.backend == "ccl":
            env["CCL_WORKER_COUNT"] = str(self.ccl_workers)
            if self.pin:
                env["CCL_WORKER_AFFINITY"] = self.ccl_worker_affinity()
        if self.preload:
            env["LD_PRELOAD"] = ":".join(self.preload)
        return env

    def describe(self) -> list[str]:
        """Human lines for `fab train --dry-run` and the job log."""
        lines = [
            f"machine: {self.machine} ({self.sockets} socket(s), {self.physical_cores} physical cores)",
            f"ranks per node: {self.ranks_per_node}; threads per rank: {self.threads_per_rank}; "
            f"CCL workers per rank: {self.ccl_workers}; idle cores: {self.idle_cores}",
        ]
        for s in self.slots:
            where = "pinned" if self.pin else "not pinned (cores shown are the share, not a binding)"
            ccl = f", CCL workers on {_ranges(s.ccl_cores)}" if s.ccl_cores else ""
            lines.append(f"  local rank {s.local_rank}: socket(s) {','.join(map(str, s.sockets))}, "
                         f"threads on cores {_ranges(s.compute_cores)}{ccl} ({where})")
        lines += [f"note: {n}" for n in self.notes]
        return lines


def _ranges(cores: tuple[int, ...]) -> str:
    """0,1,2,3,8 -> '0-3,8'."""
    runs: list[list[int]] = []  # [first, last] of each run of consecutive cores
    for core in sorted(cores):
        if runs and runs[-1][1] == core - 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(first) if first == last else f"{first}-{last}" for first, last in runs)


def _domains(machine: InstanceType, ranks: int) -> list[tuple[int, ...]]:
    """Split the node's physical cores into `ranks` equal, contiguous, socket-aligned domains."""
    sockets, per_socket = machine.sockets, machine.cores_per_socket
    socket_cores = [tuple(range(s * per_socket, (s + 1) * per_socket)) for s in range(sockets)]
    if ranks % sockets == 0:  # one or more ranks per socket
        per_rank = per_socket // (ranks // sockets)
        return [cores[i * per_rank:(i + 1) * per_rank]
                for cores in socket_cores for i in range(ranks // sockets)]
    if sockets % ranks == 0:  # a rank spans several whole sockets
        span = sockets // ranks
        return [sum(socket_cores[r * span:(r + 1) * span], ()) for r in range(ranks)]
    per_rank = machine.physical_cores // ranks  # uneven: contiguous chunks across sockets
    return [tuple(range(r * per_rank, (r + 1) * per_rank)) for r in range(ranks)]


def plan_layout(machine: InstanceType, *, backend: str, ranks_per_node: int | None = None,
                threads_per_rank: int | None = None, ccl_workers: int | None = None,
                pin: bool = True, preload: tuple[str, ...] = (TCMALLOC_PATH,)) -> Layout:
    """The rank layout of one node of type `machine` for a DDP `backend` (`gloo` or `ccl`).

    `None` means the default; any given value is validated against the machine.
    """
    what = (f"{machine.name} ({machine.sockets} socket(s) x {machine.cores_per_socket} "
            f"physical cores = {machine.physical_cores})")
    if machine.sockets < 1 or machine.physical_cores < machine.sockets:
        raise LayoutError(f"machine {machine.name!r}: {machine.sockets} socket(s) and "
                          f"{machine.physical_cores} physical cores cannot hold a rank; describe the "
                          "node with sockets >= 1 and physical_cores >= sockets")
    if backend not in ("gloo", "ccl"):
        raise LayoutError(f"backend: {backend!r} is not supported; allowed: ccl, gloo")

    ranks = machine.sockets if ranks_per_node is None else ranks_per_node
    if not isinstance(ranks, int) or isinstance(ranks, bool) or not 1 <= ranks <= machine.physical_cores:
        raise LayoutError(f"ranks per node: {ranks!r} is not possible on {what}; allowed 1 to "
                          f"{machine.physical_cores} (default {machine.sockets}, one per socket)")
    notes: list[str] = []
    if ranks % machine.sockets and machine.sockets % ranks:
        notes.append(f"{ranks} ranks do not divide {machine.sockets} sockets evenly: some ranks "
                     "straddle a socket boundary (slower memory access)")
    domains = _domains(machine, ranks)
    domain_size = len(domains[0])
    if domain_size * ranks < machine.physical_cores:
        notes.append(f"{machine.physical_cores - domain_size * ranks} core(s) left idle so that "
                     "every rank gets the same number of cores")

    if backend != "ccl":
        if ccl_workers:
            raise LayoutError(f"CCL workers: {ccl_workers} given, but the {backend!r} backend has no "
                              "CCL workers; leave it unset or use the intel profile (ccl backend)")
        workers = 0
    elif ccl_workers is None:
        workers = DEFAULT_CCL_WORKERS if domain_size >= SMALL_DOMAIN_CORES else 1
        if domain_size < 2:
            workers = 0
            notes.append("each rank has a single core: no core left for a CCL worker, so oneCCL "
                         "runs its worker on the compute core")
    else:
        workers = ccl_workers
        if not isinstance(workers, int) or isinstance(workers, bool) or not 0 <= workers < domain_size:
            raise LayoutError(f"CCL workers: {workers!r} per rank leave no core for training threads "
                              f"in a {domain_size}-core rank domain on {what} with {ranks} rank(s) per "
                              f"node; allowed 0 to {domain_size - 1}")

    most_threads = domain_size - workers
    threads = most_threads if threads_per_rank is None else threads_per_rank
    if not isinstance(threads, int) or isinstance(threads, bool) or not 1 <= threads <= most_threads:
        raise LayoutError(
            f"threads per rank: {threads!r} is more than a rank can have on {what} with {ranks} "
            f"rank(s) per node ({domain_size} cores per rank, {workers} of them for CCL workers); "
            f"allowed 1 to {most_threads}: never more threads than physical cores")

    sockets_of = {c: c // machine.cores_per_socket for c in range(machine.physical_cores)}
    slots = tuple(
        RankSlot(local_rank=i,
                 sockets=tuple(sorted({sockets_of[c] for c in cores})),
                 ccl_cores=tuple(cores[:workers]),
                 compute_cores=tuple(cores[workers:workers + threads]))
        for i, cores in enumerate(domains))
    return Layout(machine=machine.name, sockets=machine.sockets, physical_cores=machine.physical_cores,
                  backend=backend, ranks_per_node=ranks, threads_per_rank=threads, ccl_workers=workers,
                  slots=slots, pin=pin, preload=tuple(p for p in preload if p), notes=tuple(notes))


def machine_from_lscpu(text: str, name: str = "probed") -> InstanceType:
    """An InstanceType from `lscpu -p=CPU,CORE,SOCKET` output (for nodes the catalog does not know)."""
    cores: set[tuple[int, int]] = set()
    sockets: set[int] = set()
    cpus = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(",")
        if len(parts) < 3 or not all(p.strip().isdigit() for p in parts[:3]):
            raise LayoutError(f"lscpu output: cannot read line {line!r}; expected 'CPU,CORE,SOCKET' "
                              "numbers (run `lscpu -p=CPU,CORE,SOCKET`)")
        cpus += 1
        core, socket = int(parts[1]), int(parts[2])
        sockets.add(socket)
        cores.add((socket, core))
    if not cores:
        raise LayoutError("lscpu output: no CPU lines found (run `lscpu -p=CPU,CORE,SOCKET`)")
    from cluster.stack.catalog import custom
    return custom(name, sockets=len(sockets), physical_cores=len(cores), vcpus=cpus)
