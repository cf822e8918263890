"""`python -m training [arguments]`: the distributed training job (training/train.py).

The process ends with os._exit once main() has returned and the output is flushed: by then the
job's work is done (summary written, process group destroyed), and a library's C++ thread torn
down during interpreter exit ("terminate called without an active exception", seen about once in
twenty multi-rank runs after a clean finish) could otherwise turn the job's exit code into an
abort that mpirun reports as a failure.
"""

import logging
import os
import sys

# Line-buffered output: MPI launchers label ranks' output chunk by chunk, so a block-buffered
# rank would get lines split between labels.
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)

from training.train import main  # noqa: E402

code = main()
logging.shutdown()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
