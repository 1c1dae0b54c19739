"""The cost terms as formulas: sympy expressions of dim sizes, cut factors and hardware constants.

The cost model's formulas are plain arithmetic (graph/kinds.py, cost/collectives.py), so calling
them with sympy symbols instead of numbers returns the expression the model evaluates. Symbols:

    b s t h n g d f v e c r   the op's dim sizes (graph/ir.py legend)
    p_<dim>                   how many ways the layout cuts that dim (a product of mesh axes)
    P                         peak FLOP/s of the device for the dtype
    eta_<kind>, eta_<kind>_bwd  achievable fraction of P for the op's forward and backward kernels (the
                              measured kernel tables at the op's local shape: cost.opcost.op_rates)
    K                         the GEMM knee in FLOPs: a kernel of F FLOPs runs at eta * F / (F + K)
                              (0 when GEMMs are costed from the tables)
    G                         idle seconds per op kernel (EndToEnd.kernel_gap_s)
    H, eta_hbm                HBM bytes/s and its achievable fraction
    m                         a collective's message bytes (collectives.py conventions)
    alpha_<level>, B_<level>  latency (s) and bandwidth (bytes/s per device) of a link level
    eta_link                  achievable fraction of link bandwidth for the collective kind
    S_fp8, C_fwd, C_bwd       under FP8 (FP4), a GEMM's speedup over BF16 and its casts' bytes (cost/precision.py)

Each formula comes with its value with the plan's numbers substituted, which equals what the cost
model computes (tests hold them together).
"""

from __future__ import annotations

from types import SimpleNamespace

import sympy as sp

from symtensor.cost.collectives import collective_time, level_counts
from symtensor.cost.engine import ENGINES
from symtensor.cost.opcost import hbm_fraction, local_sizes, loss_saved_bytes, memory_multiples, op_rates
from symtensor.cost.precision import RECIPES, cast_bytes, fp8_gemm, gemm_speedup
from symtensor.cost.stack_kernels import op_facts
from symtensor.graph import DTYPE_BYTES, kind_of
from symtensor.layout import OpLayout, cut_factor, linked_layout

_EFF_FIELD = {"linear": "gemm", "bmm": "bmm", "attention": "attention"}


def _sym(name: str) -> sp.Symbol:
    return sp.Symbol(name, positive=True)


def _value(expr, values: dict) -> float:
    return float(sp.sympify(expr).xreplace({_sym(k): sp.Float(v) for k, v in values.items()}))


class _Roofline:
    """max(flops time, bytes time) kept as its two branches: sympy's Max over symbols that are
    merely positive spends seconds trying to order them."""

    def __init__(self, *branches, add=0):
        self.branches, self.add = branches, add

    def text(self) -> str:
        parts = [str(b) for b in self.branches]
        core = parts[0] if len(parts) == 1 else f"Max({', '.join(parts)})"
        return f"{core} + {self.add}" if self.add != 0 else core

    def value(self, values: dict) -> float:
        return max(_value(b, values) for b in self.branches) + (_value(self.add, values) if self.add != 0 else 0.0)


def _local_sizes(op, layout: OpLayout, mesh, values: dict) -> dict:
    """Symbolic local dim sizes, d / p_d for cut dims; fills ``values`` with the numbers."""
    full = linked_layout(op, layout)
    sizes = {}
    for d, n in op.dims:
        values[d] = n
        f = cut_factor(full, d, mesh)
        if f > 1:
            values[f"p_{d}"] = f
            sizes[d] = _sym(d) / _sym(f"p_{d}")
        else:
            sizes[d] = _sym(d)
    return sizes


def compute_formula(ev, op, layout: OpLayout, fp8: str | None = None, stack=None) -> dict:
    """Forward FLOPs and forward / backward seconds of the op's local piece (opcost.op_time's roofline);
    ``fp8``: the plan's FP8 recipe (``TrainConfig.fp8``), None in BF16; ``stack``: its stack's facts (the loss
    and elementwise kernels, ``Stack``)."""
    kind = kind_of(op.kind)
    values: dict = {}
    sizes = _local_sizes(op, layout, ev.mesh, values)
    flops = kind.fwd_flops(sizes, dict(op.attrs))
    nbytes = 0
    for t, dims in zip(op.inputs + op.outputs, op.in_dims + op.out_dims):
        term = DTYPE_BYTES[ev.tensors[t].dtype]
        for d in dims:
            term = term * sizes[d]
        nbytes = nbytes + term
    eta = f"eta_{_EFF_FIELD.get(op.kind, 'gemm')}"
    local = local_sizes(op, layout, ev.mesh)
    gap = ev.eff.end_to_end.kernel_gap_s
    values.update(P=ev.cluster.device.flops(ev.dtype), H=ev.cluster.device.hbm_bandwidth,
                  eta_hbm=hbm_fraction(op, ev.eff), K=0.0 if ev.eff.tabled("gemm") else ev.eff.gemm_knee, G=gap)
    hbm_time = nbytes / (_sym("H") * _sym("eta_hbm"))
    g = _sym("G") if gap and op.kind != "reshape" else sp.Integer(0)
    casts = fp8 is not None and fp8_gemm(op)
    if casts:  # an FP8 GEMM: its measured speedup, and its casts as memory-bound time (cost.precision)
        values["S_fp8"] = gemm_speedup(op, local, ev.cluster.device, RECIPES[fp8])
        values["C_fwd"], values["C_bwd"] = cast_bytes(op, local, RECIPES[fp8], ENGINES[ev.framework].pytorch_kernels)
    loss, elementwise, attention = op_facts(op.kind, kind.memory_bound, stack)
    if kind.memory_bound:  # the bytes its kernels move (opcost.memory_multiples)
        fwd_times, bwd_times = (sp.nsimplify(m) for m in memory_multiples(op, ev.eff, loss, elementwise))
        fwd = _Roofline(fwd_times * hbm_time, add=g)
        bwd = _Roofline(bwd_times * hbm_time, add=g) if kind.bwd_fixed else _Roofline(sp.Integer(0))
        bwd_flops = sp.Integer(0)
    else:
        grads = ev.grad_operands[op.name]
        ratio = sp.nsimplify(kind.bwd_fixed if kind.bwd_ratio is None else kind.bwd_ratio * grads)
        bwd_flops = flops * ratio
        fwd_eta, bwd_eta = op_rates(op, local, ev.eff, grads, ev.dtype, kind.fwd_flops(local, dict(op.attrs)), False,
                                    attention)
        values.update({eta: fwd_eta, f"{eta}_bwd": bwd_eta})
        bwd_kernels = grads if kind.bwd_ratio is not None else (1 if kind.bwd_fixed else 0)
        run, run_bwd = (flops / _sym("S_fp8"), bwd_flops / _sym("S_fp8")) if casts else (flops, bwd_flops)
        cast_fwd = _sym("C_fwd") / (_sym("H") * _sym("eta_hbm")) if casts else 0
        cast_bwd = _sym("C_bwd") / (_sym("H") * _sym("eta_hbm")) if casts else 0
        fwd = _Roofline((run + _sym("K")) / (_sym("P") * _sym(eta)), hbm_time, add=g + cast_fwd)
        bwd = _Roofline((run_bwd + _sym("K") * ratio) / (_sym("P") * _sym(f"{eta}_bwd")), 2 * hbm_time,
                        add=g * bwd_kernels + cast_bwd) if ratio else _Roofline(sp.Integer(0))
    return {"fwd_flops": str(flops), "bwd_flops": str(bwd_flops), "bytes": str(nbytes),
            "fwd_time_s": fwd.text(), "bwd_time_s": bwd.text(),
            "value_fwd_s": fwd.value(values), "value_bwd_s": bwd.value(values),
            "value_fwd_flops": _value(flops, values), "symbols": values}


def collective_formula(ev, kind: str, nbytes: float, axes) -> dict:
    """Seconds of one collective of ``nbytes`` over the group spanning mesh ``axes`` (collective_time)."""
    counts = level_counts(axes, ev.mesh, len(ev.levels))
    levels = [SimpleNamespace(latency=_sym(f"alpha_{lv.name}"), bandwidth=_sym(f"B_{lv.name}")) for lv in ev.levels]
    # sympy integers keep (p-1)/p exact in the printed formula
    expr = collective_time(kind, _sym("m"), [sp.Integer(c) for c in counts], levels, _sym("eta_link"))
    values = {"m": nbytes, "eta_link": ev.eff.link_for(kind)}
    for lv, c in zip(ev.levels, counts):
        if c > 1:
            values.update({f"alpha_{lv.name}": lv.latency, f"B_{lv.name}": lv.bandwidth})
    group = {lv.name: c for lv, c in zip(ev.levels, counts) if c > 1}
    return {"kind": kind, "group": group, "formula": str(expr), "value_s": _value(expr, values),
            "symbols": values}


def memory_formula(ev, op, layout: OpLayout, fp8: str | None = None, framework: str | None = None,
                   loss: str | None = None) -> dict:
    """Bytes of the op's saved activations per micro-batch on one device (before recomputation);
    under ``fp8`` an FP8 GEMM keeps its inputs' FP8 copies (``Recipe.saved_fraction`` of the bytes); under
    ``framework`` (an engine name) the MoE combine keeps what that engine keeps (``cost.moe.saved_scale``)."""
    from symtensor.cost.engine import ENGINES
    from symtensor.cost.moe import saved_scale
    from symtensor.graph import op_saved_activations

    values: dict = {}
    sizes = _local_sizes(op, layout, ev.mesh, values)
    expr = sp.Integer(0)
    for io, idx, tname in op_saved_activations(op, ev.tensors):
        keeps = saved_scale(op, io, idx, ENGINES[framework]) if framework is not None else 1.0
        if not keeps:
            continue
        dims = op.in_dims[idx] if io == "in" else op.out_dims[idx]
        term = sp.Integer(DTYPE_BYTES[ev.tensors[tname].dtype]) * sp.nsimplify(keeps)
        if fp8 is not None and io == "in" and fp8_gemm(op):
            term = term * sp.nsimplify(RECIPES[fp8].saved_fraction)
        for d in dims:
            term = term * sizes[d]
        expr = expr + term
    if kind_of(op.kind).extra_saved_bytes is not None:
        expr = expr + loss_saved_bytes(op, sizes, loss)
    return {"saved_bytes": str(expr), "value_bytes": _value(expr, values), "symbols": values}
