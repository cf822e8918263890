"""The base image nodes boot from when baseAmi is not set: Canonical's Ubuntu 24.04 LTS amd64.

Two layers look it up and must agree on the choice: the Pulumi program (infra/lookups.py, through
`aws.ec2.get_ami_ids`) picks the image it launches, and `fab preflight` (node_setup/aws/preflight.py,
through boto3's `describe_images`) dry-runs a launch from the same image. Both take the owner and
the name pattern from here; the newest match wins in both.
"""

# Canonical's AWS account, the owner of the official Ubuntu images in every commercial region.
CANONICAL_OWNER = "099720109477"
# Ubuntu 24.04 LTS (noble) amd64 server images; gp3 root volumes since 23.10.
UBUNTU_2404_AMD64 = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"
