"""Draw and write `fab report`: each of cluster/job/runreport.py's SERIES against the step, every job's curve
on the same axes, its recoveries as dashed lines (matplotlib, no display), and one self-contained HTML
file with the plots inline (base64 PNG) beside each job's facts."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Sequence

from cluster.job.runreport import SERIES, JobReport, facts

PAGE = "report.html"


def figure(reports: Sequence[JobReport], key: str, label: str):
    """One series of every job on one matplotlib figure, or None when no job has a point of it."""
    if not any(r.curves.get(key) for r in reports):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.6))
    for index, report in enumerate(reports):
        colour = f"C{index % 10}"
        points = report.curves.get(key) or []
        if points:
            ax.plot([s for s, _ in points], [v for _, v in points], "o-" if len(points) < 30 else "-",
                    color=colour, label=report.label, markersize=3)
        for n, step in enumerate(report.recoveries):
            ax.axvline(step, color=colour, linestyle="--", linewidth=1,
                       label=f"{report.label}: resumed" if n == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def png(fig) -> bytes:
    import matplotlib.pyplot as plt

    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out.getvalue()


def plots(reports: Sequence[JobReport]) -> dict[str, bytes]:
    """SERIES key -> PNG, for each series some job has."""
    drawn = {key: figure(reports, key, label) for key, label in SERIES}
    return {key: png(fig) for key, fig in drawn.items() if fig is not None}


def page(reports: Sequence[JobReport], images: dict[str, bytes], title: str) -> str:
    """The report as one HTML page: the plots inline, then each job's facts; every text escaped."""
    esc = html.escape
    parts = [f"<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{esc(title)}</title>",
             "<style>body{font-family:sans-serif;margin:1em 2em}table{border-collapse:collapse;margin:0 2em 1em 0}"
             "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}.jobs{display:flex;flex-wrap:wrap}"
             "</style></head><body>", f"<h1>{esc(title)}</h1>"]
    labels = dict(SERIES)
    for key, data in images.items():
        parts.append(f"<h2>{esc(labels[key])}</h2><img alt=\"{esc(labels[key])} against step\" "
                     f"src=\"data:image/png;base64,{base64.b64encode(data).decode()}\">")
    parts.append("<div class=\"jobs\">")
    for report in reports:
        rows = "".join(f"<tr><th>{esc(name)}</th><td>{esc(value)}</td></tr>" for name, value in facts(report))
        parts.append(f"<table><caption>{esc(report.label)}</caption>{rows}</table>")
    parts.append("</div>")
    problems = [p for r in reports for p in r.problems]
    if problems:
        parts.append("<ul>" + "".join(f"<li>{esc(p)}</li>" for p in problems) + "</ul>")
    parts.append("</body></html>\n")
    return "".join(parts)


def write(reports: Sequence[JobReport], directory: Path, title: str, *, as_png: bool) -> list[Path]:
    """report.html (and with `as_png` each plot as <series>.png) into `directory`; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    images = plots(reports)
    written = [directory / PAGE]
    written[0].write_text(page(reports, images, title))
    if as_png:
        for key, data in images.items():
            path = directory / f"{key}.png"
            path.write_bytes(data)
            written.append(path)
    return written
