"""One command-line convention over every `fab` task (docs/design.md, "The command line").

Iterates every task of `node_setup.tasks.ns` and every option its `get_arguments()` reports:
counts are whole numbers (invoke kind int) of 1 or more (0 only where it means something: the
options of `common.ZERO_ALLOWED`), money, rates and sizes are floats, durations take the one
duration kind (`90s`, `30m`, `2h`, `1h30m`; a bare number is refused with a line that says to add a
unit), one name per idea, and no option hides a number in a text option.
"""

from __future__ import annotations

import pytest
from invoke import Exit

from node_setup.tasks import common, ns

COUNTS = {"nodes", "min-nodes", "max-restarts", "max-recoveries", "epochs", "batch-size", "max-steps",
          "synthetic-examples", "ranks-per-node", "threads", "ccl-workers", "cores", "samples", "steps", "repeats",
          "seq-len", "lines", "flows-per-rank", "workdir-limit-mb"}
# Money, rates and sizes: decimals.
FLOATS = {"hourly-usd", "min-free-gib", "link-mbit", "link-delay-ms", "ddp-bucket-mb"}
DURATIONS = {"idle", "poll", "grace", "notice", "auto-stop", "auto-stop-idle", "wait-for-capacity",
             "checkpoint-every", "single-node-time", "ssh-timeout", "keeper-delay", "keeper-console-delay"}
# One name per idea: the names that were retired for the one kept.
RETIRED = {"batch": "batch-size", "restart-limit": "max-restarts", "checkpoint-minutes": "checkpoint-every"}
# A list of counts, not one count: `fab plan --nodes 1,2,4,8`.
LIST_OF_COUNTS = {("plan", "nodes")}
DURATION_KINDS = common.DURATION_KINDS  # the kinds a duration option may read (its one syntax)


def _options():
    for name in ns.task_names:
        for arg in ns[name].get_arguments():
            yield name, arg.names[0], arg


OPTIONS = list(_options())
IDS = [f"{t}--{o}" for t, o, _ in OPTIONS]


def _refused(arg, value: str) -> str:
    with pytest.raises(Exit) as caught:
        arg.set_value(value)
    assert caught.value.code == common.BAD_INPUT
    message = str(caught.value.message)
    assert "\n" not in message and message.startswith(f"error: --{arg.names[0]}: ")
    return message


@pytest.mark.parametrize(("task", "option", "arg"), OPTIONS, ids=IDS)
def test_every_option_has_a_known_kind_and_help(task, option, arg):
    assert arg.kind in (str, bool, int, float, list, *DURATION_KINDS), (task, option, arg.kind)
    assert arg.help, f"fab {task} --{option} has no help text"


@pytest.mark.parametrize(("task", "option", "arg"), OPTIONS, ids=IDS)
def test_one_name_per_idea(task, option, arg):
    assert option not in RETIRED, f"fab {task} --{option}: the convention's name is --{RETIRED[option]}"


@pytest.mark.parametrize(("task", "option", "arg"), OPTIONS, ids=IDS)
def test_counts_are_whole_numbers_of_one_or_more(task, option, arg):
    if option not in COUNTS or (task, option) in LIST_OF_COUNTS:
        assert arg.kind is not int or option in COUNTS, f"fab {task} --{option}: an int that is not a count"
        return
    assert arg.kind is int, f"fab {task} --{option} is a count but reads {arg.kind.__name__}"
    assert "is not a whole number" in _refused(arg, "four")
    assert "give 0 or more" in _refused(arg, "-1") or "give 1 or more" in _refused(arg, "-1")
    if option in common.ZERO_ALLOWED:
        arg.set_value("0")
        assert arg.value == 0
    else:
        assert "give 1 or more" in _refused(arg, "0")
    arg.set_value("3")
    assert arg.value == 3


@pytest.mark.parametrize(("task", "option", "arg"), OPTIONS, ids=IDS)
def test_money_rates_and_sizes_are_floats(task, option, arg):
    if option in FLOATS:
        assert arg.kind is float, f"fab {task} --{option} reads {arg.kind.__name__}"
        arg.set_value("2.5")
        assert arg.value == 2.5
    else:
        assert arg.kind is not float, f"fab {task} --{option}: a float that is not money, a rate or a size"


@pytest.mark.parametrize(("task", "option", "arg"), OPTIONS, ids=IDS)
def test_durations_take_one_syntax(task, option, arg):
    if option not in DURATIONS:
        assert arg.kind not in DURATION_KINDS, f"fab {task} --{option}: a duration not in the convention's list"
        return
    assert arg.kind in DURATION_KINDS, f"fab {task} --{option} is a duration but reads {arg.kind.__name__}"
    for text, seconds in (("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400)):
        arg.set_value(text)
        assert arg.value == seconds
    assert "add a unit" in _refused(arg, "90")
    assert "is not a duration" in _refused(arg, "soon")


@pytest.mark.parametrize(("task", "option", "arg"), OPTIONS, ids=IDS)
def test_no_number_hides_in_a_text_option(task, option, arg):
    if arg.kind is not str or (task, option) in LIST_OF_COUNTS:
        return
    default = "" if arg.default is None or not common.given(arg.default) else str(arg.default)
    try:
        float(default)
    except ValueError:
        return
    pytest.fail(f"fab {task} --{option}: a text option with the number {default!r} as its default")


def test_unset_defaults_are_not_given_and_falsy():
    arguments = {a.names[0]: a for a in ns["train"].get_arguments()}
    assert not common.given(arguments["epochs"].value) and not arguments["epochs"].value
    assert not common.given(arguments["nodes"].value)
    arguments["nodes"].set_value("2")
    assert common.given(arguments["nodes"].value) and arguments["nodes"].value == 2


def test_the_nodes_zero_line_says_what_all_nodes_is():
    arguments = {a.names[0]: a for a in ns["train"].get_arguments()}
    message = _refused(arguments["nodes"], "0")
    assert message == "error: --nodes: 0 is not allowed; give 1 or more (leave --nodes out for the default: all nodes)"
