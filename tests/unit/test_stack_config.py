"""Reading Pulumi.<stack>.yaml into a ClusterSpec for preflight and plan (no Pulumi CLI)."""

import base64

import pytest

from cluster.stack.spec import ConfigError
from node_setup.stack_config import StackConfigError, load_stack_spec

KEY = "ssh-ed25519 " + base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes(32)).decode()

STACK = f"""config:
  aws:region: eu-west-1
  xeon-cluster:instanceType: c6i.16xlarge
  xeon-cluster:workerCount: "7"
  xeon-cluster:masterSpot: "false"
  xeon-cluster:sockets: "0"
  xeon-cluster:publicKey: {KEY}
  xeon-cluster:adminCidrs:
    - 198.51.100.0/24
  xeon-cluster:baseAmi:
    secure: AAABAKxyz
"""


def test_the_only_stack_file_is_read(tmp_path):
    (tmp_path / "Pulumi.example.yaml").write_text("config: {}\n")
    (tmp_path / "Pulumi.dev.yaml").write_text(STACK)
    spec = load_stack_spec(root=tmp_path)
    assert (spec.stack, spec.region, spec.instance_type, spec.worker_count, spec.master_spot) == (
        "dev", "eu-west-1", "c6i.16xlarge", 7, False)
    assert spec.sockets is None and spec.admin_cidrs == ("198.51.100.0/24",)
    assert load_stack_spec(root=tmp_path, overrides={"workerCount": 1}).worker_count == 1


def test_several_stacks_need_a_name_and_a_missing_one_is_named(tmp_path):
    (tmp_path / "Pulumi.dev.yaml").write_text(STACK)
    (tmp_path / "Pulumi.prod.yaml").write_text(STACK)
    with pytest.raises(StackConfigError, match="pass --stack"):
        load_stack_spec(root=tmp_path)
    assert load_stack_spec("prod", root=tmp_path).stack == "prod"
    with pytest.raises(StackConfigError, match="'qa' has no file"):
        load_stack_spec("qa", root=tmp_path)


def test_no_stack_file_says_how_to_make_one(tmp_path):
    with pytest.raises(StackConfigError, match="pulumi stack init"):
        load_stack_spec(root=tmp_path)


def test_bad_values_are_reported_with_the_file_name(tmp_path):
    (tmp_path / "Pulumi.dev.yaml").write_text(STACK.replace('"7"', '"lots"'))
    with pytest.raises(ConfigError, match=r"Pulumi.dev.yaml: workerCount: 'lots' is not a whole number"):
        load_stack_spec(root=tmp_path)


def test_a_key_pulumi_up_would_refuse_is_refused_with_the_closest_key(tmp_path):
    (tmp_path / "Pulumi.dev.yaml").write_text(STACK.replace("xeon-cluster:workerCount", "xeon-cluster:workerCont"))
    with pytest.raises(ConfigError) as refused:
        load_stack_spec(root=tmp_path)
    assert "Pulumi.dev.yaml: xeon-cluster:workerCont: not a setting of this project; did you mean workerCount?" \
        in str(refused.value)


@pytest.mark.parametrize("text, message", [
    ("- config\n- aws:region\n", r"Pulumi.dev.yaml: not Pulumi stack config; allowed: a map with a `config` map .*"
                                   r"\(found a list at the top\)"),
    ("just words\n", r"not Pulumi stack config; .*\(found a str at the top\)"),
    ("config: [aws:region]\n", r"Pulumi.dev.yaml: `config` must be a map of keys like xeon-cluster:instanceType "
                                r"\(found a list\)"),
    ("config: eu-west-1\n", r"`config` must be a map .*\(found a str\)"),
    ("config: {aws:region: [eu\n", r"Pulumi.dev.yaml: not valid YAML \(.* at line 2, column 1\)"),
])
def test_a_file_that_is_no_stack_config_is_one_line_naming_the_file(text, message, tmp_path):
    (tmp_path / "Pulumi.dev.yaml").write_text(text)
    with pytest.raises(StackConfigError, match=message) as refused:
        load_stack_spec(root=tmp_path)
    assert "\n" not in str(refused.value)
