"""Set one of this project's settings in a Pulumi stack file, as `pulumi config set` would, keeping
the file's other lines and comments (a YAML round trip would drop them). Used by
`fab preflight --pick-zone --write`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from cluster.stack.config_keys import BY_KEY, PROJECT


def set_stack_value(path: str | os.PathLike, key: str, value: str | bool) -> None:
    """`<project>:<key>: <value>` in the stack file's `config:` map, replacing the key's line if there is one."""
    if key not in BY_KEY:
        raise ValueError(f"{key!r} is not a setting of {PROJECT}")
    path = Path(path)
    text = path.read_text() if path.exists() else ""
    scalar = yaml.safe_dump(value, default_style=None).splitlines()[0]  # quoted only if YAML needs it
    line = f"{PROJECT}:{key}: {scalar}"
    lines = text.splitlines()
    own = re.compile(rf"^(\s+){re.escape(PROJECT)}:{re.escape(key)}\s*:")
    for i, existing in enumerate(lines):
        match = own.match(existing)
        if match:
            lines[i] = match.group(1) + line
            break
    else:
        top = next((i for i, existing in enumerate(lines) if re.match(r"^config:\s*(#.*)?$", existing)), None)
        if top is None:
            if any(existing.startswith("config:") for existing in lines):
                raise ValueError(f"{path}: its `config:` is not a block map; run `pulumi config set {key} {value}`")
            lines += ["config:", f"  {line}"]
        else:
            lines.insert(top + 1, f"  {line}")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)
