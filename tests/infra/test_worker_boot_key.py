"""The workers' first boot under the Pulumi mocks: the launch template's user data writes the cluster key
(the public half from the controller's key store, made there before the first `pulumi up` if absent),
and a new cluster key makes a new template version without replacing the group, while every other
property of the template still replaces it (the mocks number a changed template's versions anew)."""

from __future__ import annotations

import base64
import json
import stat

import pytest

from cluster.node.render import KEY_RESTRICTIONS
from tests.infra.conftest import SUBNET_CIDR, fresh_run, minimal_config, worker_group, worker_template

CLUSTER = "xeon-dev"  # minimal_config's cluster name


def template_and_group(monitor):
    template, group = worker_template(monitor), worker_group(monitor)
    return template, group


def user_data(template) -> str:
    return base64.b64decode(template.inputs["userData"]).decode()


def key_store(config_home):
    return config_home / "xeon-cluster" / "keys" / CLUSTER


def test_the_key_pair_is_made_before_the_first_up_and_its_public_half_is_the_user_data(controller_config):
    assert not key_store(controller_config).exists()
    monitor, outputs = fresh_run(minimal_config())
    store = key_store(controller_config)
    public = (store / "id_ed25519.pub").read_text().strip()
    assert public.endswith(f" xeon-cluster:{CLUSTER}")
    assert stat.S_IMODE((store / "id_ed25519").stat().st_mode) == 0o600
    template, _ = template_and_group(monitor)
    script = user_data(template)
    assert script.startswith("#!/bin/sh\n")
    # the line as the script receives it (shell-quoted in its header), from= the workers' subnet
    assert f"LINE='from=\"{SUBNET_CIDR}\",{KEY_RESTRICTIONS} {public}'\n" in script
    assert "SSH_USER=ubuntu\n" in script
    # A second `pulumi up` reads the same pair: the same user data.
    again, _ = fresh_run(minimal_config())
    assert user_data(template_and_group(again)[0]) == script


def test_the_private_half_is_in_no_input_output_or_user_data(controller_config):
    monitor, outputs = fresh_run(minimal_config())
    private = (key_store(controller_config) / "id_ed25519").read_text()
    body = private.splitlines()[1]  # a line of the key's base64, whatever wraps it
    template, _ = template_and_group(monitor)
    seen = json.dumps([[r.inputs, r.state] for r in monitor.registrations], default=str) + json.dumps(
        outputs, default=str) + user_data(template)
    assert "PRIVATE KEY" not in seen and body not in seen


def test_another_cluster_key_changes_the_user_data_and_the_version_but_does_not_replace_the_group(
        tmp_path, monkeypatch):
    before, _ = fresh_run(minimal_config())
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "another-controller"))  # a second key store
    after, _ = fresh_run(minimal_config())
    (old_template, old_group), (new_template, new_group) = template_and_group(before), template_and_group(after)
    assert user_data(new_template) != user_data(old_template)
    assert new_template.state["latestVersion"] != old_template.state["latestVersion"]  # a new version
    assert new_group.replacement_trigger == old_group.replacement_trigger  # no replacement
    # the group launches its next workers from the new version (an in-place update)
    assert new_group.inputs["launchTemplate"]["version"] == str(new_template.state["latestVersion"])


@pytest.mark.parametrize("change", [{"rootVolumeGib": 200}, {"rootVolumeType": "gp2"}, {"placementGroup": False}],
                         ids=["root volume size", "root volume type", "placement group"])
def test_the_templates_other_properties_still_replace_the_group(change):
    before, _ = fresh_run(minimal_config())
    after, _ = fresh_run(minimal_config(**change))
    (old_template, old_group), (new_template, new_group) = template_and_group(before), template_and_group(after)
    assert user_data(new_template) == user_data(old_template)  # the same key: only the property changed
    assert new_group.replacement_trigger != old_group.replacement_trigger and new_group.delete_before_replace
