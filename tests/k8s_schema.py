"""The Kubeflow CRD schemas the tests validate `fab k8s-job`'s manifests against (tests/k8s_crds/).

Each file of tests/k8s_crds/ is the `openAPIV3Schema` of one published CustomResourceDefinition,
the schema the Kubernetes API server validates that kind with, with its `description` texts
removed (they validate nothing) and where it came from (`source`: the project, release, file and
the SHA-256 of that file as released):

    pytorchjob.json   kubeflow.org/v1 PyTorchJob, the training operator v1.9.4
                      (manifests/base/crds/kubeflow.org_pytorchjobs.yaml), the release of the SDK
                      node_setup/kubeflow.py builds it with (kubeflow-training 1.9.4)
    trainjob.json     trainer.kubeflow.org/v1alpha1 TrainJob, Kubeflow Trainer v2.3.0
                      (manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml), the release of the
                      models node_setup/kubeflow.py builds it with (kubeflow-trainer-api 2.3.0)

Neither project ships its CRDs in a package this project can install (PyPI's kubeflow-training and
kubeflow-trainer-api hold generated Python models only), so the schemas are kept here as data. To
refresh one from a release's CRD file: `python -m tests.k8s_schema CRD.yaml PROJECT RELEASE PATH >
tests/k8s_crds/KIND.json` (and move the pin in pyproject.toml with it: tests/unit/test_k8s_schemas.py
checks that the installed models are of the schemas' release).

`problems(manifest)` checks a manifest as the API server would on create, strictly (kubectl's
default `--validate=strict`: a field the schema does not know is an error, not dropped):
- the structural schema as JSON Schema (draft 4, what OpenAPI v3.0 schemas are): types, required
  fields, enums, patterns, lengths, item counts, minimum and maximum; `nullable`,
  `x-kubernetes-int-or-string` (an integer or a string), `x-kubernetes-preserve-unknown-fields`
  (anything goes below);
- `x-kubernetes-list-type`: `map` lists have one item per key (`x-kubernetes-list-map-keys`), `set`
  lists no repeated item;
- the CEL rules (`x-kubernetes-validations`) of the forms these CRDs use: `self == oldSelf` only
  applies to an update (skipped); `X.matches('RE')`, `size(X) <= N`, `self == '' || ...`,
  `self in [...]` and `has(X)` are evaluated; any other rule is reported as not understood, so a
  refreshed schema cannot pass by being skipped.
What it cannot check is the API server's own: metadata (ObjectMeta: the name's form), and whatever
the operators' admission webhooks refuse (tests/k8s_trainer.py holds what the tests check of
Trainer's).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

CRDS = Path(__file__).resolve().parent / "k8s_crds"
FILES = ("pytorchjob.json", "trainjob.json")


def trimmed(value: Any) -> Any:
    """A schema without its `description` texts."""
    if isinstance(value, dict):
        return {k: trimmed(v) for k, v in value.items() if k != "description"}
    if isinstance(value, list):
        return [trimmed(v) for v in value]
    return value


def from_crd(text: str, project: str, release: str, path: str) -> dict:
    """The data file of a CRD file's text: its first served version's schema, trimmed, and its source."""
    import yaml

    crd = yaml.safe_load(text)
    version = next(v for v in crd["spec"]["versions"] if v.get("served", True))
    return {"source": {"project": project, "release": release, "file": path,
                       "sha256": hashlib.sha256(text.encode()).hexdigest()},
            "group": crd["spec"]["group"], "version": version["name"], "kind": crd["spec"]["names"]["kind"],
            "openAPIV3Schema": trimmed(version["schema"]["openAPIV3Schema"])}


def load(name: str) -> dict:
    return json.loads((CRDS / name).read_text())


@lru_cache(maxsize=None)
def schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> the data file's content."""
    out = {}
    for name in FILES:
        crd = load(name)
        out[(f"{crd['group']}/{crd['version']}", crd["kind"])] = crd
    return out


def json_schema(node: Any) -> Any:
    """A structural schema node as JSON Schema (draft 4), strict about unknown fields."""
    if isinstance(node, list):
        return [json_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    names = ("properties", "patternProperties")  # maps of names to schemas: convert their values only
    out = {k: {name: json_schema(sub) for name, sub in v.items()} if k in names else json_schema(v)
           for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in ("nullable", "default", "format")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out = {"anyOf": [{"type": "integer"}, {"type": "string"}], **{k: v for k, v in out.items() if k != "anyOf"}}
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if ("properties" in node and "additionalProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


_PATH = r"self((?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
_STRING = r"'((?:[^'\\]|\\.)*)'"
_RULES = [
    (re.compile(rf"^{_PATH}\.matches\({_STRING}\)$"), "matches"),
    (re.compile(rf"^size\({_PATH}\) <= (\d+)$"), "size"),
    (re.compile(rf"^self == '' \|\| self\.matches\({_STRING}\)$"), "empty-or-matches"),
    (re.compile(rf"^self in \[((?:{_STRING}(?:, )?)+)\]$"), "in"),
    (re.compile(rf"^has\({_PATH}\)$"), "has"),
]
_MISSING = object()


def _field(value: Any, dotted: str) -> Any:
    for name in filter(None, dotted.split(".")):
        if not isinstance(value, dict) or name not in value:
            return _MISSING
        value = value[name]
    return value


def cel_holds(rule: str, value: Any) -> bool | None:
    """Whether a CEL rule of the forms above holds for `value` (`self`); None: a transition rule
    (`oldSelf`), which applies to updates only. ValueError for a rule of any other form."""
    if "oldSelf" in rule:
        if rule != "self == oldSelf":
            raise ValueError(f"CEL rule not understood: {rule!r}")
        return None
    for pattern, form in _RULES:
        found = pattern.match(rule)
        if not found:
            continue
        if form == "matches":
            target = _field(value, found.group(1))
            return isinstance(target, str) and re.search(found.group(2), target) is not None
        if form == "size":
            target = _field(value, found.group(1))
            return target is not _MISSING and len(target) <= int(found.group(2))
        if form == "empty-or-matches":
            return value == "" or re.search(found.group(1), value) is not None
        if form == "in":
            return value in re.findall(_STRING, found.group(1))
        return _field(value, found.group(1)) is not _MISSING
    raise ValueError(f"CEL rule not understood: {rule!r}")


def _pairs(schema: dict, value: Any, where: str) -> Iterator[tuple[dict, Any, str]]:
    """Every (schema node, value, path) below and including this one, where the value is present."""
    yield schema, value, where
    if isinstance(value, dict):
        for name, sub in value.items():
            node = (schema.get("properties") or {}).get(name)
            if node is None and isinstance(schema.get("additionalProperties"), dict):
                node = schema["additionalProperties"]
            if node is not None:
                yield from _pairs(node, sub, f"{where}.{name}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from _pairs(schema["items"], item, f"{where}[{index}]")


def kubernetes_extensions(schema: dict, manifest: dict) -> list[str]:
    """What the x-kubernetes-* keywords refuse in `manifest`: repeated list keys, CEL rules that fail."""
    out = []
    for node, value, where in _pairs(schema, manifest, "$"):
        kind = node.get("x-kubernetes-list-type")
        if kind in ("map", "set") and isinstance(value, list):
            keys = node.get("x-kubernetes-list-map-keys", ())
            seen = [json.dumps([i.get(k) for k in keys] if kind == "map" else i, sort_keys=True) for i in value]
            repeated = sorted({s for s in seen if seen.count(s) > 1})
            if repeated:
                out.append(f"{where}: {kind} list repeats {', '.join(repeated)}")
        for rule in node.get("x-kubernetes-validations", ()):
            holds = cel_holds(rule["rule"], value)
            if holds is False:
                out.append(f"{where}: {rule.get('message') or rule['rule']}")
    return out


@lru_cache(maxsize=None)
def _converted(key: tuple[str, str]) -> dict:
    return json_schema(schemas()[key]["openAPIV3Schema"])


def problems(manifest: dict) -> list[str]:
    """Everything the published schema of the manifest's kind refuses in it ([] when it validates)."""
    from jsonschema import Draft4Validator

    key = (manifest.get("apiVersion"), manifest.get("kind"))
    crd = schemas().get(key)  # type: ignore[arg-type]
    if crd is None:
        return [f"no published schema here for apiVersion {key[0]!r}, kind {key[1]!r}"]
    schema = crd["openAPIV3Schema"]
    validator = Draft4Validator(_converted(key))
    found = [f"$.{'.'.join(str(p) for p in e.absolute_path)}: {e.message}" for e in validator.iter_errors(manifest)]
    return found + kubernetes_extensions(schema, manifest)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m tests.k8s_schema CRD.yaml PROJECT RELEASE PATH-IN-THE-RELEASE", file=sys.stderr)
        return 2
    crd, project, release, path = argv
    print(json.dumps(from_crd(Path(crd).read_text(), project, release, path), indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
