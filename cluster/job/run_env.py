"""Which environment variables a run may give its ranks (pure): names that change how an interpreter, a
shell, the dynamic loader, a TLS library, an MPI fabric, OpenMP or a compiler driver starts are refused
unless --allow-env names them (on the command line only); the launch's own are refused; values are one
line. Used by the run request (cluster/job/request.py), `fab k8s-job`
(cluster/job/k8s.py) and a resumed run's new values (node_setup/tasks/managed.py)."""

from __future__ import annotations

import re
from typing import Iterable, Mapping

from cluster.job import checks as ck
from cluster.job.checks import RequestError
from cluster.job.launch import RESERVED_VARIABLES, is_variable_name

# Environment names that change how an interpreter, a shell, the dynamic loader, a TLS library, an MPI
# fabric, OpenMP or a compiler driver starts (what runs or is loaded before the program's first line, or
# instead of it): refused in --env (fab train, fab k8s-job, a job file, a run spec) unless --allow-env
# names them on the command line (a job file may not set allow-env: cluster/job/jobfile.py's `refused`).
# Each source below is the documentation the names come from; tests/unit/test_run_env.py holds a test
# per source. TMPDIR is allowed although glibc's list names it: it moves where temporary files go (a
# larger disk is a common reason to set it) and starts nothing.
REFUSED_ENV_SOURCES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    # source: (names, name prefixes)
    # python(1), "ENVIRONMENT VARIABLES": every PYTHON* (PYTHONSTARTUP, PYTHONPATH, PYTHONHOME, ...)
    "Python (python(1) ENVIRONMENT VARIABLES)": ((), ("PYTHON",)),
    # bash(1) "Shell Variables", "FUNCTIONS" (exported BASH_FUNC_name%%), dash(1) ENV; the search path itself
    "the shell (bash(1) Shell Variables, dash(1) ENV)": (
        ("BASH_ENV", "ENV", "PATH", "IFS", "PS4", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND", "CDPATH", "HOME",
         "ZDOTDIR"), ("BASH_FUNC_",)),
    # ld.so(8) ENVIRONMENT (every LD_*) and glibc's sysdeps/generic/unsecvars.h, the names the loader
    # clears for a setuid program (TMPDIR aside, see above)
    "the dynamic loader (ld.so(8), glibc unsecvars.h)": (
        ("GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE",
         "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR"), ("LD_",)),
    # openssl-env(7): the configuration (a provider or engine `module=` runs its constructor at load,
    # e.g. at Python's `import hashlib`), the modules' and engines' folders
    "a TLS library (openssl-env(7))": (
        ("OPENSSL_CONF", "OPENSSL_CONF_INCLUDE", "OPENSSL_MODULES", "OPENSSL_ENGINES"), ()),
    # fi(7) of libfabric (FI_PROVIDER_PATH: where providers are loaded from) and Intel MPI's reference
    # (I_MPI_OFI_LIBRARY: the libfabric loaded; I_MPI_HYDRA_BOOTSTRAP*: what starts the proxies; I_MPI_ROOT)
    "an MPI fabric (libfabric fi(7), Intel MPI environment reference)": (
        ("FI_PROVIDER_PATH", "I_MPI_OFI_LIBRARY", "I_MPI_ROOT", "I_MPI_HYDRA_BOOTSTRAP", "I_MPI_HYDRA_BOOTSTRAP_EXEC",
         "I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", "OPAL_PREFIX", "OMPI_MCA_plm_rsh_agent",
         "OMPI_MCA_mca_base_component_path"), ()),
    # the OpenMP specification, "OMP_TOOL_LIBRARIES" (a tool library loaded at the runtime's start)
    "OpenMP (OpenMP 5 OMP_TOOL_LIBRARIES)": (("OMP_TOOL", "OMP_TOOL_LIBRARIES"), ()),
    # GNU make's implicit variables (the drivers torch's Inductor and cpp_extension run: `$CXX --version`)
    # and GCC's "Environment Variables Affecting GCC" (where the driver finds its programs, libraries, headers)
    "a compiler driver (GNU make implicit variables, GCC environment variables)": (
        ("CC", "CXX", "CPP", "LD", "AS", "AR", "FC", "GCC_EXEC_PREFIX", "COMPILER_PATH", "LIBRARY_PATH", "CPATH",
         "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH"), ()),
    # other interpreters and tools a rank may start: perlrun(1), node(1), ruby(1), the JVM's launcher, git(1)
    "other interpreters (perlrun(1), node(1), ruby(1), java(1), git(1))": (
        ("PERL5OPT", "PERL5LIB", "PERLLIB", "NODE_OPTIONS", "RUBYOPT", "RUBYLIB", "JAVA_TOOL_OPTIONS",
         "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "BROWSER", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_EXEC_PATH"),
        ("GIT_CONFIG",)),
}
ALLOW_ENV_OPTION = "--allow-env"
ALLOW_ENV_KEY = "allow_env"  # the tasks' option name: from the command line only, never a job file


def refused_source(name: str) -> str | None:
    """What `name` changes the start of (a REFUSED_ENV_SOURCES key), or None when it is not refused."""
    for source, (names, prefixes) in REFUSED_ENV_SOURCES.items():
        if name in names or name.startswith(prefixes):
            return source
    return None


def parse_allow_env(text: str) -> tuple[str, ...]:
    """`--allow-env NAME,...` (commas or spaces between names): the names, each a variable name."""
    names = tuple(n for n in re.split(r"[,\s]+", text or "") if n)
    for name in names:
        if not is_variable_name(name) or len(name) > 128:
            raise ck.refuse(ALLOW_ENV_OPTION, name, "environment variable names, e.g. --allow-env PYTHONHASHSEED")
    return names


def check_env(env: Mapping[str, str], allow: Iterable[str] = (), setting: str = "--env") -> tuple[tuple[str, str], ...]:
    """The ranks' environment checked: names are variable names, not set by the launch itself and, unless
    `allow` names them, not REFUSED_ENV_SOURCES'; values are one line. Returned as pairs in the given order."""
    allowed = set(allow)
    for name, value in env.items():
        if not isinstance(name, str) or not is_variable_name(name) or len(name) > 128:
            raise ck.refuse(setting, name, "NAME=VALUE with a variable name (letters, digits, _)")
        if name in RESERVED_VARIABLES:
            raise RequestError(f"{setting}: {name} is set by the launch itself; allowed: any other variable")
        source = refused_source(name)
        if source is not None and name not in allowed:
            raise RequestError(f"{setting}: {name} changes how {source} starts on every node, so it is refused; "
                               f"allowed: other names, or name it in {ALLOW_ENV_OPTION} {name} on the command line "
                               "if you mean it")
        ck.line(f"{setting} {name}", value, optional=False)
    return tuple((str(k), str(v)) for k, v in env.items())
