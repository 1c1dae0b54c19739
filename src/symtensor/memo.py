"""The one memo helper: a table that computes a missing value from its key, once.

Caches in the planner are owned: a table belongs to an object with a lifetime (an evaluator, a
search's ``EvaluatorPool``, a per-op problem) and goes with it; there is no module-level cache.

    >>> squares = Memo(lambda n: n * n)
    >>> squares[12], len(squares)
    (144, 1)

A hit is a plain dict lookup (``table[key]``, in C); only a miss calls Python. Hot loops that
must key a table by a small id while the computation needs the object itself (the search's
per-op tables, keyed by layout uids) write ``table.get`` out instead, and say so.
"""

from __future__ import annotations


class Memo(dict):
    """``memo[key]`` is ``compute(key)``, computed on the first lookup and kept.

    Args:
        compute: a pure function of the key.
        limit: when the table holds this many entries it is cleared before the next one is added
            (0: unbounded; for tables whose keys are not bounded by the graph and the mesh).
    """

    __slots__ = ("compute", "limit")

    def __init__(self, compute, limit: int = 0):
        super().__init__()
        self.compute, self.limit = compute, limit

    def __missing__(self, key):
        if self.limit and len(self) >= self.limit:
            self.clear()
        value = self[key] = self.compute(key)
        return value
