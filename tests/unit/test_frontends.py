"""Frontends without torch: the dim table the capture unifies tensor dims with, and importing the frontends
does not import torch. (The captures themselves, torch.export of PyTorch / Hugging Face models into the IR:
tests/integration/test_frontends_capture.py.)
"""

import subprocess
import sys

from symtensor.frontends.dims import DimTable


# -- dims: no torch ---------------------------------------------------------------------------------
def test_regroup_splits_and_merges_atoms():
    t = DimTable()
    b, s, h = t.new(2), t.new(16), t.new(4096)
    split = t.regroup(((b,), (s,), (h,)), (2, 16, 32, 128))
    assert [t.sizes(axis) for axis in split] == [(2,), (16,), (32,), (128,)]
    assert t.leaves(h) == split[2] + split[3]  # h itself now stands for n, d
    merged = t.regroup(split, (32, 4096))
    assert merged == ((b, s), split[2] + split[3])


def test_regroup_refuses_views_that_cut_no_dim_evenly():
    t = DimTable()
    assert t.regroup(((t.new(6),), (t.new(4),)), (4, 6)) is None


def test_unify_refuses_dims_held_by_one_tensor():
    """``P @ V`` contracts the key sequence ``t``; unifying it with ``s`` would give the scores
    ``[b, n, s, t]`` the same dim twice."""
    t = DimTable()
    s, key = t.new(16), t.new(16)
    t.mark_apart([s, key])
    assert t.unify([s], [key]) == [(s, key)]
    other = t.new(16)
    assert t.unify([s], [other]) == [] and t.find(other) == t.find(s)


def test_importing_frontends_does_not_import_torch():
    code = "import sys, symtensor.frontends; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
