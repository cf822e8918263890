"""The checkpoint bucket: private, encrypted, TLS-only, versioned, and kept on `pulumi destroy`.

- Private: all four public-access blocks, and bucket-owner-enforced ownership (no ACLs).
- Encrypted at rest with S3-managed keys (SSE-S3, AES256). An S3 Bucket Key only applies to
  SSE-KMS, so none is set.
- TLS only: the bucket policy denies every request made without TLS (`aws:SecureTransport`
  false), whoever makes it. The nodes' role (infra/node_role.py) is granted access by its own
  policy; this one only denies.
- Versioned: an overwritten or deleted checkpoint file stays as a noncurrent version for
  NONCURRENT_VERSION_DAYS days, so a bad save or a mistaken prune can be undone
  (`aws s3api list-object-versions`, then copy the version back). Resume reads current versions
  only, so the nodes need no `s3:GetObjectVersion`.
- Lifecycle: noncurrent versions expire after NONCURRENT_VERSION_DAYS days, delete markers left
  with no versions behind them are removed, and multipart uploads that never completed (an upload
  interrupted by a spot reclaim) are aborted after ABORT_MULTIPART_DAYS days: they are billed
  while they last and are invisible to a plain listing.

Keeping the bucket uses `retain_on_delete`, not `protect`: `protect` would make `pulumi destroy`
fail until the user unprotects the bucket, while `retain_on_delete` lets destroy finish and only
drops the bucket from the stack's state (AWS keeps it, with its checkpoints). Every setting above
is retained with it, so a kept bucket stays private, TLS-only and cleaned up by its lifecycle.
With `destroyBucket: true` the bucket is created with `force_destroy` and deleted, objects and
all their versions. The bucket name is generated (logical name plus a random suffix), so a stack
brought up again after a destroy makes a fresh bucket instead of colliding with the kept one.
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from cluster.stack.spec import ClusterSpec

NONCURRENT_VERSION_DAYS = 30
ABORT_MULTIPART_DAYS = 7


def tls_only_policy(bucket_arn: str) -> str:
    """Deny any request to the bucket or its objects that does not use TLS."""
    return json.dumps({
        "Version": "2012-10-17",
        "Statement": [{
            "Sid": "DenyWithoutTLS",
            "Effect": "Deny",
            "Principal": "*",
            "Action": "s3:*",
            "Resource": [bucket_arn, f"{bucket_arn}/*"],
            "Condition": {"Bool": {"aws:SecureTransport": "false"}},
        }],
    })


class CheckpointBucket(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, tags: dict[str, str],
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:CheckpointBucket", name, None, opts)
        keep = not spec.destroy_bucket
        child = pulumi.ResourceOptions(parent=self, retain_on_delete=keep)

        self.bucket = aws.s3.Bucket(
            name, force_destroy=spec.destroy_bucket, tags={**tags, "Name": name}, opts=child)

        def setting(resource, suffix: str, after: list[pulumi.Resource] | None = None, **args):
            """One setting of the bucket: waits for it through its id and is kept (or not) with it."""
            return resource(f"{name}-{suffix}", bucket=self.bucket.id, **args,
                            opts=pulumi.ResourceOptions.merge(child, pulumi.ResourceOptions(depends_on=after)))

        self.public_access_block = setting(
            aws.s3.BucketPublicAccessBlock, "private",
            block_public_acls=True, block_public_policy=True, ignore_public_acls=True, restrict_public_buckets=True)
        self.ownership = setting(
            aws.s3.BucketOwnershipControls, "ownership",
            rule=aws.s3.BucketOwnershipControlsRuleArgs(object_ownership="BucketOwnerEnforced"))
        self.encryption = setting(
            aws.s3.BucketServerSideEncryptionConfiguration, "encryption",
            rules=[aws.s3.BucketServerSideEncryptionConfigurationRuleArgs(
                apply_server_side_encryption_by_default=aws.s3.
                BucketServerSideEncryptionConfigurationRuleApplyServerSideEncryptionByDefaultArgs(
                    sse_algorithm="AES256"),
            )])
        # After the public access block: S3 refuses concurrent changes to one bucket's settings.
        self.policy = setting(aws.s3.BucketPolicy, "tls-only", after=[self.public_access_block],
                              policy=self.bucket.arn.apply(tls_only_policy))
        self.versioning = setting(
            aws.s3.BucketVersioning, "versioning",
            versioning_configuration=aws.s3.BucketVersioningVersioningConfigurationArgs(status="Enabled"))
        # Noncurrent-version rules act once versioning is on (the provider's documented ordering).
        self.lifecycle = setting(
            aws.s3.BucketLifecycleConfiguration, "lifecycle", after=[self.versioning],
            rules=[aws.s3.BucketLifecycleConfigurationRuleArgs(
                id="checkpoint-housekeeping",
                status="Enabled",
                # Every object: an empty prefix. An empty filter block (or none) is documented as "every
                # object" too, but the provider warns that one of prefix, tag, size or and is required
                # (hashicorp/terraform-provider-aws#42515) and says it will become an error.
                filter=aws.s3.BucketLifecycleConfigurationRuleFilterArgs(prefix=""),
                noncurrent_version_expiration=aws.s3.BucketLifecycleConfigurationRuleNoncurrentVersionExpirationArgs(
                    noncurrent_days=NONCURRENT_VERSION_DAYS),
                expiration=aws.s3.BucketLifecycleConfigurationRuleExpirationArgs(expired_object_delete_marker=True),
                abort_incomplete_multipart_upload=aws.s3.
                BucketLifecycleConfigurationRuleAbortIncompleteMultipartUploadArgs(
                    days_after_initiation=ABORT_MULTIPART_DAYS),
            )])
        self.register_outputs({"bucketName": self.bucket.bucket})
