"""The log assembler (cluster/job/logstream.py) on job logs recorded on a 3-node local cluster.

tests/unit/logs/ holds the raw bytes of real jobs' logs, as the master's job directory had them:
- mpirun-three-ranks.log: three_ranks.py under Intel MPI, 3 ranks (partial lines, carriage-return progress
  on stderr and stdout, ANSI colour, several lines in one write, every rank at once);
- mpirun-failing-rank.log: failing_rank.py (recorded as fail.py), rank 1's traceback in pieces;
- mpirun-demo.log and torchrun-demo.log: the built-in demo job (`fab train --nodes 3 --max-steps 6`, with
  `--launcher torchrun`): torch's socket warning on every rank, transformers' load report of the new QA
  head, every rank's metrics dict, the summary JSON;
- torchrun-shutdown-trace.log: torchrun-demo.log with the C++ trace the agents of node1 and node2 print
  when the master's rendezvous store closed before their own shutdown, at the end of a job that succeeded
  (its lines as torch 2.x prints them, frames shortened; not recorded on this machine's local cluster,
  whose agents exit in an order that does not print it).
"""

from __future__ import annotations

import io
import os
import random
import secrets
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from cluster.job.joblog import failure_report
from cluster.exit_codes import INTERRUPTED
from cluster.job.launch import job_dir
from cluster.job.logstream import LAUNCHER_END_NAME, LogAssembler, LogSink, assemble, whole_lines
from node_setup.ssh import job as jobs
from tests.unit.test_runlog import LocalMaster

LOGS = Path(__file__).parent / "logs"
HOSTS = ["node0", "node1", "node2"]
JOB = "20261127-152440-5083"


def recorded(name: str) -> str:
    return (LOGS / name).read_bytes().decode()


def chunked(text: str, sizes) -> list[str]:
    pieces, at = [], 0
    for size in sizes:
        pieces.append(text[at:at + size])
        at += size
    return [p for p in pieces if p] + ([text[at:]] if at < len(text) else [])


def chunkings(text: str):
    """The log as a stream may bring it: whole, a character at a time, in small and in random pieces."""
    yield [text]
    yield list(text)
    yield chunked(text, [3] * len(text))
    yield chunked(text, [64] * len(text))
    for seed in range(3):
        rng = random.Random(seed)
        yield chunked(text, [rng.randint(1, 40) for _ in range(len(text))])


def streamed(chunks, **options) -> list[str]:
    """What a reader writes to its output when the stream's reader flushes after every chunk (as invoke does)."""
    out = io.StringIO()
    sink = LogSink(LogAssembler(HOSTS, **options), out)
    for chunk in chunks:
        sink.write(chunk)
        sink.flush()
    sink.close()
    return out.getvalue().splitlines()


def rank_lines(rank: int, *, metrics: bool) -> list[str]:
    """Every line three_ranks.py's rank prints, as a terminal would leave it, labelled."""
    label = f"[node{rank} r{rank}] "
    lines = [f"rank {rank} of 3 starting",
             *([f"{{'loss': 1.2345, 'grad_norm': 0.5, 'rank': {rank}}}"] if metrics else []),
             "progress 100%|##########| 10/10", f"ok rank {rank} bold",
             f"{rank} 0 {rank} 1 {rank} 2 {rank} 3 {rank} 4 done",
             f"chunk a {rank}", f"chunk b {rank}", f"chunk c {rank}", "5/5 steps [=====]",
             f"rank {rank} warning on stderr"]
    return [label + line for line in lines]


@pytest.mark.parametrize("chunks", list(chunkings(recorded("mpirun-three-ranks.log"))))
def test_three_ranks_interleaved_give_whole_correctly_labelled_lines_however_the_stream_is_cut(chunks):
    lines = streamed(chunks)
    assert lines[0].startswith(f"[xeon-cluster] job {JOB} started")
    assert lines[-2] == f"[xeon-cluster] job {JOB} exited with code 0"
    assert lines[-1] == "[xeon-cluster] hidden: 2 line(s) of the other ranks' metrics (fab logs --all-ranks shows them)"
    for rank in range(3):  # each rank's lines whole, in its order, under its own label (and no other line)
        assert [line for line in lines if line.startswith(f"[node{rank} r{rank}] ")] == \
            rank_lines(rank, metrics=rank == 0)
    assert len(lines) == 3 + sum(len(rank_lines(r, metrics=r == 0)) for r in range(3))


def test_every_ranks_metrics_with_all_ranks_and_colour_kept_for_a_terminal():
    lines = streamed([recorded("mpirun-three-ranks.log")], all_ranks=True, colour=True)
    for rank in range(3):
        assert f"[node{rank} r{rank}] {{'loss': 1.2345, 'grad_norm': 0.5, 'rank': {rank}}}" in lines
        assert f"[node{rank} r{rank}] \x1b[32mok\x1b[0m rank {rank} \x1b[1mbold\x1b[0m\x1b[0m" in lines
    assert not any("hidden" in line for line in lines)
    plain = streamed([recorded("mpirun-three-ranks.log")])
    assert not any("\x1b" in line for line in plain)


def test_on_a_terminal_only_colour_passes_never_a_title_a_screen_clear_or_a_control():
    hostile = "[0] \x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m\x07\x08 end\n[1] \x1b[1;1Hhome\x1b\\\n"
    for colour in (True, False):
        lines = assemble(hostile, ["a", "b"], colour=colour, notes=False)
        assert [line.replace("\x1b[31m", "").replace("\x1b[0m", "") for line in lines] == \
            ["[a r0   ] red end", "[b r1   ] home"]
        assert ("\x1b[31mred" in lines[0]) is colour


@pytest.mark.parametrize("chunks", list(chunkings(recorded("mpirun-failing-rank.log")))[:3])
def test_a_failing_ranks_traceback_comes_whole_and_names_the_rank(chunks):
    lines = streamed(chunks)
    assert [line for line in lines if line.startswith("[node1 r1] ")] == [
        "[node1 r1] step 2/3rank 1 at step 3",  # the program wrote no newline after its progress: as on a terminal
        "[node1 r1] Traceback (most recent call last):",
        '[node1 r1]   File "/root/.xeon-cluster/jobs/20261127-152450-6fad/workdir/fail.py", line 9, in <module>',
        '[node1 r1]     raise ValueError("bad batch on rank 1")',
        "[node1 r1] ValueError: bad batch on rank 1",
        "[node1 r1] [xeon-cluster] rank 1 on host node1 (pid 11646): exited with code 1"]
    log = recorded("mpirun-failing-rank.log")
    assert failure_report(log, HOSTS, 255) == ["rank 1 on node node1 (host node1, pid 11646): exit code 1"]
    assert "[1] ValueError: bad batch on rank 1\n" in whole_lines(log, HOSTS)


@pytest.mark.parametrize(("name", "launcher", "warnings"), [("mpirun-demo.log", "mpirun", 3),
                                                           ("torchrun-demo.log", "torchrun", 6)])
def test_the_demo_jobs_log_shows_the_summary_once_rank_0s_metrics_and_counts_the_warnings(name, launcher, warnings):
    log = recorded(name)
    lines = streamed(chunked(log, [7] * len(log)), launcher=launcher)
    summary = [line for line in lines if "run summary" in line]
    assert summary == ["[node0 r0] run summary: completed, step 6 of 6, "
                       f"{'561.989' if launcher == 'mpirun' else '545.696'} samples/s, train loss 3.84079, "
                       f"MFU {'0.18' if launcher == 'mpirun' else '0.15'}% "
                       "(all of it: summary.json in the job's output folder)"]
    assert not any('"status"' in line or line.endswith("{") for line in lines)  # no line of the JSON itself
    assert [line.split("] ", 1)[0] for line in lines if "'train_runtime'" in line] == ["[node0 r0"]
    assert not any("hostname of the client socket" in line or "MISSING" in line for line in lines[:-3])
    assert lines[-3:] == [
        f"[xeon-cluster] hidden: {warnings} line(s) of torch's \"hostname of the client socket cannot be retrieved\" "
        "warning", "[xeon-cluster] hidden: 7 line(s) of transformers' load report (only a new head's weights missing)",
        "[xeon-cluster] hidden: 2 line(s) of the other ranks' metrics (fab logs --all-ranks shows them)"]
    labels = {line.split("] ", 1)[0] + "]" for line in lines if not line.startswith("[xeon-cluster]")}
    assert labels == {"[node0 r0]"}  # every line is rank 0's: none labelled by the launcher, none cut in two
    # every rank's metrics when asked: 2 lines more, 1 count line less
    assert len(streamed([log], launcher=launcher, all_ranks=True)) == len(lines) + 2 - 1


def test_a_json_block_that_is_not_the_summary_is_shown_as_it_is():
    log = "[0] {\n[0]   \"a\": 1\n[0] }\n[1] {\n[1] not json\n"
    assert assemble(log, ["n0", "n1"], notes=False) == ['[n0 r0  ] {', '[n0 r0  ]   "a": 1', '[n0 r0  ] }',
                                                        '[n1 r1  ] {', '[n1 r1  ] not json']


def test_a_summary_says_what_it_has():
    lines = assemble("[0] {\n[0] \"status\": \"interrupted\", \"exit_code\": 75, \"world_size\": 2\n[0] }\n",
                     ["n0", "n1"], notes=False)
    assert lines == ["[n0 r0  ] run summary: interrupted (all of it: summary.json in the job's output folder)"]


def test_fab_logs_lines_counts_the_lines_a_person_sees(tmp_path):
    log = recorded("mpirun-three-ranks.log")
    d = tmp_path / job_dir(JOB)
    d.mkdir(parents=True)
    (d / "log").write_bytes(log.encode())
    whole = assemble(log, HOSTS, notes=False)
    for count in (1, 5, 21):
        out = io.StringIO()
        jobs.follow(LocalMaster(tmp_path), JOB, HOSTS, out, last_lines=count, follow_=False)
        assert out.getvalue().splitlines() == whole[-count:]
    out = io.StringIO()  # followed (the job has ended): the last lines, then nothing twice, then the count line
    jobs.follow(LocalMaster(tmp_path), JOB, HOSTS, out, last_lines=3)
    assert out.getvalue().splitlines() == whole[-3:]
    out = io.StringIO()
    jobs.follow(LocalMaster(tmp_path), JOB, HOSTS, out)
    assert out.getvalue().splitlines() == assemble(log, HOSTS)


def test_the_launchers_own_lines_open_mpis_tags_and_a_line_in_two_chunks():
    out = io.StringIO()
    sink = LogSink(LogAssembler(["node0", "node0", "node1", "node1"]), out)
    for chunk in ("[3] loss 0.5\n[0] hel", "lo\r\n[mpiexec@node0] Error: oops\n",
                  "[2] partial line\n[xeon-cluster] job x exited with code 0\n",
                  "[1,1]<stdout>: from open mpi\n=   BAD TERMINATION\n[0] Map: 50%\r[0] \n[1] keep [this] \n"):
        sink.write(chunk)
        sink.flush()
    sink.close()
    assert out.getvalue().splitlines() == [
        "[node1 r3] loss 0.5", "[node0 r0] hello", "[mpirun  ] [mpiexec@node0] Error: oops",
        "[node1 r2] partial line", "[xeon-cluster] job x exited with code 0", "[node0 r1] from open mpi",
        "[mpirun  ] =   BAD TERMINATION", "[node0 r0] Map: 50%", "[node0 r1] keep [this] "]


def test_a_successful_torchrun_jobs_log_hides_the_agents_shutdown_trace():
    log = recorded("torchrun-shutdown-trace.log")
    trace = [line for line in log.splitlines() if line.startswith(("[node1 torchrun] ", "[node2 torchrun] "))
             and "hostname of the client socket" not in line and line.split("] ", 1)[1].strip()]
    assert len(trace) == 2 * 16
    for chunks in chunkings(log):
        lines = streamed(chunks, launcher="torchrun")
        assert not any("torchrun" in line.split("] ", 1)[0] for line in lines), lines
        assert lines[-6:-4] == ["[node0 r0] run summary: completed, step 6 of 6, 545.696 samples/s, train loss "
                                "3.84079, MFU 0.15% (all of it: summary.json in the job's output folder)",
                                "[xeon-cluster] job 20261127-152107-0a9a exited with code 0"]
        assert "[xeon-cluster] hidden: 32 line(s) of torchrun's shutdown trace (the rendezvous closed before " \
               "this agent's shutdown; harmless)" in lines
    assert assemble(log, HOSTS, "torchrun", notes=False) == assemble(recorded("torchrun-demo.log"), HOSTS,
                                                                     "torchrun", notes=False)


def test_a_trace_that_does_not_end_in_the_shutdown_line_and_a_load_report_with_other_keys_are_shown():
    trace = ("[node1 torchrun] [W1127 15:21:23.1 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=4): x\n"
             "[node1 torchrun] frame #0: c10::Error::Error() + 0x80\n")
    failed = trace + "[node1 torchrun] torch.distributed.DistNetworkError: failed to recv\n"
    assert assemble(failed, HOSTS, "torchrun", notes=False) == [
        "[node1 torchrun] [W1127 15:21:23.1 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=4): x",
        "[node1 torchrun] frame #0: c10::Error::Error() + 0x80",
        "[node1 torchrun] torch.distributed.DistNetworkError: failed to recv"]
    assert assemble(trace, HOSTS, "torchrun", notes=False) == [  # the log ends inside it: shown too
        "[node1 torchrun] [W1127 15:21:23.1 TCPStore.cpp:125] [c10d] recvValue failed on SocketImpl(fd=4): x",
        "[node1 torchrun] frame #0: c10::Error::Error() + 0x80"]
    report = ("[0] [transformers] M LOAD REPORT from: m\n[0] Key | Status  | \n[0] a.weight | MISSING | \n"
              "[0] b.weight | UNEXPECTED | \n[0] step 1\n")
    assert assemble(report, HOSTS) == ["[node0 r0] [transformers] M LOAD REPORT from: m",
                                       "[node0 r0] Key | Status  | ", "[node0 r0] a.weight | MISSING | ",
                                       "[node0 r0] b.weight | UNEXPECTED | ", "[node0 r0] step 1"]


def test_ddps_find_unused_parameters_warning_is_hidden_on_every_rank():
    warning = ("[W1127 15:21:22.1 reducer.cpp:1430] Warning: find_unused_parameters=True was specified in DDP "
               "constructor, but did not find any unused parameters in the forward pass. (function operator())\n")
    lines = assemble("".join(f"[{rank}] {warning}[{rank}] step {rank}\n" for rank in range(3)), HOSTS)
    assert lines == ["[node0 r0] step 0", "[node1 r1] step 1", "[node2 r2] step 2",
                     "[xeon-cluster] hidden: 3 line(s) of DDP's find_unused_parameters warning (every rank's)"]


# The launcher's lines at the end of a local cluster's job whose second node was reclaimed (Intel MPI's Hydra).
_I_HYDRA = "../../../../../src/pm/i_hydra"
HYDRA_END = "".join(line + "\n" for line in (
    "Connection to 10.204.206.3 closed by remote host.",
    "[mpiexec@node0] Error: Downstream from host node1 exited abnormally",
    "[mpiexec@node0] Trying to close other downstreams",
    f"[mpiexec@node0] HYD_sock_write ({_I_HYDRA}/libhydra/sock/hydra_sock_intel.c:362): write error (Bad file "
    "descriptor)",
    f"[mpiexec@node0] wait_proxies_to_terminate ({_I_HYDRA}/mpiexec/intel/i_mpiexec.c:554): downstream from host "
    "node1 exited with status 255"))


def _launcher_end_shown(shown: list[str]) -> list[str]:
    return [line for line in shown if "mpiexec@" in line or "Connection to" in line]


def test_an_interrupted_jobs_launcher_end_is_hidden_and_counted_and_a_failed_jobs_is_shown(tmp_path):
    """The real job script with a stand-in mpirun: rank 0 (under the rank wrapper) logs a step and ends
    INTERRUPTED at a spot notice, or fails; Hydra then prints its end lines and returns 255. The interrupted
    job's end lines are hidden and counted; the failed job's are shown (they say which node went away)."""
    from tests.unit.test_launch import RANK_WRAPPER, run_job_script

    for code, expected in ((INTERRUPTED, INTERRUPTED), (1, 255)):
        rank_0 = f"echo '[0] step 3'; exit {code}"
        mpirun = (f"#!/bin/sh\nPMI_RANK=0 sh -c {shlex.quote(RANK_WRAPPER)} xeon-rank sh -c {shlex.quote(rank_0)}\n"
                  f"printf %s {shlex.quote(HYDRA_END)}\nexit 255\n")
        plan, done, _, _ = run_job_script(tmp_path / str(code), "intel-mpi", mpirun=mpirun)
        assert done.returncode == expected, done.stdout + done.stderr
        shown = assemble((tmp_path / str(code) / "home" / plan.job_dir / "log").read_text(), ["node0"])
        assert "[node0 r0] step 3" in shown and f"[xeon-cluster] job {plan.job_id} exited with code {expected}" in shown
        note = f"[xeon-cluster] hidden: {len(HYDRA_END.splitlines())} line(s) of {LAUNCHER_END_NAME}"
        if code == INTERRUPTED:
            assert _launcher_end_shown(shown) == [] and note in shown, shown
        else:
            assert [line.split("] ", 1)[1] for line in _launcher_end_shown(shown)] == HYDRA_END.splitlines(), shown
            assert not any(LAUNCHER_END_NAME in line for line in shown)


def test_a_stopped_jobs_launcher_end_is_hidden_and_the_log_says_it_was_stopped(tmp_path):
    """The real job script runs a stand-in mpirun whose rank logs a step; `fab stop`'s own steps
    (node_setup/ssh/job.py stop: job-stop-master.sh marks the job stopped, job-stop-node.sh ends what carries
    the job's id) end it; the stand-in then prints Hydra's end lines and returns 255. The log says the job was
    stopped; what a person sees has no Hydra line, one count line for them, and the job's last lines."""
    from cluster.job.launch import plan_launch
    from cluster.job.layout import plan_layout
    from cluster.stack import catalog

    home, venv = tmp_path / "home", tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    mpirun = venv / "bin" / "mpirun"
    (tmp_path / "hydra-end").write_text(HYDRA_END)
    mpirun.write_text(f"#!/bin/sh\ntrap 'cat {shlex.quote(str(tmp_path / 'hydra-end'))}; exit 255' TERM\n"
                      "echo '[0] step 1'\nwhile :; do sleep 0.1; done\n")
    mpirun.chmod(0o755)
    layout = plan_layout(catalog.custom("test", 1, 2), backend="gloo")
    job_id = f"20260101-000000-{secrets.token_hex(2)}"  # the stop ends whatever on this machine carries it
    plan = plan_launch(flavour="intel-mpi", job_id=job_id, hosts=["node0"], master_addr="127.0.0.1",
                       layout=layout, program=["python", "-m", "training"], venv=str(venv))
    d = home / plan.job_dir
    d.mkdir(parents=True)
    (d / "run.sh").write_text(plan.script())
    env = {"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
    script = subprocess.Popen(["sh", str(d / "run.sh")], env=env, cwd=tmp_path, start_new_session=True)
    try:
        for _ in range(300):  # the rank's step is in the log: the job runs
            if "[0] step 1" in ((d / "log").read_text() if (d / "log").exists() else ""):
                break
            time.sleep(0.1)
        here = LocalMaster(home)  # the master is the job's one node
        # The stand-in ends on TERM within a sleep of 0.1 s; the stop waits only until it is gone, but KILLs it after
        # `grace` (exit 137, not Hydra's 255): on a loaded 2-core machine 2 s was once too short.
        assert all(step.ok for step in jobs.stop(here, {"node0": here}, plan.job_id, grace=20))
        assert script.wait(timeout=30) == 255
    finally:
        if script.poll() is None:
            os.killpg(script.pid, signal.SIGKILL)
    log = (d / "log").read_text()
    assert f"[xeon-cluster] job {plan.job_id} was stopped\n" in log and "exited with status 255" in log
    shown = assemble(log, ["node0"])
    assert _launcher_end_shown(shown) == [] and "[mpirun  ] Terminated" not in shown, shown
    ended = len(HYDRA_END.splitlines()) + log.splitlines().count("Terminated")  # the shell's, for the stand-in's sleep
    assert f"[xeon-cluster] hidden: {ended} line(s) of {LAUNCHER_END_NAME}" in shown
    assert shown[-3:-1] == [f"[xeon-cluster] job {plan.job_id} was stopped",
                            f"[xeon-cluster] job {plan.job_id} exited with code 255"]


def test_the_launchers_lines_before_a_rank_speaks_and_before_more_rank_lines_are_shown_in_place():
    """Held end lines are shown once a rank speaks again, and Hydra's lines before any rank's (a node it cannot
    reach) are never held; a log that ends without the job script's line shows what was held."""
    hydra = "[mpiexec@node0] Error: Unable to run bstrap_proxy on node1"
    assert assemble(f"{hydra}\n[0] step 1\n", ["node0"]) == [f"[mpirun  ] {hydra}", "[node0 r0] step 1"]
    log = f"[0] step 1\n{hydra}\n[0] step 2\n{hydra}\n"
    assert assemble(log, ["node0"]) == ["[node0 r0] step 1", f"[mpirun  ] {hydra}", "[node0 r0] step 2",
                                        f"[mpirun  ] {hydra}"]
