"""Work on nodes over SSH: connections with pinned host keys (`connections`, `keys`), one parallel
fan-out over nodes (`fanout`), installing and checking the software profile (`install`, with the
project wheel and the wheelhouse in `wheels`), node-to-node SSH for MPI (`distribute`) and the
training job's life on the master (`job`). May import `cluster/`, Fabric, invoke and paramiko;
never boto3 (AWS work lives in node_setup/aws).
"""
