"""boto3 work on the AWS account: one place for clients (`clients`) and for reading AWS errors
(`errors`), then discovery of a running cluster by its tags, preflight checks before `pulumi up`
and `fab train`, prices, and the sweep for leftovers. May import `cluster/`, `node_setup/discovery.py` (the cluster
selection's names and errors) and botocore/boto3; never Fabric or paramiko (nothing here opens an SSH session).
"""
