"""Pulumi.yaml's config schema, the config key table, ClusterSpec and the docs agree on every key."""

from __future__ import annotations

import dataclasses
import re

import yaml

from cluster.stack.config_keys import BY_KEY, CONFIG_KEYS, PROJECT
from cluster.stack.spec import ClusterSpec
from infra import config as infra_config
from node_setup.controller import tomllib
from tests.infra.conftest import ROOT, minimal_config

PROJECT_FILE = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
SCHEMA = PROJECT_FILE["config"]


def test_project_file_runs_the_infra_program():
    assert PROJECT_FILE["name"] == PROJECT
    assert PROJECT_FILE["runtime"]["name"] == "python"
    assert PROJECT_FILE["main"] == "infra/"


def test_project_file_runs_pulumi_from_the_projects_own_virtualenv():
    """The setup step's provider process can load it only where the project is installed."""
    options = PROJECT_FILE["runtime"]["options"]
    assert options["virtualenv"] == ".venv" and options["toolchain"] == "pip"
    assert ".venv/" in (ROOT / ".gitignore").read_text().splitlines()  # never committed
    # When Pulumi creates that venv (`pulumi install`, or `pulumi up` without one) it installs the
    # requirements.txt of the program's directory (`main`), running pip there; without that file the
    # venv would hold no pulumi and no project.
    program_dir = ROOT / PROJECT_FILE["main"]
    lines = [line.strip() for line in (program_dir / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    assert lines == ["-e ..[controller]"]
    assert (program_dir / ".." / "pyproject.toml").resolve() == ROOT / "pyproject.toml"
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("pulumi>=") for req in extras["controller"])
    assert any(req.startswith("pulumi-aws") for req in extras["controller"])


def test_schema_declares_exactly_the_keys_of_the_table():
    assert set(SCHEMA) == set(BY_KEY)


def test_every_spec_attribute_but_stack_and_region_has_one_key():
    attributes = {f.name for f in dataclasses.fields(ClusterSpec)} - {"stack", "region"}
    assert sorted(k.attr for k in CONFIG_KEYS) == sorted(attributes)


def test_every_key_has_a_type_and_description_matching_how_it_is_read():
    for key, decl in SCHEMA.items():
        assert decl["type"] == BY_KEY[key].pulumi_type, f"{key} is declared {decl['type']} but read otherwise"
        assert len(decl.get("description", "")) > 20, key
        if decl["type"] == "array":
            assert decl["items"] == {"type": "string"}, key


def test_unset_placeholders_are_the_schema_defaults():
    for entry in CONFIG_KEYS:
        if entry.unset is not None:
            assert str(SCHEMA[entry.key]["default"]) == entry.unset, entry.key


def test_only_public_key_and_admin_cidrs_are_required():
    # A typed key without a default is required by the Pulumi CLI.
    assert {k for k, d in SCHEMA.items() if "default" not in d} == {"publicKey", "adminCidrs"}


def test_schema_defaults_mean_the_same_as_the_spec_defaults():
    required = {"publicKey": minimal_config()["publicKey"], "adminCidrs": minimal_config()["adminCidrs"]}
    as_cli_passes_them = {k: (d["default"] if isinstance(d["default"], list) else str(d["default"]).lower()
                              if isinstance(d["default"], bool) else str(d["default"]))
                          for k, d in SCHEMA.items() if "default" in d}
    decoded = {k: infra_config._decode(k, v if not isinstance(v, list) else str(v).replace("'", '"'))
               for k, v in as_cli_passes_them.items()}
    with_defaults = ClusterSpec.from_config({**{k: v for k, v in decoded.items() if v is not None}, **required},
                                            stack="dev", region="us-east-1")
    without = ClusterSpec.from_config(required, stack="dev", region="us-east-1")
    assert with_defaults == without


def test_example_stack_file_is_a_valid_config(harness):
    example = yaml.safe_load((ROOT / "Pulumi.example.yaml").read_text())["config"]
    prefix = "xeon-cluster:"
    values = {k[len(prefix):]: v for k, v in example.items() if k.startswith(prefix)}
    assert set(values) <= set(SCHEMA)
    outputs = harness.run(values, region=example["aws:region"])
    assert outputs["region"] == example["aws:region"]
    assert outputs["workerCount"] == int(values["workerCount"]) and outputs["workerGroupName"]


def test_docs_table_lists_every_key_with_its_default():
    docs = (ROOT / "docs" / "aws.md").read_text()  # the configuration reference
    for key, decl in SCHEMA.items():
        row = re.search(rf"^\| `{key}` \|([^\n]*)$", docs, re.MULTILINE)
        assert row, f"docs/aws.md has no table row for {key}"
        if "default" in decl:
            default = decl["default"]
            shown = ("`[]`" if default == [] else "`\"\"`" if default == "" else
                     f"`{str(default).lower() if isinstance(default, bool) else default}`")
            assert shown in row.group(1), f"{key}: default {shown} not in docs row {row.group(0)}"
        else:
            assert "required" in row.group(1), key
