"""The schemas the tests validate `fab k8s-job`'s manifests against, built at test time from the Kubeflow
projects' own Python models (the PyPI packages node_setup/kubeflow.py builds the manifests with):

    TrainJob    kubeflow-trainer-api 2.3.0: pydantic models generated from Kubeflow Trainer's OpenAPI
                spec, Kubernetes' own types (pod spec, quantities, ObjectMeta) included. Their
                `model_json_schema(by_alias=True)`, with each model closed to fields it does not
                have; a oneOf wrapper (a Quantity: a string or a number, an IntOrString) made the
                choice of its alternatives (pydantic renders it as an object of its validators); an
                enum, which these models check in a field validator the JSON schema does not show,
                read from that validator's own refusal.
    PyTorchJob  kubeflow-training 1.9.4: openapi-generator models generated from the training operator's
                OpenAPI spec, with the `kubernetes` client's models (generated the same way from
                Kubernetes' spec) below the pod template. Each class's `openapi_types` (the type) and
                `attribute_map` (the name), closed to other fields; a field is required when its setter
                refuses None ("must not be `None`"); a type the package lacks (elasticPolicy's metrics)
                admits nothing.
    ConfigMap   the `kubernetes` client's V1ConfigMap, built the same way.

Strict as kubectl's default `--validate=strict`: a field the models do not know is an error, as are
a wrong type, a missing required field, a value outside an enum and a null (the models write none).
A check of a model the walkers do not understand (a setter or validator refusing anything but None
or an enum's outsider) stops the build rather than being skipped. Each schema is built once per
process. What the models do not carry, and so is not checked here (the CRDs' CEL rules, bounds,
patterns and list-map keys, ObjectMeta's rules, the webhooks): docs/kubernetes.md, "What the tests
check, against what".
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from types import SimpleNamespace
from typing import Any

from cluster.job import k8s, trainjob

# (apiVersion, kind) -> the package whose models say what the kind is, and its model of the kind
MODELS = {
    (trainjob.API_VERSION, trainjob.KIND): ("kubeflow-trainer-api", "TrainerV1alpha1TrainJob"),
    (k8s.API_VERSION, k8s.KIND): ("kubeflow-training", "KubeflowOrgV1PyTorchJob"),
    ("v1", "ConfigMap"): ("kubernetes", "V1ConfigMap"),
}
_NOTES = ("title", "description", "default")  # JSON Schema annotations: they validate nothing
_NAMED = ("properties",)  # maps of names to schemas: a property may be called "default"
_ENUM = re.compile(r"^(each list item )?must be one of (?:enum values )?\((.*)\)$")
_PROBE = "\x00"  # a value no enum, pattern or format of Kubernetes admits


def _tidy(node: Any) -> Any:
    """A pydantic JSON schema without annotations, and an Optional's `null` alternative dropped."""
    if isinstance(node, list):
        return [_tidy(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: {name: _tidy(sub) for name, sub in v.items()} if k in _NAMED else _tidy(v)
           for k, v in node.items() if k not in _NOTES}
    if "anyOf" in out:
        members = [m for m in out.pop("anyOf") if m != {"type": "null"}]
        out.update(members[0] if len(members) == 1 else {"anyOf": members})
    return out


def _refusal(check, value) -> str:
    """The ValueError `check(value)` raises, as text ('' when it admits the value)."""
    try:
        check(value)
    except ValueError as refusal:
        return str(refusal)
    return ""


def _not_understood(where: str, refusal: str) -> ValueError:
    return ValueError(f"{where}: a check of the models not understood: {refusal or 'it admits anything'}")


def _pydantic_model(cls, node: dict) -> dict:
    """One Trainer model's schema (tidied): closed, its enums added; a oneOf wrapper as its alternatives."""
    fields = node.get("properties", {})
    if "actual_instance" in fields:  # oneof_schema_<n>_validator: one per alternative
        return {"anyOf": [schema for name, schema in fields.items() if name.startswith("oneof_schema_")]}
    for validator in cls.__pydantic_decorators__.field_validators.values():
        refusal = _refusal(validator.func, _PROBE)
        found = _ENUM.match(refusal)
        if not found:
            raise _not_understood(f"{cls.__name__}.{validator.cls_var_name}", refusal)
        for field in validator.info.fields:
            schema = fields[cls.model_fields[field].alias or field]
            (schema["items"] if found.group(1) else schema)["enum"] = ast.literal_eval(f"[{found.group(2)}]")
    return {**node, "additionalProperties": False}


def trainer_schema(root: str) -> dict:
    """The JSON Schema of Trainer's model `root` (kubeflow_trainer_api.models)."""
    from kubeflow_trainer_api import models

    schema = getattr(models, root).model_json_schema(by_alias=True)
    defs = schema.pop("$defs", {})
    defs.setdefault(root, schema)
    return {"$ref": f"#/$defs/{root}",
            "$defs": {name: _pydantic_model(getattr(models, name), _tidy(node)) for name, node in defs.items()}}


_SCALARS = {"str": {"type": "string"}, "int": {"type": "integer"}, "float": {"type": "number"},
            "bool": {"type": "boolean"}, "datetime": {"type": "string"}, "date": {"type": "string"},
            "object": {}}  # object: any JSON value (an IntOrString, a RawExtension)


def _required(cls, attr: str) -> bool:
    """Whether `cls`'s setter of `attr` refuses None; ValueError when it refuses anything else."""
    probe = cls.__new__(cls)
    probe.local_vars_configuration = SimpleNamespace(client_side_validation=True)

    def check(value):
        setattr(probe, attr, value)

    refusal = _refusal(check, _PROBE) or _refusal(check, None)
    if refusal and not refusal.endswith("must not be `None`"):
        raise _not_understood(f"{cls.__name__}.{attr}", refusal)
    return bool(refusal)


def _openapi_type(name: str, models, defs: dict) -> dict:
    if name in _SCALARS:
        return dict(_SCALARS[name])
    if name.startswith("list[") and name.endswith("]"):
        return {"type": "array", "items": _openapi_type(name[len("list["):-1], models, defs)}
    if name.startswith("dict(str, ") and name.endswith(")"):
        return {"type": "object", "additionalProperties": _openapi_type(name[len("dict(str, "):-1], models, defs)}
    if name not in defs:
        cls = getattr(models, name, None)
        if cls is None:  # a type the package lacks (the SDK could not read such a field back either)
            return {"not": {}}
        defs[name] = {}  # while its fields are walked (a model may contain itself)
        defs[name] = {"type": "object", "additionalProperties": False,
                      "properties": {cls.attribute_map[attr]: _openapi_type(kind, models, defs)
                                     for attr, kind in cls.openapi_types.items()},
                      "required": [cls.attribute_map[attr] for attr in cls.openapi_types if _required(cls, attr)]}
    return {"$ref": f"#/$defs/{name}"}


def openapi_schema(models, root: str) -> dict:
    """The JSON Schema of the openapi-generator model `root` of the module `models`."""
    defs: dict[str, dict] = {}
    return {**_openapi_type(root, models, defs), "$defs": defs}


@lru_cache(maxsize=None)
def schema(api_version: str, kind: str) -> dict:
    """The JSON Schema of a kind `fab k8s-job` writes, from its package's models."""
    package, root = MODELS[(api_version, kind)]
    if package == "kubeflow-trainer-api":
        return trainer_schema(root)
    if package == "kubeflow-training":
        from kubeflow.training import models  # the kubernetes client's models too (it imports them)
    else:
        from kubernetes.client import models
    return openapi_schema(models, root)


@lru_cache(maxsize=None)
def _validator(api_version: str, kind: str):
    from jsonschema import Draft202012Validator

    return Draft202012Validator(schema(api_version, kind))


def problems(manifest: dict) -> list[str]:
    """Everything the models of the manifest's kind refuse in it ([] when it validates)."""
    key = (manifest.get("apiVersion"), manifest.get("kind"))
    if key not in MODELS:
        return [f"no models here for apiVersion {key[0]!r}, kind {key[1]!r}"]
    errors = _validator(*key).iter_errors(manifest)
    return sorted("$" + "".join(f".{p}" for p in e.absolute_path) + f": {e.message}" for e in errors)
