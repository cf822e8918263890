"""`fab up`, `fab down`: the cluster's life in one place, the Pulumi CLI with the toolkit's part around it.

`fab up`: `fab preflight` (the up stops when it fails), then `pulumi up --refresh`. `fab down`:
`pulumi destroy`, then, once it succeeded, `fab forget` (the controller's key pair and host keys
of the cluster) and `fab sweep`'s listing. The steps and command lines are cluster/stack/lifecycle.py's,
the process handling (streamed output, Ctrl-C passed on once, never a kill) node_setup/pulumi_cli.py's.
Without the Pulumi CLI both print the commands to run by hand and exit 2.
"""

from __future__ import annotations

from invoke import Exit

from cluster.stack import lifecycle
from cluster.stack.spec import ClusterSpec
from node_setup import pulumi_cli
from node_setup.tasks.common import FAILED, fail, task
from node_setup.tasks.costs import _stack_spec, run_stack_preflight, sweep_listing


def _spec(stack: str) -> ClusterSpec:
    if stack:
        try:
            lifecycle.check_stack(stack)
        except ValueError as exc:
            raise fail(str(exc)) from None
    return _stack_spec(stack, required=True)


def _need_pulumi(steps: list[lifecycle.Step]) -> None:
    if not pulumi_cli.find_pulumi():
        raise fail(lifecycle.missing_cli_message(steps))


def _run_pulumi(step: lifecycle.Step) -> None:
    """Run the step's Pulumi command; exit with its code when it fails."""
    print(f"fab: running {lifecycle.Step(step.kind, step.run_argv).command}", flush=True)
    code = pulumi_cli.run_streaming(step.run_argv)
    if code:
        raise Exit(f"error: `{step.argv[0]} {step.argv[1]}` exited with code {code}", code=code)


@task(help={
    "stack": "Pulumi stack to bring up (default: the only Pulumi.<stack>.yaml here besides the example)",
    "preflight": "run `fab preflight` first and stop when it fails (on by default; --no-preflight skips it)",
    "ip_check": "preflight: compare adminCidrs with this machine's public address",
})
def up(c, stack="", preflight=True, ip_check=True):
    """Preflight, then `pulumi up --refresh` for the stack, its output streamed; exits with Pulumi's code.

    A first up takes about an hour, two on metal types (docs/aws-lifecycle.md). Ctrl-C is passed to
    Pulumi once (it cancels cleanly) and `fab` waits for it to exit: Pulumi is never killed.
    """
    spec = _spec(stack)
    steps = lifecycle.up_steps(spec.stack, preflight=preflight)
    _need_pulumi(steps)
    for step in steps:
        if step.kind == lifecycle.PREFLIGHT_STEP:
            code = run_stack_preflight(spec, ip_check=ip_check)
            if code:
                raise Exit(f"error: preflight failed (exit code {code}): nothing was created; fix what it names "
                           "and run `fab up` again", code=code)
        else:
            _run_pulumi(step)
    print(f"up: cluster {spec.cluster_name} is up (stack {spec.stack}); next: `fab setup` (checks the nodes and "
          f"arms the idle auto-stop), then `fab train --nodes {spec.node_count}`")


@task(help={
    "stack": "Pulumi stack to destroy (default: the only Pulumi.<stack>.yaml here besides the example)",
    "yes": "do not ask before destroying",
})
def down(c, stack="", yes=False):
    """`pulumi destroy` for the stack, its output streamed; after it succeeded, forget the cluster's keys
    and list what is left with the toolkit's tags (`fab sweep`). Exits with Pulumi's code when it fails.

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
