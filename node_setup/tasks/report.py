"""`fab report`: one job's (or several jobs' overlaid) loss, learning rate, samples per second and step time
against the step, as one self-contained HTML file (and PNGs), from the jobs' own records on the master
(cluster/job/runreport.py decides what is drawn, node_setup/report_plot.py draws it)."""

from __future__ import annotations

from pathlib import Path

from cluster.job import runreport
from cluster.names import printable
from node_setup.tasks import common
from node_setup.tasks.common import CLUSTER_HELP, FAILED, JOB_HELP, REGION_HELP, fail, task


@task(help={"job": JOB_HELP + "; give --job again to overlay several jobs' curves",
            "to": "the folder report.html goes into (made when missing)",
            "png": "also save each plot as <series>.png in that folder (for a terminal user)",
            "cluster": CLUSTER_HELP, "region": REGION_HELP},
      iterable=("job",))
def report(c, job=None, to="", png=False, cluster="", region=""):
    """Write one HTML file of a job's curves against the step; several --job overlay them.

    Loss, learning rate, samples per second and step time, recoveries marked, the summary beside the plan;
    --png also saves each plot as a PNG."""
    from node_setup import report_plot
    from node_setup.ssh import job as jobs

    if not to:
        raise fail("--to: missing; give the folder report.html goes into, e.g. --to reports/lr-small")
    directory = Path(to).expanduser()
    if directory.exists() and not directory.is_dir():
        raise fail(f"--to: {to!r} is not a folder")
    inventory = common.inventory(cluster, region)
    master = common.connect(inventory)[inventory.master.name]
    reports = []
    for wanted in job or [""]:
        try:
            job_id = jobs.resolve_job_id(master, wanted or None)
            meta = jobs.read_metadata(master, job_id)
        except jobs.JobError as exc:
            raise fail(str(exc)) from None
        output_dir = meta.get("output_dir")
        if not output_dir:
            raise fail(f"--job: job {job_id} records no output folder on {inventory.master.name}", FAILED)
        label = f"{meta['name']} ({job_id})" if meta.get("name") else job_id
        reports.append(runreport.job_report(label, jobs.read_job_records(master, output_dir)))
    for made in reports:
        for line in made.problems:
            print(printable(line))
        if made.empty():
            print(f"{printable(made.label)}: no curves (no trainer_state.json log history, no progress.json)")
    title = f"cluster {inventory.name}: " + ", ".join(r.label for r in reports)
    for path in report_plot.write(reports, directory, title, as_png=png):
        print(f"wrote {path}")


TASKS = [report]
