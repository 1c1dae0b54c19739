"""Alpha-beta collectives on a hierarchical cluster.

A group spans some mesh axes; per level h it has ``n_h`` members (the product of its axes on that
level). NCCL runs one ring through the whole group (a double binary tree for all-reduce across
nodes), pipelining its chunks through every level: each level pays its own latency per step, and
the bandwidth term is that of the slowest level for the data that crosses it (Hockney model, spec
section 2.1). Inter-node bandwidth is per GPU: each GPU has its own NIC (rail-optimised DGX
fabrics), so a ring across nodes moves 1/n_inner of the data over each NIC. With ``m`` bytes,
``p`` members, latency alpha and inverse achievable bandwidth
beta = 1 / (link bandwidth x link efficiency), per level:

    all_reduce      2 (p-1) alpha + 2 (p-1)/p m beta        m = the buffer
    all_gather        (p-1) alpha +   (p-1)/p m beta        m = the gathered result
    reduce_scatter    (p-1) alpha +   (p-1)/p m beta        m = the input
    all_to_all        (p-1) alpha +   (p-1)/p m beta        m = the per-device buffer
    send/recv              alpha  +           m beta

An outer level moves ``m`` over the product of the inner members (the inner members carry
distinct parts of the buffer over their own NICs); all-reduce across nodes pays a tree's
2 ceil(log2 p) alpha rather than the ring's 2 (p-1) alpha. All-gather and reduce-scatter run one
ring through all ``n`` members: n - 1 steps, of which those between members of one node pay the
intra-node latency and the others the network's (NCCL's model, src/graph/tuning.cc
``ncclTopoTuneModel``: ring latency ``(nsteps - nInterSteps) * intraLat + nInterSteps *
interLat``, nsteps = nRanks - 1, nInterSteps = nNodes - 1): a level's (p - 1) steps are taken
once per member of the levels outside it, so a ring of 1,024 ranks over 128 nodes pays 896
NVLink steps and 127 network steps, where 8 ranks inside one node pay 7; all-to-all sends the
share of the buffer destined beyond each level at that level's bandwidth. A level where the group
has one member costs nothing, so a group of size 1 moves no bytes. Formulas use plain arithmetic
and work on sympy symbols too.
"""

from __future__ import annotations

from symtensor.hardware.efficiency import KINDS


def level_counts(axes, mesh, n_levels: int) -> list[int]:
    """Members of a group per level (innermost first) for a group spanning ``axes`` of ``mesh``."""
    counts = [1] * n_levels
    for a in axes:
        ax = mesh[a]
        counts[ax.level] *= ax.size
    return counts


def collective_time(kind: str, nbytes, counts, levels, link_eff=1.0):
    """Seconds for one collective of ``nbytes`` over a group with ``counts`` members per level.

    NCCL runs one ring (a double binary tree for inter-node all-reduce) through the whole group,
    its chunks pipelined through every level at once: each level pays its latency per step, and
    the slowest level's transfer bounds the bandwidth term (not the sum of the levels'; that
    would be a two-phase hierarchical algorithm, which NCCL does not use for these kinds)."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind}")
    latency = 0
    transfer = 0
    inner = 1  # product of the members of the levels inside this one
    group = 1
    for c in counts:
        group *= c
    ring = kind in ("all_gather", "reduce_scatter")
    for i, (level, p) in enumerate(zip(levels, counts)):
        if p == 1:
            continue
        alpha = level.latency
        measured = getattr(level, "link_efficiency", ())
        beta = 1 / (level.bandwidth * (dict(measured).get(kind, link_eff) if measured else link_eff))
        if kind == "all_reduce":
            m = nbytes / inner
            steps = 2 * (p - 1) if i == 0 else 2 * min(p - 1, _ceil_log2(p))  # tree across nodes
            latency += steps * alpha
            here = 2 * (p - 1) / p * m * beta
        elif ring:
            m = nbytes / inner
            latency += (p - 1) * (group // (inner * p)) * alpha  # once per member of the levels outside
            here = (p - 1) / p * m * beta
        elif kind == "all_to_all":
            # the share of the buffer that leaves the inner groups but stays inside this level
            share = (inner * p - inner) / group
            latency += (p - 1) * alpha
            here = share * nbytes * beta
        else:  # send_recv between two members of this level
            latency += alpha
            here = nbytes * beta
        transfer = _larger(transfer, here)
        inner *= p
    return latency + transfer


def _ceil_log2(p) -> int:
    return max(1, (int(p) - 1).bit_length())


def _larger(a, b):
    """max() that also works on sympy expressions (the formulas of ``symtensor explain``)."""
    try:
        return a if a >= b else b
    except TypeError:
        import sympy

        return sympy.Max(a, b)
