"""The local cluster: N nodes on this Linux machine, each a network namespace with its own sshd.

`state` names everything and records it (pure but for the state file), `system` runs the `ip`,
`unshare` and process commands on recorded names and PIDs, `cluster` brings a cluster up and down
(and a node down and back, for the spot rehearsal), `imds_server` is each node's metadata service
(a standard-library script run inside the node's namespace).
May import `cluster/`, node_setup.controller (the config directory the state lives under) and
training.imds (the metadata address the job asks, standard library only); never boto3, never
node_setup.ssh, never the `fab` tasks.
"""
