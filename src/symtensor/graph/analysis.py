"""Facts derived from a graph alone: which tensors get gradients, FLOPs in the MFU convention."""

from __future__ import annotations

from symtensor.graph.ir import Graph
from symtensor.graph.kinds import op_model_flops


def requires_grad(graph: Graph) -> set[str]:
    """Tensors whose gradient backward computes: trainable parameters and what depends on them."""
    req = {t.name for t in graph.tensors.values() if t.param and t.trainable}
    for op in graph.ops:
        if any(t in req for t in op.inputs):
            req.update(op.outputs)
    return req


def grad_operands(graph: Graph, req: set[str] | None = None) -> dict[str, int]:
    """Per op, the operands of its contraction (the first two inputs; a bias adds no matmul) whose
    gradient backward computes."""
    req = requires_grad(graph) if req is None else req
    return {op.name: sum(1 for t in op.inputs[:2] if t in req) for op in graph.ops}


def model_flops(graph: Graph, operands: dict[str, int] | None = None, causal_halved: bool = True) -> float:
    """Forward + backward FLOPs of one micro-step in the MFU convention (no recomputation):
    6 N tokens + attention terms, causal attention halved as Megatron-LM counts it (megatron/training/
    training.py ``num_floating_point_operations``: "causal mask (only half of the mask is non-zero)")
    (``causal_halved=False``: in full, ``full_attention_ratio``). ``operands``: ``grad_operands(graph)``
    when the caller has it."""
    ops = grad_operands(graph) if operands is None else operands
    return sum(op_model_flops(op, ops[op.name], causal_halved) * layer_repeat(graph, op.layer) for op in graph.ops)


def full_attention_ratio(graph: Graph, operands: dict[str, int] | None = None) -> float:
    """How many times the halved count (``model_flops``) the FLOPs are when causal attention is counted in
    full, 12 L H Q T per token: the convention of PaLM, Korthikanti et al. 2022, torchtitan ("we follow the
    convention and do not account for sparsity in causal attention", pytorch/torchtitan@b5bcd76
    torchtitan/models/utils.py ``get_dense_model_nparams_and_flops``) and llm-foundry (``attn_flops_per_seq
    = n_layers * 2 * 2 * (d_model * (seq_len**2))``, mosaicml/llm-foundry scripts/train/benchmarking/
    README.md). An MFU published in that convention is this times the one ``model_flops`` gives."""
    ops = grad_operands(graph) if operands is None else operands
    return model_flops(graph, ops, causal_halved=False) / model_flops(graph, ops)


def layer_repeat(graph: Graph, layer: int) -> int:
    """How many real layers the ops of ``layer`` stand for (1 except in skeleton graphs)."""
    return graph.meta.get("repeat", {}).get(layer, 1)
