"""The baked image: the master set up with the profile (setup step), then imaged without reboot.

The setup step exists only to make this image (with `bake: false` setup is left to `fab setup`),
so both live in one component. `AmiFromInstance` would stop its source first, which a one-time
spot master cannot do, hence `snapshot_without_reboot` after the step's `sync`. The image name
comes from the step's `bake_tag`, so a new step (new master, profile or pin) makes a new image and
the workers that boot from it are replaced. On delete the provider deregisters the image and
deletes the snapshots it created (it records `manage_ebs_snapshots` at create time).
"""

from __future__ import annotations

import pulumi
import pulumi_aws as aws

from cluster.spec import ClusterSpec
from cluster.tags import PROFILE_KEY
from infra.master import MasterNode
from infra.setup_step import ProfileSetup


class BakedImage(pulumi.ComponentResource):
    def __init__(self, name: str, spec: ClusterSpec, master: MasterNode, tags: dict[str, str],
                 ssh_rules: list[pulumi.Resource], opts: pulumi.ResourceOptions | None = None):
        super().__init__("xeon-cluster:infra:BakedImage", name, None, opts)
        self.setup = ProfileSetup(
            f"{name}-setup",
            host=master.connect_address,
            user=spec.ssh_user,
            private_key_path=spec.private_key_path,
            instance_id=master.instance.id,
            profile=spec.profile,
            # The step connects over SSH: it waits for the rules that admit it, not only the master.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[master.instance, *ssh_rules]))
        self.image = aws.ec2.AmiFromInstance(
            name,
            name=self.setup.bake_tag.apply(lambda tag: f"{spec.cluster_name}-{spec.software_profile}-{tag}"),
            description=f"xeon-cluster {spec.cluster_name}: {spec.profile.description}",
            source_instance_id=master.instance.id,
            snapshot_without_reboot=True,
            tags={**tags, "Name": name, PROFILE_KEY: spec.software_profile},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.setup]))
        self.register_outputs({"imageId": self.image.id})
