"""TEST DOUBLE of intel_extension_for_pytorch (ipex_test_double).

`optimize` records how the job called it (dtype, optimizer type, train mode, rank) and returns
the model and optimizer unchanged, as the real one returns its optimised pair.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _record import record  # noqa: E402

__version__ = "0.0+ipex-test-double"


def optimize(model, dtype=None, optimizer=None, **kwargs):
    record(double="ipex", event="optimize", rank=int(os.environ.get("RANK", "0")), dtype=str(dtype),
           optimizer=type(optimizer).__name__ if optimizer is not None else None,
           model=type(model).__name__, training=bool(model.training), kwargs=sorted(kwargs))
    return (model, optimizer) if optimizer is not None else model
