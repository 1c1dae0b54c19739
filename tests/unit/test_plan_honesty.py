"""Plans you can trust (issue 14): the search costs only layouts the plan loader accepts (one
legality rule, linked and carried dims included), the summary says when a plan is heterogeneous
and what differs, and the exports refuse what their engine cannot run."""

from __future__ import annotations

import pytest

from symtensor import api
from symtensor.errors import PlanError
from symtensor.hardware import load_cluster
from symtensor.layout import refusal
from symtensor.plan import load_plan, save_plan
from symtensor.models import load_model_config
from symtensor.search import megatron_plan

# A small MoE whose expert capacity c = ceil(1.25 * 3 * 4096 / 7) = 2195 is odd: no sequence or
# context cut of the tokens carries to it.
ODD_CAPACITY = ["experts=7", "top_k=3", "capacity_factor=1.25", "layers=2", "hidden=512", "heads=8", "kv_heads=8",
                "ffn=1024", "vocab=32000"]


def test_megatron_layouts_refuse_a_capacity_their_sequence_cut_does_not_divide():
    """tp=4 with sequence parallelism carries the dispatch's cut of s to the capacity c=2195: the
    Megatron layouts were built unchecked, so the grid and the seeds costed them."""
    cfg = load_model_config("tiny-mixtral", ODD_CAPACITY)
    with pytest.raises(PlanError, match=r"tp=4 .*sequence parallelism: op layers\.0\.dispatch: linked dim c=2195"):
        megatron_plan(cfg, load_cluster("dgx-a100-80g", devices=32), tp=4, dp=8, sp=True, global_batch=8,
                      seq=4096)


def test_a_searched_moe_plan_reloads(tmp_path):
    """The search wrote plans its own loader refused ("op layers.0.dispatch: linked dim c=2195 is
    not divisible by its cut 4"): the Megatron seed tp=4 sp cut the odd capacity."""
    p = api.plan("tiny-mixtral", "dgx-a100-80g", devices=32, global_batch=8, seq=4096, overrides=ODD_CAPACITY)
    ops = {op.name: op for op in p.graph.ops}
    assert all(refusal(ops[n], lay, p.mesh) is None for n, lay in p.op_layouts().items())
    save_plan(p, tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").layouts == p.layouts
