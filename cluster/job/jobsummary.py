"""A job's summary.json as `fab` reads it back from the master: checked before anything uses it.

The file is written by the job on the master (training/summary.py), so what comes back is only
as good as the master: a file cut short, an older or newer job's fields, or one written by someone
else. `parse(text)` is the one way in for every reader (`fab train`'s report and reclaim report,
the cost record, the recoveries record): it never raises; a field that `fab` uses but is not of
the shape the job writes is left out, with one warning line saying which; fields `fab` does not
use are kept as they are. Text printed from the file is one line of printable characters.
"""

from __future__ import annotations

import json
from typing import Any

from cluster import records

# The fields `fab train` prints after a run, as they are (cluster/job/jobreport.py): scalars only.
PRINTED = ("status", "world_size", "nodes", "global_batch_size", "steps", "epoch", "train_loss",
           "samples_per_second", "wall_seconds", "final_model")
_SCALARS = (bool, int, float, str, type(None))


def _scalar(value: Any) -> bool:
    return isinstance(value, _SCALARS) and (not isinstance(value, str) or value.isprintable())


def _text(value: Any) -> bool:
    return isinstance(value, str) and value.isprintable()


def _step(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _optional_text(value: Any) -> bool:
    return value is None or _text(value)


def _path(value: Any) -> bool:  # there, and null for a checkpoint a full disk could not hold
    return value is None or _text(value)


# checkpoints[]: what the job's checkpoint callback records (a null path and a save_error: one a full disk
# could not hold); checkpoint_upload_errors[]: {step, error}.
_CHECKPOINT = {"step": _step, "path": _path, "uri": _optional_text, "upload_error": _optional_text,
               "save_error": _optional_text}
_UPLOAD_ERROR = {"step": _step, "error": _text}
_LIST_ITEMS = {"checkpoints": _CHECKPOINT, "checkpoint_upload_errors": _UPLOAD_ERROR}


def _record_ok(item: Any, shape: dict) -> bool:
    """A dict whose fields in `shape` are there (`uri`/`upload_error` may be missing) and well formed."""
    if not isinstance(item, dict):
        return False
    return all(check(item[key]) if key in item else check is _optional_text for key, check in shape.items())


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def checked(data: Any, where: str = "summary.json") -> tuple[dict | None, list[str]]:
    """(the summary with malformed fields left out, one warning line for each), or (None, [why]) when
    `data` is not a JSON object. Pure; `data` is not changed."""
    if not isinstance(data, dict):
        return None, [f"warning: {where}: a JSON {type(data).__name__}, not an object; not read"]
    out: dict = {}
    warnings: list[str] = []

    def drop(field: str, value: Any, allowed: str) -> None:
        warnings.append(f"warning: {where}: {field}: {_shown(value)} left out; allowed: {allowed}")

    for key, value in data.items():
        if not isinstance(key, str):  # json.loads gives str keys; a dict from elsewhere may not
            drop(repr(key), value, "string keys")
        elif key in _LIST_ITEMS:
            if value is None:
                out[key] = []
                continue
            if not isinstance(value, list):
                drop(key, value, "a list")
                continue
            shape = _LIST_ITEMS[key]
            kept = [item for item in value if _record_ok(item, shape)]
            for index, item in enumerate(value):
                if not _record_ok(item, shape):
                    drop(f"{key}[{index}]", item, "{" + ", ".join(shape) + "} with a step of 0 or more")
            out[key] = kept
        elif key == "metrics":
            if value is None:
                continue
            if not isinstance(value, dict):
                drop(key, value, "a map of names to numbers or text")
                continue
            out[key] = {}
            for name, metric in value.items():
                if _text(name) and _scalar(metric):
                    out[key][name] = metric
                else:
                    drop(f"metrics.{name}" if _text(name) else f"metrics[{_shown(name)}]", metric,
                         "a number or one line of text, named by one line of text")
        elif key == "interruption":
            if value is None or (isinstance(value, dict) and _step(value.get("step"))):
                out[key] = value
            else:
                drop(key, value, "null or {step: a whole number}")
        elif key == "settings":
            if not isinstance(value, dict):
                drop(key, value, "a map")
                continue
            out[key] = dict(value)
            if not _optional_text(value.get("checkpoint_uri")):
                del out[key]["checkpoint_uri"]
                drop("settings.checkpoint_uri", value["checkpoint_uri"], "null or one line of text")
        elif key in PRINTED and not _scalar(value):
            drop(key, value, "a number or one line of text")
        else:
            out[key] = value
    return out, warnings


def parse(text: str | None, where: str = "summary.json") -> tuple[dict | None, list[str]]:
    """`checked` of the JSON in `text`; (None, [why]) when there is no text or it is not JSON."""
    try:
        data = records.load(text, where)  # bounded: size, nesting, numbers
    except records.RecordError as exc:
        return None, [f"warning: {exc}"]
    if data is None:
        return None, [] if text is None else [f"warning: {where}: empty; not read"]
    return checked(data, where)

