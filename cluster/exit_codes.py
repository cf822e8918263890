"""Exit codes, written once: the training job's (`python -m training`), the ones `fab` adds, and what the
job script, the log stream and the supervisor read. Standard library only: every layer imports it.

`fab train` passes the job's own code through and turns INTERRUPTED into "spot capacity was reclaimed;
run `fab train --resume`".
"""

OK = 0
FAILED = 1  # an unexpected error; the failing rank printed its traceback
BAD_INPUT = 2  # bad arguments, data, tokenizer or environment; rank 0 printed one message
UNREACHABLE = 3  # fab: a node could not be reached or prepared
INTERRUPTED = 75  # spot interruption notice: checkpoint taken (summary.json says where), rerun with --resume
CTRL_C = 130  # fab: interrupted with Ctrl-C
STOPPED = 143  # 128 + SIGTERM: the job was ended by `fab stop`
