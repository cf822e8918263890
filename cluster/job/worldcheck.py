"""Did the ranks of a multi-rank job form one world? Decided from the ranks' own records (pure).

Every rank of `fab train --script/--module` runs under the runner (xeon_cluster/run.py), which
writes a record (xeon_cluster.run.WORLD_RECORD_KEYS) into the job's ranks folder on its node: the
WORLD_SIZE it was started with, and whether a process group of that size was ever formed while the
program ran. A job whose ranks all exited 0 but never joined one such group ran the same
single-process program N times: N times the work, no speed-up, reported as a success. `fab train`
says so and exits TRAINED_ALONE, unless the user asked for independent ranks (INDEPENDENT_OPTION).

The records come from the nodes, where the job's own code ran and could write anything there:
`parse_records` checks each one whole (`check_record`: an object of whole numbers and a boolean) and
leaves out a malformed one with a line naming the node and the file (shown through
cluster/names.py's `printable`), so nothing a rank wrote ends `fab train` in a traceback or reaches
the terminal as an escape sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from cluster import records as node_records
from cluster.names import printable
from xeon_cluster.run import WORLD_RECORD_KEYS, WORLD_RECORD_PREFIX

TRAINED_ALONE = 4  # fab train's exit code: the ranks of a multi-rank job never joined one process group
INDEPENDENT_OPTION = "--independent-ranks"
RECORD_GLOB = f"{WORLD_RECORD_PREFIX}*.json"  # in the job's ranks folder on every node
MAX_RANK = 1_000_000  # a rank, a world size or a group size above this is no record of a real job
RECORD_BYTES = 4096  # what is read of one record file (the runner writes under 100 bytes)
RECORDS_PER_NODE = 4096  # record files read from one node at most
SHOWN_CHARS = 80  # of a malformed value or a file name in the line that names it


@dataclass(frozen=True)
class Verdict:
    code: int  # 0, or TRAINED_ALONE
    lines: tuple[str, ...]  # what fab train prints at the end


@dataclass(frozen=True)
class Records:
    by_rank: dict[int, dict]  # the well-formed records
    problems: tuple[str, ...]  # one line per malformed record: the node, the file, why


def _shown(value: object) -> str:
    text = printable(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def check_record(value: Any) -> str | None:
    """Why `value` is not a world record as the runner writes it (None when it is one): an object with
    rank, expected and largest whole numbers (0 to MAX_RANK; expected at least 1) and joined true or false."""
    if not isinstance(value, dict):
        return f"not a JSON object but {type(value).__name__}"
    missing = [key for key in WORLD_RECORD_KEYS if key not in value]
    if missing:
        return f"no {', '.join(missing)}"
    for key, low in (("rank", 0), ("expected", 1), ("largest", 0)):
        number = value[key]
        if not isinstance(number, int) or isinstance(number, bool) or not low <= number <= MAX_RANK:
            return f"{key} {_shown(repr(number))}, allowed a whole number of {low} to {MAX_RANK}"
    if not isinstance(value["joined"], bool):
        return f"joined {_shown(repr(value['joined']))}, allowed true or false"
    return None


def parse_records(found: Iterable[tuple[str, str]], folder: str = "") -> Records:
    """The ranks' records from each node's listing, (node, text): one `FILE<tab>CONTENT` line per record
    file (node_setup/ssh/world.py reads them so). A line whose content is not a record (`check_record`;
    not JSON, NaN or Infinity, nested past the parser) is left out with a line naming the node and
    `folder`/FILE; lines without a tab are nothing."""
    records: dict[int, dict] = {}
    problems: list[str] = []
    for node, text in found:
        for line in text.splitlines():
            name, tab, content = line.partition("\t")
            if not tab:
                continue
            where = f"{folder.rstrip('/')}/{name}" if folder else name
            try:
                value = node_records.load(content, where)
            except node_records.RecordError as exc:
                why: str | None = exc.why
            else:
                why = check_record(value)
            if why:
                problems.append(f"world: {_shown(node)}: {_shown(where)} is not a world record ({why}); left out")
            else:
                records[value["rank"]] = value
    return Records(records, tuple(problems))


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
    largest = max((records[r]["largest"] for r in alone), default=0)
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
