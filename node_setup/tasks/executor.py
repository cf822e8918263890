"""Arguments after `--` on a `fab` command line go to the training program, not to a shell.

Fabric reads `fab TASK ... -- WORDS` as "run WORDS on the hosts given with -H", and without -H it
stops with a traceback. The project's `fabric.yaml` (and the `xeon-cluster` command) use this
executor instead: WORDS are added to `--extra` of a task that has that option (`fab train`), and
any other task stops with one line and exit code 2. Only with -H does Fabric's own behaviour apply.

A node that cannot be reached while a task runs (no answer, refused, authentication, a changed
host key) ends the task with one line naming the host and what to check, and exit code 3, never
paramiko's traceback: every task that connects gets this from here.
"""

from __future__ import annotations

from fabric.executor import Executor as FabricExecutor

from node_setup.tasks.common import UNREACHABLE, fail

EXTRA_OPTION = "extra"


class Executor(FabricExecutor):
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

            line = explain_opening(exc)
            if line is None:
                raise
            raise fail(line, UNREACHABLE) from None
