"""Work on nodes over SSH: connections with pinned host keys (`connections`, `keys`), one parallel
fan-out over nodes (`fanout`), installing and checking the software profile (`install`, with the
project wheel and the wheelhouse in `wheels`), node-to-node SSH for MPI (`distribute`), the
training job's life on the master (`job`), a user program's workdir and requirements (`workdir`,
`requirements`), idle auto-stop (`autostop`) and `fab train --managed`'s node work (`recovery`).

May import `cluster/`, Fabric, invoke and paramiko; node_setup.controller (the project checkout
and the config directory); node_setup.backends (what differs by the cluster's kind: a new node's
console, the idle auto-stop's default and group, the wheelhouse); and node_setup.local.state, whose
state file holds the host keys a local cluster generated, which `connections` pins before
connecting. Never boto3 (AWS work lives in node_setup/aws).
"""
