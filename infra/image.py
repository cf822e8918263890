"""The baked image: the master set up with the profile (setup step), then imaged without reboot.

The setup step exists only to make this image (with `bake: false` setup is left to `fab setup`),
so both live in one component.

Why no reboot: CreateImage (what `AmiFromInstance` calls) by default shuts the source's operating
system down and boots it again (the instance stays `running`; EC2 does not stop it) so the
snapshot is taken of volumes at rest. We pass `snapshot_without_reboot` (CreateImage's
`NoReboot`) instead, because the setup step's pre-bake cleanup parked the master's SSH host keys
in /run (a tmpfs a reboot wipes) and cleaned cloud-init's state (a reboot would run it again as
on a first boot, with new host keys that no longer match the ones the controller pinned), and a
metal instance takes many minutes to reboot. The step's final `sync`, with nothing else writing,
stands in for the reboot's consistency.

Name and lifecycle:
- The name carries the step's `bake_tag` and its `stamp`, an output the setup step sets when it is
  created (the UTC time of its setup run) and keeps on updates (infra/setup_step.py). The name is
  not in `ignore_changes`: Pulumi applies `ignore_changes` to a replacement too, so an ignored name
  would make a re-bake create its image under the old image's name (`InvalidAMIName.Duplicate`
  when that name is still taken, e.g. on a create retried after a partial one). A software change
  (profile or pin) replaces the step, whose create sets a new stamp, and the bake tag is the
  image's `replacement_trigger`: the new image has a new name, and the workers that boot from it
  are replaced. A new master only updates the step: stamp, name and image stay. (A stack whose
  step was recorded before steps had a stamp gets one at its next update, and with it one
  re-bake under the new name.)
- Source: the setup step's `bake_source`, the master the image was made from. A new master (a lost
  or auto-stopped one, or one replaced for a setting: `masterSpot`, `instanceType`, ...) is set up
  again by the step's update, which keeps `bake_source`: the image and the workers stay. Only a
  software change (the step replaced) makes the current master the source.
- A new image is made before the old one is deregistered (no `delete_before_replace`, on the image
  nor on the setup step it depends on): the launch template moves to the new image, the group is
  replaced (its trigger holds the image id) and launches the new workers from it, and only then, at
  the end of the `pulumi up`, does the engine delete the old image. Old workers never run on a
  deregistered image (a reclaimed one can still be relaunched during the bake), and the name's stamp
  keeps the two images' names apart.
- Create timeout: the provider's 40-minute default can pass for the first, full snapshot of a
  freshly written root volume; we allow IMAGE_CREATE_MINUTES_PER_GIB per GiB, at least
  IMAGE_CREATE_MIN_MINUTES.
- Snapshot tags: `AmiFromInstance` tags only the image (pulumi-aws 7 has no snapshot tag input),
  so the root snapshot is tagged by `aws.ec2.Tag` resources, one per tag, on the image's
  `root_snapshot_id`; the leak sweep (node_setup/aws/sweep.py) finds a snapshot left behind by
  its tags. They are `deleted_with` the image: deleting the image deletes its snapshots.
On delete the provider deregisters the image and deletes the snapshots it created (it records
`manage_ebs_snapshots` at create time).
- Kept (`keepImage`): the image and its snapshot's tags are `retain_on_delete`, so `pulumi destroy` (and a
  re-bake that replaces the image) drops them from the stack and leaves them in the account. The tags of both
  say what the bake put in, as the setup step recorded it when it ran (its `baked` output, kept by its updates as
  the image is: cluster/stack/image_reuse.py's `baked_tags`: the profile's bake tag, the region, the base and its
  image id, the architecture, this project's version the step installed, the step's stamp); every image carries
  them, and a kept one `keep` too. The engine records retain_on_delete at a `pulumi up`, so a keepImage
  changed later takes effect at the next one.
- From a kept image (`kept`: the stack reuses one, cluster/stack/image_reuse.py) there is no bake: the component
  holds the setup step alone (which checks the master booted from the image) and `image_id` is the kept image's.
  The kept image is not a resource of this stack: its `pulumi destroy` leaves it.
"""

from __future__ import annotations

import re

import pulumi
import pulumi_aws as aws

from cluster.stack import image_reuse
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import KEEP_KEY
from infra.master import MasterNode
from infra.setup_step import ProfileSetup, bake_tag, ssh_timeout_for

IMAGE_CREATE_MIN_MINUTES = 120
IMAGE_CREATE_MINUTES_PER_GIB = 1


def image_create_timeout(root_volume_gib: int) -> str:
    """How long the image may take to become available, e.g. "120m"."""
    return f"{max(IMAGE_CREATE_MIN_MINUTES, IMAGE_CREATE_MINUTES_PER_GIB * root_volume_gib)}m"


def image_name(spec: ClusterSpec, bake_tag: str, stamp: str) -> str:
    """`<cluster>-<profile>-<bake tag>-<the setup step's stamp>`: new with every create of the step."""
    return f"{spec.cluster_name}-{spec.software_profile}-{bake_tag}-{stamp}"


def _tag_resource_name(name: str, key: str) -> str:
    return f"{name}-snapshot-{re.sub(r'[^A-Za-z0-9-]+', '-', key).strip('-').lower()}"


class BakedImage(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, master: MasterNode, tags: dict[str, str],
                 ssh_rules: list[pulumi.Resource], auto_stop_idle_s: int | None = None,
                 kept: image_reuse.KeptImage | None = None, opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:BakedImage", name, None, opts)
        self.setup = ProfileSetup(
            f"{name}-setup",
            host=master.connect_address,
            user=spec.ssh_user,
            private_key_path=spec.private_key_path,
            instance_id=master.instance.id,
            profile=spec.profile,
            cluster=spec.cluster_name,
            region=spec.region,
            auto_stop_idle_s=auto_stop_idle_s,
            kept_image=kept.image_id if kept else None,
            bake_identity=None if kept else master.instance.ami.apply(lambda ami: image_reuse.bake_identity(spec, ami)),
            ssh_timeout_seconds=ssh_timeout_for(spec.instance_type),
            opts=pulumi.ResourceOptions(
                parent=self,
                # The step connects over SSH: it waits for the rules that admit it, not only the master.
                depends_on=[master.instance, *ssh_rules]))
        self.image: aws.ec2.AmiFromInstance | None = None
        self.snapshot_tags: list[aws.ec2.Tag] = []
        if kept:
            self.image_id: pulumi.Input[str] = kept.image_id
            self.register_outputs({"imageId": kept.image_id})
            return
        keep = spec.keep_image
        static = {**tags, "Name": name, **({KEEP_KEY: image_reuse.KEPT} if keep else {})}
        # What the bake put in, as the step recorded it when it ran (kept by its updates, as the image is).
        image_tags = self.setup.baked.apply(lambda baked: {**static, **(baked or {})})
        self.image = aws.ec2.AmiFromInstance(
            name,
            name=self.setup.stamp.apply(lambda stamp: image_name(spec, bake_tag(spec.profile.fingerprint()), stamp)),
            description=f"xeon-cluster {spec.cluster_name}: {spec.profile.description}",
            source_instance_id=self.setup.bake_source,
            snapshot_without_reboot=True,
            tags=image_tags,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.setup], retain_on_delete=keep,
                replacement_trigger=bake_tag(spec.profile.fingerprint()),
                custom_timeouts=pulumi.CustomTimeouts(create=image_create_timeout(spec.root_volume_gib))))
        self.image_id = self.image.id
        # The keys are known now (the values of some once the step ran): one Tag resource per key.
        keys = sorted({**static, **image_reuse.baked_tags(image_reuse.bake_identity(spec, ""), project_version=None,
                                                          created="")})
        self.snapshot_tags = [
            aws.ec2.Tag(_tag_resource_name(name, key), resource_id=self.image.root_snapshot_id, key=key,
                        value=image_tags.apply(lambda t, key=key: f"{name}-root" if key == "Name" else
                                               t.get(key, image_reuse.UNKNOWN)),
                        opts=pulumi.ResourceOptions(parent=self, deleted_with=self.image, retain_on_delete=keep))
            for key in keys
        ]
        self.register_outputs({"imageId": self.image.id, "rootSnapshotId": self.image.root_snapshot_id})
