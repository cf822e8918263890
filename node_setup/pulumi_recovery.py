"""Replace a lost master with the Pulumi CLI, changing nothing else and never killing Pulumi.

Only the master: the workers are an Auto Scaling group, which replaces a lost worker itself (their
instances are not in the stack). The steps and their reasons are cluster/run/stack_recovery.py's: compare
the stack file (`Pulumi.<stack>.yaml` in the project's directory) with the settings the last `pulumi up`
recorded and stop with the command for the user on any difference, wait for EC2 to report the lost
master `terminated` (bounded), refresh only its instance, then `pulumi up` of the master and its
dependents (with nothing pending: the master created, the setup step updated). Every Pulumi command runs through
node_setup/pulumi_cli.py's runner: output streamed as it comes (the progress), no time limit, and a
Ctrl-C passed to Pulumi once so it cancels cleanly (never SIGKILL). Afterwards fab says what the
stack holds: its instances and any operation an interrupted run could not record.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from cluster.run import stack_recovery as sr
from cluster.stack.lifecycle import PULUMI
from node_setup import pulumi_cli

# What replace_lost_master() returns.
REPLACED = "replaced"  # pulumi up of the master succeeded
NOT_TERMINATED = "not-terminated"  # EC2 still had the lost master after the bounded wait: nothing run
OTHER_CHANGES = "other-changes"  # the stack has other pending changes: the command is for the user
FAILED = "failed"  # a Pulumi command failed or was interrupted (the stack's content is reported)
NOT_IN_STACK = "not-in-stack"  # the stack holds no master with that instance id (nothing to target)


def _capture(argv: Sequence[str]) -> tuple[int, str]:
    lines: list[str] = []
    code = pulumi_cli.run_streaming(argv, write=lines.append, say=_say_plain)
    return code, "".join(lines)


def _say_plain(line: str) -> None:
    print(line, flush=True)


def _streamed(say: Callable[[str], None]) -> Callable[[str], None]:
    def write(text: str) -> None:
        say(f"  pulumi | {text.rstrip()}")
    return write


def report_stack(stack: str, cwd: str | None, say: Callable[[str], None]) -> None:
    """Say what the stack holds now (from `pulumi stack export`)."""
    code, text = _capture(sr.export_argv(stack, cwd))
    if code:
        say(f"could not read the stack {stack} (pulumi stack export: exit code {code}); "
            f"`pulumi stack --stack {stack}` shows it")
        return
    say(f"the stack {stack} holds now:")
    for line in sr.stack_holds(sr.parse_json_output(text)):
        say(f"  {line}")


def stack_file_settings(stack: str, cwd: str | None) -> tuple[Mapping | None, str]:
    """node_replacement.node_settings of the stack file `Pulumi.<stack>.yaml` in `cwd` (the settings a
    `pulumi up` from here would apply), or None and why it cannot be read."""
    from cluster.stack.node_replacement import node_settings
    from cluster.stack.spec import ConfigError
    from node_setup.stack_config import StackConfigError, load_stack_spec

    try:
        return node_settings(load_stack_spec(stack, cwd or ".")), ""
    except StackConfigError as exc:
        return None, str(exc)
    except ConfigError as exc:
        return None, "; ".join(exc.problems)


def replace_lost_master(stack: str, master_id: str, *, region: str | None, say: Callable[[str], None],
                        cwd: str | None = None, wait_terminated=None, timeout_s: float = sr.TERMINATED_WAIT_S) -> str:
    """Replace the lost master `master_id` of `stack`; one of REPLACED, NOT_TERMINATED, OTHER_CHANGES,
    FAILED, NOT_IN_STACK. The stack file is `Pulumi.<stack>.yaml` in `cwd` (Pulumi's project directory).
    `wait_terminated(ids, region, timeout_s=...)` -> {id: state} left (a seam for tests; default
    node_setup/aws/termination.py's)."""
    if wait_terminated is None:
        from node_setup.aws.termination import wait_terminated
    manual = sr.manual_command(stack)
    wanted, unreadable = stack_file_settings(stack, cwd)
    if wanted is None:
        say(f"cannot compare the stack with its stack file ({unreadable}): fab replaces the master only when "
            f"nothing else would change, so it stops here. Review and apply it yourself: {manual}")
        return OTHER_CHANGES
    code, text = _capture(sr.export_argv(stack, cwd))
    if code:
        say(f"could not read the stack {stack} (pulumi stack export: exit code {code}); run `{manual}` yourself")
        return FAILED
    state = sr.parse_json_output(text)
    urn = sr.master_urn(state, master_id)
    if urn is None:
        say(f"the stack {stack} holds no master {master_id}: nothing for fab to replace "
            f"(`{manual}` shows what the stack would do)")
        return NOT_IN_STACK
    pending = sr.pending_settings(wanted, sr.deployed_settings_of(state))
    if pending:
        say(f"the stack file of {stack} differs from what its last `pulumi up` recorded ({'; '.join(pending[:6])}"
            f"{'; ...' if len(pending) > 6 else ''}): a `pulumi up` of the master and its dependents would apply "
            f"that too (the image, the workers' template and group depend on the master), so fab stops here. "
            f"Review and apply it yourself: {manual}")
        return OTHER_CHANGES
    say(f"waiting for EC2 to report the master {master_id} terminated (at most {timeout_s / 60:g} min) before "
        "refreshing")
    left = wait_terminated([master_id], region, timeout_s=timeout_s)
    if left:
        states = ", ".join(f"{iid}: {state}" for iid, state in sorted(left.items()))
        say(f"AWS has not terminated the lost master after {timeout_s / 60:g} min ({states}); a refresh "
            f"now would change nothing. Not running Pulumi: once it is terminated, run `{manual}`")
        return NOT_TERMINATED
    targets = [urn]
    say(f"refreshing only the lost master: {sr.urn_name(urn)}")
    code = pulumi_cli.run_streaming(sr.refresh_argv(stack, targets, cwd), write=_streamed(say), say=_say_plain)
    if code:
        say(f"`pulumi refresh` of the lost master ended with exit code {code}")
        report_stack(stack, cwd, say)
        return FAILED
    say(f"replacing the lost master, nothing else pending (Pulumi runs until it is done: its output follows; "
        f"Ctrl-C cancels it cleanly, it is never killed): {PULUMI} up --target ... --target-dependents")
    code = pulumi_cli.run_streaming(sr.up_argv(stack, targets, cwd), write=_streamed(say), say=_say_plain)
    if code:
        say(f"`pulumi up` of the lost master ended with exit code {code}")
    report_stack(stack, cwd, say)
    return FAILED if code else REPLACED
