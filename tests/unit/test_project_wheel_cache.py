"""The controller's cache of project wheels, read by every fab on this machine at once (the suite's
three workers, two terminals): a wheel there is whole or absent, never half written."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

from node_setup.controller import PROJECT_ROOT, project_version
from node_setup.ssh import wheels


def test_a_wheel_being_cached_is_never_seen_half_written_by_another_fab(tmp_path, monkeypatch):
    out = tmp_path / project_version(PROJECT_ROOT)
    seen: list[bool] = []
    copy2 = shutil.copy2

    def copy_in_two_halves(src, dst, **kwargs):
        data = Path(src).read_bytes()
        Path(dst).write_bytes(data[: len(data) // 2])
        # what another fab's build_project_wheel finds now, and whether it is the whole wheel
        seen.extend(found.read_bytes() == data for found in sorted(out.glob("xeon_cluster-*.whl")))
        return copy2(src, dst, **kwargs)

    monkeypatch.setattr(wheels.shutil, "copy2", copy_in_two_halves)
    wheel = wheels.build_project_wheel(cache_dir=tmp_path)
    assert False not in seen
    with zipfile.ZipFile(wheel.path) as zf:
        assert zf.testzip() is None
    assert [p.name for p in out.iterdir()] == [wheel.path.name]
