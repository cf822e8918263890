"""`python -m training [arguments]`: the distributed training job (training/train.py)."""

import sys

# Line-buffered output: MPI launchers label ranks' output chunk by chunk, so a block-buffered
# rank would get lines split between labels.
sys.stdout.reconfigure(line_buffering=True)
sys.stderr.reconfigure(line_buffering=True)

from training.train import main  # noqa: E402

sys.exit(main())
