"""TEST DOUBLE of oneccl_bindings_for_pytorch (ccl_test_double).

Like the real package, importing it registers a `ccl` torch.distributed backend; this one creates
a gloo process group underneath and records each creation, so a test can prove that the job
initialised its process group with backend `ccl` when the bindings import.
"""

import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from _record import record  # noqa: E402

__version__ = "0.0+ccl-test-double"


def _create_ccl_test_double(store, rank, size, timeout):
    record(double="ccl", event="create_process_group", rank=rank, size=size)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


dist.Backend.register_backend("ccl", _create_ccl_test_double, devices=["cpu"])
