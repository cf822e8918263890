"""Pulumi.yaml's config schema, infra/config.py, ClusterSpec and the docs agree on every key."""

from __future__ import annotations

import inspect
import re

import yaml

from cluster.spec import ClusterSpec
from infra import config as infra_config
from tests.infra.conftest import ROOT, minimal_config

PROJECT_FILE = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
SCHEMA = PROJECT_FILE["config"]
KINDS = {"string": infra_config.STRING_KEYS, "integer": infra_config.INTEGER_KEYS,
         "boolean": infra_config.BOOLEAN_KEYS, "array": infra_config.ARRAY_KEYS}


def keys_read_by_spec() -> set[str]:
    source = inspect.getsource(ClusterSpec.from_config)
    return set(re.findall(r'get\("([a-zA-Z]+)"', source))


def test_project_file_runs_the_infra_program():
    assert PROJECT_FILE["name"] == "xeon-cluster" == infra_config.PROJECT
    assert PROJECT_FILE["runtime"]["name"] == "python"
    assert PROJECT_FILE["main"] == "infra/"


def test_schema_declares_exactly_the_keys_the_spec_reads():
    assert set(SCHEMA) == set(infra_config.CONFIG_KEYS) == keys_read_by_spec()


def test_every_key_has_a_type_and_description_matching_how_it_is_read():
    for key, decl in SCHEMA.items():
        assert decl["type"] in KINDS, key
        assert key in KINDS[decl["type"]], f"{key} is declared {decl['type']} but read otherwise"
        assert len(decl.get("description", "")) > 20, key
        if decl["type"] == "array":
            assert decl["items"] == {"type": "string"}, key


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
    assert len(outputs["nodePrivateAddresses"]) == 1 + int(values["workerCount"])


def test_docs_table_lists_every_key_with_its_default():
    docs = (ROOT / "README.md").read_text()
    for key, decl in SCHEMA.items():
        row = re.search(rf"^\| `{key}` \|([^\n]*)$", docs, re.MULTILINE)
        assert row, f"README.md has no table row for {key}"
        if "default" in decl:
            default = decl["default"]
            shown = ("`[]`" if default == [] else "`\"\"`" if default == "" else
                     f"`{str(default).lower() if isinstance(default, bool) else default}`")
            assert shown in row.group(1), f"{key}: default {shown} not in docs row {row.group(0)}"
        else:
            assert "required" in row.group(1), key
