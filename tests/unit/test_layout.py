"""The rank layout for every catalog instance type, its invariants, overrides and their errors."""

import pytest

from cluster.stack import catalog
from cluster.job.layout import LayoutError, machine_from_lscpu, plan_layout
from cluster.node.profiles import TCMALLOC_PATH

TYPES = [catalog.CATALOG[name] for name in catalog.known_types()]
BACKENDS = ("gloo", "ccl")


def _cores_of_mask(mask: str) -> set[int]:
    bits = int(mask, 16)
    return {i for i in range(bits.bit_length()) if bits >> i & 1}


@pytest.mark.parametrize("machine", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
def test_default_is_one_rank_per_socket_with_every_core_used(machine, backend):
    layout = plan_layout(machine, backend=backend)
    assert layout.ranks_per_node == machine.sockets
    workers = layout.ccl_workers
    assert (workers > 0) == (backend == "ccl")
    assert layout.threads_per_rank == machine.cores_per_socket - workers
    assert layout.threads_per_rank * layout.ranks_per_node + workers * layout.ranks_per_node == machine.physical_cores
    assert layout.idle_cores == 0
    for slot in layout.slots:  # each rank stays on its own socket
        assert slot.sockets == (slot.local_rank,)


@pytest.mark.parametrize("machine", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_never_more_threads_than_physical_cores_and_domains_disjoint(machine, backend, ranks):
    layout = plan_layout(machine, backend=backend, ranks_per_node=ranks)
    assert layout.ranks_per_node == ranks
    assert (layout.threads_per_rank + layout.ccl_workers) * ranks <= machine.physical_cores
    seen: set[int] = set()
    for slot in layout.slots:
        cores = set(slot.cores)
        assert len(slot.compute_cores) == layout.threads_per_rank
        assert len(slot.ccl_cores) == layout.ccl_workers
        assert not cores & seen, "two ranks share a core"
        assert all(0 <= c < machine.physical_cores for c in cores), "a core beyond the physical ones"
        assert _cores_of_mask(slot.mask) == set(slot.compute_cores)
        seen |= cores
    env = layout.rank_env()
    assert env["OMP_NUM_THREADS"] == str(layout.threads_per_rank)
    assert env["LD_PRELOAD"] == TCMALLOC_PATH
    domains = env["I_MPI_PIN_DOMAIN"].strip("[]").split(",")
    assert len(domains) == ranks
    if backend == "ccl":
        affinity = [int(c) for c in env["CCL_WORKER_AFFINITY"].split(",")]
        assert len(affinity) == ranks * layout.ccl_workers
        assert not set(affinity) & set().union(*(_cores_of_mask(m) for m in domains))
    else:
        assert "CCL_WORKER_COUNT" not in env


def test_recipe_node_two_ranks_on_r7iz_16xl():
    layout = plan_layout(catalog.lookup("r7iz.metal-16xl"), backend="ccl")
    env = layout.rank_env()
    assert env["I_MPI_PIN_DOMAIN"] == "[0xfffc,0xfffc0000]"
    assert env["CCL_WORKER_AFFINITY"] == "0,1,16,17"
    assert env["CCL_WORKER_COUNT"] == "2"
    assert env["OMP_NUM_THREADS"] == "14"


def test_one_rank_on_a_two_socket_node_spans_both_sockets():
    layout = plan_layout(catalog.lookup("c6i.32xlarge"), backend="gloo", ranks_per_node=1)
    assert layout.threads_per_rank == 64
    assert layout.slots[0].sockets == (0, 1)
    assert layout.rank_env()["I_MPI_PIN_DOMAIN"] == "[" + hex(2**64 - 1) + "]"


def test_uneven_ranks_are_noted_and_leave_idle_cores():
    layout = plan_layout(catalog.lookup("r7iz.metal-16xl"), backend="gloo", ranks_per_node=3)
    assert layout.threads_per_rank == 10
    assert layout.idle_cores == 2
    assert any("straddle" in n for n in layout.notes)
    assert any("idle" in n for n in layout.notes)


def test_threads_override_fewer_is_allowed_more_is_refused():
    machine = catalog.lookup("c6i.16xlarge")
    assert plan_layout(machine, backend="gloo", threads_per_rank=8).threads_per_rank == 8
    with pytest.raises(LayoutError) as err:
        plan_layout(machine, backend="gloo", threads_per_rank=33)
    message = str(err.value)
    assert "threads per rank: 33" in message and "allowed 1 to 32" in message and "c6i.16xlarge" in message
    with pytest.raises(LayoutError, match="allowed 1 to 30"):
        plan_layout(machine, backend="ccl", threads_per_rank=31)


def test_ranks_override_bounds():
    machine = catalog.lookup("c7i.metal-24xl")
    assert plan_layout(machine, backend="gloo", ranks_per_node=48).threads_per_rank == 1
    for bad in (0, 49, -1):
        with pytest.raises(LayoutError, match=r"ranks per node: .* allowed 1 to 48"):
            plan_layout(machine, backend="gloo", ranks_per_node=bad)


def test_ccl_workers_override_and_errors():
    machine = catalog.lookup("r7iz.metal-16xl")
    layout = plan_layout(machine, backend="ccl", ccl_workers=4)
    assert layout.threads_per_rank == 12
    assert layout.rank_env()["CCL_WORKER_AFFINITY"] == "0,1,2,3,16,17,18,19"
    with pytest.raises(LayoutError, match="allowed 0 to 15"):
        plan_layout(machine, backend="ccl", ccl_workers=16)
    with pytest.raises(LayoutError, match="gloo.*no CCL workers"):
        plan_layout(machine, backend="gloo", ccl_workers=2)


def test_small_domains_get_one_ccl_worker():
    layout = plan_layout(catalog.lookup("r7iz.metal-16xl"), backend="ccl", ranks_per_node=8)
    assert layout.ccl_workers == 1 and layout.threads_per_rank == 3


def test_unpinned_layout_sets_no_masks_and_preload_can_be_dropped():
    layout = plan_layout(catalog.custom("local", 1, 2), backend="gloo", pin=False, preload=())
    env = layout.rank_env()
    assert env == {"OMP_NUM_THREADS": "2", "I_MPI_PIN": "0"}
    assert layout.small_node


def test_unknown_backend_is_refused():
    with pytest.raises(LayoutError, match="allowed: ccl, gloo"):
        plan_layout(catalog.lookup("c6i.16xlarge"), backend="nccl")


def test_describe_names_cores():
    lines = plan_layout(catalog.lookup("r7iz.metal-16xl"), backend="ccl").describe()
    assert "local rank 1: socket(s) 1, threads on cores 18-31, CCL workers on 16-17 (pinned)" in lines[3]


def test_machine_from_lscpu_counts_physical_cores_and_sockets():
    text = "# The following is the parsable format\n# CPU,Core,Socket\n"
    # 2 sockets x 2 cores x 2 threads, siblings numbered after all first threads
    rows = [(0, 0, 0), (1, 1, 0), (2, 2, 1), (3, 3, 1), (4, 0, 0), (5, 1, 0), (6, 2, 1), (7, 3, 1)]
    text += "".join(f"{c},{k},{s}\n" for c, k, s in rows)
    machine = machine_from_lscpu(text)
    assert (machine.sockets, machine.physical_cores, machine.vcpus) == (2, 4, 8)
    with pytest.raises(LayoutError, match="lscpu"):
        machine_from_lscpu("garbage line\n")
