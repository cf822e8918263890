"""One log assembler: what a person sees of a job's log (pure).

The job's log on the master is the launcher's output, every rank's in pieces. Intel MPI's
`-prepend-rank` writes `[N] ` before every piece it forwards from rank N, and a piece may end in the
middle of a line: the next rank's piece then follows on the same line of the log
(`[2] 2 3[1] rank world`); Open MPI tags each line `[1,N]<stdout>: `; under torchrun the rank wrapper
labels every whole line `[node1 rN] ` and the job script the agent's `[node1 torchrun] `; the job
script's and Hydra's own lines (`[xeon-cluster] job ... started`, `[mpiexec@node0] ...`, `===`
banners) start a line of their own. `LogAssembler.feed(text)` takes the log in whatever chunks it
arrives (a chunk may end anywhere, inside a prefix too) and returns the lines to show:

- each rank's pieces are joined into whole lines BEFORE a line is labelled `[node1 r3] ` (a partial
  line waits in its rank's buffer);
- a carriage-return progress line (a progress bar) shows its last state;
- escape sequences: colour (SGR) is kept when the output is a terminal (`colour=True`), everything
  else is removed, as are control characters (cluster/names.py `printable`);
- the run summary rank 0 prints as JSON (training/summary.py) becomes one line (the whole of it is
  summary.json in the output folder, and `fab train` reports it after the job);
- metrics dicts that every rank prints (`{'loss': ...}`, `{'train_runtime': ...}`) are shown for rank 0
  only, unless `all_ranks`;
- known harmless launcher warnings (HARMLESS) are hidden and counted: `notes()` says how many; so are
  the known harmless blocks of lines (BLOCKS: torchrun's C++ trace when the rendezvous closed before an
  agent's shutdown, transformers' load report of a new head), each held from its first line until it is
  known to be that block (then hidden) or not (then shown as it is);
- the launcher's end lines (LAUNCHER_END: Hydra's `[mpiexec@node0] ... exited with status 255`, its ssh's
  `Connection to ... closed`, a `===` banner) that come after the ranks' lines are held until the job
  script's next line: hidden and counted when that line says the job was stopped or interrupted
  (ENDED_QUIETLY: cluster/shell/job.sh's `was stopped` after `fab stop`, rank 0's or the job's INTERRUPTED
  code), shown otherwise (a failure's end says which node went away), and shown as soon as a rank speaks
  again.

`finish()` returns what is still held at the end (partial lines, an unfinished JSON block). `LogSink`
is the same as a text stream a remote command's output is written into; `whole_lines(log)` is the log
with every rank's pieces joined (for reading it, as cluster/job/joblog.py's failure report does).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Callable, Sequence, TextIO

from cluster.exit_codes import INTERRUPTED
from cluster.names import printable

LAUNCHER = "launcher"
# Intel MPI's rank prefix, anywhere in the stream; Open MPI's at the start of a line.
_INTEL = re.compile(r"\[(\d+)\] ")
_OPENMPI = re.compile(r"\[\d+,(\d+)\]<std(?:out|err)>: ?")
# A line already labelled with its node: the rank wrapper's `[node1 r3] `, the job script's `[node1 torchrun] `.
_LABELLED = re.compile(r"\[([A-Za-z0-9_.-]+) (?:r(\d+)|(torchrun))\] ?")
# What may still become a prefix when a chunk ends inside one (`[`, `[12]`, `[1,3]<std`, `[node1 r`).
_OPEN_PREFIX = re.compile(r"\[[A-Za-z0-9_., -]{0,64}(?:\][<a-z>:]{0,9})?\Z")
# Inside a rank's piece: the next rank's prefix, or the job script's own line (which starts a line even
# after a rank's unfinished piece).
_JOB_LINE = "[xeon-cluster] job "
_NEXT_PIECE = re.compile(r"\[(\d+)\] |" + re.escape(_JOB_LINE))
_SGR = re.compile(r"\x1b\[[0-9;]*m")
# A metrics dict as Python prints one: {'loss': 1.2, ...} (the Hugging Face Trainer's log lines).
_METRICS = re.compile(r"^\{'[A-Za-z_][A-Za-z0-9_/.-]*': .*\}$")
SUMMARY_KEYS = ("status", "exit_code", "world_size")  # what makes a JSON object the job's summary
MAX_JSON_LINES = 2000  # a longer block is shown as it is
# The launcher's lines as a job ends because a node went away or its session was ended (`fab stop`):
# Hydra's `[mpiexec@node0] ...` (and its proxies'), its ssh's `Connection to 10.0.0.2 closed by remote
# host.`, the `===` banner of a terminated rank, the shell's word for a child a signal ended.
LAUNCHER_END = re.compile(r"(\[(?:mpiexec|proxy:[^\]@]*|bstrap:[^\]@]*)@[^\]]*\] |Connection to \S+ closed"
                          r"(?: by remote host)?\.$|=+$|=   |(?:Terminated|Killed)$)")
# The job script's line that says the job was stopped or interrupted (cluster/shell/job.sh).
ENDED_QUIETLY = re.compile(re.escape(_JOB_LINE) + r"\S+(?: was stopped$|: rank 0 ended with code "
                           rf"{INTERRUPTED} \(interrupted\)| exited with code {INTERRUPTED}$)")
LAUNCHER_END_NAME = "the launcher's end lines of a stopped or interrupted job (Hydra's, its ssh's)"
MAX_END_LINES = 200  # more is not an ending: shown

# Launcher and library warnings that say nothing about the job, hidden with a count:
# (what the count line calls it, the pattern of its line).
HARMLESS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("torch's \"hostname of the client socket cannot be retrieved\" warning",
     re.compile(r"\[c10d\] The hostname of the client socket cannot be retrieved")),
    ("DDP's find_unused_parameters warning (every rank's)",
     re.compile(r"find_unused_parameters=True was specified in DDP constructor, but did not find any unused")),
)


@dataclass(frozen=True)
class Block:
    """A harmless block of lines from one source: it starts with a `start` line, goes on while lines match
    `more`, and is hidden when `closes` matches the line that ends it (that line is part of it) or, with no
    `closes`, when `harmless(lines)` says so of the lines held once a line that is not `more` comes."""

    name: str
    start: re.Pattern[str]
    more: re.Pattern[str]
    closes: re.Pattern[str] | None = None
    harmless: Callable[[list[str]], bool] = lambda lines: False


_LOAD_ROW = re.compile(r"^(\S+)\s*\| (\w+)\s*\|")


def _only_missing(lines: list[str]) -> bool:
    """A load report whose every key is MISSING: a new head, initialised as the task needs (nothing lost)."""
    rows = [m.group(2) for m in map(_LOAD_ROW.match, lines[1:]) if m and m.group(1) != "Key"]
    return bool(rows) and all(status == "MISSING" for status in rows)


BLOCKS: tuple[Block, ...] = (
    # torchrun's agent on a node whose rendezvous store (on the master) closed first, at the end of a job
    # whose ranks were done: a C++ trace, then the agent's "has failed to shutdown the rendezvous".
    Block("torchrun's shutdown trace (the rendezvous closed before this agent's shutdown; harmless)",
          re.compile(r"\[c10d\] \w+ failed on SocketImpl"),
          re.compile(r"^(?:Exception raised from |frame #\d+: |\[[WE]\d{4} .*\[c10d\] \w+ failed on SocketImpl"
                     r"|[WE]\d{4} .* has failed to send a keep-alive heartbeat to the rendezvous )"),
          closes=re.compile(r"has failed to shutdown the rendezvous .* due to an error of type "
                            r"RendezvousConnectionError")),
    # transformers' table of the weights a from_pretrained did not find: the new task head of the built-in job
    Block("transformers' load report (only a new head's weights missing)",
          re.compile(r"LOAD REPORT from: "),
          re.compile(r"^(?:\S+\s*\| \w+\s*\||-+\+[-+]*|Notes:|- \w+:)"),
          harmless=_only_missing),
)


@dataclass(frozen=True)
class Source:
    """Where a piece of the log came from: a rank (`rank` set; `mpi`: its pieces start with Intel MPI's
    or Open MPI's prefix, else its lines come labelled), or the launcher (an agent's label, or none)."""

    label: str
    rank: int | None = None
    mpi: bool = False

    def prefix(self) -> str:
        """The line's prefix as the log writes it (for `whole_lines`)."""
        if self.mpi:
            return f"[{self.rank}] "
        return "" if self.label == LAUNCHER else f"[{self.label}] "


@dataclass
class _Held:
    text: str = ""  # the unfinished line
    block: list[str] | None = None  # a JSON object's lines so far (rank 0's summary, perhaps)
    harmless: tuple[Block, list[str]] | None = None  # a harmless block's lines so far, perhaps (BLOCKS)


def _collapse(line: str) -> str:
    """A line with carriage returns as a terminal would leave it: its last state that shows something."""
    if "\r" not in line:
        return line
    states = [s for s in line.split("\r") if printable(s).strip()]
    return states[-1] if states else ""


@dataclass
class LogAssembler:
    rank_hosts: Sequence[str] = ()
    launcher: str = "mpirun"  # the label of the launcher's own lines
    all_ranks: bool = False  # every rank's metrics dicts, not rank 0's only
    colour: bool = False  # keep colour: the output is a terminal
    whole: bool = False  # `whole_lines`: every line joined and collapsed, with its prefix, nothing else done
    hidden: dict[str, int] = field(default_factory=dict)  # what was hidden, and how many lines
    _raw: str = ""  # the end of the last chunk, when it may be the start of a prefix
    _source: Source | None = None  # where the stream's current piece comes from (None: a line starts)
    _held: dict[Source, _Held] = field(default_factory=dict)
    _ranks_seen: bool = False  # a rank has spoken: the launcher's lines from here may be its end lines
    _end: list[str] = field(default_factory=list)  # the launcher's end lines held (LAUNCHER_END)

    def __post_init__(self) -> None:
        self.rank_hosts = list(self.rank_hosts)
        self.width = max([len(h) for h in self.rank_hosts] + [4]) + len(str(len(self.rank_hosts))) + 2

    # ------------------------------------------------------------------ the stream cut into pieces

    def _mpi_rank(self, number: str) -> Source | None:
        rank = int(number)
        if self.rank_hosts and rank >= len(self.rank_hosts):
            return None  # no such rank: text that only looks like a prefix
        host = self.rank_hosts[rank] if rank < len(self.rank_hosts) else "?"
        return Source(f"{host} r{rank}", rank, mpi=True)

    def _line_start(self, text: str, pos: int) -> tuple[Source, int] | None:
        """The source of the line starting at `pos` and where its text begins; None: wait for more text."""
        for pattern in (_INTEL, _OPENMPI):
            found = pattern.match(text, pos)
            if found and (source := self._mpi_rank(found.group(1))) is not None:
                return source, found.end()
        found = _LABELLED.match(text, pos)
        if found and found.end() == len(text) and not found.group().endswith(" "):
            return None  # the label's space may come with the next chunk
        if found:
            node, rank, _ = found.groups()
            return Source(f"{node} {'r' + rank if rank else 'torchrun'}", int(rank) if rank else None), found.end()
        if _OPEN_PREFIX.match(text, pos):
            return None
        return Source(LAUNCHER), pos

    def _next_piece(self, text: str, pos: int, end: int) -> int | None:
        """Where, inside a rank's piece that Intel MPI forwarded, the next rank's piece (or the job script's
        line) starts, before `end`."""
        for found in _NEXT_PIECE.finditer(text, pos, end):
            if found.group(1) is None or self._mpi_rank(found.group(1)) is not None:
                return found.start()
        return None

    def feed(self, data: str) -> list[str]:
        """The lines to show that `data` (the next chunk of the log) completes."""
        text, pos, shown = self._raw + data, 0, []
        self._raw = ""
        while pos < len(text):
            if self._source is None:
                start = self._line_start(text, pos)
                if start is None:  # a chunk that ends inside a prefix
                    self._raw = text[pos:]
                    break
                self._source, pos = start
                continue
            newline = text.find("\n", pos)
            end = newline if newline >= 0 else len(text)
            piece_end = self._next_piece(text, pos, end) if self._source.mpi else None
            if piece_end is not None:
                self._hold(text[pos:piece_end])
                self._source, pos = None, piece_end
                continue
            if newline < 0:
                cut = text.rfind("[", pos)
                if self._source.mpi and cut >= 0 and (_OPEN_PREFIX.match(text, cut)
                                                      or _JOB_LINE.startswith(text[cut:])):
                    end = cut  # perhaps the next piece's start: decided with the next chunk
                    self._raw = text[cut:]
                self._hold(text[pos:end])
                break
            self._hold(text[pos:newline])
            shown += self._line_done(self._source)
            self._source, pos = None, newline + 1
        return shown

    def _hold(self, text: str) -> None:
        held = self._held.setdefault(self._source, _Held())  # type: ignore[arg-type]
        held.text += text
        if "\r" in held.text:  # a progress bar redrawn for hours: keep its last state only
            head, _, last = held.text.rpartition("\r")
            held.text = "\r" + (last if printable(last).strip() else _collapse(head) + "\r")

    # ------------------------------------------------------------------ a whole line shown

    def _line_done(self, source: Source) -> list[str]:
        held = self._held[source]
        line, held.text = _collapse(held.text), ""
        if self.whole:
            return [source.prefix() + line]
        if source.label == LAUNCHER and held.block is None:
            plain = printable(line)
            if self._ranks_seen and LAUNCHER_END.match(plain) and len(self._end) < MAX_END_LINES:
                self._end.append(line)
                return []
            if plain.startswith(_JOB_LINE):  # the job script's: the ranks are done
                end = self._end_lines(hide=ENDED_QUIETLY.match(plain) is not None)
                return self._release(but=source) + end + self._show(source, line)
            return self._end_lines() + self._show(source, line)
        if source.label != LAUNCHER:
            self._ranks_seen = True
        return self._end_lines() + self._rank_line(source, held, line)

    def _end_lines(self, hide: bool = False) -> list[str]:
        """The launcher's end lines held: hidden (counted) or shown."""
        end, self._end = self._end, []
        if hide and end:
            return self._hide(LAUNCHER_END_NAME, len(end))
        return [shown for line in end for shown in self._show(Source(LAUNCHER), line)]

    def _rank_line(self, source: Source, held: _Held, line: str) -> list[str]:
        if held.block is not None:
            held.block.append(line)
            if line == "}" or len(held.block) > MAX_JSON_LINES:
                block, held.block = held.block, None
                return self._block_done(source, block)
            return []
        if line == "{" and source.rank is not None:
            held.block = [line]
            return []
        return self._show(source, line)

    def _block_done(self, source: Source, block: list[str]) -> list[str]:
        try:
            value = json.loads("\n".join(block))
        except ValueError:
            value = None
        if isinstance(value, dict) and all(key in value for key in SUMMARY_KEYS):
            return self._show(source, summary_line(value))
        return [shown for line in block for shown in self._show(source, line)]

    def _hide(self, what: str, lines: int = 1) -> list[str]:
        self.hidden[what] = self.hidden.get(what, 0) + lines
        return []

    def _show(self, source: Source, line: str) -> list[str]:
        text = self._clean(line)
        if not text.strip():
            return []  # a rank's empty line (the end of a progress bar, a stray newline): noise once labelled
        plain = printable(line)  # what the patterns read: no colour
        held = self._held.setdefault(source, _Held())
        shown: list[str] = []
        if held.harmless is not None:
            block, lines = held.harmless
            if block.more.search(plain):
                lines.append(plain)
                return []
            if block.closes is not None and block.closes.search(plain):
                held.harmless = None
                return self._hide(block.name, len(lines) + 1)
            shown = self._block_ended(source)
        for block in BLOCKS:
            if block.start.search(plain):
                held.harmless = (block, [plain])
                return shown
        return shown + self._label(source, text)

    def _block_ended(self, source: Source) -> list[str]:
        """A held block that ends without its closing line: hidden if it is harmless as it is, else shown."""
        held = self._held[source]
        (block, lines), held.harmless = held.harmless, None  # type: ignore[misc]
        if block.closes is None and block.harmless(lines):
            return self._hide(block.name, len(lines))
        return [s for line in lines for s in self._label(source, line)]

    def _label(self, source: Source, text: str) -> list[str]:
        """A line that is not part of a harmless block: hidden when harmless, else labelled."""
        for name, pattern in HARMLESS:
            if pattern.search(text):
                return self._hide(name)
        if source.rank not in (None, 0) and not self.all_ranks and _METRICS.match(text.strip()):
            return self._hide("the other ranks' metrics (fab logs --all-ranks shows them)")
        if source.label == LAUNCHER:
            return [text] if text.startswith("[xeon-cluster]") else [f"[{self.launcher:<{self.width}}] {text}"]
        return [f"[{source.label:<{self.width}}] {text}"]

    def _clean(self, line: str) -> str:
        if not self.colour:
            return printable(line)
        parts = _SGR.split(line)
        colours = _SGR.findall(line)
        return "".join(printable(p) + (colours[i] if i < len(colours) else "") for i, p in enumerate(parts)) + (
            "\x1b[0m" if colours else "")

    # ------------------------------------------------------------------ the end

    def finish(self) -> list[str]:
        """What is still held when the log ends: unfinished lines (a progress bar's last state, a JSON block)."""
        if self._raw:
            self._source = self._source or Source(LAUNCHER)
            self._hold(self._raw)
            self._raw = ""
        self._source = None
        return self._release() + self._end_lines()

    def _release(self, but: Source | None = None) -> list[str]:
        """Every source's unfinished line and JSON block (but one's), shown as they are."""
        shown: list[str] = []
        for source, held in list(self._held.items()):
            if source == but:
                continue
            if held.text:
                shown += self._line_done(source)
            if held.block is not None:
                block, held.block = held.block, None
                shown += [s for line in block for s in self._show(source, line)]
            if held.harmless is not None:  # a block that did not end
                shown += self._block_ended(source)
        return shown

    def notes(self) -> list[str]:
        """One line per kind of line that was hidden, with its count."""
        return [f"[xeon-cluster] hidden: {count} line(s) of {what}" for what, count in self.hidden.items()]


def summary_line(summary: dict) -> str:
    """The one line a run's summary JSON becomes in the log."""
    facts = [str(summary.get("status"))]
    if isinstance(summary.get("steps"), int):
        facts.append(f"step {summary['steps']}" + (f" of {summary['max_steps']}"
                                                   if isinstance(summary.get("max_steps"), int) else ""))
    if isinstance(summary.get("samples_per_second"), (int, float)):
        facts.append(f"{summary['samples_per_second']} samples/s")
    if isinstance(summary.get("train_loss"), (int, float)):
        facts.append(f"train loss {summary['train_loss']}")
    if isinstance(summary.get("mfu"), (int, float)):
        facts.append(f"MFU {summary['mfu'] * 100:.2f}%")
    return f"run summary: {', '.join(facts)} (all of it: summary.json in the job's output folder)"


class LogSink:
    """A text stream for a remote command's output: every chunk written goes through `assembler`, and the
    lines it completes go to `out`. `flush()` flushes `out` only (the command's reader calls it after
    every chunk: an unfinished line stays held); `close()` shows what is held and the count lines."""

    def __init__(self, assembler: LogAssembler, out: TextIO):
        self.assembler = assembler
        self.out = out

    def write(self, data: str) -> int:
        for line in self.assembler.feed(data):
            self.out.write(line + "\n")
        return len(data)

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        for line in self.assembler.finish() + self.assembler.notes():
            self.out.write(line + "\n")
        self.out.flush()


def assemble(log: str, rank_hosts: Sequence[str] = (), launcher: str = "mpirun", *, notes: bool = True,
             **options) -> list[str]:
    """The lines a person sees of `log` (a whole log, or a piece of one), with the count lines unless `notes` is off."""
    assembler = LogAssembler(rank_hosts, launcher, **options)
    return assembler.feed(log) + assembler.finish() + (assembler.notes() if notes else [])


def whole_lines(log: str, rank_hosts: Sequence[str] = ()) -> str:
    """`log` with every rank's pieces joined into whole lines, each with its prefix (`[3] `, `[node1 r3] `),
    progress lines in their last state; nothing hidden, nothing relabelled (for reading the log)."""
    assembler = LogAssembler(rank_hosts, whole=True)
    return "".join(line + "\n" for line in assembler.feed(log) + assembler.finish())
