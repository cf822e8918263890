"""Arguments after `--` on a `fab` command line go to the training program, not to a shell.

Fabric reads `fab TASK ... -- WORDS` as "run WORDS on the hosts given with -H", and without -H it
stops with a traceback. The project's `fabric.yaml` (and the `xeon-cluster` command) use this
executor instead: WORDS are added to `--extra` of a task that has that option (`fab train`), and
any other task stops with one line and exit code 2. Only with -H does Fabric's own behaviour apply.
"""

from __future__ import annotations

from fabric.executor import Executor as FabricExecutor

from node_setup.tasks.common import fail

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
