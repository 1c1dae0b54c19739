"""``symtensor profile``: measure this cluster's curves once, write them as a cluster file.

    grid      what is measured: shapes, sizes, time budgets per device class (pure data)
    worker    the torchrun entry point: times the grid (torch), rank 0 writes the file
    fit       one saturating law rate(x) = a x / (x + knee) through every measured table
    document  measurements -> cluster document (the preset schema) and back: residuals per point
    run       the request's checks and the local torchrun launch

Importing this package does not import torch; ``worker`` does.
"""

from symtensor.profile.document import build, curves, measured_tables, read, write
from symtensor.profile.run import profile

__all__ = ["build", "curves", "measured_tables", "profile", "read", "write"]
