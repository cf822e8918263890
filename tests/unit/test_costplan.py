"""The plan table (pure) and the `fab plan` task end to end with a given price (no AWS)."""

import copy
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
                flows_per_rank=1, placement_group=False, on_demand=False, hourly_usd=5.0, region="us-east-1",
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


def test_fab_plan_placement_group_is_a_flag_with_a_no_form():
    from invoke.parser import Parser, ParserContext

    from node_setup.cost_tasks import plan

    def arguments():
        task = copy.copy(plan)
        task.help = dict(plan.help)  # get_arguments() pops the help texts it uses
        return {a.name: a for a in task.get_arguments()}

    def parsed(*argv):
        context = ParserContext(name="plan", args=arguments().values())
        return Parser(contexts=[context]).parse_argv(["plan", *argv])[0].args["placement_group"].value

    assert parsed() is True
    assert parsed("--no-placement-group") is False
    assert parsed("--placement-group") is True
    assert "--no-placement-group" in arguments()["placement_group"].help


def test_fab_plan_placement_group_doubles_the_per_flow_bandwidth(tmp_path, monkeypatch):
    from node_setup.cost_tasks import build_plan

    monkeypatch.chdir(tmp_path)
    with_pg, header_pg, _, _ = build_plan(**_plan_args(placement_group=True))
    without, header, _, _ = build_plan(**_plan_args(placement_group=False))
    assert "in placement group" in header_pg and "no placement group" in header
    four = {r.nodes: r.prediction.run_seconds for r in without}[4]
    assert {r.nodes: r.prediction.run_seconds for r in with_pg}[4] < four
    with pytest.raises(ValueError, match=r"--placement-group: 'false' is not allowed; give --placement-group or "
                                         r"--no-placement-group"):
        build_plan(**_plan_args(placement_group="false"))


def test_fab_plan_notes_when_the_stack_disagrees_about_the_placement_group(tmp_path, monkeypatch):
    import base64

    from cluster.spec import ClusterSpec
    from node_setup import cost_tasks

    key = "ssh-ed25519 " + base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(32)).decode()
    spec = ClusterSpec.from_config({"publicKey": key, "adminCidrs": ["203.0.113.0/24"], "placementGroup": False},
                                   stack="dev", region="us-east-1")
    monkeypatch.setattr(cost_tasks, "_stack_defaults", lambda stack: (spec, ""))
    _, header, _, notes = cost_tasks.build_plan(**_plan_args(placement_group=True))
    assert "in placement group" in header  # the flag decides
    assert any("placementGroup false" in n and "add --no-placement-group" in n for n in notes)
    _, _, _, notes = cost_tasks.build_plan(**_plan_args(placement_group=False))
    assert not any("placementGroup" in n for n in notes)


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
