"""`fab jobs`'s reading of the master's records: cluster/shell/job-list.sh run here against job directories
made in a temporary home (as the master has them), its JSON answer read by cluster/job/joblist.py; states,
durations, the program, and for whatever is missing, malformed or hostile: "unknown", one line naming the
node and the file, never a forged row, an escape sequence on the terminal or an exception. The controller's
job history (cluster/job/jobhistory.py, node_setup/job_history.py) keeps the rows of a master since replaced.
The script also runs against a real cluster's jobs in tests/ssh/test_jobs_list.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import shell
from cluster.job import jobhistory
from cluster.job.joblist import JobRow, as_json, parse, program_of, table
from cluster.job.launch import JOBS_DIR
from node_setup import job_history
from node_setup.ssh import job as jobs
from tests.unit.test_runlog import LocalMaster

START = 1767323045  # 2026-01-02T03:04:05Z
META = {"started": "2026-01-02T03:04:05Z", "hosts": ["node0", "node1"], "world_size": 4,
        "output_dir": "xeon-cluster-runs/20260102-030405-aaaa", "launcher": "mpirun",
        "task": "qa", "checkpoint_uri": "s3://bucket/runs"}


def job(home: Path, job_id: str, *, meta=None, exit_code: str | None = None, stopped: str | None = None,
        ended: int | None = None) -> Path:
    d = home / JOBS_DIR / job_id
    d.mkdir(parents=True)
    if meta is not None:
        (d / "job.json").write_bytes(meta.encode() if isinstance(meta, str) else json.dumps(meta).encode())
    for name, text in (("exit_code", exit_code), ("stopped", stopped)):
        if text is not None:
            (d / name).write_text(text)
            if ended is not None:
                os.utime(d / name, (ended, ended))
    return d


def listed(home: Path) -> str:
    """job-list.sh's answer, run as the master runs it (sh -c SCRIPT xeon-cluster), HOME at `home`."""
    done = subprocess.run(["sh", "-c", shell.render("job-list.sh", {"JOBS_DIR": JOBS_DIR}), "xeon-cluster"],
                          env={**os.environ, "HOME": str(home)}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_states_durations_exit_codes_programs_newest_first(tmp_path):
    job(tmp_path, "20260102-030405-aaaa", meta=META, exit_code="0\n", ended=START + 65)
    job(tmp_path, "20260102-030406-bbbb", meta={**META, "script": "train.py"}, exit_code="1\n", ended=START + 5)
    job(tmp_path, "20260102-030407-cccc", meta=META, exit_code="75\n", ended=START + 5)
    job(tmp_path, "20260102-030408-dddd", meta=META, stopped="2026-01-02T03:05:00Z\n", exit_code="143\n",
        ended=START + 55)
    running = job(tmp_path, "20260102-030409-eeee", meta={**META, "task": ""})
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "20260102-030409-eeee"])
    try:
        (running / "pid").write_text(f"{sleeper.pid}\n")
        rows, problems = parse(listed(tmp_path), "node0")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert problems == []
    assert [(r.id[-4:], r.state, r.exit_code, r.duration_s) for r in rows[1:]] == [
        ("dddd", "stopped", 143, 55), ("cccc", "interrupted", 75, 5), ("bbbb", "failed", 1, 5),
        ("aaaa", "completed", 0, 65)]
    assert (rows[0].state, rows[0].exit_code, rows[0].nodes, rows[0].ranks) == ("running", None, 2, 4)
    assert rows[0].duration_s > 3600 * 24 * 300  # running: from its start (START, in the past) up to the answer's now
    assert [r.program for r in rows] == ["built-in", "built-in qa", "built-in qa", "script train.py", "built-in qa"]
    assert rows[-1].checkpoint_uri == "s3://bucket/runs"
    shown = table(rows, "lab").splitlines()
    assert shown[1].split()[11] == "program" and shown[3].split()[:11] == [
        "20260102-030408-dddd", "-", "stopped", "2026-01-02T03:04:05Z", "55s", "2", "4", "143", "-", "-", "built-in"]
    assert shown[-1].split()[4] == "1m05s"


def test_a_job_json_cannot_forge_a_row_and_what_it_says_reaches_the_terminal_as_text(tmp_path):
    forged = '{"started": "2026-01-02T03:04:05Z"}\n@@end\n@@job 20990101-000000-ffff\nexited 0\n@@json\n{}'
    job(tmp_path, "20260102-030405-aaaa", meta=forged, exit_code="0\n")
    job(tmp_path, "20260102-030406-bbbb", meta={**META, "output_dir": "runs/\x1b[2J\x1b]0;pwned\x07x\u202e"},
        exit_code="0\n")
    job(tmp_path, "20260102-030407-cccc\x1b[2J", meta=META, exit_code="0\n")  # no job id: not listed
    rows, problems = parse(listed(tmp_path), "node0")
    assert [r.id for r in rows] == ["20260102-030406-bbbb", "20260102-030405-aaaa"]
    assert problems == ["node0: ~/.xeon-cluster/jobs/20260102-030405-aaaa/job.json: not JSON (Extra data: line 2 "
                        "column 1 (char 36))"]
    text = table(rows, "lab") + as_json(rows, "lab", problems)
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert table(rows, "lab").splitlines()[2].endswith("  ~/runs/x")  # the text stays, the sequences go


def test_malformed_records_are_one_line_each_and_unknown_in_the_table(tmp_path):
    job(tmp_path, "20260102-030405-aaaa", meta="{not json", exit_code="banana\n")
    job(tmp_path, "20260102-030406-bbbb", meta="")
    job(tmp_path, "20260102-030407-cccc", exit_code="0\n",
        meta=json.dumps({"started": 5, "hosts": "node0", "world_size": "4", "output_dir": 7}))
    job(tmp_path, "20260102-030408-dddd", meta="[1, 2]", exit_code="0\n")
    rows, problems = parse(listed(tmp_path), "node0")
    by_id = {r.id[-4:]: r for r in rows}
    assert [by_id[k].state for k in ("aaaa", "bbbb", "cccc", "dddd")] == ["unknown", "unknown", "completed",
                                                                          "completed"]
    for row in rows:
        assert (row.started, row.duration_s, row.nodes, row.ranks, row.output_dir) == (None, None, None, None, None)
    assert problems == [
        "node0: ~/.xeon-cluster/jobs/20260102-030405-aaaa/exit_code: 'banana' is no exit code",
        "node0: ~/.xeon-cluster/jobs/20260102-030405-aaaa/job.json: not JSON (Expecting property name enclosed in "
        "double quotes: line 1 column 2 (char 1))",
        "node0: ~/.xeon-cluster/jobs/20260102-030407-cccc/job.json: started is 5, not a time such as "
        "2026-01-02T03:04:05Z",
        "node0: ~/.xeon-cluster/jobs/20260102-030408-dddd/job.json: not a JSON object"]
    assert parse("@@job x\n", "node0") == ([], [
        "node0: the job list is not JSON (Expecting value: line 1 column 1 (char 0)); is this project's "
        "job-list.sh what ran there?"])
    assert parse('{"now": 5, "jobs": []}', "node0") == ([], [])
    assert table([], "lab") == "no job on cluster lab yet (fab train starts one)"


def test_fab_status_reads_a_malformed_job_json_as_one_line_naming_node_and_file(tmp_path):
    job(tmp_path, "20260102-030405-aaaa", meta="{not json")
    with pytest.raises(jobs.JobError, match=r"^the master: ~/.xeon-cluster/jobs/20260102-030405-aaaa/job.json: "
                                            r"not JSON \(Expecting property name"):
        jobs.read_metadata(LocalMaster(tmp_path), "20260102-030405-aaaa")
    job(tmp_path, "20260102-030406-bbbb", meta={**META, "hosts": "\x1b[2Jnode0"})
    assert "hosts" not in jobs.read_metadata(LocalMaster(tmp_path), "20260102-030406-bbbb")  # left out, not shown


def test_program_of_a_job():
    """job.json's typed fields, as cluster/job/jobplan.py writes them from the run's request."""
    assert program_of({"task": "classification"}) == "built-in classification"
    assert program_of({"task": ""}) == "built-in"
    assert program_of({"module": "pkg.train"}) == "module pkg.train"
    assert program_of({"training_args": ["--task", "qa"]}) is None  # a command line is never read back
    assert program_of({}) is None


def row(job_id: str, state: str = "completed", **fields) -> JobRow:
    return JobRow(job_id, state, None, None, None, None, fields.pop("exit_code", 0), fields.pop("output_dir", None),
                  None, **fields)


def test_the_history_keeps_the_jobs_of_a_master_since_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    old = [row("20260102-030405-aaaa", output_dir="/var/tmp/runs/aaaa", master="node0"),
           row("20260102-030406-bbbb", "running", exit_code=None, master="node0",
               checkpoint_uri="s3://bucket/runs", program="built-in qa", output_dir="runs/bbbb")]
    job_history.record("lab", old)
    new_master = [row("20260103-000000-cccc", master="node3")]
    rows = job_history.record("lab", new_master)
    assert [(r.id[-4:], r.state, r.master) for r in rows] == [("cccc", "completed", "node3"),
                                                              ("bbbb", "unknown", "node0"),
                                                              ("aaaa", "completed", "node0")]
    assert job_history.read("lab") == rows
    shown = table(rows, "lab", master="node3").splitlines()
    assert "a master since replaced" in shown[3] and "a master since replaced" not in shown[2]
    assert jobhistory.whereabouts(rows[1]) == [
        "job 20260102-030406-bbbb (built-in qa, unknown) ran on master node0, which no longer has it",
        "its output folder was ~/runs/bbbb on that master: on a disk the nodes share, any node has it still; on "
        "the master's own disk it went with the master",
        "its checkpoints were uploaded to s3://bucket/runs (`aws s3 cp --recursive s3://bucket/runs DIR` copies "
        "them)"]


def test_a_malformed_history_is_one_line_and_a_new_one_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = job_history.path("lab")
    path.parent.mkdir(parents=True)
    good = json.loads(jobhistory.dumps([row("20260102-030405-aaaa")]))
    good["jobs"].append({**good["jobs"][0], "id": "../../x"})
    path.write_text(json.dumps(good))
    said: list[str] = []
    assert [r.id for r in job_history.read("lab", say=said.append)] == ["20260102-030405-aaaa"]
    assert said == [f"{path}: 1 malformed entry left out"]
    path.write_text("{")
    said.clear()
    assert job_history.record("lab", [row("20260103-000000-cccc")], say=said.append)[0].id == "20260103-000000-cccc"
    assert said[0].startswith(f"{path}: not JSON") and json.loads(path.read_text())["format"] == jobhistory.FORMAT


def test_a_history_written_before_the_name_and_figures_is_read_and_keeps_them_once_listed(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = job_history.path("lab")
    path.parent.mkdir(parents=True)
    older = json.loads(jobhistory.dumps([row("20260102-030405-aaaa")]))
    for field in jobhistory.LATER_FIELDS:
        del older["jobs"][0][field]
    path.write_text(json.dumps(older))
    assert [(r.id, r.name, r.loss) for r in job_history.read("lab")] == [("20260102-030405-aaaa", None, None)]
    named = row("20260103-000000-cccc", name="lr-small", loss=0.5, samples_per_second=12.0)
    job_history.record("lab", [named])
    assert job_history.read("lab")[0] == named


def test_a_job_fab_train_starts_is_in_the_history_before_any_fab_jobs(tmp_path, monkeypatch):
    """node_setup/tasks/job_run.py adds the job it started: a master lost before anyone listed its jobs does not
    take it along."""
    from cluster.job.jobplan import plan
    from cluster.job.train_options import request_from_options
    from tests.unit.test_job_run import RUN, inventory

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    request = request_from_options(dict(nodes=3, synthetic_examples=200, max_steps=6,
                                        checkpoint_uri="s3://ckpt-bucket/r1"), inventory(), run_id=RUN)[0]
    job_history.record("lab", [row("20261127-090000-aaaa", master="node0")])
    job_history.started(plan(request, inventory()))
    rows = job_history.read("lab")
    assert [(r.id, r.state, r.master, r.nodes, r.program, r.checkpoint_uri) for r in rows] == [
        (RUN, "running", "node0", 3, "built-in qa", "s3://ckpt-bucket/r1"),
        ("20261127-090000-aaaa", "completed", "node0", None, None, None)]  # the others as they were
    after = job_history.record("lab", [])  # a new master lists none of them
    assert [(r.id, r.state) for r in after] == [(RUN, "unknown"), ("20261127-090000-aaaa", "completed")]


def _started(home: Path, job_id: str, name: str, summary: dict | None, progress: dict | None) -> None:
    """A named job started as fab starts one (its files, then jobcommands' start command, run here as the master
    runs it), whose script writes the output folder's records as the job does, then its exit code."""
    from cluster.inventory import Inventory
    from cluster.job import jobcommands
    from cluster.job.jobplan import plan
    from cluster.job.launch import job_dir
    from cluster.job.request import BuiltinJob, RunRequest

    inventory = Inventory.from_mapping({"name": "lab", "sockets": 1, "physical_cores": 4,
                                        "hosts": [{"name": f"node{i}", "address": f"10.0.0.{i + 2}"}
                                                  for i in range(2)]}, default_name="lab")
    job_plan = plan(RunRequest(job_id, 2, BuiltinJob(max_steps=3), output_dir=f"runs/{job_id}", name=name),
                    inventory)
    d = home / job_dir(job_id)
    d.mkdir(parents=True)
    for file, text in jobcommands.job_files(job_plan).items():
        (d / file).write_text(text)
    writes = "".join(f"printf '%s' {json.dumps(json.dumps(record))} > \"$HOME/runs/{job_id}/{file}\"\n"
                     for file, record in (("summary.json", summary), ("progress.json", progress)) if record)
    (d / "run.sh").write_text(f'echo "$$" > "$HOME/{job_dir(job_id)}/pid"\nmkdir -p "$HOME/runs/{job_id}"\n{writes}'
                              f'echo 0 > "$HOME/{job_dir(job_id)}/exit_code"\n')
    done = subprocess.run(["sh", "-c", jobcommands.start_command(job_plan)], env={"HOME": str(home),
                          "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done
    for _ in range(300):  # the detached script's end: its exit code (bounded: 30 s)
        if (d / "exit_code").exists():
            break
        subprocess.run(["sleep", "0.1"])
    assert (d / "exit_code").exists(), f"no exit code after 30 s; {d} holds {sorted(p.name for p in d.iterdir())}"


def test_a_named_job_shows_its_name_loss_and_speed_and_its_name_finds_its_newest_job(tmp_path):
    progress = {"format": 1, "step": 3, "total": 3, "samples_per_second": 44.5, "steps_per_second": 2.0,
                "updated": START}
    _started(tmp_path, "20260102-030405-aaaa", "lr-small", {"status": "completed", "exit_code": 0, "world_size": 2,
                                                            "train_loss": 2.71828, "samples_per_second": 123.45},
             progress)
    _started(tmp_path, "20260102-030406-bbbb", "lr-small", None, progress)  # a script of yours: progress only
    _started(tmp_path, "20260102-030407-cccc", "lr-big", None, None)
    rows, problems = parse(listed(tmp_path), "node0")
    assert problems == []
    assert [(r.id[-4:], r.name, r.loss, r.samples_per_second) for r in rows] == [
        ("cccc", "lr-big", None, None), ("bbbb", "lr-small", None, 44.5), ("aaaa", "lr-small", 2.71828, 123.45)]
    shown = table(rows, "lab").splitlines()
    assert shown[1].split()[:2] == ["job", "name"] and shown[1].split()[9:11] == ["loss", "samples/s"]
    assert shown[4].split()[:3] == ["20260102-030405-aaaa", "lr-small", "completed"]
    assert shown[4].split()[8:10] == ["2.7183", "123.5"] and shown[2].split()[8:10] == ["-", "-"]
    master = LocalMaster(tmp_path)
    assert jobs.resolve_job_id(master, "lr-small") == "20260102-030406-bbbb"  # the newest of that name
    assert jobs.resolve_job_id(master, "20260102-030405-aaaa") == "20260102-030405-aaaa"
    with pytest.raises(jobs.JobError, match=r"^--job: no job named 'lr-medium' on this cluster"):
        jobs.resolve_job_id(master, "lr-medium")


@pytest.mark.parametrize("name", ["20260102-030405-aaaa", "-x", "a b", "a;rm", "x" * 65, "é"])
def test_a_job_name_is_refused_in_one_line_unless_it_is_a_name(name):
    from cluster.job.request import BuiltinJob, RequestError, RunRequest

    with pytest.raises(RequestError, match=r"^--name: .* is not allowed; allowed: letters, digits"):
        RunRequest("20260102-030405-aaaa", 1, BuiltinJob(), name=name)



def test_a_supervised_runs_spec_keeps_the_name_for_every_job_it_starts():
    from cluster.job.request import BuiltinJob, Managed, RunRequest

    named = RunRequest("20260102-030405-aaaa", 2, BuiltinJob(), managed=Managed(), name="long-run")
    again = RunRequest.from_mapping(json.loads(json.dumps(named.to_mapping())))  # the spec beside its checkpoints
    assert again == named and again.name == "long-run"
    older = named.to_mapping()
    del older["name"]  # a spec written before names
    assert RunRequest.from_mapping(older).name is None


def test_fab_jobs_costs_each_job_and_a_supervised_run_with_its_recoveries(tmp_path):
    from cluster.cost.jobcosts import cost_table

    recorded = {"status": "completed", "exit_code": 0, "world_size": 2,
                "cost": {"planned_seconds": 50.0, "planned_usd": 0.01, "actual_seconds": 61.0, "actual_usd": 0.0345}}
    job(tmp_path, "20260102-030405-aaaa", meta=META, exit_code="0\n", ended=START + 61)
    (tmp_path / JOBS_DIR / "20260102-030405-aaaa" / "summary.json").write_text(json.dumps(recorded))  # fab's own
    run = {**META, "supervised_run": "20260102-030406-bbbb", "name": "long"}
    job(tmp_path, "20260102-030406-bbbb", meta=run, exit_code="75\n", ended=START + 3600)  # reclaimed after 1 h
    job(tmp_path, "20260102-030407-cccc", meta=run, exit_code="75\n", ended=START + 1800)
    job(tmp_path, "20260102-030408-dddd", meta=run, exit_code="0\n", ended=START + 900)
    rows, problems = parse(listed(tmp_path), "node0")
    assert problems == [] and rows[-1].cost_usd == 0.0345 and {r.run for r in rows[:3]} == {"20260102-030406-bbbb"}
    text = cost_table(rows, 2.0, "lab").splitlines()  # $2 per node-hour, 2 nodes each
    costs = {line.split()[0]: line.split() for line in text[2:6]}
    assert costs["20260102-030405-aaaa"][-2:] == ["$0.0345", "recorded"]
    assert costs["20260102-030406-bbbb"][-2:] == ["$4.0000", "estimated"]  # 2 nodes x 1 h x $2
    assert costs["20260102-030407-cccc"][-2:] == ["$2.0000", "estimated"]  # its 30 min, its start to its end
    assert text[6] == "supervised run 20260102-030406-bbbb: 3 job(s), 2 recovery(ies), $7.0000"
    assert text[7] == "all jobs: $7.0345; estimates at the cluster's $2.0000 per node-hour now"


def test_a_supervised_runs_folder_is_not_a_job_and_its_jobs_are(tmp_path):
    """`fab train --managed` keeps its workdir and data files in ~/.xeon-cluster/jobs/<run id>/ (an id of the
    same form as a job's) with no job.json: no row of "unknown"s for it, and no problem line; its jobs are
    rows."""
    run = "20260102-030400-9999"
    folder = job(tmp_path, run)
    (folder / "workdir").mkdir()
    (folder / "workdir" / "train.py").write_text("print(1)\n")
    (folder / "data").mkdir()
    job(tmp_path, "20260102-030405-aaaa", meta={**META, "supervised_run": run}, exit_code="0\n", ended=START + 5)
    rows, problems = parse(listed(tmp_path), "node0")
    assert [(r.id, r.state) for r in rows] == [("20260102-030405-aaaa", "completed")] and problems == []


def _local_cluster_made_at(created_at: float):
    """The state file of local cluster "lab" as `fab local-up` keeps it, made at `created_at`; its inventory."""
    from cluster.inventory import Inventory, Node
    from node_setup.local import state as local_state

    paths = local_state.paths_for("lab")
    local_state.save_state(paths, local_state.ClusterState(
        name="lab", bridge="xc-lab", subnet="10.9.9.0/24", bridge_address="10.9.9.1", data_dir=str(paths.data_dir),
        cluster_dir=str(paths.cluster_dir), key_path=str(paths.key_path), inventory_path=str(paths.inventory_path),
        created_at=created_at))
    return Inventory(name="lab", kind="local", user="root", key_path="/k",
                     nodes=(Node(name="node0", address="10.9.9.2", private_address="10.9.9.2", rank=0, role="master"),))


def test_a_new_local_cluster_of_an_old_ones_name_has_a_history_of_its_own(tmp_path, monkeypatch):
    """`fab local-down`, then `fab local-up` of the same name: the new cluster lists none of the old one's jobs
    (on the code before, one file per name held both)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    old = _local_cluster_made_at(1764500000.5)
    job_history.record(old.name, [row("20261130-100000-aaaa")], identity=job_history.identity(old))
    assert job_history.identity(old) == "1764500000"
    new = _local_cluster_made_at(1764600000.0)
    assert job_history.read(new.name, identity=job_history.identity(new)) == []
    assert [r.id for r in job_history.read(old.name, identity="1764500000")] == ["20261130-100000-aaaa"]


def test_the_end_of_a_job_fab_train_followed_is_in_the_history(tmp_path, monkeypatch):
    """node_setup/tasks/job_run.py reads the master's records once its job ended (`observed`): the history holds
    the end (interrupted, 75) though no `fab jobs` ran after the start."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    home = tmp_path / "master"
    job(home, "20260102-030405-aaaa", meta=META, exit_code="75\n", ended=START + 30)
    inventory = _local_cluster_made_at(1764600000.0)
    rows = job_history.observed(inventory, LocalMaster(home))
    assert [(r.id, r.state, r.exit_code) for r in rows] == [("20260102-030405-aaaa", "interrupted", 75)]
    assert job_history.read("lab", identity=job_history.identity(inventory)) == rows


def test_a_supervised_runs_jobs_are_listed_beneath_their_run_and_a_notice_is_interrupted(tmp_path):
    """`fab jobs` of a managed run that was reclaimed twice (its jobs ended 75 at the spot notices) and then
    completed, with jobs of no run before and after it: one line for the run, its three jobs beneath it (newest
    first, indented under it), the others loose rows in their places; every column where the header puts it."""
    run = "20260102-030410-9999"
    before, after = "20260102-030405-aaaa", "20260102-030430-cccc"
    jobs_of_run = ["20260102-030420-bbb3", "20260102-030415-bbb2", "20260102-030410-bbb1"]
    job(tmp_path, before, meta=META, exit_code="0\n", ended=START + 4)
    for job_id, code in zip(jobs_of_run, ("0\n", "75\n", "75\n")):
        job(tmp_path, job_id, meta={**META, "supervised_run": run, "name": "long"}, exit_code=code, ended=START + 30)
    job(tmp_path, after, meta=META, exit_code="1\n", ended=START + 60)
    rows, problems = parse(listed(tmp_path), "node0")
    assert problems == []
    shown = table(rows, "lab").splitlines()
    assert shown[3] == "  supervised run 20260102-030410-9999: 3 job(s), 2 recovery(ies); the newest completed"
    assert [line[:24] for line in shown[2:]] == [
        f"  {after}  ", shown[3][:24], *(f"    {j}" for j in jobs_of_run), f"  {before}  "]
    states = {line.split()[0]: line.split()[2] for line in shown[2:] if not line.startswith("  supervised")}
    assert states == {after: "failed", jobs_of_run[0]: "completed", jobs_of_run[1]: "interrupted",
                      jobs_of_run[2]: "interrupted", before: "completed"}
    header = shown[1]
    for line in shown[2:]:
        if not line.startswith("  supervised"):
            assert line.index(" 2026-01-02T03:04:05Z") + 1 == header.index("started (UTC)"), line
    loose = table([r for r in rows if r.run is None], "lab").splitlines()
    assert loose[2].startswith(f"  {after} -")  # with no run: the columns as before


def test_a_managed_runs_jobs_are_in_the_history_from_the_first_ones_start_to_the_last_ones_end(tmp_path,
                                                                                               monkeypatch):
    """`fab train --managed` (node_setup/tasks/managed.py hand_off): once the supervisor started the run's first
    job the history holds it, running; once the run ended every job the supervisor started is there as the
    master recorded its end (two reclaimed at a notice: interrupted, 75; the last completed), under the run,
    though no `fab jobs` or `fab status` ran. The master is a stand-in home where job-list.sh runs for real; the
    supervisor's start and the run's log are stand-ins that write what the job scripts write."""
    from types import SimpleNamespace

    from cluster.job.jobplan import plan
    from node_setup.tasks import managed
    from tests.unit.test_job_run import RUN, inventory, requests

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    home = tmp_path / "master"
    request = requests()["--managed"]
    first = plan(request, inventory())
    later = ["20261127-103000-ab13", "20261127-110000-ab14"]
    meta = {**META, "supervised_run": RUN}
    sleeper: list[subprocess.Popen] = []

    def start_supervisor(master, spec, secrets, systemd):
        d = job(home, first.job_id, meta=meta)  # the first job's script runs: its pid, no exit code yet
        sleeper.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", first.job_id]))
        (d / "pid").write_text(f"{sleeper[0].pid}\n")

    seen_at_start: list[list[tuple]] = []

    def follow_run(master, run_id, **_):
        seen_at_start.append([(r.id, r.state) for r in job_history.read("lab")])
        sleeper[0].kill()
        sleeper[0].wait()
        (home / JOBS_DIR / first.job_id / "exit_code").write_text("75\n")  # reclaimed: rank 0's code at the notice
        job(home, later[0], meta=meta, exit_code="75\n")
        job(home, later[1], meta=meta, exit_code="0\n")
        return managed.OK

    monkeypatch.setattr(managed, "_spec_key", lambda: None)
    monkeypatch.setattr(managed, "publish_spec", lambda *a, **k: [])
    monkeypatch.setattr(managed, "supervisor_spec", lambda *a: ({}, {}))
    monkeypatch.setattr(managed.nodes, "start_supervisor", start_supervisor)
    monkeypatch.setattr(managed.nodes, "supervised_state",
                        lambda master, run: {"run": run, "status": "running", "job": first.job_id})
    monkeypatch.setattr(managed, "follow_run", follow_run)
    life = SimpleNamespace(transport=SimpleNamespace(master="node0", conns={"node0": LocalMaster(home)}))
    try:
        assert managed.hand_off(request, inventory(), first, life) == managed.OK
    finally:
        for process in sleeper:
            process.kill()
            process.wait()
    assert seen_at_start == [[(first.job_id, "running")]]
    assert [(r.id, r.state, r.exit_code, r.run) for r in job_history.read("lab")] == [
        (later[1], "completed", 0, RUN), (later[0], "interrupted", 75, RUN), (first.job_id, "interrupted", 75, RUN)]
