"""The pure time model: table-driven cases, the recipe's four-node figure, durations."""

import math

import pytest

from cluster.cost import timemodel as tm
from cluster import durations
from cluster.cost.models import lookup_dataset, lookup_model, parse_count

DISTIL = lookup_model("distilbert-base-uncased").params
SQUAD = lookup_dataset("squad").train_features


def _rate(single_node_seconds=26 * 60):
    return tm.throughput_from_single_node_time(single_node_seconds, SQUAD)


@pytest.mark.parametrize("gbps,pg,grad_bytes,params", [
    (25, False, 2, DISTIL), (25, True, 4, DISTIL), (50, True, 4, 110_000_000), (200, False, 2, 335_000_000),
    (1, False, 4, 1_000_000_000),
])
def test_one_node_has_efficiency_one_and_runs_the_measured_time(gbps, pg, grad_bytes, params):
    work = tm.Workload(params=params, samples=SQUAD, gradient_bytes=grad_bytes)
    one = tm.predict(work, tm.Network(gbps, placement_group=pg), 1, _rate(), ranks_per_node=2)
    assert one.efficiency == pytest.approx(1.0)
    assert one.comm_s == 0
    # 26 min measured = start-up + one epoch (to within the last partial batch)
    assert one.run_seconds == pytest.approx(26 * 60, abs=1.0)


@pytest.mark.parametrize("nodes", [2, 3, 4, 8, 16])
@pytest.mark.parametrize("grad_bytes,params", [(2, DISTIL), (4, DISTIL), (4, 335_000_000)])
@pytest.mark.parametrize("overlap", [0.0, 0.5, 1.0])
def test_more_bandwidth_never_predicts_a_slower_time(nodes, grad_bytes, params, overlap):
    work = tm.Workload(params=params, samples=SQUAD, gradient_bytes=grad_bytes)
    times = []
    for gbps in (1, 5, 10, 25, 50, 100, 200, 400):
        for pg in (False, True):
            pred = tm.predict(work, tm.Network(gbps, placement_group=pg), nodes, _rate(),
                              ranks_per_node=2, overlap=overlap)
            times.append((pred.node_gbps, pred.epoch_seconds))
    times.sort()
    for (bw_a, t_a), (bw_b, t_b) in zip(times, times[1:]):
        if bw_b > bw_a:
            assert t_b <= t_a + 1e-9, (bw_a, t_a, bw_b, t_b)


@pytest.mark.parametrize("gbps,pg,flows,ranks,expected", [
    (25, False, 1, 1, 5),    # one flow outside a placement group: 5 Gbps cap
    (25, True, 1, 1, 10),    # inside one: 10 Gbps
    (25, False, 1, 2, 10),   # two ranks, two flows
    (25, True, 4, 2, 25),    # eight flows capped by the instance's 25 Gbps
    (200, True, 4, 2, 80),
    (50, False, 1, 2, 10),
])
def test_node_bandwidth_is_the_smaller_of_instance_and_flow_caps(gbps, pg, flows, ranks, expected):
    assert tm.Network(gbps, placement_group=pg, flows_per_rank=flows).node_gbps(ranks) == expected


def test_ring_allreduce_moves_2_n_minus_1_over_n_of_the_gradient():
    grad = 132_725_760  # DistilBERT bf16 gradients
    no_latency = dict(latency_s=0.0)
    t2 = tm.allreduce_seconds(grad, 2, 10, **no_latency)
    t4 = tm.allreduce_seconds(grad, 4, 10, **no_latency)
    assert tm.allreduce_seconds(grad, 1, 10) == 0
    assert t2 == pytest.approx(grad * 8 / (10e9 * tm.WIRE_EFFICIENCY))  # 2(1)/2 = 1
    assert t4 / t2 == pytest.approx(1.5)  # 2(3)/4


@pytest.mark.parametrize("params,buckets,hidden_share", [
    (135_618, 1, 0.0),  # the offline demo's 0.5 MB gradient: one bucket, ready only when backward ends
    (DISTIL, 11, tm.DEFAULT_OVERLAP),  # 265 MB in 25 MB buckets: the default share hides
])
def test_only_the_buckets_before_the_last_hide_under_backward(params, buckets, hidden_share):
    work = tm.Workload(params=params, samples=SQUAD, batch_per_rank=16)
    pred = tm.predict(work, tm.Network(25), 2, 1e-3)  # backward far longer than the all-reduce: no cap from it
    assert pred.buckets == buckets
    assert 1 - pred.exposed_comm_s / pred.comm_s == pytest.approx(hidden_share)


@pytest.mark.parametrize("overlap,pg", [(0.0, False), (tm.DEFAULT_OVERLAP, False), (1.0, False),
                                        (tm.DEFAULT_OVERLAP, True)])
def test_recipe_four_node_figure_within_15_percent(overlap, pg):
    """26 min on one r7iz.metal-16xl -> measured 7 min 30 s on four (2 ranks/node, batch 32 per rank,
    global batch 256, IPEX bf16 so 2-byte gradients, no placement group in the hand-made recipe).
    Holds for any overlap assumption between none and full, and with or without a placement group."""
    work = tm.Workload(params=DISTIL, samples=SQUAD, batch_per_rank=32, gradient_bytes=2)
    pred = tm.predict(work, tm.Network(25, placement_group=pg), 4, _rate(), ranks_per_node=2, overlap=overlap)
    assert pred.steps == math.ceil(SQUAD / 256)
    measured = 7 * 60 + 30
    assert abs(pred.run_seconds - measured) / measured < 0.15, durations.format_duration(pred.run_seconds)


def test_default_throughput_for_the_recipe_matches_its_measurement():
    rate = tm.default_throughput("r7iz.metal-16xl", "distilbert-base-uncased", "squad")
    assert rate.source.startswith("measured")
    assert rate.samples_per_s == pytest.approx(_rate())
    c6i = tm.default_throughput("c6i.16xlarge", "distilbert-base-uncased", "squad")
    assert c6i.samples_per_s < rate.samples_per_s
    assert tm.default_throughput("c7i.metal-48xl", "bert-base-uncased", "squad").source.startswith("estimate")
    with pytest.raises(ValueError, match="--single-node-time"):
        tm.default_throughput("r7iz.metal-16xl", "gpt2", "squad")


@pytest.mark.parametrize("text,seconds", [
    ("26m", 1560), ("1h30m", 5400), ("45s", 45), ("1h2m3s", 3723), ("90", 90), ("3.5h", 12600),
    (" 7m30s ", 450), ("2H", 7200),
])
def test_parse_duration(text, seconds):
    assert durations.parse_duration(text, "--single-node-time") == seconds


@pytest.mark.parametrize("text", ["", "abc", "1h30", "m", "30m1h", "-5m", "0s", "1d"])
def test_parse_duration_rejects_with_the_allowed_forms(text):
    with pytest.raises(ValueError, match="--single-node-time"):
        durations.parse_duration(text, "--single-node-time")


def test_format_duration():
    assert durations.format_duration(450) == "7m 30s"
    assert durations.format_duration(3723) == "1h 02m 03s"
    assert durations.format_duration(45.4) == "45s"


def test_model_sizes_and_counts():
    assert lookup_model("distilbert/distilbert-base-uncased").params == pytest.approx(66e6, rel=0.01)
    assert lookup_model("bert-base").params == pytest.approx(110e6, rel=0.01)
    assert parse_count("66M") == 66_000_000 and parse_count("1.3B") == 1_300_000_000 and parse_count(5) == 5
    with pytest.raises(ValueError, match="--params"):
        lookup_model("gpt-7")
    with pytest.raises(ValueError, match="params"):
        parse_count("lots")


@pytest.mark.parametrize("bad", [dict(params=0), dict(samples=-1), dict(epochs=0), dict(batch_per_rank=0)])
def test_workload_rejects_nonpositive(bad):
    args = dict(params=DISTIL, samples=SQUAD) | bad
    with pytest.raises(ValueError, match=next(iter(bad))):
        tm.Workload(**args)
