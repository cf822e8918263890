"""Spend so far and a run's cost (cluster/cost/spend.py, pure), and what `fab train` plans from a job plan."""

from __future__ import annotations

import pytest
from types import SimpleNamespace

from cluster.cost import costplan, plan_options, spend
from cluster.cost import timemodel as tm
from cluster.inventory import Inventory, Node
from cluster.job.request import Demo, OwnProgram
from tests.unit.test_jobplan import job_plan

NOW = 1_800_000_000.0
JOB = "20260101-000000-0009"
HOUR = 3600.0


def row(name="node0", market=spend.SPOT, launched=NOW - 2 * HOUR, price=1.5, source="spot price history, a"):
    return spend.node_spend(name, market, launched, NOW, price, source)


def test_spend_is_uptime_times_the_hourly_price():
    node = row(launched=NOW - 5400, price=2.0)
    assert node.uptime_s == 5400
    assert node.spent_usd == pytest.approx(3.0)
    assert spend.node_spend("n", spend.SPOT, NOW + 60, NOW, 2.0, "").uptime_s == 0  # a clock behind EC2's: not negative


def test_unknown_launch_time_or_price_leaves_the_spend_unknown():
    assert row(launched=None).spent_usd is None and row(launched=None).uptime_s is None
    assert row(price=None).spent_usd is None and row(price=None).uptime_s == 2 * HOUR


def test_the_total_adds_priced_nodes_and_names_the_others():
    total = spend.ClusterSpend((row("node0", price=1.5), row("node1", spend.ON_DEMAND, NOW - HOUR, 4.0),
                                row("node2", price=None)))
    assert total.usd_per_hour == pytest.approx(5.5)
    assert total.spent_usd == pytest.approx(2 * 1.5 + 4.0)
    assert total.unpriced == ["node2"]
    line = total.total_line()
    assert "3 node(s), $5.5000/hour, $7.00 spent so far" in line and "not counted: node2" in line
    assert total.total_json() == {"nodes": 3, "usd_per_hour": 5.5, "spent_usd": 7.0, "unpriced": ["node2"]}


def test_a_local_cluster_costs_nothing_and_says_so():
    total = spend.ClusterSpend(tuple(row(f"node{i}", spend.LOCAL_MARKET, NOW - 90, 0.0, spend.LOCAL_NO_PRICE)
                                     for i in range(3)))
    assert total.spent_usd == 0 and total.unpriced == []
    assert total.total_line().endswith(f"$0.00 spent so far ({spend.LOCAL_NO_PRICE})")
    assert total.source_lines() == [f"price: {spend.LOCAL_NO_PRICE}"]


@pytest.mark.parametrize("kind, spot, expected", [
    ("aws", True, spend.SPOT), ("aws", False, spend.ON_DEMAND), ("aws", None, None),
    ("local", None, spend.LOCAL_MARKET), ("file", True, None)])
def test_the_market_is_the_backends(kind, spot, expected):
    from node_setup.backends import backend_for

    node = Node(name="node0", address="10.0.0.2", private_address="10.0.0.2", rank=0, spot=spot)
    assert backend_for(kind).market(node) == expected


def test_status_columns_line_up_with_the_header():
    columns = spend.spend_columns(row(launched=NOW - 3723, price=2.4))
    assert columns.split() == ["spot", "1h", "02m", "03s", "$2.4000", "$2.48"]
    assert len(columns) == len(spend.SPEND_HEADER) == len(spend.spend_columns(None))
    assert spend.spend_columns(None).split() == ["-"] * 4


def test_node_json_has_iso_launch_time_and_rounded_figures():
    data = row(launched=NOW - 5400, price=2.0).as_json()
    assert data == {"market": "spot", "launched_at": "2027-01-15T06:30:00Z", "uptime_seconds": 5400,
                    "usd_per_hour": 2.0, "spent_usd": 3.0, "price_source": "spot price history, a"}


def prediction(steps=100, epoch_s=500.0, startup=20.0):
    return tm.Prediction(nodes=2, ranks_per_node=1, steps=steps, compute_s=epoch_s, comm_s=0, exposed_comm_s=0,
                         startup_s=startup, epoch_seconds=epoch_s, run_seconds=startup + epoch_s, efficiency=1,
                         node_gbps=10)


def test_planned_seconds_count_epochs_or_max_steps_whichever_ends_first():
    p = prediction()  # 5 s per step
    assert spend.planned_seconds(p, 2.0) == pytest.approx(20 + 200 * 5)
    assert spend.planned_seconds(p, 2.0, max_steps=30) == pytest.approx(20 + 30 * 5)
    assert spend.planned_seconds(p, 0.5, max_steps=500) == pytest.approx(20 + 50 * 5)


def test_run_cost_lines_and_record():
    cost = spend.RunCost(4, 8.0, "spot price history, us-east-1a", planned_s=900.0, actual_s=990.0)
    assert cost.planned_usd == pytest.approx(2.0) and cost.actual_usd == pytest.approx(2.2)
    assert cost.planned_line() == ("planned: 15m 00s, $2.00 (4 node(s) at $8.0000/hour, "
                                   "spot price history, us-east-1a)")
    assert cost.actual_line() == "actual: 16m 30s, $2.20 (110% of the planned time)"
    assert cost.record() == {"planned_seconds": 900.0, "planned_usd": 2.0, "actual_seconds": 990.0,
                             "actual_usd": 2.2, "hourly_usd": 8.0, "nodes": 4,
                             "price_source": "spot price history, us-east-1a"}


def test_a_run_the_planner_cannot_plan_says_why_in_one_line():
    cost = spend.RunCost(3, 0.0, spend.LOCAL_NO_PRICE, why_not_planned="no catalog type", actual_s=42.0)
    assert cost.planned_line() == f"planned: cannot plan this run: no catalog type ({spend.LOCAL_NO_PRICE})"
    assert cost.actual_line() == f"actual: 42s, $0.00 ({spend.LOCAL_NO_PRICE})"
    assert cost.record()["planned_seconds"] is None and cost.record()["not_planned"] == "no catalog type"
    assert cost.record()["actual_usd"] == 0.0
    unpriced = spend.RunCost(2, None, "no price for x", planned_s=60.0, actual_s=60.0)
    assert unpriced.planned_line() == "planned: 1m 00s, - (no price: no price for x)"
    assert unpriced.record()["actual_usd"] is None


def test_run_price_is_unknown_when_one_node_has_none():
    assert spend.run_price(spend.ClusterSpend((row(price=1.0), row("node1", price=2.0)))) == (
        3.0, "spot price history, a")
    assert spend.run_price(spend.ClusterSpend((row(price=1.0), row("node1", price=None, source="x"))))[0] is None


# ---------------------------------------------------------------- what fab train plans (node_setup/tasks/spend.py)


def aws_inventory(itype="r7iz.metal-16xl", nodes=4):
    hosts = tuple(Node(name=f"node{i}", address=f"10.0.0.{i + 10}", private_address=f"10.0.0.{i + 10}", rank=i,
                       instance_type=itype, spot=True) for i in range(nodes))
    return Inventory(name="demo", kind="aws", user="ubuntu", nodes=hosts, instance_type=itype)


def job(inventory, **settings):
    """The built-in job with these typed settings (cluster/job/request.py's BuiltinJob) on every node."""
    return job_plan(inventory, len(inventory.nodes), **settings)


def test_fab_train_plans_the_built_in_job_like_fab_plan():
    from node_setup.tasks.spend import plan_seconds

    inventory = aws_inventory()
    plan = job(inventory, task="qa", model="distilbert-base-uncased", epochs=2.0)
    seconds, why = plan_seconds(plan, calibration_for=lambda name: None)
    assert why == ""
    options = plan_options.PlanOptions(nodes="4", instance_type="r7iz.metal-16xl", epochs=2.0,
                                   ranks_per_node=plan.layout.ranks_per_node)
    expected = costplan.plan_rows(plan_options.plan_inputs(None, options), costplan.Price(1, "spot", "t"))[0]
    assert seconds == pytest.approx(expected.prediction.run_seconds)
    short, _ = plan_seconds(job(inventory, max_steps=10), calibration_for=lambda name: None)
    assert short == pytest.approx(spend.planned_seconds(expected.prediction, 1.0, 10))
    assert short < seconds / 10


@pytest.mark.parametrize("settings, itype, expected", [
    (dict(model="my-own/model"), "r7iz.metal-16xl", "'my-own/model' has no known size (the planner knows "
                                                    "all-minilm-l6-v2, bert-base-uncased"),
    (dict(task="qa"), "m5.large", "instance type 'm5.large' is not in the planner's catalog"),
    (dict(train_file="data.json"), "r7iz.metal-16xl", "size of your own --train-file"),
    (dict(demo=Demo("qa", 200)), "r7iz.metal-16xl", "the offline demo's size"),
])
def test_fab_train_says_why_it_cannot_plan(settings, itype, expected):
    from node_setup.tasks.spend import plan_seconds

    inventory = aws_inventory(itype, nodes=2)
    if itype == "m5.large":
        inventory = Inventory(name="lab", kind="file", user="u", nodes=inventory.nodes, instance_type=itype,
                              sockets=1, physical_cores=2)
    seconds, why = plan_seconds(job(inventory, **settings), calibration_for=lambda name: None)
    assert seconds is None and expected in why and "\n" not in why


def test_a_user_s_own_program_is_not_planned():
    from node_setup.tasks.spend import plan_seconds

    plan = job(aws_inventory(), program=OwnProgram(script="train.py"))
    assert plan_seconds(plan, calibration_for=lambda name: None) == (
        None, "the planner knows the built-in job only, not your own --script/--module")


class MasterDouble:
    """Test double for the master's Fabric connection: files in a dict, commands run on that dict."""

    def __init__(self, files):
        self.files = dict(files)

    def get(self, path, local):
        if path not in self.files:
            raise FileNotFoundError(path)
        local.write(self.files[path].encode())

    def put(self, local, remote):
        self.files[remote] = local.getvalue().decode()

    def run(self, command, **_):
        import shlex

        from cluster import records

        for path, text in self.files.items():  # a record read (cluster/records.py read_command)
            if command == records.read_command(path):
                return SimpleNamespace(ok=True, stdout=text)
        if command.startswith("cd && if [ -L "):
            return SimpleNamespace(ok=False, stdout="")  # no such file
        verb, _, source, target = shlex.split(command)
        assert (verb, _) == ("mv", "-f")
        self.files[target] = self.files.pop(source)


def local_plan():
    hosts = tuple(Node(name=f"node{i}", address=f"10.9.0.{i + 2}", private_address=f"10.9.0.{i + 2}", rank=i)
                  for i in range(2))
    inventory = Inventory(name="local", kind="local", user="root", nodes=hosts, sockets=1, physical_cores=2)
    return job_plan(inventory, 2, run_id=JOB, max_steps=5, output_dir=f"/out/{JOB}")


@pytest.mark.parametrize("state, code, recorded", [("exited", 0, True), ("running", 1, False),
                                                  ("running", 130, False)])
def test_fab_train_prints_the_actual_cost_and_records_it_in_summary_json(monkeypatch, capsys, state, code, recorded):
    import json

    from node_setup.ssh import job as ssh_job
    from node_setup.tasks.spend import RunCostClock

    monkeypatch.setattr(ssh_job, "job_state", lambda master, job_id: (state, str(code)))
    times = iter([100.0, 163.0])
    plan = local_plan()
    clock = RunCostClock.at_launch(plan, clock=lambda: next(times))
    assert capsys.readouterr().out.startswith("planned: cannot plan this run: the machines of cluster 'local'")
    master = MasterDouble({f"/out/{JOB}/summary.json": json.dumps({"status": "completed", "steps": 5})})
    cost = clock.at_end(master, plan, code)
    out = capsys.readouterr().out
    summary = json.loads(master.files[f"/out/{JOB}/summary.json"])
    if not recorded:  # the job goes on (Ctrl-C detached, or the stream was lost): nothing is final yet
        assert cost is None and out == "" and spend.COST_KEY not in summary
        return
    assert out == f"actual: 1m 03s, $0.00 ({spend.LOCAL_NO_PRICE})\n"
    assert summary["steps"] == 5 and summary[spend.COST_KEY] == cost.record()
    assert summary[spend.COST_KEY]["actual_seconds"] == 63.0 and summary[spend.COST_KEY]["actual_usd"] == 0.0
    assert set(master.files) == {f"/out/{JOB}/summary.json"}  # the partial file was moved into place


def test_a_local_node_s_start_is_its_sshd_s_else_local_up_s(tmp_path):
    import os
    import time

    from node_setup.discovery import process_started_at, resolve_cluster
    from node_setup.local import state as local_state

    (tmp_path / "inventory.yaml").write_text("kind: local\nname: t1\nhosts: [10.200.0.2, 10.200.0.3, 10.200.0.4]\n")
    nodes = [local_state.NodeState(name=f"node{i}", namespace="ns", veth="v", address=f"10.200.0.{i + 2}", dir="d",
                                   sshd_config="c") for i in range(3)]
    nodes[0].sshd_pid = os.getpid()  # a live process: its start time from /proc
    nodes[2].reclaimed_at = NOW  # `fab local-reclaim` took it down
    state = local_state.ClusterState(name="t1", bridge="b", subnet="s", bridge_address="a", data_dir="d",
                                     cluster_dir=str(tmp_path), key_path="k", inventory_path="i", nodes=nodes,
                                     created_at=NOW - HOUR)
    (tmp_path / "state.json").write_text(state.to_json())
    inventory = resolve_cluster(str(tmp_path / "inventory.yaml"))
    own = process_started_at(os.getpid())
    assert own is not None and 0 < own <= time.time()  # this test's own process: started before now
    assert [n.launched_at for n in inventory.nodes] == [own, NOW - HOUR, None]
    (tmp_path / "state.json").unlink()  # no state file: start times not known
    assert [n.launched_at for n in resolve_cluster(str(tmp_path / "inventory.yaml")).nodes] == [None] * 3


def test_a_user_program_s_run_gets_the_toolkit_s_summary_in_its_job_directory(monkeypatch, capsys):
    """The built-in job's summary fields fab reads (cost, wall time, nodes, recoveries) for `--script`
    runs too, in the job's directory: the program's own output folder is left as the program wrote it."""
    import dataclasses
    import json

    from cluster.job.userjob import UserProgram
    from node_setup.ssh import job as ssh_job
    from node_setup.tasks.spend import RunCostClock

    monkeypatch.setattr(ssh_job, "job_state", lambda master, job_id: ("exited", "0"))
    times = iter([100.0, 145.5])
    plan = dataclasses.replace(local_plan(), user=UserProgram(script="train.py", module=None, args=()))
    clock = RunCostClock.at_launch(plan, clock=lambda: next(times))
    master = MasterDouble({f"/out/{JOB}/summary.json": json.dumps({"the program's": "own"})})
    cost = clock.at_end(master, plan, 0)
    record_path = f".xeon-cluster/jobs/{JOB}/{spend.RUN_RECORD_NAME}"
    assert capsys.readouterr().out.splitlines()[-1] == f"summary: ~/{record_path} on node0"
    record = json.loads(master.files[record_path])
    assert record == {"job_id": JOB, "exit_code": 0, "nodes": ["node0", "node1"], "world_size": 2,
                      "wall_seconds": 45.5, "recoveries": [], spend.COST_KEY: cost.record()}
    assert json.loads(master.files[f"/out/{JOB}/summary.json"]) == {"the program's": "own"}
