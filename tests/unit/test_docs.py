"""The documentation: README.md is the front door, docs/*.md the rest, and their links resolve.

- README.md stays short and opens with the two set-up commands CI and users copy.
- Every relative link in README.md and docs/*.md names an existing file, and a `#anchor` an
  existing heading of that page (GitHub's heading slugs).
- No page points outside the repository (a `../` path that leaves it), no page, code or test
  cites this project's issue or pull request numbers, and no code, test or page names a Markdown
  file the repository does not have (the design doc is docs/design.md).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

README_MAX_LINES = 260
SETUP_COMMANDS = (
    "XEON_CLUSTER_SKIP_IPEX=1 bash scripts/setup-dev.sh && . .venv/bin/activate && fab local-up --nodes 4 && "
    "{ fab setup --cluster local && fab train --nodes 4 --cluster local; fab local-down; }",
    "bash scripts/setup-dev.sh && .venv/bin/python -m pytest",
)
CI_RUN = ROOT / ".ci" / "run"


def pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def page_id(path: Path) -> str:
    return str(path.relative_to(ROOT))


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (``` or ~~~)."""
    lines, fence = [], None
    for line in text.splitlines():
        stripped = line.lstrip()
        marker = stripped[:3]
        if marker in ("```", "~~~"):
            if fence is None:
                fence = marker
            elif marker == fence:
                fence = None
            continue
        if fence is None:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link's text only
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, seen = set(), {}
    for line in prose_lines(path.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")


def links(path: Path) -> list[str]:
    """Every link target of a page, outside code blocks and code spans."""
    targets = []
    for line in prose_lines(path.read_text()):
        line = re.sub(r"(`+)(.+?)\1", "code", line)  # a code span is text, not a link
        targets += INLINE_LINK.findall(line)
        reference = REFERENCE_LINK.match(line)
        if reference:
            targets.append(reference.group(1))
    return targets


def test_readme_is_short_and_opens_with_the_setup_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; keep it to {README_MAX_LINES}"
    first = [line.strip() for line in lines[:12]]
    for command in SETUP_COMMANDS:
        assert command in first, f"README.md's first 12 lines lack the set-up command: {command}"


def test_ci_runs_readmes_set_up_and_test_command_and_nothing_needs_a_system_python():
    setup, test = SETUP_COMMANDS[1].split(" && ")
    steps = [line.strip() for line in CI_RUN.read_text().splitlines() if line.strip() and not line.startswith("#")]
    # README's set-up first, its tests last; between them only checks from the venv it made (lint, types)
    assert setup in steps and steps[-1] == test, f".ci/run must run README's set-up, then end with its tests: {steps}"
    between = steps[steps.index(setup) + 1:-1]
    assert all(step.startswith(".venv/bin/") for step in between), f".ci/run runs other steps first: {between}"
    commands = [line.strip() for line in (ROOT / "scripts" / "setup-dev.sh").read_text().splitlines()
                if not line.lstrip().startswith(("#", "echo "))]
    # A stock Debian/Ubuntu has no `python` and refuses system-wide pip (PEP 668): a command word
    # python, pip or pip3, or a system python3 running pip, is a call the stock machine fails.
    system = re.compile(r"(^|[;&|(]\s*|\b(then|do)\s+)(\$SUDO\s+|sudo\s+)?(python|pip3?)\s|python3 -m pip\b")
    calls = [line for line in commands if system.search(line)]
    assert not calls, f"scripts/setup-dev.sh calls a system python or pip: {calls}"


def test_there_are_docs_pages_and_the_readme_links_them():
    linked = {(README.parent / t.split("#")[0]).resolve() for t in links(README) if not t.startswith("#")}
    for page in sorted(DOCS.glob("*.md")):
        assert page.resolve() in linked, f"README.md does not link {page_id(page)}"


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_relative_links_point_to_existing_files_and_headings(page):
    problems = []
    for target in links(page):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page.resolve()
        if not dest.is_relative_to(ROOT):
            problems.append(f"{target}: points outside the repository")
        elif not dest.exists():
            problems.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{target}: {page_id(dest)} has no heading with anchor #{anchor}")
    assert not problems, f"{page_id(page)}:\n  " + "\n  ".join(problems)


# a relative path upwards: fine while it stays in the repository
OUTSIDE = re.compile(r"(?:\.\./)+[\w.-]+(?:/[\w.-]+)*")
# "issue N", "issue #N", "PR N", "pull request #N", "(#N)": this project's tracker, which the
# repository does not carry. Another project's, named by its owner/repo just before
# (hashicorp/terraform-provider-aws#N, boto/boto3#N), is a citation and fine.
ISSUE_NUMBER = re.compile(r"(?i:\bissues?|\bpull requests?)\s+#?\d+|\bPRs?\s+#?\d+|\(#\d+\)")
UPSTREAM = re.compile(r"[\w.-]+/[\w.-]+\s*$")
CODE_FOLDERS = ("cluster", "node_setup", "infra", "training", "xeon_cluster", "tests", "bench", "scripts")


def paths_outside(text: str, page: Path) -> list[str]:
    """The relative paths in `page`'s `text` that climb out of the repository."""
    return [m.group(0) for m in OUTSIDE.finditer(text)
            if not (page.parent / m.group(0)).resolve().is_relative_to(ROOT)]


@pytest.mark.parametrize("page, text, outside", [
    (README, "see ../elsewhere/notes", ["../elsewhere/notes"]), (DOCS / "costs.md", "see ../scripts/setup-dev.sh", []),
    (DOCS / "costs.md", "see ../../elsewhere", ["../../elsewhere"]), (README, "no path here", []),
])
def test_a_path_counts_as_outside_only_when_it_leaves_the_repository(page, text, outside):
    assert paths_outside(text, page) == outside


def issue_numbers(text: str) -> list[str]:
    """This project's issue or pull request numbers cited in `text` (not another project's)."""
    found = []
    for match in ISSUE_NUMBER.finditer(text):
        before = text[text.rfind("\n", 0, match.start()) + 1:match.start()]
        if not UPSTREAM.search(before):
            found.append(match.group(0))
    return found


@pytest.mark.parametrize("page", [README, *sorted(p for p in DOCS.rglob("*") if p.is_file())], ids=page_id)
def test_no_page_refers_outside_the_repository_or_to_issue_numbers(page):
    text = page.read_text(errors="replace")
    found = [f"outside the repository: {path!r}" for path in paths_outside(text, page)]
    found += [f"an issue number: {number!r}" for number in issue_numbers(text)]
    assert not found, f"{page_id(page)}: " + "; ".join(found)


def test_no_code_or_test_cites_an_issue_number():
    files = sorted(p for folder in CODE_FOLDERS for p in (ROOT / folder).rglob("*")
                   if p.suffix in (".py", ".sh") and "__pycache__" not in p.parts)
    assert len(files) > 100  # the walk found the code
    found = [f"{page_id(p)}: {number!r}" for p in files for number in issue_numbers(p.read_text(errors="replace"))]
    assert not found, "cites an issue or pull request number of this project:\n  " + "\n  ".join(found)


@pytest.mark.parametrize("text, cited", [
    (f"as issue {8} asked", [f"issue {8}"]), (f"see issue #{8}", [f"issue #{8}"]),
    (f"the fix (#{12})", [f"(#{12})"]), (f"Issues {3} and 4", [f"Issues {3}"]), (f"PR #{7}", [f"PR #{7}"]),
    (f"hashicorp/terraform-provider-aws#{123}", []), (f"boto3 #{123}", []),
    (f"boto/boto3 issue {4005}", []), ("${#ARRAY[@]} # 1 node", []),
])
def test_issue_numbers_are_this_projects_not_another_projects(text, cited):
    assert issue_numbers(text) == cited


SOURCE_SUFFIXES = {".py", ".md", ".sh", ".yaml", ".yml", ".toml"}
MD_NAME = re.compile(r"(?<![\w/.-])((?:\.\./)*[\w-]+(?:/[\w.-]+)*\.md)\b")


def _project_files() -> list[Path]:
    return [p for p in ROOT.rglob("*") if p.is_file() and p.suffix in SOURCE_SUFFIXES
            and not any(part.startswith(".") or part in ("build", "node_modules") for part in p.relative_to(ROOT).parts)
            and "egg-info" not in str(p)]


def _in_the_repository(named: str, where: Path, ours: set[str]) -> bool:
    """A bare name of one of the repository's Markdown files, or a path to one from the naming
    file's folder or from the repository root (never one that leaves the repository)."""
    if "/" not in named:
        return named in ours
    for base in (where.parent, ROOT):
        target = (base / named).resolve()
        if target.is_relative_to(ROOT) and target.is_file():
            return True
    return False


# The names are put together here, so that this file itself names no Markdown file it does not have.
@pytest.mark.parametrize("stem, expected", [("docs/design", True), ("design", True), ("ROADMAP", False),
                                            ("../elsewhere/notes", False), ("../docs/design", False),
                                            ("elsewhere/design", False)])
def test_a_named_markdown_file_counts_only_inside_the_repository(stem, expected):
    named = stem + ".md"
    ours = {p.name for p in _project_files() if p.suffix == ".md"}
    assert MD_NAME.search(f"see {named} for").group(1) == named
    assert _in_the_repository(named, ROOT / "README.md", ours) is expected


def test_every_markdown_file_named_in_code_tests_or_docs_is_in_the_repository():
    # a design doc, a note or a guide the project does not carry must not be cited; docs/design.md is the project's
    ours = {p.name for p in _project_files() if p.suffix == ".md"}
    assert "design.md" in ours
    outside = [f"{p.relative_to(ROOT)}: {m.group(1)}" for p in _project_files()
               for m in MD_NAME.finditer(p.read_text(errors="replace")) if not _in_the_repository(m.group(1), p, ours)]
    assert not outside, "names a Markdown file the repository does not have:\n  " + "\n  ".join(outside)


@pytest.mark.parametrize("heading, expected", [
    ("`fab distribute` (also done by `fab train` before every launch)",
     "fab-distribute-also-done-by-fab-train-before-every-launch"),
    ("Exit codes (`cluster/exit_codes.py`)", "exit-codes-clusterexit_codespy"),
    ("Checkpoints, spot interruptions and `--resume`", "checkpoints-spot-interruptions-and---resume"),
    ("Which cluster: `--cluster`", "which-cluster---cluster"),
])
def test_slugs_follow_github(heading, expected):
    assert slug(heading) == expected


# ---------------------------------------------------------------- every `fab` command line the docs show


FAB_WORDS = ("fab", "xeon-cluster")
COMMAND_RE = re.compile(r"(?:^|[\s;&|{(])(?:fab|xeon-cluster)(?:\s|$)")
# A synopsis, not a command line: `[--detach]`, `<the usual options>`, `...`, a placeholder in capitals (`--job ID`,
# `-c NAME`), options written as alternatives (`--script/--module`); tasks as alternatives: `synopsis`.
SYNOPSIS_RE = re.compile(r"\[-|<[^>]*>|\.\.\.|…|(?<![\w/.:=-])[A-Z][A-Z_]*(?![\w/.-])|\S/-")
# What a reference to an option in prose leaves out (`fab train --script`, `fab exec`): not a command line.
REFERENCE_ONLY = ("needs a value", "did not receive required positional arguments")


def command_lines(line: str) -> list[list[str]]:
    """The `fab` command lines of one line of shell, as words: split where `&&`, `||`, `;`, `|` or a `{ ... }`
    group starts or ends; `$(...)` stands for one value. ValueError: not a whole line of shell."""
    lexer = shlex.shlex(re.sub(r"\$\([^)]*\)", "VALUE", line), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    found, words = [], []
    for token in [*lexer, ";"]:
        if token in ("{", "}") or set(token) <= set(";&|"):
            if words[:1] and words[0] in FAB_WORDS:
                found.append(words)
            words = []
        else:
            words.append(token)
    return found


def block_commands(block: list[tuple[int, str]]) -> list[tuple[int, list[str]]]:
    """The command lines of one fenced block: after a `$ ` prompt when it has prompts (the rest is output),
    else every line; `\\` continues a line, `# ...` ends it."""
    prompted = any(line.lstrip().startswith("$ ") for _, line in block)
    found, pending, start = [], "", None
    for number, line in block:
        text = line.strip()
        if prompted and not pending:
            if not text.startswith("$ "):
                continue
            text = text[2:]
        text = re.sub(r"\s+#.*$", "", text)
        if text.endswith("\\"):
            pending, start = pending + text[:-1] + " ", start or number
            continue
        text, number, pending, start = pending + text, start or number, "", None
        if not COMMAND_RE.search(text):
            continue
        try:
            found += [(number, words) for words in command_lines(text)]
        except ValueError:  # a quote left open: only a fault in a line that is a command itself
            if text.split()[0] in FAB_WORDS:
                found.append((number, [text.split()[0], "<a quote left open>"]))
    return found


def documented_commands(path: Path) -> list[tuple[int, list[str], bool]]:
    """(line, words, in a code block) of every `fab` command line of a page: in fenced code blocks, and in
    inline code that starts with `fab `."""
    found, fence, block = [], None, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        marker = line.strip()[:3]
        if marker in ("```", "~~~"):
            if fence is None:
                fence = marker
            elif marker == fence:
                found += [(n, words, True) for n, words in block_commands(block)]
                fence, block = None, []
            continue
        if fence is not None:
            block.append((number, line))
            continue
        for span in re.findall(r"`((?:fab|xeon-cluster) [^`]+)`", line):
            try:
                found += [(number, words, False) for words in command_lines(span)]
            except ValueError:
                continue
    return found


@pytest.fixture(scope="module")
def parse_only():
    """`fab ARGS` through the real parser, as fab parses it (its core options, then the tasks'), nothing run:
    None, or the line fab would print. Only the named tasks' contexts are given to the second parse (the
    parser copies what it is given; all of them for a line that names none)."""
    from invoke.exceptions import Exit, ParseError
    from invoke.parser import Parser

    from node_setup.tasks import ns
    from node_setup.tasks.program import program

    contexts = ns.to_contexts()
    by_name = {name: context for context in contexts for name in (context.name, *context.aliases)}

    def parse(args: tuple[str, ...]) -> str | None:
        try:
            core = Parser(initial=program.initial_context, ignore_unknown=True).parse_argv(list(args))
            named = list(dict.fromkeys(by_name[w] for w in core.unparsed if w in by_name)) or contexts
            Parser(initial=program.initial_context, contexts=named).parse_argv(core.unparsed)
        except (ParseError, Exit) as exc:
            return str(getattr(exc, "message", None) or exc)
        return None

    return parse


def synopsis(words: list[str]) -> bool:
    """A synopsis, not a command line: SYNOPSIS_RE's marks, or tasks as alternatives (`fab setup/check`)."""
    return bool(SYNOPSIS_RE.search(" ".join(words).replace("VALUE", "v"))) or "/" in "".join(words[1:2])


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_fab_command_line_in_the_docs_parses(page, parse_only):
    refused = []
    for number, words, in_block in documented_commands(page):
        if synopsis(words):
            continue
        problem = parse_only(tuple(words[1:]))
        if problem and (in_block or not any(word in problem for word in REFERENCE_ONLY)):
            refused.append(f"{page_id(page)}:{number}: `{' '.join(words)}`: {problem}")
    assert not refused, "\n".join(refused)


def test_the_docs_parse_check_catches_what_drifted(parse_only, tmp_path):
    """What the docs said before: a bare number of seconds, an option renamed, a value the option refuses."""
    page = tmp_path / "page.txt"
    page.write_text("Run `fab autostop --idle 1800` or\n\n```\n$ fab setup --connect-timeout 5s && fab jobs\n"
                    "output: fab status --nodes 0\n$ fab train --nodes 4 \\\n    --epochs two  # a comment\n```\n"
                    "`fab train --script` is a reference; `fab logs --job ID` a synopsis.\n")
    found = [(n, words) for n, words, _ in documented_commands(page)]
    assert found == [(1, ["fab", "autostop", "--idle", "1800"]), (4, ["fab", "setup", "--connect-timeout", "5s"]),
                     (4, ["fab", "jobs"]), (6, ["fab", "train", "--nodes", "4", "--epochs", "two"]),
                     (9, ["fab", "train", "--script"]), (9, ["fab", "logs", "--job", "ID"])]
    assert [parse_only(tuple(words[1:])) for _, words in found[:4]] == [
        "error: --idle: '1800' has no unit; add a unit: 1800s, 1800m or 1800h (durations are written like 90s, 30m, "
        "2h or 1h30m)",
        "error: --connect-timeout: '5s' is not a whole number (an option of fab itself, given before the task: "
        "`fab --help` lists them)",
        None, "error: --epochs: 'two' is not a whole number"]


def test_readmes_task_table_names_every_task():
    from node_setup.tasks import ns

    table = set(re.findall(r"^\| `fab ([a-z0-9-]+)` \|", README.read_text(), re.M))
    assert table == set(ns.task_names), f"README's task table: missing {sorted(set(ns.task_names) - table)}, " \
                                        f"not tasks {sorted(table - set(ns.task_names))}"
