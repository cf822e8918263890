"""The plan table (pure) and the `fab plan` task end to end with a given price (no AWS)."""

import copy
import json

import pytest

from cluster.cost import costplan, plan_options
from cluster.cost import timemodel as tm
from cluster.durations import format_duration
from cluster.cost.models import lookup_dataset, lookup_model
from tests.fab_run import ROOT

WORK = tm.Workload(params=lookup_model("distilbert").params, samples=lookup_dataset("squad").train_features,
                   gradient_bytes=2)


def _rows(price=6.0, gbps=25):
    rate = tm.throughput_from_single_node_time(26 * 60, WORK.samples)
    return costplan.plan(WORK, tm.Network(gbps, placement_group=False), [1, 2, 4, 8], rate, price, ranks_per_node=2)


def test_run_cost_is_nodes_times_price_times_run_time():
    for row in _rows():
        assert row.hourly_usd == pytest.approx(row.nodes * 6.0)
        assert row.run_usd == pytest.approx(row.hourly_usd * row.prediction.run_seconds / 3600)


def test_cheapest_and_fastest():
    rows = _rows()
    assert costplan.fastest(rows).nodes == 8
    assert costplan.cheapest(rows).nodes == 1  # efficiency < 1 and start-up paid per node: one node is cheapest
    text = costplan.render_table(rows, price_source="spot $6/h, test")
    assert "cheapest: 1 node(s)" in text and "fastest:  8 node(s)" in text and "price: spot $6/h, test" in text


def test_json_has_one_object_per_node_count_with_the_documented_keys():
    data = [row.as_json() for row in _rows()]
    assert [d["nodes"] for d in data] == [1, 2, 4, 8]
    assert all(set(d) == {"nodes", "instance_type", "market", "price_source", "epoch_seconds", "step_seconds",
                          "comm_seconds_per_step", "efficiency", "hourly_usd", "provisioning_seconds",
                          "provisioning_usd", "provisioning_from", "other_provisioning_seconds",
                          "other_provisioning_usd", "worst_provisioning_seconds", "worst_provisioning_usd",
                          "run_seconds", "run_usd", "idle_tail_seconds", "idle_tail_usd",
                          "total_usd", "compile_seconds", "on_demand_master_extra_usd",
                          "on_demand_master_total_usd"} for d in data)
    assert data[0]["efficiency"] == 1.0


@pytest.mark.parametrize("text,expected", [("1,2,4,8", [1, 2, 4, 8]), ("4", [4]), ("8, 2,2", [2, 8])])
def test_parse_node_counts(text, expected):
    assert plan_options.parse_node_counts(text) == expected


@pytest.mark.parametrize("text", ["", "0,2", "two", "1;2"])
def test_parse_node_counts_rejects(text):
    with pytest.raises(ValueError, match="--nodes"):
        plan_options.parse_node_counts(text)


def _plan(spec=None, kept_image="", kept_why="", **over):
    """(rows, inputs) of the pure plan for the recipe's case at $5/instance-hour."""
    options = dict(nodes="1,2,4", instance_type="r7iz.metal-16xl", profile="intel", placement_group=False)
    options.update(over)
    inputs = plan_options.plan_inputs(spec, plan_options.PlanOptions(**options), kept_image=kept_image,
                                      kept_why=kept_why)
    return costplan.plan_rows(inputs, costplan.Price(5.0, "spot", "given with --hourly-usd")), inputs


def test_fab_plan_builds_the_recipe_table():
    rows, inputs = _plan()
    four = next(r for r in rows if r.nodes == 4)
    assert abs(four.prediction.run_seconds - 450) / 450 < 0.15
    assert "2 ranks/node" in inputs.header and "no placement group" in inputs.header
    assert "2-byte gradients" in inputs.header and inputs.notes[0].startswith("throughput: ")


def test_fab_plan_task_uses_a_given_price_without_a_stack_file(tmp_path, monkeypatch):
    from node_setup.tasks.costs import build_plan

    monkeypatch.chdir(tmp_path)  # no Pulumi stack file here: the plan's own defaults
    rows, header, source, notes, _ = build_plan(plan_options.PlanOptions(nodes="1,4"), hourly_usd=5.0)
    assert [r.nodes for r in rows] == [1, 4] and source.endswith("given with --hourly-usd")
    assert "r7iz.metal-16xl" in header


def test_fab_plan_task_refuses_an_invalid_stack_file_instead_of_ignoring_it(tmp_path, monkeypatch):
    from invoke import Exit

    from node_setup.tasks.costs import build_plan

    monkeypatch.chdir(tmp_path)
    (tmp_path / "Pulumi.dev.yaml").write_text("config:\n  aws:region: us-east-1\n  xeon-cluster:workerCont: 3\n")
    with pytest.raises(Exit) as stopped:
        build_plan(plan_options.PlanOptions(), hourly_usd=5.0)
    assert stopped.value.code == 2 and "workerCont" in stopped.value.message


@pytest.mark.parametrize("over, message", [
    (dict(profile="intl"), "--profile: 'intl' is unknown; allowed: intel, stock"),
    (dict(epochs=float("nan")), "--epochs: nan is not allowed"),
    (dict(epochs=0.0), "--epochs: 0.0 is not allowed"),
    (dict(epochs=float("inf")), "--epochs: inf is not allowed"),
    (dict(batch=0), "--batch-size: 0 is not allowed"),
    (dict(flows_per_rank=float("nan")), "--flows-per-rank: nan is not allowed"),
    (dict(samples=-5), "--samples: -5 is not allowed"),
    (dict(samples=float("inf")), "--samples: inf is not allowed"),
    (dict(ranks_per_node=float("nan")), "--ranks-per-node: nan is not allowed"),
    (dict(instance_type="m5.large"), "--instance-type: 'm5.large' is not in the catalog"),
])
def test_plan_options_that_cannot_be_planned_are_named(over, message):
    with pytest.raises(ValueError) as refused:
        _plan(**over)
    assert message in str(refused.value)


def test_fab_plan_placement_group_is_a_flag_with_a_no_form():
    from invoke.parser import Parser, ParserContext

    from node_setup.tasks.costs import plan

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


def test_fab_plan_placement_group_doubles_the_per_flow_bandwidth():
    with_pg, inputs_pg = _plan(placement_group=True)
    without, inputs = _plan(placement_group=False)
    assert "in placement group" in inputs_pg.header and "no placement group" in inputs.header
    four = {r.nodes: r.prediction.run_seconds for r in without}[4]
    assert {r.nodes: r.prediction.run_seconds for r in with_pg}[4] < four
    with pytest.raises(ValueError, match=r"--placement-group: 'false' is not allowed; give --placement-group or "
                                         r"--no-placement-group"):
        _plan(placement_group="false")


def test_fab_plan_notes_when_the_stack_disagrees_about_the_placement_group():
    import base64

    from cluster.stack.spec import ClusterSpec

    key = "ssh-ed25519 " + base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(32)).decode()
    spec = ClusterSpec.from_config({"publicKey": key, "adminCidrs": ["203.0.113.0/24"], "placementGroup": False},
                                   stack="dev", region="us-east-1")
    _, inputs = _plan(spec, placement_group=True)
    assert "in placement group" in inputs.header  # the flag decides
    assert any("placementGroup false" in n and "add --no-placement-group" in n for n in inputs.notes)
    _, inputs = _plan(spec, placement_group=False)
    assert not any("placementGroup" in n for n in inputs.notes)


def test_fab_plan_single_node_time_and_params_override():
    rows, inputs = _plan(single_node_time="1h", params="350M", model="my-model")
    assert rows[0].prediction.run_seconds == pytest.approx(3600, abs=2)
    assert "350M params" in inputs.header and "single-node time 1h 00m 00s (given)" in inputs.notes[0]


def test_fab_plan_draws_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    from node_setup.plan_plot import plot_plan

    path = plot_plan(_rows(), str(tmp_path / "plan.png"), "test")
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


# --- the whole cost: provisioning, the run, the idle tail -----------------------------------------

# A first `pulumi up` by its steps (cluster/stack/lifecycle.py), with the image built apart: 1 min of resources, the
# build instance's boot (m7i.large, not metal), 10 min install, the snapshot of the profile's build volume (18 s per
# GiB: intel 60 GiB, stock 40), then every node's boot, 3 min cloud-init and a 30 s check on the master; from a kept
# image: the same without the build. A boot is priced at its type's typical time (9 min for a 7th-generation metal
# type, 2 min for a virtual one); the worst case takes every boot's wait budget (40 min metal, 15 others).
METAL_BOOT, VIRTUAL_BOOT = 9 * 60, 2 * 60
METAL_BUDGET, VIRTUAL_BUDGET = 40 * 60, 15 * 60


def _build_s(boot):
    return {"intel": boot + 600 + 18 * 60, "stock": boot + 600 + 18 * 40}  # billed by the build instance alone


BUILD_S, WORST_BUILD_S = _build_s(VIRTUAL_BOOT), _build_s(VIRTUAL_BUDGET)
BUILDER_USD = {p: seconds * 0.1008 / 3600 for p, seconds in BUILD_S.items()}  # m7i.large on demand, us-east-1
WORST_BUILDER_USD = {p: seconds * 0.1008 / 3600 for p, seconds in WORST_BUILD_S.items()}
KEPT_METAL_S, KEPT_METAL_MASTER_S = 60 + METAL_BOOT + 180 + 30, METAL_BOOT + 180 + 30  # 13m 30s
BAKE_METAL_S, BAKE_METAL_MASTER_S = KEPT_METAL_S + BUILD_S["intel"], KEPT_METAL_MASTER_S  # 43m 30s
WORST_MASTER_S = METAL_BUDGET + 180 + 30  # the master's part when every boot takes its budget


def test_provisioning_bills_the_master_through_the_first_up_and_each_worker_its_boot():
    rows, _ = _plan(nodes="1,4")  # r7iz.metal-16xl: metal, workers 9 min (40 at worst)
    one, four = rows
    assert one.provisioning_seconds == four.provisioning_seconds == BAKE_METAL_S and one.provisioning_from == "bake"
    assert one.provisioning_usd == pytest.approx(5.0 * BAKE_METAL_MASTER_S / 3600 + BUILDER_USD["intel"])
    assert four.provisioning_usd == pytest.approx(5.0 * (BAKE_METAL_MASTER_S + 3 * METAL_BOOT) / 3600
                                                  + BUILDER_USD["intel"])
    # the other way, shown beside it: from a kept image
    assert four.other_provisioning_seconds == KEPT_METAL_S
    assert four.other_provisioning_usd == pytest.approx(5.0 * (KEPT_METAL_MASTER_S + 3 * METAL_BOOT) / 3600)
    # the worst case: every boot (the nodes' and the build instance's) its whole wait budget
    assert four.worst_provisioning_seconds == 60 + WORST_BUILD_S["intel"] + WORST_MASTER_S
    assert four.worst_provisioning_usd == pytest.approx(5.0 * (WORST_MASTER_S + 3 * METAL_BUDGET) / 3600
                                                        + WORST_BUILDER_USD["intel"])
    assert one.worst_provisioning_usd == pytest.approx(5.0 * WORST_MASTER_S / 3600 + WORST_BUILDER_USD["intel"])
    assert four.boot_budget_seconds == METAL_BUDGET and four.worst_provisioning_usd > 3 * four.provisioning_usd
    rows, _ = _plan(nodes="4", instance_type="c6i.16xlarge")  # not metal: boots of 2 min (15 at worst)
    assert rows[0].provisioning_seconds == 60 + BUILD_S["intel"] + VIRTUAL_BOOT + 180 + 30
    assert rows[0].provisioning_usd == pytest.approx(5.0 * (VIRTUAL_BOOT + 180 + 30 + 3 * VIRTUAL_BOOT) / 3600
                                                     + BUILDER_USD["intel"])
    assert rows[0].worst_provisioning_usd == pytest.approx(
        5.0 * (VIRTUAL_BUDGET + 180 + 30 + 3 * VIRTUAL_BUDGET) / 3600 + WORST_BUILDER_USD["intel"])
    # The built image's storage while it is kept: intel's 60 GiB build volume at $0.05 per GB-month.
    assert ("image storage: the built image's 60 GiB snapshot bills at most $3.00/month while it is kept "
            "(keepImage, or another stack boots it)") in " ".join(_plan(nodes="4")[1].notes)
    rows, inputs = _plan(nodes="4", provisioning=False)
    assert rows[0].provisioning_usd == 0 and ("provisioning", "not counted",
                                              "given (--no-provisioning: the cluster is up)") in inputs.sources
    assert rows[0].other_provisioning_usd is None and rows[0].worst_provisioning_usd is None
    assert "at most" not in costplan.lifecycle_line(rows)


def test_a_stack_that_boots_a_kept_image_is_priced_from_it_and_shows_the_bake_beside_it():
    rows, inputs = _plan(nodes="1,4", kept_image="ami-0kept", kept_why="it holds profile intel")
    one, four = rows
    assert (four.provisioning_from, four.provisioning_seconds) == ("kept image ami-0kept", KEPT_METAL_S)
    assert four.provisioning_usd == pytest.approx(5.0 * (KEPT_METAL_MASTER_S + 3 * METAL_BOOT) / 3600)
    assert four.other_provisioning_usd == pytest.approx(5.0 * (BAKE_METAL_MASTER_S + 3 * METAL_BOOT) / 3600
                                                        + BUILDER_USD["intel"])
    # the worst case from the kept image: no build, every node's boot its 40 min budget
    assert four.worst_provisioning_seconds == 60 + WORST_MASTER_S
    assert four.worst_provisioning_usd == pytest.approx(5.0 * (WORST_MASTER_S + 3 * METAL_BUDGET) / 3600)
    line = costplan.lifecycle_line(rows)
    assert line.startswith("provision $: the first `pulumi up` from kept image ami-0kept, 13m 30s (every node "
                           "from its launch; the image's build on its own small instance); with the image built "
                           f"apart: 43m 30s, 1 node(s) "
                           f"${one.other_provisioning_usd:.2f}, 4 node(s) ${four.other_provisioning_usd:.2f}; "
                           f"at most 1 node(s) ${one.worst_provisioning_usd:.2f}, 4 node(s) "
                           f"${four.worst_provisioning_usd:.2f} (44m 30s) if every boot takes its wait budget "
                           "(a node's 40m 00s); run $")
    (source,) = [where for name, _, where in inputs.sources if name == "provisioning"]
    assert source.endswith("; it holds profile intel")


@pytest.mark.parametrize("given, stack, seconds, source", [
    ("", None, 30 * 60, "autoStopIdle's default (30m)"),
    ("", "2h", 2 * 3600, "the stack's autoStopIdle"),
    ("45m", "2h", 45 * 60, "given (--auto-stop-idle)"),
])
def test_the_idle_tail_is_the_auto_stop_idle_time_of_the_whole_cluster(given, stack, seconds, source):
    options = dict(nodes="4", instance_type="r7iz.metal-16xl", auto_stop_idle=given)
    inputs = plan_options.plan_inputs(None, plan_options.PlanOptions(**options), stack_auto_stop_idle=stack)
    row = costplan.plan_rows(inputs, costplan.Price(5.0, "spot", "given"))[0]
    assert row.idle_tail_seconds == seconds
    assert row.idle_tail_usd == pytest.approx(4 * 5.0 * seconds / 3600)
    assert any(name == "idle tail" and where == source for name, _, where in inputs.sources)


def test_auto_stop_off_counts_no_idle_tail_and_says_the_nodes_bill_until_destroy():
    rows, _ = _plan(nodes="4", auto_stop_idle="off")
    row = rows[0]
    assert row.idle_tail_seconds is None and row.idle_tail_usd == 0
    assert [row.as_json() for row in rows][0]["idle_tail_seconds"] is None
    text = costplan.render_table(rows)
    assert "idle $: auto-stop off, not counted (the nodes bill until `pulumi destroy`)" in text
    assert text.splitlines()[1].split()[9] == "-"  # the idle $ column (durations are two words)


def test_a_bad_auto_stop_idle_is_named():
    with pytest.raises(ValueError, match=r"--auto-stop-idle: 'soon' is not a duration; allowed: "):
        _plan(auto_stop_idle="soon")
    with pytest.raises(ValueError, match=r"autoStopIdle: '0s' is not allowed"):
        plan_options.plan_inputs(None, plan_options.PlanOptions(), stack_auto_stop_idle="0s")


def test_the_total_is_provisioning_plus_run_plus_idle_tail_and_each_is_shown():
    rows, _ = _plan(nodes="4")
    row = rows[0]
    assert row.total_usd == pytest.approx(row.provisioning_usd + row.run_usd + row.idle_tail_usd)
    assert row.run_usd == pytest.approx(4 * 5.0 * row.prediction.run_seconds / 3600)
    header, line = costplan.render_table(rows).splitlines()[:2]
    assert header.split()[7:15] == ["provision", "$", "run", "$", "idle", "$", "total", "$"]
    cells = line.split()  # nodes, epoch time and run time (two words each), efficiency, $/hour, then the costs
    assert [float(c) for c in cells[7:11]] == pytest.approx(
        [row.provisioning_usd, row.run_usd, row.idle_tail_usd, row.total_usd], abs=0.006)
    data = [row.as_json() for row in rows][0]
    assert (data["instance_type"], data["market"], data["price_source"]) == (
        "r7iz.metal-16xl", "spot", "spot $5.0000/instance-hour, given with --hourly-usd")
    assert (data["provisioning_seconds"], data["idle_tail_seconds"]) == (BAKE_METAL_S, 1800.0)


def test_a_spot_estimate_is_a_stated_fraction_of_on_demand_and_says_so():
    estimate = costplan.spot_estimate(costplan.Price(6.0, "on-demand", "on-demand, static table"))
    assert estimate.market == "spot" and estimate.estimate
    assert estimate.usd_per_hour == pytest.approx(6.0 * costplan.SPOT_ESTIMATE_FRACTION)
    assert estimate.source.startswith("spot estimate: ") and "on-demand, static table" in estimate.source


def test_fab_plan_for_the_recipe_s_four_nodes_shows_provisioning_run_and_idle_tail(tmp_path):
    """The real `fab plan --nodes 4` (no stack file, no AWS credentials: the static table's on-demand
    price and the stated spot estimate from it; nothing is sent anywhere). A process of its own, not
    tests/fab_run.py's in-process run: boto3 state an earlier test left in this process (a client,
    credentials) must not reach the price lookup."""
    import subprocess
    import sys

    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}

    def fab_plan(*argv):
        result = subprocess.run([sys.executable, "-m", "fabric", "-r", str(ROOT), "plan", "--nodes", "4",
                                 "--region", "us-east-1", *argv], cwd=tmp_path, capture_output=True, text=True,
                                timeout=120, env=env)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    table = fab_plan()
    assert "provision $" in table and "run $" in table and "idle $" in table
    assert "price: spot $2.9760/instance-hour, spot estimate: 0.5 x the on-demand $5.9520" in table
    # 4 x r7iz.metal-16xl, profile stock: the build on its small instance (billed at its own price), then every
    # node's boot, each at its typical time; the master no longer bills through an install and a bake (it was
    # 2h 04m 00s, $12.05), and the worst case (every boot its wait budget) is shown beside it.
    stock_bake_s = 60 + BUILD_S["stock"] + KEPT_METAL_MASTER_S
    assert (f"provision $: the first `pulumi up` with the image built apart, {format_duration(stock_bake_s)}"
            in table) and format_duration(stock_bake_s) == "37m 30s"
    assert ("the build instance's boot (m7i.large) 2m 00s, install on it 10m 00s, the image's snapshot (40 GiB)"
            in table) and "every node's boot from the image 9m 00s" in table
    assert "idle $: 30m 00s idle" in table
    assert "; from a kept image (keepImage: true keeps a stack's image for the next one): 13m 30s, 4 node(s) $" \
        in table
    spot_usd = 5.952 * costplan.SPOT_ESTIMATE_FRACTION
    worst_usd = spot_usd * (WORST_MASTER_S + 3 * METAL_BUDGET) / 3600 + WORST_BUILDER_USD["stock"]
    worst_s = 60 + WORST_BUILD_S["stock"] + WORST_MASTER_S
    assert (f"; at most ${worst_usd:.2f} ({format_duration(worst_s)}) if every boot takes its wait budget "
            "(a node's 40m 00s); run $") in table
    row = json.loads(fab_plan("--json"))[0]
    spot = 5.952 * costplan.SPOT_ESTIMATE_FRACTION
    assert (row["nodes"], row["instance_type"], row["market"]) == (4, "r7iz.metal-16xl", "spot")
    assert "spot estimate" in row["price_source"]
    assert row["provisioning_usd"] == pytest.approx(spot * (BAKE_METAL_MASTER_S + 3 * METAL_BOOT) / 3600
                                                    + BUILDER_USD["stock"], abs=1e-3)
    assert row["provisioning_usd"] < 12.05 / 2  # under half of what it cost while the master imaged itself
    assert row["other_provisioning_usd"] == pytest.approx(spot * (KEPT_METAL_MASTER_S + 3 * METAL_BOOT) / 3600,
                                                          abs=1e-3)
    assert (row["worst_provisioning_seconds"], row["worst_provisioning_usd"]) == pytest.approx((worst_s, worst_usd),
                                                                                               abs=1e-3)
    assert row["idle_tail_usd"] == pytest.approx(4 * spot * 0.5, abs=1e-3)
    assert row["run_usd"] == pytest.approx(4 * spot * row["run_seconds"] / 3600, abs=1e-3)
    assert row["total_usd"] == pytest.approx(row["provisioning_usd"] + row["run_usd"] + row["idle_tail_usd"],
                                             abs=1e-3)
    # the master alone on demand: (5.952 - 2.976) x (its part of provisioning + the run + 0.5 h)
    extra = (5.952 - spot) * (BAKE_METAL_MASTER_S + row["run_seconds"] + 1800) / 3600
    assert row["on_demand_master_extra_usd"] == pytest.approx(extra, abs=1e-3)
    assert row["on_demand_master_total_usd"] == pytest.approx(row["total_usd"] + extra, abs=1e-3)
    assert (f"on-demand master (recommended for --managed runs): +${extra:.2f} "
            f"(total ${row['total_usd'] + extra:.2f}); the master at $5.9520/hour on demand instead of $2.9760 spot"
            ) in table


def test_fab_plan_takes_the_idle_tail_from_the_stack_file(tmp_path, monkeypatch):
    from node_setup.tasks.costs import build_plan
    from tests.unit.test_fab_bad_input import STACK

    monkeypatch.chdir(tmp_path)
    (tmp_path / "Pulumi.lab.yaml").write_text(STACK + "  xeon-cluster:autoStopIdle: 2h\n")
    rows, *_ = build_plan(plan_options.PlanOptions(nodes="4"), hourly_usd=5.0)
    assert rows[0].idle_tail_seconds == 7200 and rows[0].idle_tail_usd == pytest.approx(4 * 5.0 * 2)


# --- the master alone on demand (recommended for unattended --managed runs) -----------------------

STATIC_R7IZ = 5.952  # node_setup/aws/pricing.py's static on-demand price of r7iz.metal-16xl, us-east-1


def test_the_static_on_demand_price_the_figures_below_use():
    from node_setup.aws.pricing import STATIC_ON_DEMAND_USD

    assert STATIC_ON_DEMAND_USD["r7iz.metal-16xl"] == STATIC_R7IZ


def _master_rows(nodes="1,4", price=None, on_demand=None, **over):
    """A one-hour epoch on one node of r7iz.metal-16xl: provisioning (metal, with the build), the run, a 30 min idle
    tail."""
    options = dict(nodes=nodes, instance_type="r7iz.metal-16xl", profile="intel", placement_group=False,
                   single_node_time="1h")
    options.update(over)
    inputs = plan_options.plan_inputs(None, plan_options.PlanOptions(**options))
    price = price or costplan.spot_estimate(costplan.Price(STATIC_R7IZ, "on-demand", "static table"))
    return costplan.plan_rows(inputs, price), price


def test_an_on_demand_master_adds_the_price_difference_over_the_master_s_hours_only():
    spot = costplan.Price(2.0, "spot", "spot price history, us-east-1a")  # a quoted spot price, not the estimate
    on_demand = costplan.Price(STATIC_R7IZ, "on-demand", "static table")
    rows, _ = _master_rows(price=spot)
    rows, line = costplan.with_on_demand_master(rows, spot, on_demand)
    one, four = rows
    # by hand: (5.952 - 2.0) = 3.952 $/hour over the master's 12m 30s + 1 h (the run, plus under a second of
    # start-up) + 0.5 h
    assert one.prediction.run_seconds == pytest.approx(3600, abs=2)
    assert one.on_demand_master_usd == pytest.approx(3.952 * (BAKE_METAL_MASTER_S / 3600 + 1.5), abs=0.005)
    # four nodes: the master alone, not four times; its hours are its 12m 30s + the shorter run + 0.5 h
    assert four.prediction.run_seconds < 1000
    assert four.on_demand_master_usd == pytest.approx(
        3.952 * (BAKE_METAL_MASTER_S / 3600 + 0.5 + four.prediction.run_seconds / 3600))
    assert four.on_demand_master_usd < one.on_demand_master_usd
    assert line == ("on-demand master (recommended for --managed runs): "
                    f"1 node(s) +${one.on_demand_master_usd:.2f} "
                    f"(total ${one.total_usd + one.on_demand_master_usd:.2f}), "
                    f"4 node(s) +${four.on_demand_master_usd:.2f} "
                    f"(total ${four.total_usd + four.on_demand_master_usd:.2f}); "
                    "the master at $5.9520/hour on demand (static table) instead of $2.0000 spot through "
                    "provisioning, the run and the idle tail; the workers spot")


@pytest.mark.parametrize("over, hours", [
    (dict(provisioning=False), 1.5),  # the run and the idle tail
    (dict(auto_stop_idle="off"), BAKE_METAL_MASTER_S / 3600 + 1.0),  # the master's provisioning and the run
    (dict(provisioning=False, auto_stop_idle="2h"), 3.0),
])
def test_an_on_demand_master_counts_the_plan_s_own_terms(over, hours):
    rows, price = _master_rows(nodes="1", **over)
    assert price.on_demand is not None and price.usd_per_hour == pytest.approx(STATIC_R7IZ / 2)
    rows, line = costplan.with_on_demand_master(rows, price, price.on_demand)
    # by hand: the spot estimate is half of 5.952, so the master on demand adds 2.976 $/hour
    assert rows[0].on_demand_master_usd == pytest.approx(2.976 * hours, abs=0.002)
    assert f"+${2.976 * hours:.2f} (total $" in line and "(static table)" not in line  # the price line names it
    data = [row.as_json() for row in rows][0]
    assert data["on_demand_master_extra_usd"] == pytest.approx(2.976 * hours, abs=0.002)
    assert data["on_demand_master_total_usd"] == pytest.approx(data["total_usd"] + 2.976 * hours, abs=0.002)


def test_a_plan_on_demand_says_the_master_already_is():
    price = costplan.Price(STATIC_R7IZ, "on-demand", "static table")
    rows, _ = _master_rows(price=price)
    rows, line = costplan.with_on_demand_master(rows, price, None)
    assert line == ("on-demand master (recommended for --managed runs): master already on demand "
                    "(this plan prices every node on demand)")
    assert [[row.as_json() for row in rows][i]["on_demand_master_extra_usd"] for i in (0, 1)] == [0.0, 0.0]


def test_a_stack_with_an_on_demand_master_gets_the_figure_the_spot_table_leaves_out():
    rows, price = _master_rows(nodes="1")
    rows, line = costplan.with_on_demand_master(rows, price, price.on_demand, master_spot=False)
    assert line.startswith("on-demand master (recommended for --managed runs): master already on demand "
                           "(the stack's masterSpot false), which the spot prices above leave out: "
                           f"+${2.976 * (BAKE_METAL_MASTER_S / 3600 + 1.5):.2f} (total $")
    # by hand: 2.976 $/hour over the master's 12m 30s of provisioning + the 1 h run + the 30 min tail
    rows, line = costplan.with_on_demand_master(rows, costplan.Price(3.0, "spot", "given"), None, master_spot=False,
                                                unknown="no on-demand price")
    assert line.endswith("master already on demand (the stack's masterSpot false), which the spot prices above "
                         "leave out; not priced (no on-demand price)")


def test_fab_plan_with_a_given_price_does_not_guess_the_on_demand_one(tmp_path, monkeypatch):
    from node_setup.tasks.costs import build_plan

    monkeypatch.chdir(tmp_path)
    rows, _, _, notes, _ = build_plan(plan_options.PlanOptions(nodes="4"), hourly_usd=5.0)
    assert notes[0] == ("on-demand master (recommended for --managed runs): not priced (--hourly-usd gives one "
                        "price for every node, not the master's on-demand price)")
    assert [row.as_json() for row in rows][0]["on_demand_master_extra_usd"] is None
    rows, _, _, notes, _ = build_plan(plan_options.PlanOptions(nodes="4", on_demand=True), hourly_usd=5.0)
    assert notes[0].endswith("master already on demand (this plan prices every node on demand)")


# --- the stack's answers to scarce spot: instanceTypes and onDemandFallback ------------------------

SCARCE = ("  xeon-cluster:onDemandFallback: 20m\n  xeon-cluster:instanceTypes:\n    - m7i.48xlarge\n"
          "    - c7i.48xlarge\n    - r7i.48xlarge\n")


def test_fab_plan_shows_the_range_over_the_listed_types_and_what_the_fallback_costs(tmp_path, monkeypatch):
    from node_setup.aws import pricing
    from node_setup.tasks.costs import build_plan
    from tests.unit.test_fab_bad_input import STACK

    monkeypatch.chdir(tmp_path)
    (tmp_path / "Pulumi.lab.yaml").write_text(STACK + SCARCE)
    # each type's price as the static table's on-demand price (the test double for AWS's answers)
    monkeypatch.setattr(pricing, "hourly_price", lambda itype, region, spot=True, **kw: costplan.Price(
        pricing.STATIC_ON_DEMAND_USD[itype], "on-demand", "static table"))
    rows, _, _, notes, _ = build_plan(plan_options.PlanOptions(nodes="4"))
    (row,) = rows
    assert row.instance_type == "m7i.48xlarge"  # the first type: the master's, and the table's
    (listed,) = [n for n in notes if n.startswith("instanceTypes:")]
    assert ("any of m7i.48xlarge $4.8384, c7i.48xlarge $4.2840, r7i.48xlarge $6.3504 per instance-hour" in listed)
    # the same plan at each type's spot estimate: the nodes' part of the total scales with the price (the same time
    # model: one shape); the image's build on its own small instance costs the same whatever the nodes' type
    from cluster.node.profiles import get_profile
    from cluster.stack import catalog, lifecycle

    build = lifecycle.first_up(catalog.lookup("m7i.48xlarge"), get_profile("stock").min_root_volume_gib).builder_usd
    low, high = (build + (row.total_usd - build) * pricing.STATIC_ON_DEMAND_USD[t] / 9.6768
                 for t in ("c7i.48xlarge", "r7i.48xlarge"))
    assert listed.endswith(f"the total is ${low:.2f} to ${high:.2f}")
    (fallback,) = [n for n in notes if n.startswith("onDemandFallback:")]
    # by hand: 3 workers x (9.6768 - 4.8384) $/hour over the run and the idle tail
    extra = 3 * (9.6768 - 4.8384) * (row.prediction.run_seconds + row.idle_tail_seconds) / 3600
    assert fallback == (f"onDemandFallback: if every worker runs on demand ($9.6768/hour instead of $4.8384 spot, "
                        f"through the run and the idle tail): +${extra:.2f} (total ${row.total_usd + extra:.2f})")
    # a given price, or no such settings: no such lines
    _, _, _, given, _ = build_plan(plan_options.PlanOptions(nodes="4"), hourly_usd=5.0)
    assert not [n for n in given if n.startswith(("instanceTypes:", "onDemandFallback:"))]
