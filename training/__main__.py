"""`python -m training [arguments]`: the distributed training job (training/train.py)."""

import sys

from training.train import main

sys.exit(main())
