"""The instance catalog: the supported types, internally consistent, with the facts the time model
rests on (network, EFA, cores; docs/design.md, "The time model") and AWS's family ratios (memory
per vCPU)."""

from __future__ import annotations

import pytest

from cluster.stack import catalog

REQUIRED = ["r7iz.metal-16xl", "r7iz.metal-32xl", "c6i.16xlarge", "c6i.32xlarge", "c7i.metal-24xl",
            "c7i.metal-48xl", "m7i.48xlarge", "c6in.32xlarge", "c7i.48xlarge", "r7i.48xlarge", "m7i.metal-48xl",
            "r7i.metal-48xl", "m6i.16xlarge", "r6i.16xlarge", "m6i.32xlarge", "r6i.32xlarge"]

# docs/design.md, "The time model": bandwidth and EFA per type.
NETWORK = {
    "r7iz.metal-16xl": (25, False), "c6i.16xlarge": (25, False),
    "r7iz.metal-32xl": (50, True), "c6i.32xlarge": (50, True), "c7i.metal-48xl": (50, True),
    "m7i.48xlarge": (50, True), "c6in.32xlarge": (200, True),
}
# AWS sizes every family at a fixed memory per vCPU: compute 2, general purpose 4, memory 8 GiB.
GIB_PER_VCPU = {"c6i": 2, "c6in": 2, "c7i": 2, "m7i": 4, "r7iz": 8, "r7i": 8, "m6i": 4, "r6i": 8}
SAPPHIRE_RAPIDS = ("r7iz", "c7i", "m7i", "r7i")


def family(name: str) -> str:
    return name.split(".")[0]


def test_every_type_the_issue_names_is_known():
    assert set(REQUIRED) <= set(catalog.known_types())
    assert catalog.known_types() == sorted(catalog.known_types())


@pytest.mark.parametrize("name", REQUIRED)
def test_core_figures_add_up(name):
    t = catalog.lookup(name)
    assert t.name == name
    assert t.sockets * t.cores_per_socket == t.physical_cores
    assert t.threads_per_core == 2 and t.vcpus == 2 * t.physical_cores
    assert t.memory_gib == GIB_PER_VCPU[family(name)] * t.vcpus


@pytest.mark.parametrize("name", list(NETWORK))
def test_network_and_efa_match_the_recorded_facts(name):
    t = catalog.lookup(name)
    assert (t.network_gbps, t.efa) == NETWORK[name]


def test_layouts_read_on_live_instances():
    # Read with lscpu on live instances (the layouts of the recipe this project started from), so not marked as
    # inferred.
    r7iz, c6i = catalog.lookup("r7iz.metal-16xl"), catalog.lookup("c6i.16xlarge")
    assert (r7iz.sockets, r7iz.cores_per_socket, r7iz.sockets_inferred) == (2, 16, False)
    assert (c6i.sockets, c6i.cores_per_socket, c6i.sockets_inferred) == (1, 32, False)


@pytest.mark.parametrize("name", REQUIRED)
def test_bf16_only_on_sapphire_rapids_and_metal_by_name(name):
    t = catalog.lookup(name)
    spr = family(name) in SAPPHIRE_RAPIDS
    assert t.amx is spr and t.avx512_bf16 is spr and t.bf16 is spr
    assert t.bare_metal is (".metal" in name)


def test_unknown_type_and_custom_description():
    assert catalog.lookup("x9z.huge") is None
    custom = catalog.custom("x9z.huge", sockets=2, physical_cores=48)
    assert (custom.sockets, custom.cores_per_socket, custom.vcpus, custom.bf16) == (2, 24, 96, False)
    assert catalog.custom("y", 1, 8, vcpus=8, bf16=True).threads_per_core == 1


# AWS's families of one generation and size: the same processor and core count, memory 2/4/8 GiB per vCPU.
SIBLINGS = [("c7i.48xlarge", "m7i.48xlarge", "r7i.48xlarge"), ("c7i.metal-48xl", "m7i.metal-48xl", "r7i.metal-48xl"),
            ("c6i.32xlarge", "c6in.32xlarge", "m6i.32xlarge", "r6i.32xlarge"),
            ("c6i.16xlarge", "m6i.16xlarge", "r6i.16xlarge")]


@pytest.mark.parametrize("siblings", SIBLINGS, ids=lambda s: s[0])
def test_the_c_m_and_r_types_of_one_size_are_one_shape_and_no_other_type_is(siblings):
    for name in siblings:
        assert catalog.same_shape(name) == sorted(siblings)


def test_a_shape_differs_in_cores_bf16_or_bare_metal():
    shapes = {catalog.shape(catalog.CATALOG[n]) for n in ("c7i.48xlarge", "c7i.metal-48xl", "c6i.32xlarge",
                                                          "r7iz.metal-32xl", "c7i.metal-24xl")}
    assert len(shapes) == 5
    assert catalog.same_shape("x9z.huge") == []


@pytest.mark.parametrize("name, typical, budget", [
    ("r7iz.metal-16xl", 540, 2400),  # Intel 7th generation metal: the measured median 531 s, rounded up
    ("c7i.metal-48xl", 540, 2400),
    ("c5.metal", 800, 2400),  # Intel 5th generation metal: 792 s
    ("z1d.metal", 800, 2400),
    ("m6g.metal", 800, 2400),  # Graviton 6th: 751 s
    ("x.metal", 800, 2400),  # no generation in the name: the older metal's time
    ("", 800, 2400),  # a type not known: treated as metal, as the wait budget is
    ("c6i.16xlarge", 120, 900),  # virtual: about two minutes
    ("m7i.large", 120, 900),
])
def test_a_boot_is_priced_at_its_typical_time_and_waited_for_up_to_its_budget(name, typical, budget):
    assert (catalog.typical_boot_s(name), catalog.boot_wait_s(name)) == (typical, budget)
    assert catalog.typical_boot_s(name) < catalog.boot_wait_s(name)


def test_a_type_s_generation_is_the_digits_after_its_family_letters():
    assert [catalog.generation(n) for n in ("r7iz.metal-16xl", "c5.metal", "m7i.48xlarge", "x.metal")] == [7, 5, 7,
                                                                                                            None]
