"""SymTensor: symbolic and adaptive tensor partitioning for distributed training.

The library is usable without torch and without the CLI:

    >>> from symtensor.models import build_model
    >>> g = build_model("llama2-7b", micro_batch=1, seq=4096)
    >>> round(g.params_total() / 1e9, 2)
    6.74
"""

from symtensor.errors import PlanError

__all__ = ["PlanError"]
__version__ = "0.1.0"
