"""The image every node boots, built apart by EC2 Image Builder (cluster/stack/image_build.py says what it runs).

No node that runs jobs is ever imaged: Image Builder launches its own small build instance (BUILDER_INSTANCE_TYPE)
from the base image, in the stack's region and subnet, with a security group of its own (outbound only: nothing
reaches it) and a role of its own (Image Builder's and SSM's managed policies, read the install script and write
the build's logs in the stack's bucket, nothing else). The one component downloads the profile's install script
(the one `fab setup` runs, without this project's wheel) from the bucket and runs it; Image Builder snapshots the
instance, terminates it, and distributes the image with its bake identity as tags (cluster/stack/image_reuse.py:
profile and bake tag, region, base, architecture; `keep` with keepImage). The build volume is the profile's
smallest root volume: a node's launch grows it to rootVolumeGib.

Name and lifecycle:
- Component, recipe and distribution are named after the cluster, the profile and its bake tag (a hash of the
  profile's fingerprint): a software change makes new ones and a new image (the image's replacement trigger is the
  bake tag), built before the old one goes; the master and the workers move to it as the workers always did (their
  image changed), and the old image is released only after, at the end of the `pulumi up`.
- The base: the kept base image (infra/placement.py: the first lookup's, or `baseAmi`), so a newer Ubuntu image
  builds nothing.
- A failed build ends `pulumi up` with one line: Image Builder's reason and where its logs are (an error hook).
- The image belongs to no stack. Deleting an Image Builder image leaves its AMI (the provider deregisters
  nothing); this stack's `ImageRelease` record does: at `pulumi destroy` (or when a new image replaced it) its
  delete reads the AMI's tags as they are then and deregisters it and its snapshots only when this stack does not
  keep it (keepImage) and no other stack records its use (image_build.release; node_setup/aws/images.py). Every
  stack records its use of the image it boots, its own or a kept one, with one tag (USED_BY_PREFIX + its
  cluster), which its destroy removes; nothing else tags or untags an image after its build.
"""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_aws as aws
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider

from cluster.node.setup_script import InstallPlan, install_script
from cluster.stack import image_build, image_reuse
from cluster.stack.node_replacement import bake_tag
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import KEEP_KEY, USED_BY_PREFIX
from infra.node_role import assume_role_policy

ROOT_DEVICE = "/dev/sda1"  # Canonical's Ubuntu images boot from it
BUILD_VOLUME_TYPE = "gp3"  # the build volume's (a node's launch sets rootVolumeType: no setting rebuilds the image)
BUILDER_SUFFIX = "-builder"  # the build instance's role, profile and security group: the image's name and this
BUILDER_POLICIES = ("EC2InstanceProfileForImageBuilder", "AmazonSSMManagedInstanceCore")


def builder_bucket_policy(bucket_arn: str) -> str:
    """The build instance's own access to the stack's bucket: read the install scripts, write the build logs."""
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"{bucket_arn}/{image_build.INSTALL_PREFIX}/*"},
        {"Effect": "Allow", "Action": "s3:PutObject", "Resource": f"{bucket_arn}/{image_build.LOG_PREFIX}/*"}]})


def build_failure_hook(name: str, logs: pulumi.Input[str]) -> pulumi.ErrorHook:
    """A failed build in one line (image_build.failure_line); nothing is retried."""
    seen: list[str] = [logs] if isinstance(logs, str) else []
    if not seen:
        pulumi.Output.from_input(logs).apply(seen.append)  # known long before the build can fail

    async def on_error(args: pulumi.ErrorHookArgs) -> bool:
        if args.failed_operation == "create" and args.errors:
            pulumi.log.error(image_build.failure_line(args.name, args.errors[0], seen[0] if seen else "the bucket"))
        return False

    return pulumi.ErrorHook(f"{name}-build-reason", on_error)


def _first_ami(resources: Any) -> str:
    """The AMI id in the Image's `output_resources` (objects from the provider, mappings from its doubles)."""
    def field(item, key):
        return item.get(key) if isinstance(item, dict) else getattr(item, key, None)

    return field(field(resources[0], "amis")[0], "image")


class BuiltImage(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, *, base_ami: pulumi.Input[str], vpc_id: str,
                 subnet_id: pulumi.Input[str], bucket: aws.s3.Bucket, tags: dict[str, str],
                 hooks: bool = True, opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:BuiltImage", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tag = bake_tag(spec.profile.fingerprint())
        label = f"{spec.cluster_name}-{spec.software_profile}-{tag}"
        script = aws.s3.BucketObjectv2(
            f"{name}-install", bucket=bucket.id, key=image_build.install_key(spec.software_profile, tag),
            content=install_script(InstallPlan(spec.profile)), content_type="text/x-shellscript", tags=tags,
            opts=child)
        uri = pulumi.Output.concat("s3://", bucket.bucket, "/", script.key)

        role = aws.iam.Role(f"{name}{BUILDER_SUFFIX}", assume_role_policy=assume_role_policy(),
                            description=f"xeon-cluster {spec.cluster_name}: its image's build instance", tags=tags,
                            opts=child)
        attached = [aws.iam.RolePolicyAttachment(f"{name}{BUILDER_SUFFIX}-{policy.lower()}", role=role.name,
                                                 policy_arn=f"arn:aws:iam::aws:policy/{policy}", opts=child)
                    for policy in BUILDER_POLICIES]
        access = aws.iam.RolePolicy(f"{name}{BUILDER_SUFFIX}-bucket", role=role.id,
                                    policy=bucket.arn.apply(builder_bucket_policy), opts=child)
        profile = aws.iam.InstanceProfile(f"{name}{BUILDER_SUFFIX}", role=role.name, tags=tags,
                                          opts=pulumi.ResourceOptions(parent=self, depends_on=[*attached, access]))
        # Outbound only (apt, PyPI, SSM, S3): nothing reaches the build instance, and it is in no cluster group.
        self.builder_group = aws.ec2.SecurityGroup(
            f"{name}{BUILDER_SUFFIX}", vpc_id=vpc_id, description="the image's build instance: outbound only",
            tags={**tags, "Name": f"{name}{BUILDER_SUFFIX}"}, opts=child)
        egress = aws.vpc.SecurityGroupEgressRule(
            f"{name}{BUILDER_SUFFIX}-out", security_group_id=self.builder_group.id, ip_protocol="-1",
            cidr_ipv4="0.0.0.0/0", tags=tags, opts=child)

        component = aws.imagebuilder.Component(
            name, name=label, platform="Linux", version=image_build.VERSION,
            description=f"xeon-cluster: profile {spec.software_profile}'s install",
            data=uri.apply(image_build.component_document), tags=tags, opts=child)
        recipe = aws.imagebuilder.ImageRecipe(
            name, name=label, version=image_build.VERSION, parent_image=base_ami,
            components=[aws.imagebuilder.ImageRecipeComponentArgs(component_arn=component.arn)],
            block_device_mappings=[aws.imagebuilder.ImageRecipeBlockDeviceMappingArgs(
                device_name=ROOT_DEVICE, ebs=aws.imagebuilder.ImageRecipeBlockDeviceMappingEbsArgs(
                    encrypted="true", volume_size=spec.profile.min_root_volume_gib,
                    volume_type=BUILD_VOLUME_TYPE, delete_on_termination="true"))],
            tags=tags, opts=child)
        self.logs = pulumi.Output.concat("s3://", bucket.bucket, "/", image_build.LOG_PREFIX, "/")
        infrastructure = aws.imagebuilder.InfrastructureConfiguration(
            name, name=label, instance_types=[image_build.BUILDER_INSTANCE_TYPE], instance_profile_name=profile.name,
            subnet_id=subnet_id, security_group_ids=[self.builder_group.id], terminate_instance_on_failure=True,
            instance_metadata_options=aws.imagebuilder.InfrastructureConfigurationInstanceMetadataOptionsArgs(
                http_tokens="required", http_put_response_hop_limit=1),
            logging=aws.imagebuilder.InfrastructureConfigurationLoggingArgs(
                s3_logs=aws.imagebuilder.InfrastructureConfigurationLoggingS3LogsArgs(
                    s3_bucket_name=bucket.bucket, s3_key_prefix=image_build.LOG_PREFIX)),
            resource_tags=tags, tags=tags, opts=child)
        # What the image holds, known before the build (the base's id: the one given, else the recipe's).
        self.identity = recipe.parent_image.apply(lambda base: {
            **image_reuse.baked_tags(image_reuse.bake_identity(spec, base), project_version=None, created=""),
            **({KEEP_KEY: image_reuse.KEPT} if spec.keep_image else {})})
        distribution = aws.imagebuilder.DistributionConfiguration(
            name, name=label, tags=tags, opts=child, distributions=[
                aws.imagebuilder.DistributionConfigurationDistributionArgs(
                    region=spec.region,
                    ami_distribution_configuration=aws.imagebuilder.
                    DistributionConfigurationDistributionAmiDistributionConfigurationArgs(
                        name=f"{label}-{{{{ imagebuilder:buildDate }}}}",
                        description=f"xeon-cluster {spec.cluster_name}: {spec.profile.description}",
                        ami_tags=self.identity.apply(lambda held: {**tags, "Name": label, **held})))])
        self.image = aws.imagebuilder.Image(
            name, image_recipe_arn=recipe.arn, infrastructure_configuration_arn=infrastructure.arn,
            distribution_configuration_arn=distribution.arn,
            image_tests_configuration=aws.imagebuilder.ImageImageTestsConfigurationArgs(image_tests_enabled=False),
            tags=tags, opts=pulumi.ResourceOptions(
                parent=self, replacement_trigger=tag, depends_on=[egress],
                custom_timeouts=pulumi.CustomTimeouts(create=image_build.BUILD_TIMEOUT),
                hooks=pulumi.ResourceHookBinding(on_error=[build_failure_hook(name, self.logs)]) if hooks else None))
        self.image_id: pulumi.Output[str] = self.image.output_resources.apply(_first_ami)
        self.release = ImageRelease(f"{name}-release", image_id=self.image_id, cluster=spec.cluster_name,
                                    region=spec.region, keep=spec.keep_image, opts=child)
        self.register_outputs({"imageId": self.image_id, "logs": self.logs})


def image_use(name: str, spec: ClusterSpec, image_id: pulumi.Input[str],
              opts: pulumi.ResourceOptions | None = None) -> aws.ec2.Tag:
    """This stack's record that it boots the image (its own or a kept one): removed by its destroy."""
    return aws.ec2.Tag(name, resource_id=image_id, key=f"{USED_BY_PREFIX}{spec.cluster_name}", value=spec.stack,
                       opts=opts)


class ImageReleaseProvider(ResourceProvider):
    """Deletes nothing on create; its delete releases the image (node_setup/aws/images.py's release_built).
    Pickled by reference, as the setup step's provider (infra/setup_step.py): keep this path and name."""

    def create(self, props: dict[str, Any]) -> CreateResult:
        return CreateResult(f"release-{props['image_id']}", {k: v for k, v in props.items() if not k.startswith("__")})

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [k for k in ("image_id", "cluster", "region", "keep") if olds.get(k) != news.get(k)]
        return DiffResult(changes=bool(changed), replaces=[k for k in changed if k in ("image_id", "region")],
                          delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]):
        from pulumi.dynamic import UpdateResult

        return UpdateResult({k: v for k, v in news.items() if not k.startswith("__")})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        from node_setup.aws.clients import client
        from node_setup.aws.images import release_built

        line = release_built(client("ec2", props.get("region") or None), props["image_id"], props["cluster"],
                             keep=bool(props.get("keep")))
        pulumi.log.info(f"image {props['image_id']}: {line}")


class ImageRelease(pulumi.dynamic.Resource, module="xeon-cluster", name="ImageRelease"):
    """The record that this stack built the image: its delete removes the image when nobody keeps or boots it."""

    def __init__(self, name: str, *, image_id: pulumi.Input[str], cluster: str, region: str, keep: bool,
                 opts: pulumi.ResourceOptions | None = None):
        super().__init__(ImageReleaseProvider(), name,
                         {"image_id": image_id, "cluster": cluster, "region": region, "keep": keep}, opts)
