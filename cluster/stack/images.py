"""The base image nodes boot from when baseAmi is not set: Canonical's Ubuntu 24.04 LTS amd64.

Two layers look it up and must agree on the choice: the Pulumi program (infra/lookups.py, through
`aws.ec2.get_ami_ids`) picks the image it launches, and `fab preflight` (node_setup/aws/preflight.py,
through boto3's `describe_images`) dry-runs a launch from the same image. Both take the owner and
the filters from here (tests/infra/test_lifecycle.py checks what the program's lookup sends); the
newest match wins in both.
"""

# Canonical's AWS account, the owner of the official Ubuntu images in every commercial region.
CANONICAL_OWNER = "099720109477"
# Ubuntu 24.04 LTS (noble) amd64 server images; gp3 root volumes since 23.10.
UBUNTU_2404_AMD64 = "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*"

# DescribeImages filters (name, value) for the base image, besides the owner: the name pattern, an
# x86_64 HVM image with an EBS root volume (what every catalog type boots).
BASE_IMAGE_FILTERS: tuple[tuple[str, str], ...] = (
    ("name", UBUNTU_2404_AMD64),
    ("architecture", "x86_64"),
    ("virtualization-type", "hvm"),
    ("root-device-type", "ebs"),
)
