"""The operator-graph IR and the registry of operator kinds."""

from symtensor.graph.analysis import full_attention_ratio, grad_operands, layer_repeat, model_flops, requires_grad
from symtensor.graph.ir import DTYPE_BYTES, Graph, Op, Tensor, rescale_dim
from symtensor.graph.kinds import (
    KINDS,
    attention_span,
    kind_of,
    op_fwd_flops,
    op_model_flops,
    op_no_cut,
    op_saved_activations,
    op_saves,
)

__all__ = ["full_attention_ratio", "grad_operands", "layer_repeat", "model_flops", "requires_grad", "DTYPE_BYTES",
           "Graph", "Op", "Tensor", "rescale_dim", "KINDS", "attention_span", "kind_of", "op_fwd_flops",
           "op_model_flops", "op_no_cut", "op_saved_activations", "op_saves"]
