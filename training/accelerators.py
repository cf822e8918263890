"""Intel Extension for PyTorch, applied by the job itself (transformers removed `use_ipex` in 4.57).

Only the `intel` software profile installs IPEX; the stock profile gets bf16 and AMX from oneDNN
in stock PyTorch and skips this.
"""

from __future__ import annotations

import importlib

from training.errors import BadInput

IPEX_MODULE = "intel_extension_for_pytorch"


def load_ipex(mode: str):
    """The imported IPEX module, or None. mode: auto (if it imports), on (required), off."""
    if mode == "off":
        return None
    try:
        return importlib.import_module(IPEX_MODULE)
    except ImportError as exc:
        if mode == "on":
            raise BadInput(f"--use_ipex on: {IPEX_MODULE} does not import here ({exc}); install the "
                           "'intel' software profile or use --use_ipex off") from None
        return None


def optimize(ipex, model, optimizer, *, bf16: bool):
    """ipex.optimize on the model and its optimizer before DDP wraps them; returns both.

    IPEX runs bf16 only on CPUs whose oneDNN kernels support it (hardware.ipex_bf16_support; every
    instance type in cluster/stack/catalog.py has them) and otherwise refuses with an AssertionError,
    which becomes one line naming the way out."""
    import torch

    dtype = torch.bfloat16 if bf16 else torch.float32
    model.train()
    try:
        return ipex.optimize(model, optimizer=optimizer, dtype=dtype)
    except AssertionError as exc:
        if not bf16:
            raise
        raise BadInput(f"--bf16 with IPEX: this CPU cannot run it ({' '.join(str(exc).split())}); "
                       "use --bf16 false or --use_ipex off") from None
