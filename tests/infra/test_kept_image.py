"""A kept image under the Pulumi mocks: keepImage tags the built image kept, with what it holds, and its release
record keeps it; a later stack whose settings match boots every node from it with no build; a stack keeps its
first choice.

The rule itself (which image matches) is tests/unit/test_image_reuse.py's; here, what the real program registers
for it, with an account (FakeAws) that holds a kept image or a stack's marker.
"""

from __future__ import annotations

from cluster.stack import image_reuse
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import (BASE_IMAGE_KEY, BASE_KEY, CLUSTER_KEY, FINGERPRINT_KEY, IMAGE_SOURCE_KEY, KEEP_KEY,
                                MANAGED_BY_KEY, MANAGED_BY_VALUE, REGION_KEY, STACK_KEY, STACK_MARKER_KEY,
                                USED_BY_PREFIX)
from tests.infra.conftest import (AMI, BASE_AMI, BUILT, DISTRIBUTION, REGION, RELEASE, SETUP, STACK, TAG, FakeAws,
                                  fresh_run, kept_image, master_template, minimal_config, worker_group,
                                  worker_template)

SG = "aws:ec2/securityGroup:SecurityGroup"


def _spec(**config) -> ClusterSpec:
    return ClusterSpec.from_config(minimal_config(**config), stack=STACK, region=REGION)


def kept_tags(spec: ClusterSpec, *, stack: str = "old", created: str = "20260401T080000Z", **over) -> dict[str, str]:
    """The tags a kept bake of `spec`'s settings carries, made by another stack."""
    tags = {MANAGED_BY_KEY: MANAGED_BY_VALUE, CLUSTER_KEY: f"xeon-{stack}", STACK_KEY: stack, KEEP_KEY: "true",
            **image_reuse.baked_tags(image_reuse.bake_identity(spec, "ami-0olderbase"), project_version="0.0.9",
                                     created=created)}
    tags.update(over)
    return tags


def _marker(monitor) -> dict:
    (group,) = [r for r in monitor.of_type(SG) if STACK_MARKER_KEY in r.inputs["tags"]]
    return group.inputs["tags"]


def _ami_tags(monitor) -> dict:
    (distribution,) = monitor.of_type(DISTRIBUTION)
    (where,) = distribution.inputs["distributions"]
    return where["amiDistributionConfiguration"]["amiTags"]


def _built(monitor) -> str:
    (image,) = monitor.of_type(BUILT)
    return image.state["outputResources"][0]["amis"][0]["image"]


def test_keep_image_builds_an_image_tagged_kept_with_what_it_holds_and_its_release_keeps_it():
    monitor, outputs = fresh_run(minimal_config(keepImage=True))
    tags = _ami_tags(monitor)
    want = {KEEP_KEY: "true", FINGERPRINT_KEY: image_reuse.wanted(_spec()).fingerprint, REGION_KEY: REGION,
            BASE_KEY: image_reuse.BASE_RELEASE, BASE_IMAGE_KEY: BASE_AMI, CLUSTER_KEY: "xeon-dev"}
    assert tags.items() >= want.items()
    (release,) = monitor.of_type(RELEASE)
    assert {k: v for k, v in release.inputs.items() if k != "__provider"} == {
        "image_id": _built(monitor), "cluster": "xeon-dev", "region": REGION, "keep": True}
    assert not monitor.of_type(AMI)  # nothing is made from an instance
    assert _marker(monitor)[IMAGE_SOURCE_KEY] == image_reuse.BAKE and outputs["imageSource"] == image_reuse.BAKE


def test_without_keep_image_it_carries_no_keep_tag_and_its_release_may_remove_it():
    monitor, _ = fresh_run(minimal_config())
    assert KEEP_KEY not in _ami_tags(monitor) and _ami_tags(monitor)[FINGERPRINT_KEY]
    (release,) = monitor.of_type(RELEASE)
    assert release.inputs["keep"] is False


def test_keep_image_false_later_untags_nothing_and_rebuilds_nothing():
    """Turning keepImage off changes only the stack's own record (its release) and the tags of a later build: no
    resource of the program tags or untags a built image but the stack's own use record."""
    kept, _ = fresh_run(minimal_config(keepImage=True))
    not_kept, _ = fresh_run(minimal_config(keepImage=False))
    assert _built(kept) == _built(not_kept)
    assert kept.of_type(BUILT)[0].replacement_trigger == not_kept.of_type(BUILT)[0].replacement_trigger
    for monitor in (kept, not_kept):
        assert [t.inputs["key"] for t in monitor.of_type(TAG)] == [f"{USED_BY_PREFIX}xeon-dev"]


def test_a_matching_kept_image_boots_every_node_with_no_install_and_no_build():
    spec = _spec()
    fake = FakeAws(kept=[kept_image("ami-0kept", kept_tags(spec))])
    monitor, outputs = fresh_run(minimal_config(), fake)
    assert not monitor.of_type(AMI) and not monitor.of_type(BUILT) and not monitor.of_type(RELEASE)
    master = master_template(monitor)
    template, group, (setup,) = worker_template(monitor), worker_group(monitor), monitor.of_type(SETUP)
    assert master.inputs["imageId"] == template.inputs["imageId"] == "ami-0kept"
    assert setup.inputs["kept_image"] == "ami-0kept"
    # The workers wait for no setup: their group depends on the kept placement and the image, not on the step.
    assert setup.urn not in group.dependencies and setup.urn not in template.dependencies
    assert (outputs["amiId"], outputs["imageSource"], outputs["baseAmiId"]) == ("ami-0kept", "ami-0kept",
                                                                               "ami-0olderbase")
    assert _marker(monitor)[IMAGE_SOURCE_KEY] == "ami-0kept"
    # It records its use of the kept image, which its destroy removes: the image's owner then sees it is used.
    (use,) = monitor.of_type(TAG)
    assert use.inputs == {"resourceId": "ami-0kept", "key": f"{USED_BY_PREFIX}xeon-dev", "value": STACK}
    assert not use.retain_on_delete


def test_a_kept_image_of_other_pins_or_not_kept_is_not_reused():
    spec = _spec()
    other_pins = kept_tags(spec, **{FINGERPRINT_KEY: "0123456789ab"})
    not_kept = {k: v for k, v in kept_tags(spec).items() if k != KEEP_KEY}
    fake = FakeAws(kept=[kept_image("ami-0pins", other_pins), kept_image("ami-0left", not_kept)])
    monitor, outputs = fresh_run(minimal_config(), fake)
    assert outputs["amiId"] == _built(monitor) == master_template(monitor).inputs["imageId"]


def test_a_stack_that_baked_keeps_baking_when_a_matching_image_is_kept_later():
    spec = _spec()
    marker = {STACK_MARKER_KEY: STACK, CLUSTER_KEY: spec.cluster_name, IMAGE_SOURCE_KEY: image_reuse.BAKE}
    fake = FakeAws(kept=[kept_image("ami-0kept", kept_tags(spec))], groups={"sg-0marker": marker})
    monitor, outputs = fresh_run(minimal_config(), fake)
    assert len(monitor.of_type(BUILT)) == 1 and outputs["imageSource"] == image_reuse.BAKE


def test_a_stack_that_reuses_an_image_keeps_it_while_it_matches():
    spec = _spec()
    marker = {STACK_MARKER_KEY: STACK, CLUSTER_KEY: spec.cluster_name, IMAGE_SOURCE_KEY: "ami-0first"}
    kept = [kept_image("ami-0first", kept_tags(spec)),
            kept_image("ami-0newer", kept_tags(spec, created="20260601T080000Z"))]
    monitor, outputs = fresh_run(minimal_config(), FakeAws(kept=kept, groups={"sg-0marker": marker}))
    assert outputs["amiId"] == "ami-0first" and not monitor.of_type(AMI)
    # A new stack (no marker) takes the newest match.
    _, outputs = fresh_run(minimal_config(), FakeAws(kept=kept))
    assert outputs["amiId"] == "ami-0newer"


def test_without_a_bake_no_kept_image_is_looked_up():
    fake = FakeAws(kept=[kept_image("ami-0kept", kept_tags(_spec()))])
    _, outputs = fresh_run(minimal_config(bake=False), fake)
    assert outputs["imageSource"] == "none" and outputs["amiId"] == BASE_AMI
    assert not any(a.get("owners") == ["self"] for _, a in fake.calls)


def test_the_release_provider_is_pickled_by_reference_to_a_stable_class_path():
    """Pulumi pickles a dynamic provider into the state, and runs its delete at `pulumi destroy`: a reference (this
    module path and class name), not a copy, as the setup step's (tests/infra/test_setup_step.py)."""
    import base64

    from infra.image import ImageReleaseProvider

    monitor, _ = fresh_run(minimal_config())
    (release,) = monitor.of_type(RELEASE)
    payload = release.inputs["__provider"]
    payload = payload["value"] if isinstance(payload, dict) else payload
    raw = base64.b64decode(payload)
    assert len(payload) < 400 and b"infra.image" in raw and b"ImageReleaseProvider" in raw
    assert ImageReleaseProvider.__module__ == "infra.image"
