"""Did the ranks of a multi-rank job form one world? Decided from the ranks' own records (pure).

Every rank of `fab train --script/--module` runs under the runner (xeon_cluster/run.py), which
writes a record (xeon_cluster.run.WORLD_RECORD_KEYS) into the job's ranks folder on its node: the
WORLD_SIZE it was started with, and whether a process group of that size was ever formed while the
program ran. A job whose ranks all exited 0 but never joined one such group ran the same
single-process program N times: N times the work, no speed-up, reported as a success. `fab train`
says so and exits TRAINED_ALONE, unless the user asked for independent ranks (INDEPENDENT_OPTION).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Mapping

from xeon_cluster.run import WORLD_RECORD_KEYS, WORLD_RECORD_PREFIX

TRAINED_ALONE = 4  # fab train's exit code: the ranks of a multi-rank job never joined one process group
INDEPENDENT_OPTION = "--independent-ranks"
RECORD_GLOB = f"{WORLD_RECORD_PREFIX}*.json"  # in the job's ranks folder on every node


@dataclass(frozen=True)
class Verdict:
    code: int  # 0, or TRAINED_ALONE
    lines: tuple[str, ...]  # what fab train prints at the end


def parse_records(texts: Iterable[str]) -> dict[int, dict]:
    """The ranks' records, by rank, from the nodes' files (one JSON object a line; others skipped)."""
    records: dict[int, dict] = {}
    for text in texts:
        for line in text.splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict) and set(WORLD_RECORD_KEYS) <= set(value) and isinstance(value["rank"], int):
                records[value["rank"]] = value
    return records


def _ranks(ranks: Iterable[int]) -> str:
    return ", ".join(str(r) for r in sorted(ranks))


def verdict(records: Mapping[int, dict], world_size: int, *, independent: bool = False) -> Verdict:
    """What the records of a job of `world_size` ranks (all exited 0) say; `independent`: --independent-ranks."""
    if world_size < 2:
        return Verdict(0, ())
    alone = sorted(r for r, rec in records.items() if rec.get("joined") is not True)
    missing = sorted(set(range(world_size)) - set(records))
    lines = []
    if not alone and not missing:
        return Verdict(0, (f"world: all {world_size} ranks joined one process group of {world_size}",))
    if missing:
        lines.append(f"world: no record from rank(s) {_ranks(missing)} (a rank that left with os._exit, or nodes "
                     "whose xeon-cluster is older than this checkout's: `fab setup` updates it)")
    if not alone:
        return Verdict(0, tuple(lines))
    largest = max((int(records[r].get("largest") or 0) for r in alone), default=0)
    seen = "never initialised torch.distributed" if largest == 0 else f"formed a group of {largest} at most"
    who = "every rank" if len(alone) == world_size else f"rank(s) {_ranks(alone)}"
    lines.append(f"each rank trained alone: {world_size} times the work, no speed-up ({who} of {world_size} {seen})")
    if independent:
        lines.append(f"  as asked ({INDEPENDENT_OPTION}): the ranks ran independently")
        return Verdict(0, tuple(lines))
    lines.append("  the program must form one world: torch.distributed.init_process_group(), Accelerator() or "
                 "Trainer (docs/your-own-script.md); if the ranks are meant to run alone, rerun with "
                 f"{INDEPENDENT_OPTION}")
    return Verdict(TRAINED_ALONE, tuple(lines))
