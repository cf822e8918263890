"""The calibration `fab bench` kept for a cluster, read for `fab train` (its compile figures and measured
layout); a file that cannot be read is named and left aside, never a reason to stop a launch."""

from __future__ import annotations

from cluster.cost import calibration as calib
from node_setup.controller import config_root


def for_cluster(cluster: str) -> tuple[calib.Calibration | None, str]:
    """(the cluster's calibration or None, a note when one exists but cannot be used)."""
    try:
        path = calib.path_for(config_root(), cluster)
    except calib.CalibrationError:
        return None, ""
    if not path.is_file():
        return None, ""
    try:
        return calib.parse(path.read_text(), str(path)), ""
    except (OSError, calib.CalibrationError) as exc:
        return None, f"note: {exc}; training without it (the layout rule, no compile estimate)"
