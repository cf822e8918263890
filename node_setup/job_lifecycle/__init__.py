"""One job lifecycle for every path that starts a job: `fab train` (the built-in job, your own program,
--managed, --managed --resume) on the controller and the run supervisor on the master.

- `transport`: what the lifecycle needs of the place it runs from (`Transport`): run a command on nodes,
  put a file on one; and what each place does its own way: trust the nodes (the host keys the master's
  ssh uses), copy the workdir, install requirements, follow the log. node_setup/ssh/transport.py is
  Fabric's on the controller; node_setup/supervisor/onmaster.py's is plain ssh and bash on the master.
- `steps`: `Lifecycle`: prepare (the job's directory, the busy-node check, the version warning, the
  offline demo), upload (data files, the workdir, requirements), hosts (ssh config, known_hosts and
  hostfile on the master), start (and the idle auto-stop armed), outcome (cluster/job/jobreport.py's one
  rule), stop.

May import `cluster/` only: never Fabric, paramiko, invoke or boto3 (the supervisor runs it in the node
venv, which has none of them).
"""
