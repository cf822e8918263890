"""cluster/job/training_flags.py is the built-in job's own parser's list of flags (what fab train checks
--extra against on the controller): compared with the parser training/args.py builds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.job import training_flags

FILE = Path(training_flags.__file__)
KINDS = {None: training_flags.VALUE, "?": training_flags.OPTIONAL, "+": training_flags.MANY, 0: training_flags.NONE}
NAMES = {training_flags.VALUE: "VALUE", training_flags.OPTIONAL: "OPTIONAL", training_flags.MANY: "MANY",
         training_flags.NONE: "NONE"}


def parser_flags() -> dict[str, str]:
    """Every flag of `python -m training`'s parser (underscores) and what follows it."""
    transformers = pytest.importorskip("transformers")
    args = pytest.importorskip("training.args")
    parser = transformers.HfArgumentParser((args.ModelArguments, args.DataArguments, args.JobArguments,
                                            args.training_arguments_class()))
    return {"--" + option[2:].replace("-", "_"): KINDS[action.nargs] for action in parser._actions
            for option in action.option_strings if option not in ("-h", "--help")}


def test_the_list_is_the_jobs_parser():
    found = parser_flags()
    if os.environ.get("XC_REGENERATE"):
        text = FILE.read_text()
        head = text[:text.index("FLAGS: dict[str, str] = {")]
        body = "".join(f'    "{flag}": {NAMES[kind]},\n' for flag, kind in sorted(found.items()))
        FILE.write_text(f"{head}FLAGS: dict[str, str] = {{\n{body}}}\n")
    assert training_flags.FLAGS == found, ("the job's parser accepts other flags than cluster/job/training_flags.py "
                                           "lists; regenerate it: XC_REGENERATE=1 .venv/bin/python -m pytest "
                                           "tests/unit/test_training_flags.py")
