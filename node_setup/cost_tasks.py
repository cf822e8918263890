"""fab preflight | plan | sweep: know before you pay, leave nothing behind (issue 5)."""

from __future__ import annotations

import sys

from invoke import task
from invoke.exceptions import Exit

from cluster import catalog, costplan, models
from cluster import timemodel as tm
from cluster.spec import ConfigError
from node_setup import aws, pricing
from node_setup.stack_config import StackConfigError, load_stack_spec

DEFAULT_INSTANCE_TYPE = "r7iz.metal-16xl"
DEFAULT_MODEL = "distilbert-base-uncased"
DEFAULT_DATASET = "squad"


def _spec_or_exit(stack):
    try:
        return load_stack_spec(stack or None)
    except (StackConfigError, ConfigError) as exc:
        raise Exit(f"preflight: {exc}", code=2) from None


@task(auto_shortflags=False, help={
    "stack": "Pulumi stack whose Pulumi.<stack>.yaml to check (default: the only one besides the example)",
    "ip_check": "compare adminCidrs with this machine's public address (asks checkip.amazonaws.com)",
})
def preflight(c, stack="", ip_check=True):
    """Check credentials, region, instance offerings, vCPU quotas, a DryRun launch and adminCidrs.

    Exit code 0 when the launch should succeed, 1 when it would fail, 2 when the stack config is bad.
    """
    from node_setup.preflight import lookup_public_ip, run_preflight

    spec = _spec_or_exit(stack)
    report = run_preflight(spec, public_ip=lookup_public_ip if ip_check else None)
    print(report.render())
    if report.exit_code:
        raise Exit(code=report.exit_code)


def _stack_defaults(stack):
    """(spec or None, note): plan works without a stack file, from its own defaults."""
    try:
        return load_stack_spec(stack or None), ""
    except (StackConfigError, ConfigError) as exc:
        if stack:
            raise Exit(f"plan: {exc}", code=2) from None
        return None, ""


@task(auto_shortflags=False, help={
    "nodes": "comma-separated node counts to compare, e.g. 1,2,4,8",
    "instance_type": f"instance type (default: the stack's, else {DEFAULT_INSTANCE_TYPE})",
    "model": f"model name for its parameter count and default throughput (default {DEFAULT_MODEL})",
    "dataset": f"data set for its size and default throughput (default {DEFAULT_DATASET}; "
               f"known: {', '.join(sorted(models.DATASETS))})",
    "epochs": "epochs to train (cost and run time scale with it)",
    "single_node_time": "measured time of one epoch on one node (26m, 1h30m, 45s); replaces the default throughput",
    "params": "parameter count for a model not in the list (66M, 1.3B)",
    "samples": "training samples (features) per epoch for a data set not in the list",
    "batch": "batch size per rank",
    "profile": "software profile (intel: bf16 gradients, 2 bytes; stock: fp32 gradients, 4 bytes); default the stack's",
    "ranks_per_node": "training processes per node in multi-node runs (default: the type's sockets)",
    "flows_per_rank": "TCP flows per rank for the all-reduce (CCL workers under the intel profile)",
    "placement_group": "nodes share a cluster placement group (10 Gbps per flow instead of 5); on by default, "
                       "--no-placement-group plans without one (a note says when the stack's placementGroup differs)",
    "on_demand": "price on-demand instead of spot",
    "hourly_usd": "price per instance-hour to use instead of looking it up",
    "region": "region for prices (default: the stack's, else AWS_REGION)",
    "stack": "Pulumi stack to take defaults from",
    "json": "print one JSON object per node count (nodes, epoch_seconds, efficiency, hourly_usd, total_usd)",
    "plot": "also draw run time and cost against node count into this PNG file",
})
def plan(c, nodes="1,2,4,8", instance_type="", model=DEFAULT_MODEL, dataset=DEFAULT_DATASET, epochs=1.0,
         single_node_time="", params="", samples=0, batch=32, profile="", ranks_per_node=0, flows_per_rank=1,
         placement_group=True, on_demand=False, hourly_usd=0.0, region="", stack="", json=False, plot=""):
    """Predict epoch time, scaling efficiency and cost for several node counts."""
    try:
        rows, header, source, notes = build_plan(
            nodes=nodes, instance_type=instance_type, model=model, dataset=dataset, epochs=float(epochs),
            single_node_time=single_node_time, params=params, samples=int(samples), batch=int(batch),
            profile=profile, ranks_per_node=int(ranks_per_node), flows_per_rank=int(flows_per_rank),
            placement_group=bool(placement_group), on_demand=on_demand, hourly_usd=float(hourly_usd),
            region=region, stack=stack)
    except (ValueError, LookupError) as exc:
        raise Exit(f"plan: {exc}", code=2) from None
    if json:
        print(costplan.render_json(rows))
    else:
        print(costplan.render_table(rows, header=header, price_source=source, notes=notes))
    if plot:
        from node_setup.plan_plot import plot_plan

        print(f"plot: {plot_plan(rows, plot, header)}", file=sys.stderr if json else sys.stdout)


def build_plan(*, nodes, instance_type, model, dataset, epochs, single_node_time, params, samples, batch,
               profile, ranks_per_node, flows_per_rank, placement_group, on_demand, hourly_usd, region, stack):
    spec, _ = _stack_defaults(stack)
    itype = instance_type or (spec.instance_type if spec else DEFAULT_INSTANCE_TYPE)
    instance = (spec.instance if spec and spec.instance_type == itype else catalog.lookup(itype))
    if instance is None:
        raise ValueError(f"--instance-type: {itype!r} is not in the catalog ({', '.join(catalog.known_types())})")
    profile = profile or (spec.software_profile if spec else "stock")
    grad_bytes = tm.GRADIENT_BYTES["bf16" if profile == "intel" else "fp32"]
    model_name = models.lookup_model(model).name if not params else model
    n_params = models.parse_count(params, "--params") if params else models.lookup_model(model).params
    data_name = dataset
    if samples:
        n_samples = samples
    else:
        data = models.lookup_dataset(dataset)
        data_name, n_samples = data.name, data.train_features
    work = tm.Workload(params=n_params, samples=n_samples, batch_per_rank=batch, gradient_bytes=grad_bytes,
                       epochs=epochs)
    if single_node_time:
        seconds = tm.parse_duration(single_node_time)
        rate = tm.throughput_from_single_node_time(seconds, n_samples)
        rate_source = f"single-node time {tm.format_duration(seconds)} (given)"
    else:
        default = tm.default_throughput(itype, model_name, data_name)
        rate, rate_source = default.samples_per_s, default.source
    if not isinstance(placement_group, bool):
        raise ValueError(f"--placement-group: {placement_group!r} is not allowed; give --placement-group "
                         "or --no-placement-group")
    in_pg = placement_group
    net = tm.Network(instance.network_gbps, placement_group=in_pg, flows_per_rank=flows_per_rank)
    ranks = ranks_per_node or instance.sockets
    notes = [f"throughput: {rate:.1f} samples/s per node, {rate_source}"]
    if spec and spec.placement_group != in_pg:
        notes.append(f"the stack sets placementGroup {str(spec.placement_group).lower()} but this plan is "
                     f"{'with' if in_pg else 'without'} a placement group; "
                     f"{'drop --no-placement-group' if spec.placement_group else 'add --no-placement-group'} "
                     "to plan the stack's cluster")
    spot = not on_demand and (spec.worker_spot if spec else True)
    if hourly_usd:
        price = pricing.Price(hourly_usd, "spot" if spot else "on-demand", "given with --hourly-usd")
    else:
        where = region or (spec.region if spec else "")
        try:
            where = aws.resolve_region(where or None)
        except aws.AwsSetupError:
            where = "us-east-1"
            notes.append("no region set: prices for us-east-1")
        skipped: list[str] = []
        price = pricing.hourly_price(itype, where, spot=spot, notes=skipped)
        notes.extend(f"price note: {n}" for n in skipped)
    rows = costplan.plan(work, net, costplan.parse_node_counts(nodes), rate, price.usd_per_hour, ranks_per_node=ranks)
    header = (f"{itype}, {model_name} ({n_params / 1e6:.0f}M params, {grad_bytes}-byte gradients, profile {profile}), "
              f"{data_name} ({n_samples} samples) x {epochs:g} epoch(s), batch {batch}/rank, {ranks} ranks/node, "
              f"{'in' if in_pg else 'no'} placement group")
    source = f"{price.market} ${price.usd_per_hour:.4f}/instance-hour, {price.source}"
    return rows, header, source, notes


@task(auto_shortflags=False, help={
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
    from node_setup import sweep as sweeping

    if not region:
        spec, _ = _stack_defaults(stack)
        region = spec.region if spec else ""
    try:
        region = aws.resolve_region(region or None)
        ec2, s3, iam = aws.client("ec2", region), aws.client("s3", region), aws.client("iam", region)
        listing = sweeping.collect(ec2, s3, region, iam, regional_ec2=lambda other: aws.client("ec2", other))
    except aws.AwsSetupError as exc:
        raise Exit(f"sweep: {exc}", code=2) from None
    except Exception as exc:  # credentials: say what to do
        hint = aws.explain_credentials_error(exc)
        if hint:
            raise Exit(f"sweep: {hint}", code=2) from None
        raise
    print(listing.render())
    # Exit 1 at the end when a listing was refused: the sweep may have missed leaked resources.
    missed = sorted(listing.errors) + (["other regions' instances (IAM)"] if listing.elsewhere_error else [])
    incomplete = (f"sweep: the listing is incomplete (could not list: {', '.join(missed)}); "
                  "fix the permissions named above and rerun") if missed else ""
    todo = listing.leaked(include_buckets=delete_buckets)
    if not delete:
        if todo:
            print("run `fab sweep --delete` to remove the leaked resources")
        if incomplete:
            raise Exit(incomplete, code=1)
        return
    if not todo:
        print("nothing leaked: nothing to remove" if listing.clusters_known else
              "nothing removed: without the instances no cluster can be told up or down")
        if incomplete:
            raise Exit(incomplete, code=1)
        return
    if not yes:
        answer = input(f"delete {len(todo)} resource(s) listed as leaked"
                       f"{' and kept' if delete_buckets else ''} in {region}? type 'yes': ")
        if answer.strip().lower() != "yes":
            raise Exit("sweep: nothing deleted", code=1)
    outcomes = sweeping.delete(listing, ec2, s3, iam, include_buckets=delete_buckets)
    print(sweeping.render_outcomes(outcomes))
    if incomplete:
        raise Exit(incomplete, code=1)
    if any(o.startswith(("FAILED", "skipped")) for _, o in outcomes):
        raise Exit(code=1)


TASKS = [preflight, plan, sweep]
