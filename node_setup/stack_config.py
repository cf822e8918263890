"""Read a stack's `Pulumi.<stack>.yaml` into a ClusterSpec without the Pulumi CLI.

`fab preflight` and `fab plan` run before `pulumi up`, from the same settings: the keys
`xeon-cluster:<camelCaseKey>` (the ones `infra/config.py` reads) and the region `aws:region`.
Secret values (`{secure: ...}`) cannot be read without the CLI and are not needed here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from cluster.node import autostop
from cluster.stack.config_keys import AUTO_STOP_IDLE, KNOWN_KEYS, PROJECT, is_unset, unknown_key_problem
from cluster.stack.spec import ClusterSpec, ConfigError

EXAMPLE_STACK = "example"


class StackConfigError(ValueError):
    """No stack file, several candidates, or a file that is not Pulumi stack config."""


def stack_files(root: str | os.PathLike = ".") -> dict[str, Path]:
    """Stack name -> file, for every Pulumi.<stack>.yaml in `root` except the example."""
    found = {}
    for path in sorted(Path(root).glob("Pulumi.*.yaml")):
        stack = path.name[len("Pulumi."):-len(".yaml")]
        if stack and stack != EXAMPLE_STACK:
            found[stack] = path
    return found


def choose_stack(stack: str | None, root: str | os.PathLike = ".") -> tuple[str, Path]:
    files = stack_files(root)
    if stack:
        path = Path(root) / f"Pulumi.{stack}.yaml"
        if not path.is_file():
            raise StackConfigError(f"--stack: {stack!r} has no file {path}; stacks here: "
                                   f"{', '.join(files) or 'none'} (create one with `pulumi stack init {stack}`)")
        return stack, path
    if len(files) == 1:
        return next(iter(files.items()))
    if not files:
        raise StackConfigError(f"no Pulumi.<stack>.yaml in {Path(root).resolve()}: run `pulumi stack init dev` and "
                               "set its config (see Pulumi.example.yaml), or pass --stack")
    raise StackConfigError(f"several stacks here ({', '.join(files)}): pass --stack NAME")


def _yaml_problem(exc: Exception) -> str:
    """A YAML error in one line: what is wrong and where (PyYAML's own text spans several lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def read_stack_values(path: str | os.PathLike) -> tuple[dict[str, Any], str, list[str]]:
    """(camelCase settings, region, keys of this project that are no setting) from a stack file."""
    try:
        doc = yaml.safe_load(Path(path).read_text()) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise StackConfigError(f"{path}: not valid YAML ({_yaml_problem(exc)})") from None
    except OSError as exc:
        raise StackConfigError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if not isinstance(doc, dict):
        raise StackConfigError(f"{path}: not Pulumi stack config; allowed: a map with a `config` map of keys like "
                               f"{PROJECT}:instanceType (found a {type(doc).__name__} at the top)")
    config = doc.get("config") or {}
    if not isinstance(config, dict):
        raise StackConfigError(f"{path}: `config` must be a map of keys like {PROJECT}:instanceType "
                               f"(found a {type(config).__name__})")
    values: dict[str, Any] = {}
    unknown: list[str] = []
    prefix = PROJECT + ":"
    for key, value in config.items():
        if not str(key).startswith(prefix):
            continue
        name = str(key)[len(prefix):]
        if name not in KNOWN_KEYS:
            unknown.append(name)
        elif not (isinstance(value, dict) and "secure" in value or is_unset(name, value)):
            values[name] = value
    region = str(config.get("aws:region") or "")
    return values, region, unknown


def load_stack_spec(stack: str | None = None, root: str | os.PathLike = ".", *,
                    overrides: dict[str, Any] | None = None) -> ClusterSpec:
    """The validated ClusterSpec of a stack (`overrides` are camelCase keys, e.g. from fab options)."""
    name, path = choose_stack(stack, root)
    values, region, unknown = read_stack_values(path)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or ""
    if not region:
        raise StackConfigError(f"{path}: aws:region is not set; run `pulumi config set aws:region us-east-1`")
    problems = [unknown_key_problem(key) for key in unknown]
    try:
        autostop.stack_idle_seconds(values.get(AUTO_STOP_IDLE), AUTO_STOP_IDLE)
    except autostop.AutostopError as exc:
        problems.append(str(exc))
    try:
        spec = ClusterSpec.from_config(values, stack=name, region=region)
    except ConfigError as err:
        problems += err.problems
    if problems:
        raise ConfigError([f"{path.name}: {p}" for p in problems])
    return spec


def stack_auto_stop_idle(cluster_name: str, root: str | os.PathLike = ".") -> int | None:
    """Seconds of the `autoStopIdle` of the stack here that makes `cluster_name` (None: off).

    The default (30m) when no stack file here names that cluster; raises AutostopError (one line)
    for a bad value.
    """
    for stack, path in stack_files(root).items():
        try:
            values = read_stack_values(path)[0]
        except StackConfigError:
            continue
        if str(values.get("clusterName") or f"xeon-{stack}").lower() == cluster_name:
            return autostop.stack_idle_seconds(values.get(AUTO_STOP_IDLE), f"{path.name}: {AUTO_STOP_IDLE}")
    return autostop.stack_idle_seconds(None)
