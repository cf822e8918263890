"""`fab train`'s and `fab k8s-job`'s options made from JobOptions' declaration (`job_task`), your own program
(`own_program`) and `fab train`'s request (`train_request`) from them, with what needs this machine."""

from __future__ import annotations

import functools
import inspect
from dataclasses import fields
from pathlib import Path
from typing import Any, Callable

from cluster.inventory import Inventory
from cluster.job import request as rq
from cluster.job.train_options import DURATION, GROUPS, SAME, Cli, JobOptions, kind_of
from node_setup.tasks.common import Unset, duration_or_off, given, task

TRAIN, K8S = "train", "k8s-job"


def _default(cli: Cli, kind: Any, default: Any, which: str) -> Any:
    """invoke's default, also giving the option its kind (Unset carries it where leaving it out means something)."""
    if which == K8S and cli.k8s_default is not None:
        return cli.k8s_default
    if default is not None or kind is bool:
        return default
    if kind is str:
        return ""
    return Unset(duration_or_off if cli.kind == DURATION else cli.kind or kind, cli.unset)


def job_task(which: str, own: dict[str, tuple[Any, Cli]]) -> Callable:
    """`fab train` (TRAIN) or `fab k8s-job` (K8S) from its body `body(c, options: JobOptions, **own)`: JobOptions'
    fields it takes and its `own` (name -> (default, Cli)), each with its help, group and job-file path kind."""
    shared = {f.name: (f.default, f.metadata["cli"]) for f in fields(JobOptions) if "cli" in f.metadata
              and (which == TRAIN or f.metadata["cli"].k8s is not None)}
    declared = {**shared, **own}

    def define(body: Callable) -> Any:
        @functools.wraps(body)
        def run(c, **values: Any) -> Any:
            mine = {name: values.pop(name) for name in own}
            return body(c, JobOptions.of({n: (v if given(v) else None) for n, v in values.items()}), **mine)

        parameters = [inspect.Parameter("c", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        helps: dict[str, str] = {}
        groups: dict[str, list[str]] = {title: [] for title in GROUPS}
        paths: dict[str, list[str]] = {"path": [], "maybe": []}
        for name, (default, cli) in declared.items():
            kind = kind_of(name) if name in shared else type(default)
            parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                                default=_default(cli, kind, default, which)))
            dashed = name.replace("_", "-")
            helps[dashed] = cli.help if which == TRAIN or cli.k8s in (None, SAME) else cli.k8s
            groups.setdefault(cli.group, []).append(dashed)
            if cli.path:
                paths[cli.path].append(name)
        run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        made = task(help=helps)(run)
        made.option_groups = {title: tuple(names) for title, names in groups.items() if names}
        made.job_file_paths, made.job_file_maybe_paths = tuple(paths["path"]), tuple(paths["maybe"])
        return made

    return define


def own_program(options: JobOptions | dict[str, Any], profile: str) -> rq.OwnProgram | None:
    """--script/--module with their options, checked on this machine (the files, the workdir's scan, the
    requirements for the nodes' `profile`); None without them. RequestError (or UserJobError): one line."""
    from cluster.job import userjob
    from cluster.node.profiles import get_profile
    from node_setup.ssh.workdir import scan

    o = JobOptions.of(options)
    script, module = o.script or "", o.module or ""
    if not (script or module):
        return None
    if script and module:
        raise rq.RequestError(f"--module: {module!r} given with --script {script!r}; allowed: one of them")
    words = userjob.split_args(f"{o.args or ''} {o.extra or ''}")
    signal = userjob.notice_signal(o.notice_signal or "")
    workdir = o.workdir or ""
    path = Path(script).expanduser()
    if script and not path.is_file():
        raise rq.RequestError(f"--script: {script!r} is not a file on this machine; allowed: the path of your training "
                              "script")
    if module:
        userjob.check_module(module)
    root = Path(workdir).expanduser() if workdir else path.parent if script else Path.cwd()
    if not root.is_dir():
        raise rq.RequestError(f"--workdir: {workdir!r} is not a folder on this machine")
    limit_mb = int(o.workdir_limit_mb or userjob.DEFAULT_WORKDIR_LIMIT_MB)
    rel = userjob.script_in_workdir(str(path.resolve()), str(root.resolve())) if script else None
    copy = scan(root, limit_mb * 1024 * 1024)
    install = None
    requirements = o.requirements or ""
    if requirements:
        req_path = Path(requirements).expanduser()
        if not req_path.is_file():
            raise rq.RequestError(f"--requirements: {requirements!r} is not a file on this machine")
        install = userjob.parse_requirements(req_path.read_text(errors="replace"), requirements,
                                             get_profile(profile))
    return rq.OwnProgram(script=rel, module=module or None, args=tuple(words), signal=signal,
                         workdir=str(root.resolve()), workdir_limit_mb=limit_mb, requirements=requirements or None,
                         resume_arg=o.resume_arg or "", independent_ranks=bool(o.independent_ranks), copy=copy,
                         install=install)


def train_request(options: JobOptions, inventory: Inventory, *, run_id: str) -> tuple[rq.RunRequest, list[str]]:
    """fab train's run request and the lines to print (the calibration's note, the layout, the compile decision)."""
    from node_setup import calibrations
    from node_setup.backends import backend_for
    from cluster.job.train_options import request_from_options

    own = own_program(options, inventory.profile)
    cal, note = calibrations.for_cluster(inventory.name)
    idle_s = backend_for(inventory.kind).default_idle_stop(inventory)

    def local_file(path: str) -> str | None:
        here = Path(path).expanduser()
        return str(here.resolve()) if here.is_file() else None

    request, lines = request_from_options(options, inventory, run_id=run_id, own=own, calibration=cal,
                                          local_file=local_file, idle_stop_s=idle_s)
    return request, [line for line in (note, *lines) if line]
