"""`fab up`, `fab down`: the cluster's life in one place, the Pulumi CLI with the toolkit's part around it.

`fab up`: `fab preflight` (the up stops when it fails), then `pulumi up --refresh`, then it waits (at most
`--wait-for-capacity`) until the workers' group has every worker in service and the master's group its master:
the program's own wait covers a group it creates, not one it only updates (the idle auto-stop's groups set back
from 0), and a group that could not be filled goes on launching nodes later (billed). It fails with the group's
own reason (its latest scaling activity) when the workers are not there, and exits 1 when the cluster has no
running master after the wait: it never says a cluster is up without one. Last, the master's
idle auto-stop is armed with the stack's autoStopIdle, as `fab setup` arms it (a cluster nobody uses stops), also
after a failed `pulumi up` or wait once the group exists (the image was made: nothing armed reaches it); a
worker it cannot reach is left out, named, and given back to its group, and the rest are armed. `fab down`:
`pulumi destroy`, then, once it succeeded, `fab forget` (the controller's key pair and host keys
of the cluster) and `fab sweep`'s listing. The steps and command lines are cluster/stack/lifecycle.py's,
the process handling (streamed output, Ctrl-C passed on once, never a kill) node_setup/pulumi_cli.py's.
Without the Pulumi CLI both print the commands to run by hand and exit 2.
"""

from __future__ import annotations

from invoke import Exit

from cluster.durations import format_duration
from cluster.stack import lifecycle
from cluster.stack import worker_group as group_rules
from cluster.stack.catalog import METAL_BOOT_WAIT_S
from cluster.stack.spec import ClusterSpec
from node_setup import pulumi_cli
from node_setup.tasks.common import FAILED, duration_or_off, fail, task
from node_setup.tasks.costs import _stack_spec, image_line, run_stack_preflight, sweep_listing

CAPACITY_POLL_S = 15.0


def _spec(stack: str) -> ClusterSpec:
    if stack:
        try:
            lifecycle.check_stack(stack)
        except ValueError as exc:
            raise fail(str(exc)) from None
    return _stack_spec(stack, required=True)


ZONE_AUTO = "auto"


def _move_zone(spec: ClusterSpec, stack: str, zone: str) -> None:
    """`fab up --zone`: availabilityZone (the best-ranked zone for `auto`) and zoneMove: true in the stack file,
    checked before anything is written."""
    from cluster.stack.spec import zone_problems
    from node_setup.stack_config import choose_stack
    from node_setup.stack_edit import set_stack_value
    from node_setup.tasks.costs import _pick_zone

    if spec.subnet_id:
        raise fail(f"--zone: the stack sets subnetId {spec.subnet_id!r}, whose zone decides; allowed: unset it "
                   "(`pulumi config rm subnetId`), or change subnetId to move the cluster")
    if zone == ZONE_AUTO:
        _pick_zone(spec, stack, write=True, move=True)
        return
    problems = zone_problems(zone, spec.region)
    if problems:
        raise fail("--zone: " + problems[0].removeprefix("availabilityZone: ") + f" or {ZONE_AUTO}")
    _, path = choose_stack(stack or None)
    set_stack_value(path, "availabilityZone", zone)
    set_stack_value(path, "zoneMove", True)
    print(f"{path.name}: availabilityZone = {zone}, zoneMove = true (the whole cluster moves there)", flush=True)


def _spot_again(spec: ClusterSpec) -> None:
    """onDemandFallback: a group the idle auto-stop set to 0 with its on-demand base raised is set back to spot
    first (base 0) before `pulumi up` launches its workers again; a group that runs keeps its base."""
    from node_setup.aws import clients, errors
    from node_setup.aws.worker_group import set_on_demand_base, worker_group

    try:
        group = worker_group(spec.cluster_name, spec.region)
        if group is not None and group.stopped and group.on_demand_base:
            set_on_demand_base(group.name, 0, spec.region)
            print(f"fab: {group.name}: on-demand base {group.on_demand_base} -> 0 (onDemandFallback: the group is "
                  "stopped, its next workers are asked for as spot first)", flush=True)
    except (clients.AwsSetupError, *errors.AWS_ERRORS) as exc:
        print(f"warning: could not read the workers' group ({str(exc).splitlines()[0]}): its on-demand base is "
              "left as it is", flush=True)


def _need_pulumi(steps: list[lifecycle.Step]) -> None:
    if not pulumi_cli.find_pulumi():
        raise fail(lifecycle.missing_cli_message(steps))


def _pulumi(step: lifecycle.Step) -> int:
    """Run the step's Pulumi command; its exit code."""
    print(f"fab: running {lifecycle.Step(step.kind, step.run_argv).command}", flush=True)
    return pulumi_cli.run_streaming(step.run_argv)


def _run_pulumi(step: lifecycle.Step) -> None:
    """Run the step's Pulumi command; exit with its code when it fails."""
    code = _pulumi(step)
    if code:
        raise Exit(f"error: `{step.argv[0]} {step.argv[1]}` exited with code {code}", code=code)


def _has_credentials() -> bool:
    """Whether boto3 finds any AWS credentials here (what Pulumi ran with; no AWS call is made)."""
    import boto3

    return boto3.session.Session().get_credentials() is not None


def _group_after_up(spec: ClusterSpec, wait_s: float):
    """The workers' group once it has every worker in service or `wait_s` passed (node_setup/aws/worker_group.py),
    and the line to fail with when it is short (None: full); (None, None) without a group. An account that
    cannot be read is one warning line: the capacity is then not checked."""
    import sys

    from node_setup.aws import clients, errors
    from node_setup.aws.worker_group import wait_for_workers

    from node_setup.aws.worker_group import set_on_demand_base

    fallback = spec.on_demand_fallback_s
    first = min(wait_s, fallback) if fallback is not None and wait_s else wait_s
    try:
        group = wait_for_workers(spec.cluster_name, region=spec.region, timeout_s=first, poll_s=CAPACITY_POLL_S)
        # onDemandFallback: short of spot capacity for its wait, the missing workers go on demand.
        acts = group is not None and bool(group.types) and first < wait_s and not group.stopped  # types: a policy
        base = group_rules.fallback_base(group.desired, len(group.in_service), group.on_demand_base,
                                         group.failure) if group is not None and acts else None
        if group and base is not None:
            set_on_demand_base(group.name, base, spec.region)
            print("fab: " + group_rules.fallback_line(group.name, base, format_duration(first), str(group.failure)),
                  flush=True)
            group = wait_for_workers(spec.cluster_name, region=spec.region, timeout_s=wait_s - first,
                                     poll_s=CAPACITY_POLL_S)
    except (clients.AwsSetupError, *errors.AWS_ERRORS) as exc:
        print(f"warning: could not read the workers' group ({str(exc).splitlines()[0]}): whether its workers are "
              "in service is not checked (`fab status` shows it)", file=sys.stderr, flush=True)
        return None, None
    if group is None or group.stopped or len(group.in_service) >= group.desired:
        return group, None
    return group, group_rules.capacity_line(group.name, group.desired, len(group.in_service), group.failure,
                                            format_duration(wait_s), group.types)


def _aws_problem(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _no_running_master(spec: ClusterSpec, wait_s: float) -> str | None:
    """After `pulumi up`: None when the cluster has a running master, else the line to fail with. The master's
    group is waited for first, at most `wait_s` (a group set back from 0 launches its master after `pulumi up`)."""
    from node_setup.aws import clients, errors, termination
    from node_setup.aws.worker_group import wait_for_master

    try:
        if wait_s:
            wait_for_master(spec.cluster_name, region=spec.region, timeout_s=wait_s, poll_s=CAPACITY_POLL_S)
        masters = termination.cluster_masters(spec.cluster_name, spec.region)
    except (clients.AwsSetupError, *errors.AWS_ERRORS) as exc:
        return (f"could not check that the master of {spec.cluster_name} runs ({_aws_problem(exc)}); run `fab up` "
                "again")
    if termination.RUNNING in masters.values():
        return None
    return (f"cluster {spec.cluster_name} has no running master after `pulumi up` "
            f"({termination.states_text(masters) or 'EC2 has none'}): nothing was armed and the cluster is not up; "
            "the master's group launches one by itself (`fab status` shows it); run `fab up` again")


def _give_back(node, group, region: str | None) -> str:
    """What became of a worker the arming leaves out, in words: one EC2 says is gone is the group's to replace;
    another is handed back to the group as the supervisor hands back a replacement it cannot admit
    (node_setup/backends/aws.py's AwsGroup: terminated through the group, which launches another)."""
    from cluster.run.supervision import GONE_STATES, Member
    from node_setup.backends.aws import AwsGroup

    if group is None or not region or not node.instance_id:
        return ("not handed back (the workers' group was not read): `fab status` shows it; `fab setup` arms the "
                "nodes again")
    machines = AwsGroup(region, group.name, [])
    member = Member(node.name, node.private_address, node.instance_id)
    try:
        state = machines.instance_state(member)
    except Exception:  # noqa: BLE001 - not known: handed back (a terminated one is refused there, said so)
        state = None
    if state in GONE_STATES:
        return f"EC2 says it is {state}: the group {group.name} launches its replacement"
    return machines.hand_back(member)


def _reachable(inventory, conns: dict, group):
    """The inventory and connections without the workers whose connection does not open (each left out in one
    warning line naming it and why, and given back to its group: `_give_back`); a line saying why when the
    master itself cannot be reached (nothing to arm)."""
    from dataclasses import replace

    from node_setup.ssh.fanout import unopened

    failed = unopened(conns)
    master = inventory.master
    if master.name in failed:
        return f"the master {master.name} ({master.instance_id}) cannot be reached: {failed[master.name]}"
    left = tuple(n for n in inventory.nodes if n.name in failed)
    for node in left:
        print(f"warning: {node.name} ({node.instance_id}) is left out of the arming: {failed[node.name]}; "
              f"{_give_back(node, group, inventory.region)}", flush=True)
    kept = replace(inventory, nodes=tuple(n for n in inventory.nodes if n.name not in failed),
                   down=inventory.down + left)
    return kept, {name: conn for name, conn in conns.items() if name not in failed}


def _arm_autostop(spec: ClusterSpec, group=None) -> str | None:
    """Arm the master's idle auto-stop with the stack's autoStopIdle as `fab setup` does (the cluster key and
    the node list on the master first) on the nodes that can be reached: a worker that cannot (no host key
    fingerprints on its console in time, reclaimed since it was found) is left out, named, and given back to
    `group` (`_reachable`); what went wrong in one line, None when it is armed (or off)."""
    from cluster.node import autostop
    from node_setup.ssh import autostop as remote
    from node_setup.ssh import connections
    from node_setup.stack_config import stack_auto_stop_idle
    from node_setup.tasks import common

    try:
        idle_s = stack_auto_stop_idle(spec.cluster_name)
        if idle_s is None:
            print("auto-stop: off (the stack's autoStopIdle)", flush=True)
            return None
        inventory = common.inventory(spec.cluster_name, spec.region)
    except (Exit, autostop.AutostopError) as exc:
        return str(getattr(exc, "message", None) or exc).removeprefix("error: ")
    conns = common.connect(inventory)
    try:
        reachable = _reachable(inventory, conns, group)
        if isinstance(reachable, str):
            return reachable
        kept, kept_conns = reachable
        print(autostop.status_line(remote.arm_at_setup(kept, kept_conns, idle_s, force=False)), flush=True)
    except Exception as exc:  # noqa: BLE001 - said in one line: the cluster is up, the auto-stop is not armed
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    finally:
        connections.close_all(conns)
    return None


@task(help={
    "stack": "Pulumi stack to bring up (default: the only Pulumi.<stack>.yaml here besides the example)",
    "preflight": "run `fab preflight` first and stop when it fails (on by default; --no-preflight skips it)",
    "ip_check": "preflight: compare adminCidrs with this machine's public address",
    "wait-for-capacity": "after `pulumi up`, wait this long at most for every worker of the group to be in "
                         f"service, and as long for the master's group's master, e.g. 1h (default "
                         f"{METAL_BOOT_WAIT_S // 60}m: a metal type's boot; off: check once); short of workers "
                         "then, fab up fails with the group's reason, without a running master with exit 1",
    "zone": "move the whole cluster to this zone (auto: the best-ranked one, as `fab preflight --pick-zone` "
            "ranks them): sets availabilityZone and zoneMove: true in the stack file first; preflight names what "
            "`pulumi up` replaces",
}, kinds={"wait-for-capacity": duration_or_off})
def up(c, stack="", preflight=True, ip_check=True, wait_for_capacity=float(METAL_BOOT_WAIT_S), zone=""):
    """Preflight, then `pulumi up --refresh` for the stack, its output streamed.

    Then waits for the workers' group to be full and the master's group to have its master, and arms the idle
    auto-stop; exits with Pulumi's code when it fails, 1 when workers are missing or no master runs.

    A first up takes about an hour, two on metal types (docs/aws-lifecycle.md). Ctrl-C is passed to
    Pulumi once (it cancels cleanly) and `fab` waits for it to exit: Pulumi is never killed.
    """
    spec = _spec(stack)
    if zone:
        _move_zone(spec, stack, zone)
        spec = _spec(stack)
    steps = lifecycle.up_steps(spec.stack, preflight=preflight)
    _need_pulumi(steps)
    if not preflight:  # preflight's report says it otherwise
        line, unread = image_line(spec)
        print(f"fab: image: {line or unread}", flush=True)
    code = 0
    for step in steps:
        if step.kind == lifecycle.PREFLIGHT_STEP:
            code = run_stack_preflight(spec, ip_check=ip_check)
            if code:
                raise Exit(f"error: preflight failed (exit code {code}): nothing was created; fix what it names "
                           "and run `fab up` again", code=code)
        else:
            if step.kind == lifecycle.PULUMI_STEP and _has_credentials() and spec.on_demand_fallback_s is not None:
                _spot_again(spec)
            code = _pulumi(step)
    group, short, unarmed = None, None, None
    if not _has_credentials():
        print("warning: no AWS credentials here: whether the workers' group has its workers in service is not "
              "checked and the idle auto-stop is not armed (`fab status` shows the group, `fab setup` arms it)",
              flush=True)
    else:
        if not code and wait_for_capacity:
            print(f"fab: waiting for the workers' group of {spec.cluster_name} to have its workers in service (at "
                  f"most {format_duration(wait_for_capacity)})", flush=True)
        group, short = _group_after_up(spec, 0 if code else wait_for_capacity)
        masterless = None if code else _no_running_master(spec, wait_for_capacity)
        if masterless:
            if short:
                print(f"warning: {short}", flush=True)
            raise Exit(f"error: {masterless}", code=FAILED)
        # After a failed `pulumi up` the master may be up with nothing to stop it; once the group exists the
        # image was made from it, so arming it puts nothing into an image.
        unarmed = _arm_autostop(spec, group) if not code or group is not None else None
    if unarmed:
        print(f"warning: the idle auto-stop is not armed ({unarmed}): nothing stops this cluster when it is idle; "
              "`fab setup` or `fab autostop` arms it", flush=True)
    if code:
        if group is not None and len(group.in_service) < group.desired:
            print(group_rules.capacity_line(group.name, group.desired, len(group.in_service), group.failure,
                                            "`pulumi up`", group.types), flush=True)
        raise Exit(f"error: `pulumi up` exited with code {code}", code=code)
    if short:
        raise Exit(f"error: {short}", code=FAILED)
    print(f"up: cluster {spec.cluster_name} is up (stack {spec.stack}); next: `fab train --nodes {spec.node_count}` "
          "(`fab setup` checks the nodes' software)")


@task(help={
    "stack": "Pulumi stack to destroy (default: the only Pulumi.<stack>.yaml here besides the example)",
    "yes": "do not ask before destroying",
})
def down(c, stack="", yes=False):
    """`pulumi destroy` for the stack, its output streamed, then what is left listed.

    After it succeeded, forgets the cluster's keys and lists what is left with the toolkit's tags (`fab
    sweep`). Exits with Pulumi's code when it fails.

    Ctrl-C is passed to Pulumi once (it cancels cleanly) and `fab` waits for it to exit.
    """
    from node_setup.ssh import keys

    spec = _spec(stack)
    steps = lifecycle.down_steps(spec.stack, spec.cluster_name)
    _need_pulumi(steps)
    if not yes:
        answer = input(f"destroy stack {spec.stack} (cluster {spec.cluster_name} in {spec.region})? type 'yes': ")
        if answer.strip().lower() != "yes":
            raise Exit("down: nothing destroyed", code=FAILED)
    for step in steps:
        if step.kind == lifecycle.PULUMI_STEP:
            _run_pulumi(step)
        elif step.kind == lifecycle.FORGET_STEP:
            try:
                forgot = keys.forget_cluster(spec.cluster_name)
            except keys.KeyStoreError as exc:
                raise Exit(f"error: {exc}", code=FAILED) from None
            print(f"forgot cluster {spec.cluster_name!r}: its SSH key pair and recorded host keys are removed"
                  if forgot else f"nothing to forget: no keys are kept for cluster {spec.cluster_name!r}")
        elif step.kind == lifecycle.SWEEP_STEP:
            _sweep(spec)


def _sweep(spec: ClusterSpec) -> None:
    """`fab sweep`'s listing after the destroy; exit 1 when it could not be made or is incomplete."""
    try:
        listing, incomplete, _, _ = sweep_listing(spec.region)
    except Exit as exc:  # no credentials now: the destroy itself succeeded
        raise Exit(f"{exc.message}; the stack is destroyed, run `fab sweep --stack {spec.stack}` to check "
                   "what is left", code=FAILED) from None
    if listing.leaked():
        print("run `fab sweep --delete` to remove the leaked resources")
    if incomplete:
        raise Exit(incomplete, code=FAILED)


TASKS = [up, down]
