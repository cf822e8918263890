"""Arguments after `--` on a `fab` command line go to the training program, not to a shell.

Fabric reads `fab TASK ... -- WORDS` as "run WORDS on the hosts given with -H", and without -H it
stops with a traceback. The project's `fabric.yaml` (and the `xeon-cluster` command) use this
executor instead: WORDS are added to `--extra` of a task that has that option (`fab train`), and
any other task stops with one line and exit code 2. Only with -H does Fabric's own behaviour apply.

A node that cannot be reached while a task runs (no answer, refused, authentication, a changed
host key) ends the task with one line naming the host and what to check, and exit code 3, never
paramiko's traceback: every task that connects gets this from here. So does a controller key store
that cannot be used (node_setup/ssh/keys.py's KeyStoreError: only one half of the cluster key there, a
key directory inside the checkout): one line saying what to do, exit code 2.

A task with a `file` option (`fab train -f job.yaml`) takes its options from that YAML mapping
(cluster/job/jobfile.py decides, by the kinds invoke reports for the task's options): what was given
on the command line wins, what the file sets replaces the defaults, before the remainder after
`--` is added to `--extra`. A file may not set `file` itself, nor `allow-env` (which lifts the refusal
of start-up-changing --env names: only a person on the command line may do that).
"""

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
    options = {name: jobfile.Option(a.kind, a.default) for name, a in arguments.items()}
    try:
        resolved = jobfile.resolve(options, data, given=given, folder=str(file.resolve().parent), where=path,
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
