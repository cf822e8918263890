"""The run supervisor: `fab train --managed`'s run, watched and recovered from the master itself.

Runs on the master in the node venv (`python -m node_setup.supervisor run <run dir>`), started by
`fab train --managed` as a service: a transient systemd unit on AWS, a process inside the node's
namespace on a local cluster. It needs neither Fabric nor paramiko (the node venv has neither): it
reaches the workers with the `ssh` the cluster key's distribution set up on the master.

- `loop`: the order of things (watch, lose, await, verify, admit, resume), every decision
  cluster/run/supervision.py's and cluster/run/recovery.py's; tested in-process against a fake backend.
- what differs per kind of cluster is the cluster's backend's (node_setup/backends/, picked by
  `backend_for`): the group of machines now, an instance's state, its console (local: the group
  keeper's record and console files; AWS: the Auto Scaling group, EC2 and GetConsoleOutput through
  the node role; an inventory file: nothing comes back).
- `onmaster`: the work on the master and, over ssh, on the workers: probes, host keys, the job's
  launch and end, the run's files.

May import `cluster/` and `node_setup/backends/`; boto3 only inside the AWS backend's methods; never Fabric,
invoke or paramiko.
"""
