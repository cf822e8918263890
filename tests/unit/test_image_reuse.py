"""The rule that decides whether a stack reuses a kept image (cluster/stack/image_reuse.py), pure: a changed pin
or profile never reuses one; region, base, architecture and root size must match; another project version reuses
it with an install; a stack keeps its first choice."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest

from cluster.node import profiles
from cluster.stack import image_reuse
from cluster.stack.image_reuse import BAKE, KeptImage, choose, mismatches, wanted
from cluster.stack.spec import ClusterSpec
from cluster.stack.tags import (ARCHITECTURE_KEY, BASE_KEY, CLUSTER_KEY, FINGERPRINT_KEY, IMAGE_SOURCE_KEY, KEEP_KEY,
                                PROJECT_VERSION_KEY, REGION_KEY, STACK_KEY)

PUBLIC_KEY = ("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAICECnqlEndt9BEuNRtVWwmWQcvgQq/FYgx/iofqx4Int "
              "test@xeon-cluster")
NOW = dt.datetime(2026, 5, 3, 12, 0, tzinfo=dt.timezone.utc)


def spec(**config) -> ClusterSpec:
    return ClusterSpec.from_config({"publicKey": PUBLIC_KEY, "adminCidrs": ["203.0.113.7/32"], **config},
                                   stack="dev", region=config.pop("region", "us-east-1"))


def image(of: ClusterSpec, image_id: str = "ami-0kept", *, gib: int = 100, created: str = "20260501T120000Z",
          state: str = "available", architecture: str = "x86_64", **tags) -> KeptImage:
    """A kept image as a bake of `of`'s settings tags it (by another stack), with `tags` changed."""
    baked = image_reuse.baked_tags(image_reuse.bake_identity(of, "ami-0base"), project_version="0.1.0+src.aaa",
                                   created=created)
    all_tags = {**baked, KEEP_KEY: "true", STACK_KEY: "old", CLUSTER_KEY: "xeon-old", **tags}
    return KeptImage.from_description({
        "ImageId": image_id, "Name": f"xeon-old-stock-{created}", "State": state, "Architecture": architecture,
        "RootDeviceName": "/dev/sda1", "CreationDate": "2026-05-01T12:40:00.000Z",
        "BlockDeviceMappings": [{"DeviceName": "/dev/sda1",
                                 "Ebs": {"SnapshotId": f"snap-{image_id}", "VolumeSize": gib}}],
        "Tags": [{"Key": k, "Value": v} for k, v in all_tags.items() if v is not None]})


def test_an_image_baked_with_the_same_settings_is_reused():
    stack = spec()
    kept = image(stack)
    assert mismatches(kept, wanted(stack)) == []
    choice = choose(wanted(stack), [kept], previous=None)
    assert choice.image == kept and choice.source == "ami-0kept" and choice.rejected == ()


def test_a_changed_pin_never_reuses_an_image():
    stack = spec()
    kept = image(stack)
    stock = profiles.PROFILES["stock"]
    edited = dataclasses.replace(stock, pip_pins=tuple(p.replace("transformers==5.23.0", "transformers==5.24.0")
                                                        for p in stock.pip_pins))
    assert edited.fingerprint() != stock.fingerprint()
    repinned = dataclasses.replace(wanted(stack), fingerprint=image_reuse.bake_tag(edited.fingerprint()))
    assert choose(repinned, [kept], previous=None).image is None
    assert "another profile or other pins" in mismatches(kept, repinned)[0]


def test_another_profile_never_reuses_an_image():
    kept = image(spec())
    intel = wanted(spec(softwareProfile="intel"))
    choice = choose(intel, [kept], previous=None)
    assert choice.image is None and choice.rejected == (("ami-0kept", mismatches(kept, intel)[0]),)
    assert mismatches(kept, intel) == [f"profile stock with bake tag {kept.tags[FINGERPRINT_KEY]}, not intel with "
                                       f"{intel.fingerprint} (another profile or other pins)"]


@pytest.mark.parametrize("change, why", [
    (dict(tags={REGION_KEY: "eu-west-1"}), "baked for region eu-west-1, not us-east-1"),
    (dict(tags={BASE_KEY: "ami-0given"}), "baked on ami-0given, not ubuntu-24.04"),
    (dict(architecture="arm64", tags={ARCHITECTURE_KEY: "arm64"}), "architecture arm64, not x86_64"),
    (dict(gib=200), "its root volume is 200 GiB, more than rootVolumeGib 100"),
    (dict(state="pending"), "it is pending, not available"),
])
def test_region_base_architecture_size_and_state_must_match(change, why):
    stack = spec()
    kept = image(stack, gib=change.get("gib", 100), state=change.get("state", "available"),
                 architecture=change.get("architecture", "x86_64"), **change.get("tags", {}))
    assert any(why in line for line in mismatches(kept, wanted(stack))), mismatches(kept, wanted(stack))
    assert choose(wanted(stack), [kept], previous=None).image is None


def test_a_given_base_ami_reuses_only_an_image_baked_on_it_and_a_smaller_root_grows():
    given = spec(baseAmi="ami-0given", rootVolumeGib=300)
    on_release, on_given = image(spec()), image(given, "ami-0ongiven")
    assert mismatches(on_release, wanted(given)) == ["baked on ubuntu-24.04, not ami-0given (baseAmi)"]
    assert choose(wanted(given), [on_release, on_given], previous=None).image == on_given  # 100 GiB <= 300


def test_an_image_not_kept_is_no_candidate():
    stack = spec()
    assert choose(wanted(stack), [image(stack, **{KEEP_KEY: None})], previous=None).image is None


def test_another_project_version_reuses_the_image_and_says_what_the_step_installs():
    stack = spec()
    choice = choose(wanted(stack), [image(stack)], previous=None)
    line = image_reuse.choice_line(choice, stack, project_version="0.2.0+src.bbb", now=NOW)
    assert line.startswith("reuses kept image ami-0kept (profile stock, baked 2d 0h ago by stack old (cluster "
                           "xeon-old), xeon-cluster 0.1.0+src.aaa)")
    assert ("it holds xeon-cluster 0.1.0+src.aaa: the setup step installs 0.2.0+src.bbb on the master and `fab setup` "
            "on the workers") in line
    assert "installs" not in image_reuse.choice_line(choice, stack, project_version="0.1.0+src.aaa", now=NOW)
    assert image(stack).tags[PROJECT_VERSION_KEY] == "0.1.0+src.aaa"


def test_the_choice_line_says_what_a_reuse_saves_and_a_bake_costs():
    stack = spec()  # r7iz.metal-16xl, 3 workers
    reuse = image_reuse.choice_line(choose(wanted(stack), [image(stack)], previous=None), stack, now=NOW)
    # by hand: a build 2m (a virtual type's typical boot) + 10m + 12m (stock's 40 GiB), then from the image 1m + 9m
    # (a 7th-generation metal type's typical boot) + 3m + 30s = 13m 30s; the nodes bill the same either way, the build
    # instance 24 min at $0.1008/hour = $0.04
    assert "takes about 13m 30s instead of 37m 30s and its build instance bills nothing ($0.04 less)" in reuse
    bake = image_reuse.choice_line(choose(wanted(stack), [], previous=None), stack, now=NOW)
    assert bake == ("bakes a new image: no kept image in us-east-1: this stack bakes its own; EC2 Image Builder "
                    "builds it on its own m7i.large ($0.04), and the first `pulumi up` takes about 37m 30s "
                    "(keepImage: false: `pulumi destroy` deletes it, unless another stack boots it)")


def test_a_stack_that_baked_keeps_baking_and_one_that_reuses_keeps_its_image():
    stack = spec()
    first, newer = image(stack, "ami-0first"), image(stack, "ami-0newer", created="20260502T120000Z")
    assert choose(wanted(stack), [first, newer], previous=None).image == newer  # a new stack: the newest match
    assert choose(wanted(stack), [first, newer], previous=BAKE).image is None
    assert choose(wanted(stack), [first, newer], previous="ami-0first").image == first
    gone = choose(wanted(stack), [newer], previous="ami-0first")
    assert gone.image == newer and gone.why.startswith("the kept image ami-0first this stack booted no longer serves "
                                                       "it (it is gone); ")


def test_the_previous_choice_is_read_from_the_stack_marker_s_tags():
    assert image_reuse.previous_source(None, IMAGE_SOURCE_KEY) is None  # no marker: a new stack
    assert image_reuse.previous_source({"xeon-cluster:stack-marker": "dev"}, IMAGE_SOURCE_KEY) == BAKE  # older stack
    assert image_reuse.previous_source({IMAGE_SOURCE_KEY: "ami-0kept"}, IMAGE_SOURCE_KEY) == "ami-0kept"


def test_a_kept_image_s_age_size_and_monthly_cost():
    kept = image(spec(), gib=120)
    assert (kept.age(NOW), kept.size_gib, kept.monthly_usd) == ("2d 0h", 120, pytest.approx(6.0))
    assert KeptImage.from_description({"ImageId": "ami-0bare", "CreationDate": "2026-05-03T11:00:00.000Z"}).age(NOW) \
        == "1h 00m 00s"


# --- the image built apart (cluster/stack/image_build.py) -----------------------------------------------------

def test_the_component_downloads_the_install_script_runs_it_and_removes_it():
    import yaml

    from cluster.stack import image_build

    uri = "s3://xeon-dev-checkpoints-0a1b/image-builder/install/stock-0a1b2c3d4e5f.sh"
    document = yaml.safe_load(image_build.component_document(uri))
    (phase,) = document["phases"]
    download, install, clean = phase["steps"]
    assert phase["name"] == "build" and download["action"] == "S3Download"
    assert download["inputs"] == [{"source": uri, "destination": f"{image_build.BUILD_DIR}/install.sh"}]
    assert install["inputs"]["commands"] == [f"bash {image_build.BUILD_DIR}/install.sh"]
    assert clean["inputs"]["commands"] == [f"rm -rf {image_build.BUILD_DIR} /root/.cache/pip"]
    for bad in ("s3://bucket/key; rm -rf /", "https://example.com/x.sh", "s3://Bucket/x", ""):
        with pytest.raises(ValueError, match="script_uri: .* is not allowed"):
            image_build.component_document(bad)


def test_a_destroy_removes_its_image_only_when_not_kept_and_no_other_stack_records_its_use():
    from cluster.stack import image_build
    from cluster.stack.tags import USED_BY_PREFIX

    mine = {f"{USED_BY_PREFIX}xeon-dev": "dev"}
    assert image_build.release(mine, "xeon-dev", keep=False) == (
        True, "removed: keepImage is false and no other stack boots it")
    assert image_build.release({}, "xeon-dev", keep=True) == (False, "kept: keepImage is true")
    used = {**mine, f"{USED_BY_PREFIX}xeon-lab": "lab"}
    assert image_build.release(used, "xeon-dev", keep=False) == (
        False, "kept: other stacks boot it (xeon-lab (stack lab))")
    assert image_build.image_users(used) == {"xeon-dev": "dev", "xeon-lab": "lab"}
