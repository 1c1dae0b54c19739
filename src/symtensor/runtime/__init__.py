"""Execute a parallel layout on PyTorch's distributed stack under torchrun, and check it.

``spec`` (RunSpec, pure data) -> ``apply`` (DeviceMesh, DTensor, fully_shard, pipelining) on the
model of ``torch_models`` -> ``worker`` (the torchrun entry point, counting collective bytes with
``commcount``) <- ``launch.run_spec`` (launch, compare with one process).

Importing this package does not import torch; ``apply``, ``commcount``, ``torch_models`` and
``worker`` do.
"""

from symtensor.runtime.launch import run_spec
from symtensor.runtime.spec import ATTN_TP, MLP_TP, MODULE_KEYS, STYLES, VOCAB_TP, RunSpec, check_fits

__all__ = ["ATTN_TP", "MLP_TP", "MODULE_KEYS", "STYLES", "VOCAB_TP", "RunSpec", "check_fits", "run_spec"]
