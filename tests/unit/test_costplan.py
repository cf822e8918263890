"""The plan table (pure) and the `fab plan` task end to end with a given price (no AWS)."""

import json

import pytest

from cluster import costplan
from cluster import timemodel as tm
from cluster.models import lookup_dataset, lookup_model

WORK = tm.Workload(params=lookup_model("distilbert").params, samples=lookup_dataset("squad").train_features,
                   gradient_bytes=2)


def _rows(price=6.0, gbps=25):
    rate = tm.throughput_from_single_node_time(26 * 60, WORK.samples)
    return costplan.plan(WORK, tm.Network(gbps, placement_group=False), [1, 2, 4, 8], rate, price, ranks_per_node=2)


def test_cost_is_nodes_times_price_times_run_time():
    for row in _rows():
        assert row.hourly_usd == pytest.approx(row.nodes * 6.0)
        assert row.total_usd == pytest.approx(row.hourly_usd * row.prediction.run_seconds / 3600)


def test_cheapest_and_fastest():
    rows = _rows()
    assert costplan.fastest(rows).nodes == 8
    assert costplan.cheapest(rows).nodes == 1  # efficiency < 1 and start-up paid per node: one node is cheapest
    text = costplan.render_table(rows, price_source="spot $6/h, test")
    assert "cheapest: 1 node(s)" in text and "fastest:  8 node(s)" in text and "price: spot $6/h, test" in text


def test_json_has_one_object_per_node_count_with_the_documented_keys():
    data = json.loads(costplan.render_json(_rows()))
    assert [d["nodes"] for d in data] == [1, 2, 4, 8]
    assert all(set(d) == {"nodes", "epoch_seconds", "efficiency", "hourly_usd", "total_usd"} for d in data)
    assert data[0]["efficiency"] == 1.0


@pytest.mark.parametrize("text,expected", [("1,2,4,8", [1, 2, 4, 8]), ("4", [4]), ("8, 2,2", [2, 8])])
def test_parse_node_counts(text, expected):
    assert costplan.parse_node_counts(text) == expected


@pytest.mark.parametrize("text", ["", "0,2", "two", "1;2"])
def test_parse_node_counts_rejects(text):
    with pytest.raises(ValueError, match="--nodes"):
        costplan.parse_node_counts(text)


def _plan_args(**over):
    args = dict(nodes="1,2,4", instance_type="r7iz.metal-16xl", model="distilbert-base-uncased", dataset="squad",
                epochs=1.0, single_node_time="", params="", samples=0, batch=32, profile="intel", ranks_per_node=0,
                flows_per_rank=1, placement_group="false", on_demand=False, hourly_usd=5.0, region="us-east-1",
                stack="")
    args.update(over)
    return args


def test_fab_plan_builds_the_recipe_table(tmp_path, monkeypatch):
    from node_setup.cost_tasks import build_plan

    monkeypatch.chdir(tmp_path)  # no Pulumi stack file here: the task's own defaults
    rows, header, source, notes = build_plan(**_plan_args())
    four = next(r for r in rows if r.nodes == 4)
    assert abs(four.prediction.run_seconds - 450) / 450 < 0.15
    assert "2 ranks/node" in header and "no placement group" in header and "2-byte gradients" in header
    assert source.endswith("given with --hourly-usd") and notes[0].startswith("throughput: ")


def test_fab_plan_single_node_time_and_params_override(tmp_path, monkeypatch):
    from node_setup.cost_tasks import build_plan

    monkeypatch.chdir(tmp_path)
    rows, header, _, notes = build_plan(**_plan_args(single_node_time="1h", params="350M", model="my-model"))
    assert rows[0].prediction.run_seconds == pytest.approx(3600, abs=2)
    assert "350M params" in header and "single-node time 1h 00m 00s (given)" in notes[0]


def test_fab_plan_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from node_setup.plan_plot import plot_plan

    path = plot_plan(_rows(), str(tmp_path / "plan.png"), "test")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
