"""`fab preflight`, `fab plan`, `fab sweep`: know before you pay, leave nothing behind."""

from __future__ import annotations

import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Literal, overload

from invoke import Exit

from cluster.cost import calibration as calib
from cluster.cost import costplan, models, plan_options
from cluster.cost.costplan import Price
from cluster.cost.spend import LOCAL_NO_PRICE
from cluster.cost.plan_options import PlanOptions
from cluster.cost.plan_mfu import plan_flops
from cluster.stack.config_keys import AUTO_STOP_IDLE
from cluster.job.job_args import DEFAULT_GRAD_COMM, GRAD_COMM_CHOICES
from cluster.stack.spec import ClusterSpec, ConfigError
from node_setup.controller import config_root
from node_setup.discovery import cluster_name
from node_setup.stack_config import StackConfigError, choose_stack, load_stack_spec, read_stack_values, stack_files
from node_setup.tasks.common import FAILED, Unset, duration, duration_or_off, fail, given, task


@overload
def _stack_spec(stack: str, *, required: Literal[True]) -> ClusterSpec: ...
@overload
def _stack_spec(stack: str, *, required: bool) -> ClusterSpec | None: ...
def _stack_spec(stack: str, *, required: bool) -> ClusterSpec | None:
    """The stack's validated spec; None only when not `required` and there is no stack file at all."""
    if not stack and not required and not stack_files():
        return None
    try:
        return load_stack_spec(stack or None)
    except StackConfigError as exc:
        raise fail(str(exc)) from None
    except ConfigError as exc:  # one problem in one line; several one per line
        raise fail(exc.problems[0] if len(exc.problems) == 1 else str(exc)) from None


@task(help={
    "stack": "Pulumi stack whose Pulumi.<stack>.yaml to check (default: the only one besides the example)",
    "ip_check": "compare adminCidrs with this machine's public address (asks checkip.amazonaws.com)",
    "pick_zone": "rank the region's zones that offer instanceType by EC2's spot placement score, then spot price",
    "write": "with --pick-zone: set the stack's availabilityZone to the best-ranked zone",
})
def preflight(c, stack="", ip_check=True, pick_zone=False, write=False):
    """Check credentials, region, instance offerings, vCPU quotas, a DryRun launch and adminCidrs.

    Exit code 0 when the launch should succeed, 1 when it would fail, 2 when the stack config is bad.
    """
    if write and not pick_zone:
        raise fail("--write: only with --pick-zone (it writes the zone --pick-zone chose)")
    spec = _stack_spec(stack, required=True)
    if pick_zone:
        return _pick_zone(spec, stack, write)
    code = run_stack_preflight(spec, ip_check=ip_check)
    if code:
        raise Exit(code=code)


def run_stack_preflight(spec: ClusterSpec, *, ip_check: bool = True) -> int:
    """`fab preflight`'s checks for the stack, printed; their exit code (0: the launch should succeed)."""
    from node_setup.aws.preflight import lookup_public_ip, run_preflight

    report = run_preflight(spec, public_ip=lookup_public_ip if ip_check else None)
    check_node_replacement(report, spec)
    check_image(report, spec)
    print(report.render())
    return report.exit_code


def image_line(spec: ClusterSpec) -> tuple[str, str]:
    """(the line on which image `pulumi up` will boot, why and what it saves; why it could not be read or "")."""
    from cluster.stack import image_reuse
    from node_setup.controller import PROJECT_ROOT, project_version

    choice, unread = stack_image_choice(spec)
    if unread:
        return "", f"cannot tell which image `pulumi up` boots: the kept images were not read ({unread})"
    if choice is None:
        return "bake: false: every node boots the base image, `fab setup` installs the profile", ""
    version = project_version() if (PROJECT_ROOT / "pyproject.toml").exists() else None
    return image_reuse.choice_line(choice, spec, project_version=version), ""


def check_image(report, spec: ClusterSpec) -> None:
    """A finding on the image the stack's nodes will boot (cluster/stack/image_reuse.py): a kept one, or a bake."""
    from node_setup.aws.findings import OK, SKIPPED

    line, unread = image_line(spec)
    report.add("image", SKIPPED if unread else OK, unread or line)


def deployed_node_settings(stack: str) -> tuple[dict | None, str]:
    """The node settings the stack's last `pulumi up` recorded (its `nodeSettings` output), or None and why
    they cannot be read (no Pulumi CLI, no such stack, nothing deployed, an older program's outputs)."""
    import json
    import subprocess

    from cluster.stack import node_replacement
    from node_setup.pulumi_cli import find_pulumi

    exe = find_pulumi()
    if not exe:
        return None, "the Pulumi CLI is not installed"
    try:
        done = subprocess.run([exe, "stack", "output", "--json", "--stack", stack], capture_output=True,
                              text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"`pulumi stack output` did not answer ({exc})"
    if done.returncode:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return None, f"`pulumi stack output --stack {stack}` failed: {said}"
    try:
        settings = node_replacement.deployed_settings(json.loads(done.stdout or "{}"))
    except ValueError:
        return None, "`pulumi stack output --json` printed no JSON"
    if settings is None:
        return None, f"stack {stack} has no {node_replacement.OUTPUT} output (not deployed yet, or by an older version)"
    return dict(settings), ""


def check_node_replacement(report, spec: ClusterSpec) -> None:
    """A finding per stack-file change that `pulumi up` would answer by replacing nodes (warn), none found
    (ok), or "cannot tell" (skipped) when the deployed settings cannot be read."""
    from cluster.stack import node_replacement
    from node_setup.aws.findings import OK, SKIPPED, WARN

    deployed, why = deployed_node_settings(spec.stack)
    if deployed is None:
        report.add("replace", SKIPPED, f"{node_replacement.CANNOT_TELL}: {why}")
        return
    lines = node_replacement.replacements(node_replacement.node_settings(spec), deployed)
    for line in lines:
        report.add("replace", WARN, line, "set it back in the stack file to keep those nodes, or expect them "
                   "to be made again (a job running on them is lost)")
    if not lines:
        report.add("replace", OK, "no setting that replaces nodes changed since the last `pulumi up`")


def _pick_zone(spec: ClusterSpec, stack: str, write: bool, move: bool = False) -> str:
    """The zone table; with `write`, availabilityZone set to the best zone in the stack file (with `move`, and
    zoneMove: true: `fab up --zone auto`). The best zone."""
    from botocore.exceptions import BotoCoreError, ClientError

    from node_setup.aws import clients as aws
    from node_setup.aws import errors
    from node_setup.aws.preflight import planned_subnet
    from node_setup.aws.zones import rank_zones, zone_table
    from node_setup.stack_config import choose_stack
    from node_setup.stack_edit import set_stack_value

    if spec.subnet_id:
        raise fail(f"--pick-zone: the stack sets subnetId {spec.subnet_id!r}, whose zone decides; "
                   "unset it (`pulumi config rm subnetId`) to let a zone be picked")
    try:
        ec2 = aws.client("ec2", spec.region)
        ranked = rank_zones(ec2, spec)
        current, label = spec.availability_zone, "the stack's zone"
        if not current and ranked:  # the zone `pulumi up` will pick, by the program's own rule
            pick = planned_subnet(ec2, spec, {r.zone for r in ranked})
            current, label = (pick[1] if pick else None), "the zone `pulumi up` will use (lowest subnet id)"
    except ClientError as exc:
        raise fail(f"cannot rank the zones of {spec.region}: {errors.describe(exc)} (needs "
                   "ec2:GetSpotPlacementScores, ec2:DescribeSpotPriceHistory, ec2:DescribeInstanceTypeOfferings)",
                   code=FAILED) from None
    except (BotoCoreError, aws.AwsSetupError) as exc:
        raise fail(f"cannot rank the zones of {spec.region}: {exc}", code=FAILED) from None
    types = "/".join(spec.types)
    if not ranked:
        raise fail(f"{types} {'are not offered together' if spec.instance_types else 'is not offered'} in any zone "
                   f"of {spec.region}", code=FAILED)
    print(f"{types} x {spec.node_count} (spot placement score for all nodes in one zone, 1-10; "
          f"latest spot price), {spec.region}, best first:")
    print(zone_table(ranked, current=current, label=label))
    best = ranked[0].zone
    if not write:
        print(f"best: {best}; `fab preflight --pick-zone --write` sets availabilityZone to it")
        return best
    _, path = choose_stack(stack or None)
    set_stack_value(path, "availabilityZone", best)
    if move:
        set_stack_value(path, "zoneMove", True)
        print(f"{path.name}: availabilityZone = {best}, zoneMove = true (the whole cluster moves there)")
        return best
    print(f"{path.name}: availabilityZone = {best} (a first choice: a stack that has its subnet keeps it; "
          "with zoneMove: true `pulumi up` moves the whole cluster there)")
    return best


def _price(inputs: plan_options.PlanInputs, spec: ClusterSpec | None, hourly_usd: float, region: str,
           instance_type: str = "") -> tuple[Price, str]:
    """The given price, or the best one AWS tells (spot history, Pricing API, static table), and the
    region it is for ("": given with --hourly-usd). `instance_type`: another than the plan's (instanceTypes)."""
    market = "spot" if inputs.spot else "on-demand"
    if hourly_usd:
        return Price(hourly_usd, market, "given with --hourly-usd"), ""
    from node_setup.aws import clients as aws
    from node_setup.aws import pricing

    where = region or (spec.region if spec else "")
    try:
        where = aws.resolve_region(where or None)
    except aws.AwsSetupError:
        where = "us-east-1"
        inputs.notes.append("no region set: prices for us-east-1")
    skipped: list[str] = []
    price = pricing.plan_price(instance_type or inputs.instance_type, where, spot=inputs.spot, notes=skipped)
    inputs.notes.extend(note for note in (f"price note: {n}" for n in skipped) if note not in inputs.notes)
    return price, where


def _on_demand_price(inputs: plan_options.PlanInputs, price: Price, where: str, *, pricing_client=None
                     ) -> tuple[Price | None, str]:
    """One instance-hour on demand for the on-demand master's line (None and why when not known): the
    spot estimate's basis, else the Pricing API's (else the static table's) for a quoted spot price."""
    if price.market != "spot":
        return None, ""
    if price.on_demand:  # the spot estimate's basis
        return price.on_demand, ""
    if not where:
        return None, "--hourly-usd gives one price for every node, not the master's on-demand price"
    from node_setup.aws import pricing

    skipped: list[str] = []
    try:
        return pricing.hourly_price(inputs.instance_type, where, spot=False, pricing=pricing_client,
                                    notes=skipped), ""
    except LookupError as exc:
        return None, str(exc)


def load_calibration(calibration_file: str, cluster: str) -> tuple[calib.Calibration | None, str]:
    """The calibration `fab plan` uses (the given file, else the cluster's from `fab bench`) and a note."""
    if calibration_file:
        path = Path(calibration_file).expanduser()
        if not path.is_file():
            raise ValueError(f"--calibration: {calibration_file!r} is not a file; allowed: a calibration "
                             "`fab bench` wrote")
        return calib.parse(path.read_text(), str(path)), ""
    if not cluster:
        return None, ""
    path = calib.path_for(config_root(), cluster_name(cluster) or cluster)
    if not path.is_file():
        return None, f"calibration: none for cluster {cluster!r} ({path}); `fab bench --cluster {cluster}` measures one"
    return calib.parse(path.read_text(), str(path)), ""


def _stack_auto_stop_idle(spec: ClusterSpec | None) -> str | None:
    """The stack file's autoStopIdle as written (None: no stack, or not set there)."""
    if spec is None:
        return None
    _, path = choose_stack(spec.stack)
    value = read_stack_values(path)[0].get(AUTO_STOP_IDLE)
    return None if value is None else str(value)


def stack_image_choice(spec: ClusterSpec):
    """(the image `pulumi up` of this stack will boot: image_reuse's Choice, or None with a bake off, why it could
    not be read or "")."""
    from node_setup.aws import clients as aws
    from node_setup.aws import errors
    from node_setup.aws.images import stack_choice

    if not spec.bake:
        return None, ""
    try:
        return stack_choice(aws.client("ec2", spec.region), spec), ""
    except (aws.AwsSetupError, *errors.AWS_ERRORS) as exc:
        return None, (errors.credentials_hint(exc) or errors.describe(exc, 160)).splitlines()[0]


def _kept_image(spec: ClusterSpec | None) -> tuple[str, str]:
    """(the kept image the stack's first `pulumi up` would boot, "" for a bake; why), for `fab plan`."""
    if spec is None:
        return "", "no stack: priced with a bake"
    choice, unread = stack_image_choice(spec)
    if unread:
        return "", f"kept images not read ({unread}): priced with a bake"
    if choice is None:
        return "", "bake: false (no image; `fab setup` installs): priced as a bake"
    return choice.source if choice.image else "", choice.why


def _local_machine(cluster: str, instance_type: str) -> tuple[str, int] | None:
    """This machine's (CPU model, physical cores) when `--cluster` names a local cluster and no --instance-type
    is given (the plan is for the local nodes), else None."""
    from node_setup.backends import backend_for, cluster_kind

    if not cluster or instance_type:
        return None
    return backend_for(cluster_kind(cluster)[0]).planned_machine()


def build_plan(options: PlanOptions, *, hourly_usd: float = 0.0, region: str = "", stack: str = "",
               calibration: calib.Calibration | None = None):
    """(rows, header, price source, notes, inputs) for `fab plan`'s options; ValueError/LookupError name the problem.

    The notes open with the line on what the master alone on demand adds (cluster/cost/costplan.py)."""
    if not (math.isfinite(hourly_usd) and hourly_usd >= 0):
        raise ValueError(f"--hourly-usd: {hourly_usd!r} is not allowed; give a price of 0 or more (0: look it up)")
    spec = _stack_spec(stack, required=False)
    kept, why = _kept_image(spec) if options.provisioning else ("", "")
    inputs = plan_options.plan_inputs(spec, options, calibration, stack_auto_stop_idle=_stack_auto_stop_idle(spec),
                                      kept_image=kept, kept_why=why)
    if options.local_machine:  # a local cluster's nodes: no price, as `fab status` says
        price = Price(0.0, "local", LOCAL_NO_PRICE)
        rows = [replace(r, on_demand_master_usd=0.0) for r in costplan.plan_rows(inputs, price)]
        return rows, inputs.header, costplan.price_source(price), [LOCAL_NO_PRICE, *inputs.notes], inputs
    price, where = _price(inputs, spec, hourly_usd, region)
    on_demand, unknown = _on_demand_price(inputs, price, where)
    rows, master_line = costplan.with_on_demand_master(costplan.plan_rows(inputs, price), price, on_demand,
                                                       master_spot=spec.master_spot if spec else True,
                                                       unknown=unknown)
    return rows, inputs.header, costplan.price_source(price), [master_line, *_spot_notes(
        inputs, spec, rows, price, on_demand, hourly_usd, region), *inputs.notes], inputs


def _spot_notes(inputs: plan_options.PlanInputs, spec: ClusterSpec | None, rows: list, price: Price,
                on_demand: Price | None, hourly_usd: float, region: str) -> list[str]:
    """The stack's answers to scarce spot: the price range over its instanceTypes (each priced as the table's
    type is) and what onDemandFallback would cost (the table's type on demand)."""
    if spec is None or hourly_usd or inputs.instance_type != spec.instance_type:
        return []  # a given price, or another type than the stack's: the stack's list does not apply
    notes = []
    if spec.instance_types:
        priced = {spec.instance_type: (price, rows)}
        for itype in spec.types[1:]:
            other, _ = _price(inputs, spec, hourly_usd, region, itype)
            priced[itype] = (other, costplan.plan_rows(inputs, other))
        notes.append(costplan.types_range_line(priced))
    if spec.on_demand_fallback_s is not None and price.market == "spot" and on_demand is not None:
        notes.append(costplan.fallback_line(rows, price, on_demand))
    return notes


@task(help={
    "nodes": "comma-separated node counts to compare, e.g. 1,2,4,8",
    "instance_type": f"instance type (default: the stack's, else {plan_options.DEFAULT_INSTANCE_TYPE})",
    "model": f"model name for its parameter count and default throughput (default: the calibration's, else "
             f"{plan_options.DEFAULT_MODEL})",
    "dataset": f"data set for its size and default throughput (default {plan_options.DEFAULT_DATASET}; "
               f"known: {', '.join(sorted(models.DATASETS))})",
    "epochs": "whole epochs to train (cost and run time scale with it)",
    "single_node_time": "measured time of one epoch on one node (26m, 1h30m, 45s); replaces the default throughput",
    "params": "parameter count for a model not in the list (66M, 1.3B)",
    "samples": "training samples (features) per epoch for a data set not in the list",
    "batch_size": "batch size per rank (default: the calibration's, else 32)",
    "profile": "software profile, stock or intel: the gradients DDP's buckets hold (stock fp32, intel bf16; what "
               "goes on the wire is --grad-comm's); default the stack's",
    "ranks_per_node": "training processes per node in multi-node runs (default: the type's sockets)",
    "flows_per_rank": "TCP flows per rank for the all-reduce (CCL workers under the intel profile)",
    "placement_group": "nodes share a cluster placement group (10 Gbps per flow instead of 5); on by default, "
                       "--no-placement-group plans without one (a note says when the stack's placementGroup differs)",
    "on_demand": "price on-demand instead of spot",
    "hourly_usd": "price per instance-hour to use instead of looking it up",
    "region": "region for prices (default: the stack's, else AWS_REGION)",
    "stack": "Pulumi stack to take defaults from (default: the only Pulumi.<stack>.yaml here, if any)",
    "json": "print one JSON object per node count (instance type, market, price source, and the seconds and "
            "dollars of provisioning, the run and the idle tail, with their total, and what the master alone "
            "on demand adds)",
    "auto_stop_idle": "idle time after the run before the auto-stop powers the nodes off, e.g. 30m, or off "
                      "(default: the stack's autoStopIdle, else 30m)",
    "provisioning": "count the first `pulumi up` (on by default; --no-provisioning when the cluster is up)",
    "plot": "also draw run time and cost against node count into this PNG file",
    "grad_comm": f"gradients on the wire: {' or '.join(GRAD_COMM_CHOICES)} (default {DEFAULT_GRAD_COMM}, as the "
                 "job's --grad_comm)",
    "ddp_bucket_mb": "DDP's gradient bucket size in MB (default DDP's 25; the job's --ddp_bucket_mb)",
    "calibration": "a calibration file `fab bench` wrote (default: the --cluster's, if it has one); it must have "
                   "measured the machine planned (the instance type; a local cluster: this CPU and core count)",
    "any_machine": "apply the calibration even though it measured another machine (a note says so)",
    "cluster": "use the calibration `fab bench` measured on this cluster (local, local:NAME or an AWS cluster name)",
    "peft": "lora: plan the job's --peft lora (only the adapters of the attention projections train, are "
            "all-reduced and checkpointed; the job's default rank, the model's shape from the catalog); default "
            "none (full fine-tuning)",
    "compile": "torch.compile: auto (compiled rows where the calibration's `fab bench --compile` figures say the "
               "saving over the run's steps exceeds the compile time), on or off; compile time goes in the start-up",
})
def plan(c, nodes="1,2,4,8", instance_type="", model="", dataset=plan_options.DEFAULT_DATASET,
         epochs=1, single_node_time=Unset(duration), params="", samples=Unset(int, "the data set's"),
         batch_size=Unset(int, "the calibration's, else 32"), profile="",
         ranks_per_node=Unset(int, "the type's sockets"), flows_per_rank=1, placement_group=True, on_demand=False,
         hourly_usd=Unset(float), region="", stack="", json=False, plot="", grad_comm="", ddp_bucket_mb=Unset(float),
         calibration="", cluster="", any_machine=False,
         auto_stop_idle=Unset(duration_or_off), provisioning=True, compile="auto",
         peft=""):  # noqa: A002
    """Predict epoch time, scaling efficiency and the whole cost (provisioning, run, idle tail) per node count."""
    idle = "" if not given(auto_stop_idle) else f"{auto_stop_idle:g}s" if auto_stop_idle else "off"
    local = _local_machine(cluster, instance_type)
    options = PlanOptions(nodes=nodes, instance_type=instance_type, model=model, dataset=dataset, epochs=epochs,
                          single_node_time=f"{single_node_time:g}s" if given(single_node_time) else "", params=params,
                          samples=samples or 0, batch=batch_size or None, profile=profile,
                          ranks_per_node=ranks_per_node or 0, flows_per_rank=flows_per_rank,
                          placement_group=placement_group, on_demand=on_demand, grad_comm=grad_comm,
                          bucket_mb=ddp_bucket_mb or 0.0, auto_stop_idle=idle,
                          provisioning=provisioning and local is None,  # a local cluster has no `pulumi up`
                          compile=str(compile).strip().lower(), peft=peft, any_machine=any_machine,
                          local_machine=local)
    try:
        cal, cal_note = load_calibration(calibration, cluster)
        rows, header, source, notes, inputs = build_plan(options, hourly_usd=hourly_usd or 0.0, region=region,
                                                         stack=stack, calibration=cal)
    except (ValueError, LookupError) as exc:
        raise fail(str(exc)) from None
    if cal_note:
        notes.append(cal_note)
    if json:
        print(plan_flops(options, inputs, cal).json(inputs, rows))  # costplan's rows with their predicted mfu
    else:
        print(costplan.render_table(rows, header=header, price_source=source, notes=notes))
        predicted = plan_flops(options, inputs, cal)
        print(predicted.line(inputs, rows))
        print(plan_options.render_sources(inputs))
        print(predicted.render_sources())
    if plot:
        from node_setup.plan_plot import plot_plan

        print(f"plot: {plot_plan(rows, plot, header)}", file=sys.stderr if json else sys.stdout)


def sweep_listing(region: str):
    """(listing, why it is incomplete or "", region, (ec2, s3, iam)) of `fab sweep`, the listing printed.

    Exit 2 (one line) when the region or the credentials are missing. Exit 1 is the caller's: a
    listing an API refused is incomplete, and may have missed leaked resources.
    """
    from node_setup.aws import clients as aws
    from node_setup.aws import sweep as sweeping

    try:
        region = aws.resolve_region(region or None)
        ec2, s3, iam = aws.client("ec2", region), aws.client("s3", region), aws.client("iam", region)
        listing = sweeping.collect(ec2, s3, region, iam, regional_ec2=lambda other: aws.client("ec2", other),
                                   autoscaling=aws.client("autoscaling", region))
    except aws.AwsSetupError as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # credentials: say what to do
        from node_setup.aws.errors import credentials_hint

        hint = credentials_hint(exc)
        if hint:
            raise fail(hint) from None
        raise
    print(listing.render())
    missed = sorted(listing.errors) + (["other regions' instances (IAM)"] if listing.elsewhere_error else [])
    incomplete = (f"sweep: the listing is incomplete (could not list: {', '.join(missed)}); "
                  "fix the permissions named above and rerun") if missed else ""
    return listing, incomplete, region, (ec2, s3, iam)


@task(help={
    "region": "region to sweep (default: the stack's, else AWS_REGION)",
    "delete": "remove the leaked resources (asks first)",
    "yes": "do not ask before deleting",
    "delete_buckets": "also delete the kept checkpoint buckets of clusters that are down, with their objects",
    "stack": "Pulumi stack to take the region from",
})
def sweep(c, region="", delete=False, yes=False, delete_buckets=False, stack=""):
    """List every resource with this toolkit's tags, by cluster; with --delete remove the leaked ones.

    IAM roles and instance profiles are global: one counts as leaked only when its cluster has no
    instance in any region. Exit code 1 when a kind of resource could not be listed (the permission
    is named), other regions could not be checked for IAM, or something could not be removed.
    """
    from node_setup.aws import clients as aws
    from node_setup.aws import sweep_delete

    if not region:
        spec = _stack_spec(stack, required=False)
        region = spec.region if spec else ""
    listing, incomplete, region, (ec2, s3, iam) = sweep_listing(region)
    todo = listing.leaked(include_buckets=delete_buckets)
    if not delete:
        if todo:
            print("run `fab sweep --delete` to remove the leaked resources")
        if incomplete:
            raise Exit(incomplete, code=FAILED)
        return
    if not todo:
        print("nothing leaked: nothing to remove" if listing.clusters_known else
              "nothing removed: without the instances no cluster can be told up or down")
        if incomplete:
            raise Exit(incomplete, code=FAILED)
        return
    if not yes:
        answer = input(f"delete {len(todo)} resource(s) listed as leaked"
                       f"{' and kept' if delete_buckets else ''} in {region}? type 'yes': ")
        if answer.strip().lower() != "yes":
            raise Exit("sweep: nothing deleted", code=FAILED)
    outcomes = sweep_delete.delete(listing, ec2, s3, iam, include_buckets=delete_buckets,
                                   autoscaling=aws.client("autoscaling", region))
    print(sweep_delete.render_outcomes(outcomes))
    if incomplete:
        raise Exit(incomplete, code=FAILED)
    if any(o.startswith(("FAILED", "skipped")) for _, o in outcomes):
        raise Exit(code=FAILED)


TASKS = [preflight, plan, sweep]
