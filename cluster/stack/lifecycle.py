"""The cluster's life in one place: what `fab up` and `fab down` run, in order, and how long an up takes.

Pure: the steps and the Pulumi command lines for a stack, and the documented time of a first
`pulumi up` (docs/aws-lifecycle.md#how-long-a-first-pulumi-up-takes) as facts that `fab plan`
prices and the README quotes. Running them is node_setup/pulumi_cli.py's and
node_setup/tasks/lifecycle.py's.

    up_steps(stack)              -> [Step]   preflight, then `pulumi up --refresh`
    down_steps(stack, cluster)   -> [Step]   `pulumi destroy`, then forget and the sweep listing
    first_up(instance)           -> FirstUp  how long the first `pulumi up` takes, what it bills
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from cluster.stack.catalog import InstanceType

PULUMI = "pulumi"

# What a step does: run the Pulumi CLI, or one of the toolkit's own parts around it.
PULUMI_STEP = "pulumi"
PREFLIGHT_STEP = "preflight"  # `fab preflight`: will the launch succeed? (node_setup/aws/preflight.py)
FORGET_STEP = "forget"  # `fab forget`: the controller's key pair and host keys of the cluster
SWEEP_STEP = "sweep"  # `fab sweep`: what is still there with the toolkit's tags (listing only)

# A stack name as `pulumi stack init` takes it (a file Pulumi.<stack>.yaml names it): checked where
# it enters, before it is put into a command line.
STACK_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}\Z")


@dataclass(frozen=True)
class Step:
    kind: str  # PULUMI_STEP or one of the toolkit's steps
    argv: tuple[str, ...]  # what a person would type (a `fab` task or the Pulumi CLI)
    run_argv: tuple[str, ...] = ()  # for PULUMI_STEP: what `fab` runs (non-interactive)

    @property
    def command(self) -> str:
        return shlex.join(self.argv)


def check_stack(stack: str) -> str:
    if not STACK_RE.match(stack or ""):
        raise ValueError(f"--stack: {stack!r} is not allowed; allowed: a stack name of letters, digits, '_', "
                         "'.' and '-' (up to 100, starting with a letter or digit)")
    return stack


def pulumi_argv(verb: str, stack: str, *, interactive: bool) -> tuple[str, ...]:
    """`pulumi up` or `pulumi destroy` for `stack`.

    `up` always refreshes: after a spot reclaim or the idle auto-stop the state still lists the
    terminated nodes and a plain `pulumi up` shows no change; on a new stack a refresh costs
    nothing. Run by `fab` (not `interactive`) its output goes through a pipe, where Pulumi cannot
    ask, so `--yes` answers for the person who ran `fab up`/`fab down --yes`.
    """
    if verb not in ("up", "destroy"):
        raise ValueError(f"pulumi verb {verb!r}: allowed up or destroy")
    argv = [PULUMI, verb, "--stack", check_stack(stack)]
    if verb == "up":
        argv.append("--refresh")
    if not interactive:
        argv += ["--yes", "--non-interactive"]
    return tuple(argv)


def _pulumi_step(verb: str, stack: str) -> Step:
    return Step(PULUMI_STEP, pulumi_argv(verb, stack, interactive=True), pulumi_argv(verb, stack, interactive=False))


def up_steps(stack: str, *, preflight: bool = True) -> list[Step]:
    """`fab up`: preflight (it stops the up when it fails), then `pulumi up --refresh`."""
    steps = [Step(PREFLIGHT_STEP, ("fab", "preflight", "--stack", check_stack(stack)))] if preflight else []
    return steps + [_pulumi_step("up", stack)]


def down_steps(stack: str, cluster: str) -> list[Step]:
    """`fab down`: `pulumi destroy`; after it succeeded, forget the cluster's keys and list what is left."""
    return [_pulumi_step("destroy", stack),
            Step(FORGET_STEP, ("fab", "forget", "--cluster", cluster)),
            Step(SWEEP_STEP, ("fab", "sweep", "--stack", check_stack(stack)))]


def missing_cli_message(steps: list[Step]) -> str:
    """What to run by hand when the Pulumi CLI is not installed: one line per command, in order."""
    return ("the Pulumi CLI (`pulumi`) is not on PATH (install it: https://www.pulumi.com/docs/install/); "
            "run these yourself, in order:\n" + "\n".join(f"  {step.command}" for step in steps))


# How long a first `pulumi up` takes, from docs/aws-lifecycle.md's table ("Expect about an hour,
# and up to two for metal types"): the master runs (and bills) through all of it: launch, boot,
# cloud-init, the profile's install and the image's first snapshot; the workers only through the
# last step, their launch and boot from the image ("a few minutes"; metal types "can take over 20
# minutes to start"). Coming back after the idle auto-stop costs less: a new master's launch, boot
# and setup again, then the workers from the image, which stays (no new snapshot).
FIRST_UP_S = {False: 3600.0, True: 2 * 3600.0}  # by bare metal
WORKER_BOOT_S = {False: 5 * 60.0, True: 20 * 60.0}  # by bare metal
FIRST_UP_SOURCE = "docs/aws-lifecycle.md: a first `pulumi up` takes about an hour, up to two on metal types"


@dataclass(frozen=True)
class FirstUp:
    seconds: float  # wall time of the first `pulumi up`
    worker_seconds: float  # what each worker bills of it (launch and boot from the image)
    source: str

    def instance_seconds(self, nodes: int) -> float:
        """Instance-seconds billed while it runs: the master throughout, each worker its boot."""
        return self.seconds + max(nodes - 1, 0) * self.worker_seconds


def first_up(instance: InstanceType) -> FirstUp:
    metal = instance.bare_metal
    kind = "metal type" if metal else "non-metal type"
    return FirstUp(FIRST_UP_S[metal], WORKER_BOOT_S[metal], f"{FIRST_UP_SOURCE} ({instance.name}: {kind})")
