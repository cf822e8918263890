"""Exit codes of `python -m training` (no torch import: the launcher side reads these too).

`fab train` turns INTERRUPTED into "spot capacity was reclaimed; run `fab train --resume`".
"""

OK = 0
FAILED = 1  # an unexpected error; the failing rank printed its traceback
BAD_INPUT = 2  # bad arguments, data, tokenizer or environment; rank 0 printed one message
INTERRUPTED = 75  # spot interruption notice: checkpoint taken (summary.json says where), rerun with --resume
