"""Capture any ``nn.Module`` into the IR with ``torch.export`` (strict=False) on fake tensors.

Pipeline: export the forward -> find constants and patterns (``patterns``) -> walk the FX graph
once, mapping each ATen op (``aten_map``, ``aten_nn``) and naming dims (``dims``) -> emit a
validated :class:`~symtensor.graph.Graph`. torch is imported here, lazily, and nowhere else in
the package outside ``frontends/``.
"""

from __future__ import annotations

from collections import Counter

from symtensor.errors import PlanError
from symtensor.frontends import aten_nn
from symtensor.frontends.aten_map import (
    HANDLERS,
    VIEW_KEYS,
    _has_tensor,
    lower_node,
    op_key,
)
from symtensor.frontends.lower import Lowering, TensorRec, Val, ir_dtype, static_shape
from symtensor.frontends.patterns import (
    find_gated,
    find_gelu_tanh,
    find_log_softmax_nll,
    find_rms_norms,
    find_rope,
    live_nodes,
)
from symtensor.graph import Graph

FUSED_HANDLERS = {"rmsnorm": aten_nn.fused_rms_norm, "cross_entropy": aten_nn.fused_cross_entropy,
                  "elementwise": aten_nn.fused_elementwise}


def import_torch():
    """torch, or a PlanError saying how to install the optional extra."""
    try:
        import torch
    except ImportError:
        raise PlanError("capturing a PyTorch module needs torch: pip install 'symtensor[torch]'") from None
    return torch


def capture_module(module, example_inputs, name: str | None = None, fake: bool = True) -> Graph:
    """The operator graph of ``module``'s forward on ``example_inputs``, as the IR.

    Args:
        module: a ``torch.nn.Module`` (its parameters may live on the meta device).
        example_inputs: a tensor, a tuple of positional inputs, or a dict of keyword inputs
            (``{"input_ids": ids, "labels": labels}``).
        name: the graph's name (default: the module's class name).
        fake: export under a ``FakeTensorMode`` fed with fake copies of the inputs, so nothing
            real is allocated or computed; with False the inputs are exported as given.

    Returns:
        A validated Graph; ``meta`` holds ``micro_batch``, ``seq``, ``layers``, ``inputs``,
        ``constants``, ``folded_ops`` and ``generic_ops``. Unmapped ATen ops become ``generic``
        ops listed in one :class:`~symtensor.frontends.CaptureWarning`.

    Example:
        >>> import torch
        >>> g = capture_module(torch.nn.Linear(8, 4), (torch.randn(2, 8),))
        >>> [op.kind for op in g.ops]
        ['linear']
    """
    torch = import_torch()
    if not isinstance(module, torch.nn.Module):
        raise PlanError(f"capture_module needs a torch.nn.Module, got {type(module).__name__}")
    args, kwargs = _split_inputs(torch, example_inputs)
    name = name or type(module).__name__
    program = _export(torch, module, args, kwargs, fake, name)
    return lower_program(program, module, name)


def _split_inputs(torch, example_inputs):
    if isinstance(example_inputs, dict):
        return (), dict(example_inputs)
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,), {}
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    raise PlanError(f"example_inputs must be a tensor, a tuple of inputs or a dict of keyword inputs, "
                    f"got {type(example_inputs).__name__}")


def _export(torch, module, args, kwargs, fake: bool, name: str):
    """``torch.export.export(strict=False)``; with ``fake`` inside a FakeTensorMode fed fake inputs
    (export then fakes the parameters in the same mode, so real weights are never read)."""
    try:
        if not fake:
            return torch.export.export(module, args, kwargs, strict=False)
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True)

        def to_fake(x):
            return mode.from_tensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) else x

        args = tuple(to_fake(a) for a in args)
        kwargs = {k: to_fake(v) for k, v in kwargs.items()}
        with mode:
            return torch.export.export(module, args, kwargs, strict=False)
    except PlanError:
        raise
    except Exception as exc:  # torch raises many types; the user needs the cause in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise PlanError(f"torch.export could not capture {name}: {type(exc).__name__}: {first[:300]}. "
                        "Check that the example inputs run the forward, and that the forward has no "
                        "data-dependent control flow") from exc


# -- the walk -------------------------------------------------------------------------------------
def lower_program(program, module, name: str) -> Graph:
    """Map an ``ExportedProgram`` of ``module`` to the IR (see the module docstring)."""
    lw = Lowering(name)
    graph = program.graph
    roots = _placeholders(lw, program, module)
    lw.live = live_nodes(graph, roots)
    params = {n for n in roots if lw.is_param(lw.val(n))}
    fused, absorbed = find_rms_norms(graph, lambda n: n in params and len(n.meta["val"].shape) == 1)
    for find in (find_log_softmax_nll, find_gated, find_rope, find_gelu_tanh):
        more, more_absorbed = find(graph)
        fused.update((k, v) for k, v in more.items() if k not in absorbed)
        absorbed |= more_absorbed
    for node in graph.nodes:
        if node.op != "call_function" or node in absorbed:
            continue
        if node not in lw.live:
            _fold(lw, node)
        elif node in fused:
            FUSED_HANDLERS[fused[node].kind](lw, node, fused[node])
        else:
            lower_node(lw, node)
    _hint_ffn(lw)
    return lw.graph(_meta(lw, module))


def _placeholders(lw: Lowering, program, module) -> list:
    """IR tensors for parameters, user inputs and constants; returns the live roots."""
    specs = {spec.arg.name: spec for spec in program.graph_signature.input_specs if hasattr(spec.arg, "name")}
    named = dict(module.named_parameters(remove_duplicate=False))
    ties = _tie_groups(module)
    roots = []
    for node in program.graph.nodes:
        if node.op != "placeholder":
            continue
        spec = specs.get(node.name)
        kind = spec.kind.name if spec is not None else "USER_INPUT"
        if not _has_tensor(node.meta.get("val")):
            lw.vals[node] = None
        elif kind == "PARAMETER":
            _param(lw, node, spec.target, named, ties)
            roots.append(node)
        elif kind == "USER_INPUT":
            _user_input(lw, node)
            roots.append(node)
        else:  # buffers and lifted constants are folded
            _constant(lw, node)
    return roots


def _tie_groups(module) -> dict[str, str]:
    """For parameters reachable under several names (tied embeddings), name -> first name."""
    first, groups = {}, {}
    for fqn, p in module.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), fqn)
        groups.setdefault(id(p), []).append(fqn)
    return {fqn: first[key] for key, names in groups.items() if len(names) > 1 for fqn in names}


def _param(lw: Lowering, node, fqn: str, named: dict, ties: dict) -> None:
    value = node.meta["val"]
    tie = ties.get(fqn)
    partner = next((t for t in lw.tensors.values() if tie is not None and t.tie == tie), None)
    axes = tuple((a,) for a in partner.atoms) if partner is not None else lw.fresh_axes(static_shape(value), True)
    param = named.get(fqn)
    trainable = bool(param.requires_grad) if param is not None else True
    lw.param_shapes[fqn] = static_shape(value)
    lw.vals[node] = lw.new_tensor(fqn, axes, static_shape(value), ir_dtype(value.dtype), role="param",
                                  trainable=trainable, tie=tie, order=partner.order if partner else None)


def _user_input(lw: Lowering, node) -> None:
    """A graph input; the first integer ``[b, s]`` input (token ids) names ``b`` and ``s``."""
    value = node.meta["val"]
    shape = static_shape(value)
    axes = lw.fresh_axes(shape, keep_ones=True)
    lw.vals[node] = lw.new_tensor(node.name, axes, shape, ir_dtype(value.dtype), role="input")
    if lw.batch_atom is not None and not value.dtype.is_floating_point and shape == lw.token_shape:
        lw.dims.unify(lw.token_atoms, [a[0] for a in axes])  # labels, masks: per token, as the ids
        return
    if lw.batch_atom is not None or not shape:
        return
    integer = not value.dtype.is_floating_point
    legend = {2: ("b", "s") if integer else ("b", "h"), 3: ("b", "s", "h")}.get(len(shape), ("b",))
    for axis, letter in zip(axes, legend):
        lw.dims.hint(axis[0], letter, 10 if integer else 4)
    lw.batch_atom = axes[0][0]
    if integer:
        lw.token_shape, lw.token_atoms = shape, [a[0] for a in axes]


def _constant(lw: Lowering, node, index=None) -> Val:
    value = node.meta["val"] if index is None else node.meta["val"][index]
    shape = static_shape(value)
    name = f"const.{node.name}" if index is None else f"const.{node.name}.{index}"
    return lw.new_tensor(name, lw.fresh_axes(shape), shape, ir_dtype(value.dtype), role="const")


def _fold(lw: Lowering, node) -> None:
    """A node that reads no input or parameter: views stay views, anything else becomes a constant."""
    key = op_key(node)
    value = node.meta.get("val")
    if not _has_tensor(value):
        lw.vals[node] = None
        return
    if key in VIEW_KEYS and lw.vals.get(node.args[0]) is not None:
        emitted = len(lw.ops)
        HANDLERS[key](lw, node)
        if len(lw.ops) == emitted:
            return
        del lw.ops[emitted:]  # a view that needed a data movement: fold it like any constant
    lw.folded[key] += 1
    if isinstance(value, (tuple, list)):
        lw.vals[node] = tuple(_constant(lw, node, i) if _has_tensor(v) else None for i, v in enumerate(value))
    else:
        lw.vals[node] = _constant(lw, node)


def _hint_ffn(lw: Lowering) -> None:
    """Unnamed dims produced by one weight and contracted by another are feed-forward dims ``f``."""
    dims = lw.dims
    contracted = {leaf for k, _ in lw.linears for leaf in dims.leaves_of(k)}
    for _, out in lw.linears:
        for leaf in dims.leaves_of(out):
            if leaf in contracted and dims.hint_of(leaf) is None:
                dims.hint(leaf, "f", 3)


def _meta(lw: Lowering, module) -> dict:
    inputs = [t for t in lw.tensors.values() if t.role == "input"]
    tokens = next((t for t in inputs if t.dtype in ("int64", "int32") and len(t.atoms) == 2), None)
    first = tokens or (inputs[0] if inputs else None)
    shape = [lw.size(a) for a in first.atoms] if first is not None else []
    dtypes = Counter(t.dtype for t in lw.tensors.values() if t.role == "param")
    return {"source": "torch.export", "module": type(module).__name__,
            "micro_batch": shape[0] if shape else None, "seq": shape[1] if len(shape) > 1 else None,
            "dtype": dtypes.most_common(1)[0][0] if dtypes else "fp32",
            "folded_ops": dict(lw.folded), "generic_ops": dict(lw.unmapped),
            # IR parameters keep the module's names but are stored [input dims, output dims] with
            # views folded (q_proj.weight [n*d, h] -> [h, n, d]); export needs torch's shapes
            "torch_param_shapes": dict(lw.param_shapes)}


__all__ = ["TensorRec", "capture_module", "import_torch", "lower_program"]
