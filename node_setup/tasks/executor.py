"""The project's executor: words after `--` go to a task's `--extra` (Fabric's run-on-hosts only with -H), `-f
job.yaml` sets a task's options (not `file` nor `allow-env`), an unreachable node or bad key store is one line."""

from __future__ import annotations

from pathlib import Path

from fabric.executor import Executor as FabricExecutor
from invoke.parser import ParserContext

from node_setup.tasks.common import UNREACHABLE, CheckedArgument, fail

EXTRA_OPTION = "extra"
FILE_OPTION = "file"  # a task's option naming its job file (fab train -f job.yaml)


def job_file_kwargs(context: ParserContext, task) -> dict:
    """The options the task's job file sets (none given on the command line), or exit 2 with one line."""
    import yaml

    from cluster.job import jobfile
    from cluster.job.run_env import ALLOW_ENV_KEY

    arguments = {a.name: a for a in set(context.args.values())}
    given = {name for name, a in arguments.items() if a.got_value}
    path = arguments[FILE_OPTION].value
    if not path:
        return {}
    file = Path(path).expanduser()
    try:
        data = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise fail(f"--{FILE_OPTION}: {path!r} cannot be read ({exc.strerror or exc}); allowed: a YAML job "
                   f"file") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}" if where is not None else ""
        raise fail(f"--{FILE_OPTION}: {path!r} is not YAML{at}; allowed: a mapping such as `nodes: 4`") from None
    try:
        resolved = jobfile.resolve({name: a.kind for name, a in arguments.items()}, data, given=given,
                                   folder=str(file.resolve().parent), where=path,
                                   paths=getattr(task, "job_file_paths", ()),
                                   maybe_paths=getattr(task, "job_file_maybe_paths", ()),
                                   exists=lambda p: Path(p).expanduser().is_file(),
                                   refused=(FILE_OPTION, ALLOW_ENV_KEY))
    except jobfile.JobFileError as exc:
        raise fail(str(exc)) from None
    for name, value in resolved.items():  # the command line's checks: a count's range, a duration's unit
        if isinstance(arguments[name], CheckedArgument):
            arguments[name].set_value(value)
            resolved[name] = arguments[name].value
    return resolved


class Executor(FabricExecutor):
    def normalize(self, tasks):
        calls = super().normalize(tasks)
        for context, call in zip(tasks, calls):
            if isinstance(context, ParserContext) and FILE_OPTION in call.kwargs:
                call.kwargs.update(job_file_kwargs(context, call.task))
        return calls

    def expand_calls(self, calls, apply_hosts=True):
        words = self.core.remainder
        if words and apply_hosts and not self.core[0].args.hosts.value:
            takers = [c for c in calls if EXTRA_OPTION in c.kwargs]
            if not takers:
                names = ", ".join(c.task.name for c in calls) or "no task"
                raise fail(f"`-- {words}`: {names} takes no arguments after `--`; "
                           "see `fab --help <task>` for its options")
            for call in takers:
                call.kwargs[EXTRA_OPTION] = f"{call.kwargs[EXTRA_OPTION]} {words}".strip()
            self.core.remainder = ""
        return super().expand_calls(calls, apply_hosts)

    def execute(self, *tasks):
        try:
            return super().execute(*tasks)
        except Exception as exc:
            from node_setup.ssh.connections import explain_opening
            from node_setup.ssh.keys import KeyStoreError

            if isinstance(exc, KeyStoreError):
                raise fail(str(exc)) from None
            line = explain_opening(exc)
            if line is None:
                raise
            raise fail(line, UNREACHABLE) from None
