"""`fab clusters`: every cluster this checkout knows (cluster/cost/clusterlist.py): the local clusters' state
files and the AWS stacks' files beside the project, EC2 asked only with --aws."""

from __future__ import annotations

from cluster.cost import clusterlist
from cluster.cost.clusterlist import AWS, LOCAL, ClusterRow
from node_setup.tasks.common import REGION_HELP, task


def local_rows() -> list[ClusterRow]:
    """One row per local cluster with a state file: its nodes up now, whose it is."""
    from node_setup.local import cluster as local_cluster
    from node_setup.local import state as local_state

    names_now = local_cluster.system.namespaces()
    rows = []
    for name in local_state.list_clusters():
        shown = LOCAL if name == local_state.DEFAULT_NAME else f"{LOCAL}:{name}"
        try:
            state = local_state.load_state(local_state.paths_for(name))
        except local_state.LocalClusterError as exc:
            rows.append(ClusterRow(shown, LOCAL, "unreadable", None, note=str(exc)))
            continue
        if state is None:
            continue
        up = sum(local_cluster.node_up(node, names_now) for node in state.nodes)
        rows.append(ClusterRow(shown, LOCAL, clusterlist.local_state(up, len(state.nodes)), len(state.nodes), 0.0,
                               "; ".join(filter(None, ["a local cluster has no price",
                                                       local_state.owner_note(state)]))))
    return rows


def aws_rows(*, query: bool, region: str = "", root=None) -> list[ClusterRow]:
    """One row per stack file beside the project (or in `root`); with `query`, what EC2 runs of it and its spend
    so far."""
    from node_setup.controller import PROJECT_ROOT
    from node_setup.stack_config import load_stack_spec, stack_files

    root = root or PROJECT_ROOT
    rows = []
    for stack, path in stack_files(root).items():
        try:
            spec = load_stack_spec(stack, root)
        except Exception as exc:  # noqa: BLE001 - a stack file fab cannot read: its row says why
            rows.append(ClusterRow(f"(stack {stack})", AWS, "unreadable", None, note=f"{path.name}: {exc}"))
            continue
        note = f"stack {stack} ({path.name}), {spec.region}"
        if not query:
            rows.append(ClusterRow(spec.cluster_name, AWS, clusterlist.NOT_QUERIED, spec.node_count, None, note))
            continue
        rows.append(_queried(spec, region or spec.region, note))
    return rows


def _queried(spec, region: str, note: str) -> ClusterRow:
    from node_setup.backends import backend_for
    from node_setup.tasks.spend import cluster_spend

    try:
        inventory = backend_for(AWS).discover(spec.cluster_name, region)
    except Exception as exc:  # noqa: BLE001 - none running, no credentials: the row says so
        return ClusterRow(spec.cluster_name, AWS, "none running", spec.node_count, None, f"{note}; {exc}")
    spent = cluster_spend(inventory)
    state = clusterlist.local_state(len(inventory.nodes), len(inventory.nodes) + len(inventory.down))
    return ClusterRow(spec.cluster_name, AWS, state, len(inventory.nodes) + len(inventory.down), spent.spent_usd,
                      note)


@task(help={"aws": "also ask EC2 what runs of each AWS stack and its spend so far (needs AWS credentials)",
            "region": REGION_HELP})
def clusters(c, aws=False, region=""):
    """List every cluster this checkout knows: the local ones and the AWS stacks, with state, nodes and spend."""
    print(clusterlist.table(local_rows() + aws_rows(query=aws, region=region)))


TASKS = [clusters]
