"""The checkpoint bucket: private, encrypted, and kept on `pulumi destroy` unless asked otherwise.

Keeping it uses `retain_on_delete`, not `protect`: `protect` would make `pulumi destroy` fail
until the user unprotects the bucket, while `retain_on_delete` lets destroy finish and only drops
the bucket from the stack's state (AWS keeps it, with its checkpoints). The public access block,
encryption and ownership settings are retained with it, so a kept bucket stays private.
With `destroyBucket: true` the bucket is created with `force_destroy` and deleted, objects and all.
The bucket name is generated (logical name plus a random suffix), so a stack brought up again
after a destroy makes a fresh bucket instead of colliding with the kept one.
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from cluster.spec import ClusterSpec


class CheckpointBucket(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:CheckpointBucket", name, None, opts)
        keep = not spec.destroy_bucket
        child = pulumi.ResourceOptions(parent=self, retain_on_delete=keep)

        self.bucket = aws.s3.Bucket(
            name, force_destroy=spec.destroy_bucket, tags={**tags, "Name": name}, opts=child)
        # Children wait for the bucket through its id; with a kept bucket they are kept too.
        self.public_access_block = aws.s3.BucketPublicAccessBlock(
            f"{name}-private",
            bucket=self.bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=child)
        self.ownership = aws.s3.BucketOwnershipControls(
            f"{name}-ownership",
            bucket=self.bucket.id,
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"),
            opts=child)
        self.encryption = aws.s3.BucketServerSideEncryptionConfiguration(
            f"{name}-encryption",
            bucket=self.bucket.id,
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.
                BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="AES256"),
                bucket_key_enabled=True,
            )],
            opts=child)
        self.register_outputs({"bucketName": self.bucket.bucket})
