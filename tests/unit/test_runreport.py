"""`fab report`'s pieces: a job's records read into curves (cluster/job/runreport.py), the curves drawn, every
job on the same axes (node_setup/report_plot.py, matplotlib) and one self-contained HTML page; the built-in
job's step timer (training/callbacks.py StepTimer) writing what the curves need into the Trainer's log
history. A real run's trainer_state.json: tests/training/test_mfu.py; `fab report` on a cluster:
tests/ssh/test_torchrun.py."""

from __future__ import annotations

import base64
import json
import re
from types import SimpleNamespace

from cluster.job import runreport
from cluster.job.runreport import RESUMED, SAMPLES_PER_SECOND, STEP_SECONDS, job_report
from node_setup import report_plot


def state(*entries: dict) -> str:
    return json.dumps({"global_step": 0, "log_history": list(entries)})


def entry(step: int, loss: float, lr: float = 1e-4, seconds: float = 0.5) -> dict:
    return {"step": step, "loss": loss, "learning_rate": lr, STEP_SECONDS: seconds, SAMPLES_PER_SECOND: 16 / seconds,
            "epoch": step / 100}


SUMMARY = {"status": "completed", "exit_code": 0, "world_size": 2, "steps": 6, "train_loss": 1.25,
           "samples_per_second": 31.9, "mfu": 0.0123, "resumed_from": None,
           "cost": {"planned_seconds": 60.0, "planned_usd": 0.01, "actual_seconds": 75.5, "actual_usd": 0.0125}}


def test_a_jobs_records_give_its_curves_recoveries_and_the_facts_beside_its_plan():
    made = job_report("lr-small", {
        "trainer_state.json": state(entry(2, 3.0), entry(4, 2.5), {"step": 4, RESUMED: True}, entry(4, 2.4),
                                    entry(6, 2.0), {"step": 6, "train_runtime": 9.0, "train_loss": 2.3},
                                    {"step": 8, "loss": "1.0"}, {"step": 9, "loss": float("nan")}),
        "summary.json": json.dumps(SUMMARY), "progress.json": None})
    assert made.curves["loss"] == [(2, 3.0), (4, 2.4), (6, 2.0)]  # the resumed run's entry at step 4 wins
    assert made.curves["learning_rate"] == [(2, 1e-4), (4, 1e-4), (6, 1e-4)]
    assert made.curves[SAMPLES_PER_SECOND] == [(2, 32.0), (4, 32.0), (6, 32.0)]
    assert made.recoveries == (4,) and made.problems == ()
    assert dict(runreport.facts(made)) == {
        "status": "completed", "exit code": "0", "ranks": "2", "steps": "6", "final training loss": "1.25",
        "samples per second": "31.9", "MFU": "1.23%", "planned time (s)": "60", "actual time (s)": "75.5",
        "planned cost (USD)": "0.01", "actual cost (USD)": "0.0125", "recoveries": "step 4"}


def test_what_a_node_wrote_badly_gives_no_curve_and_one_line_and_a_program_without_a_trainer_its_speed():
    made = job_report("j", {"trainer_state.json": "{not json", "summary.json": "[1]",
                            "progress.json": json.dumps({"format": 1, "step": 40, "samples_per_second": 12.5})})
    assert made.problems == ("j: trainer_state.json: not JSON; left out",)
    assert made.curves[SAMPLES_PER_SECOND] == [(40, 12.5)] and made.curves["loss"] == [] and made.summary == {}
    nothing = job_report("k", {"trainer_state.json": json.dumps({"log_history": {"step": 1}})})
    assert nothing.empty() and nothing.problems == ("k: trainer_state.json has no log_history list; no curves",)


def test_two_jobs_overlay_on_the_same_axes_and_the_page_holds_every_plot_inline(tmp_path):
    first = job_report("lr-small (20261201-100000-aaaa)", {"trainer_state.json": state(entry(2, 3.0), entry(4, 2.0)),
                                                           "summary.json": json.dumps(SUMMARY)})
    second = job_report("lr-<big> (20261201-110000-bbbb)", {
        "trainer_state.json": state(entry(2, 3.1, 5e-4, 0.25), {"step": 2, RESUMED: True}, entry(4, 1.5, 5e-4))})
    fig = report_plot.figure([first, second], "loss", "training loss")
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.lines] == [first.label, second.label, f"{second.label}: resumed"]
    assert list(ax.lines[1].get_xdata()) == [2, 4] and list(ax.lines[1].get_ydata()) == [3.1, 1.5]
    assert list(ax.lines[2].get_xdata()) == [2, 2]  # the recovery: a vertical line at step 2
    report_plot.png(fig)
    written = report_plot.write([first, second], tmp_path / "out", "cluster lab: two runs", as_png=True)
    assert [p.name for p in written] == ["report.html", "loss.png", "learning_rate.png", "samples_per_second.png",
                                         "step_seconds.png"]
    page = written[0].read_text()
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">', page)
    assert [alt for alt, _ in images] == ["training loss against step", "learning rate against step",
                                          "samples per second against step", "step time (s) against step"]
    for (_, data), path in zip(images, written[1:]):
        assert base64.b64decode(data) == path.read_bytes() and path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert "lr-&lt;big&gt;" in page and "<big>" not in page and "src=\"http" not in page  # escaped, nothing fetched
    assert "<caption>lr-small (20261201-100000-aaaa)</caption>" in page and "<td>step 2</td>" in page


def test_the_step_timer_writes_each_logging_steps_time_and_speed_and_a_resume_into_the_log_history():
    from training.callbacks import StepTimer

    timer = StepTimer()
    args = SimpleNamespace(per_device_train_batch_size=4, gradient_accumulation_steps=2, world_size=2,
                           output_dir="/nonexistent/out")
    trainer_state = SimpleNamespace(global_step=0, max_steps=20, log_history=[])
    timer.on_train_begin(args, trainer_state, None)  # the Trainer restores a checkpoint's state after this
    timer.progress = None  # (its record file: xeon_cluster/progress.py's own tests)
    trainer_state.global_step, trainer_state.log_history = 11, [{"step": 10, "loss": 9.0}]  # restored at step 10
    timer.on_step_end(args, trainer_state, None)
    assert trainer_state.log_history[-1] == {"step": 10, RESUMED: True}  # resumed at step 10: a recovery
    timer.step_seconds = [5.0, 0.5, 0.25]  # the first step carries the warm-up: left out
    trainer_state.global_step = 13
    trainer_state.log_history.append({"step": 13, "loss": 2.0})
    timer.on_log(args, trainer_state, None)
    assert trainer_state.log_history[-1] == {"step": 13, "loss": 2.0, STEP_SECONDS: 0.375,
                                             SAMPLES_PER_SECOND: round(16 / 0.375, 2)}
    timer.step_seconds += [1.0, 1.0]
    trainer_state.global_step = 15
    trainer_state.log_history.append({"step": 15, "train_runtime": 3.0})  # no loss: not a logging step's entry
    timer.on_log(args, trainer_state, None)
    assert trainer_state.log_history[-1] == {"step": 15, "train_runtime": 3.0}
