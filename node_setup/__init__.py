"""The edges that act on machines and accounts: the `fab` tasks and the work behind them.

    tasks/      the `fab` task modules (thin: parse options, call the rooms below, print, exit)
    aws/        boto3 work on the account: clients, errors, discovery, preflight, prices, sweep
    ssh/        work on nodes over SSH: connections and host keys, install, distribute, jobs
    local/      the no-AWS cluster of network-namespace nodes on this machine (root)
    controller.py     this controller's own places: the project checkout, its version, the config directory
    discovery.py      which nodes `--cluster` names (AWS tags, the local cluster, an inventory file)
    kubeflow.py       the PyTorchJob and TrainJob manifests, built from the Kubeflow projects' typed models
    stack_config.py   a Pulumi stack's settings read without the Pulumi CLI
    stack_edit.py     one setting written into a Pulumi stack file, keeping its other lines
    plan_plot.py      the `fab plan --plot` drawing

Decisions come from `cluster/` (pure); this package carries them out. Nothing here imports
pulumi, torch or transformers; `training` is imported only for pure constants (the metadata address in
training/imds.py for the local cluster).
What each room may import is docs/design.md's layer table (tests/unit/test_layers.py checks it).
"""
