"""Which environment variables a run may give its ranks (pure): names that change how an interpreter, a
shell or the dynamic loader starts are refused unless --allow-env names them; the launch's own are
refused; values are one line. Used by the run request (cluster/job/request.py), `fab k8s-job`
(cluster/job/k8s.py) and a resumed run's new values (node_setup/tasks/managed.py)."""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from cluster.job import checks as ck
from cluster.job.checks import RequestError
from cluster.job.launch import RESERVED_VARIABLES, is_variable_name

# Environment names that change how an interpreter, a shell or the dynamic loader starts (what runs
# before the program's first line, or instead of it): refused in --env (fab train, fab k8s-job, a job
# file, a run spec) unless --allow-env names them. TMPDIR is allowed: it moves where temporary files
# go (a larger disk is a common reason to set it) and starts nothing.
REFUSED_ENV_PREFIXES = ("PYTHON", "LD_", "BASH_FUNC_", "GIT_CONFIG")
REFUSED_ENV_NAMES = (
    "BASH_ENV", "ENV", "BROWSER", "PERL5OPT", "PERL5LIB", "PERLLIB", "NODE_OPTIONS", "RUBYOPT", "RUBYLIB",
    "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "GCONV_PATH", "GLIBC_TUNABLES", "LOCPATH", "NLSPATH",
    "PATH", "IFS", "PS4", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND", "CDPATH", "HOSTALIASES", "LOCALDOMAIN",
    "RES_OPTIONS", "HOME", "ZDOTDIR", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH")
ALLOW_ENV_OPTION = "--allow-env"


def refused_env_name(name: str) -> bool:
    """Whether `name` changes how an interpreter, a shell or the loader starts (REFUSED_ENV_*)."""
    return name in REFUSED_ENV_NAMES or name.startswith(REFUSED_ENV_PREFIXES)


def parse_allow_env(text: str) -> tuple[str, ...]:
    """`--allow-env NAME,...` (commas or spaces between names): the names, each a variable name."""
    names = tuple(n for n in re.split(r"[,\s]+", text or "") if n)
    for name in names:
        if not is_variable_name(name) or len(name) > 128:
            raise ck.refuse(ALLOW_ENV_OPTION, name, "environment variable names, e.g. --allow-env PYTHONHASHSEED")
    return names


def check_env(env: Mapping[str, str], allow: Iterable[str] = (), setting: str = "--env") -> tuple[tuple[str, str], ...]:
    """The ranks' environment checked: names are variable names, not set by the launch itself and, unless
    `allow` names them, not REFUSED_ENV_*; values are one line. Returned as pairs in the given order."""
    allowed = set(allow)
    for name, value in env.items():
        if not isinstance(name, str) or not is_variable_name(name) or len(name) > 128:
            raise ck.refuse(setting, name, "NAME=VALUE with a variable name (letters, digits, _)")
        if name in RESERVED_VARIABLES:
            raise RequestError(f"{setting}: {name} is set by the launch itself; allowed: any other variable")
        if refused_env_name(name) and name not in allowed:
            raise RequestError(f"{setting}: {name} changes how an interpreter, a shell or the loader starts on every "
                               f"node, so it is refused; allowed: other names, or name it in {ALLOW_ENV_OPTION} "
                               f"{name} if you mean it")
        ck.line(f"{setting} {name}", value, optional=False)
    return tuple((str(k), str(v)) for k, v in env.items())
