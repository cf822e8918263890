"""The cluster's life in one place: what `fab up` and `fab down` run, in order, and how long an up takes.

Pure: the steps and the Pulumi command lines for a stack, and the steps of a first `pulumi up`
(docs/aws-lifecycle.md#how-long-a-first-pulumi-up-takes) with their times per instance type, with the image's
build or from a kept image, as facts that `fab plan` prices and `fab preflight` quotes. Running them is
node_setup/pulumi_cli.py's and node_setup/tasks/lifecycle.py's.

    up_steps(stack)              -> [Step]   preflight, then `pulumi up --refresh`
    down_steps(stack, cluster)   -> [Step]   `pulumi destroy`, then forget and the sweep listing
    first_up(instance, gib, kept_image=..., worst_case=...) -> FirstUp   the first `pulumi up`'s steps, what each
                                 bills; every boot its typical time, or (worst_case) its whole wait budget
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from cluster.durations import format_duration
from cluster.stack.catalog import InstanceType, boot_wait_s, typical_boot_s
from cluster.stack.image_build import BUILDER_INSTANCE_TYPE, BUILDER_USD_PER_HOUR

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


# The steps of a first `pulumi up`, in the order the program runs them (infra/program.py), with what each
# typically takes (docs/aws-lifecycle.md's table: "about a minute", "a few minutes", "several minutes to a
# quarter of an hour", "often 15 to 45 minutes for 100 GiB") and who bills while it runs. A boot is the
# instance type's typical boot (cluster/stack/catalog.py's typical_boot_s: 9 minutes for a recent metal type, 2
# for a virtual one); the worst case is every boot taking the type's wait budget (boot_wait_s: what the program
# waits for a node's boot at most, 40 minutes for metal types, 15 for others).
RESOURCES_S = 60.0  # security groups, key pair, bucket, IAM role and profile: no instance bills yet
CLOUD_INIT_S = 180.0  # cloud-init on the master, which the setup step waits for
INSTALL_S = 600.0  # the profile's install (pip, Intel MPI) on the build instance
BAKE_S_PER_GIB = 18.0  # the image's first snapshot of the whole written build volume: 30 minutes per 100 GiB
CHECK_S = 30.0  # the setup step checks the master against the profile, as `fab check` does (and adds the project)
# Who bills during a step: the master, each worker, and the image's build instance (BUILDER_INSTANCE_TYPE, at
# BUILDER_USD_PER_HOUR: cluster/stack/image_build.py).
MASTER, WORKERS, BUILDER = "master", "workers", "builder"
STEPS_SOURCE = "the steps of a first `pulumi up` (cluster/stack/lifecycle.py; docs/aws-lifecycle.md's table)"


@dataclass(frozen=True)
class UpStep:
    name: str
    seconds: float
    billed: tuple[str, ...]  # MASTER and/or WORKERS; () before any instance runs


@dataclass(frozen=True)
class FirstUp:
    """A first `pulumi up` as its steps: with a build (the build instance's boot, install and snapshot, then every
    node's boot from the image, the master's cloud-init and check) or from a kept image (the same, with no
    build)."""

    steps: tuple[UpStep, ...]
    kept_image: bool
    source: str

    @property
    def seconds(self) -> float:
        """Wall time of the first `pulumi up`."""
        return sum(step.seconds for step in self.steps)

    @property
    def master_seconds(self) -> float:
        return sum(step.seconds for step in self.steps if MASTER in step.billed)

    @property
    def worker_seconds(self) -> float:
        """What each worker bills of it (its launch and boot)."""
        return sum(step.seconds for step in self.steps if WORKERS in step.billed)

    def instance_seconds(self, nodes: int) -> float:
        """The nodes' instance-seconds billed while it runs: the master from its launch, each worker its boot."""
        return self.master_seconds + max(nodes - 1, 0) * self.worker_seconds

    @property
    def builder_seconds(self) -> float:
        return sum(step.seconds for step in self.steps if BUILDER in step.billed)

    @property
    def builder_usd(self) -> float:
        """What the image's build instance bills (on demand, its own small type)."""
        return self.builder_seconds * BUILDER_USD_PER_HOUR / 3600

    def usd(self, nodes: int, usd_per_hour: float) -> float:
        """What it bills: the nodes' instance-seconds at `usd_per_hour`, and the build instance at its own price."""
        return self.instance_seconds(nodes) * usd_per_hour / 3600 + self.builder_usd

    def describe(self) -> str:
        """The steps and their times in words: `resources 1m 00s, the master's boot 40m 00s, ...`."""
        return ", ".join(f"{step.name} {format_duration(step.seconds)}" for step in self.steps)


def first_up(instance: InstanceType, build_volume_gib: int, *, kept_image: bool = False,
             worst_case: bool = False) -> FirstUp:
    """The first `pulumi up` of a stack of this type: with a build of a `build_volume_gib` image (the profile's
    smallest root volume, infra/image.py) on its own small instance, or from a kept image
    (cluster/stack/image_reuse.py). Either way every node launches once the image is there and boots it: the
    master and the workers at once (no node waits for another), then the master's cloud-init and check. Every
    boot (the nodes' and the build instance's) takes its type's typical time, or with `worst_case` its whole wait
    budget."""
    boot_s = boot_wait_s if worst_case else typical_boot_s
    boot = float(boot_s(instance.name))
    resources = UpStep("resources", RESOURCES_S, ())
    nodes = (UpStep("every node's boot from the " + ("kept image" if kept_image else "image"), boot,
                    (MASTER, WORKERS)),
             UpStep("cloud-init", CLOUD_INIT_S, (MASTER,)), UpStep("check", CHECK_S, (MASTER,)))
    build = () if kept_image else (
        UpStep(f"the build instance's boot ({BUILDER_INSTANCE_TYPE})", float(boot_s(BUILDER_INSTANCE_TYPE)),
               (BUILDER,)),
        UpStep("install on it", INSTALL_S, (BUILDER,)),
        UpStep(f"the image's snapshot ({build_volume_gib} GiB)", BAKE_S_PER_GIB * build_volume_gib, (BUILDER,)))
    steps: tuple[UpStep, ...] = (resources, *build, *nodes)
    kind = "metal type" if instance.bare_metal else "non-metal type"
    which = "boot budget" if worst_case else "typical boot"
    return FirstUp(steps, kept_image, f"{STEPS_SOURCE}; {instance.name} ({kind}): its {which} "
                                      f"{format_duration(boot)} (cluster/stack/catalog.py)")
