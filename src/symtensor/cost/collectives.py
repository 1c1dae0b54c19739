"""Alpha-beta collectives on a hierarchical cluster.

A group spans some mesh axes; per level h it has ``n_h`` members (the product of its axes on that
level). The algorithm model is the hierarchical one NCCL uses across nodes (rings or trees inside
each level, levels composed): a collective over a group is the sum of one collective per level,
innermost first, each on the data that is left for that level (Hockney model, spec section 2.1;
the per-level sum PARADISE uses). With ``m`` bytes, ``p`` members, latency alpha and inverse
achievable bandwidth beta = 1 / (link bandwidth x link efficiency):

    all_reduce      2 (p-1) alpha + 2 (p-1)/p m beta        m = the buffer
    all_gather        (p-1) alpha +   (p-1)/p m beta        m = the gathered result
    reduce_scatter    (p-1) alpha +   (p-1)/p m beta        m = the input
    all_to_all        (p-1) alpha +   (p-1)/p m beta        m = the per-device buffer
    send/recv              alpha  +           m beta

Hierarchically, after the inner levels reduce-scatter the buffer, an outer level moves ``m`` over
the product of the inner members; all-to-all sends the share of the buffer destined beyond each
level at that level's bandwidth. A level where the group has one member costs nothing, so a group
of size 1 moves no bytes. Formulas use plain arithmetic and work on sympy symbols too.
"""

from __future__ import annotations

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def level_counts(axes, mesh, n_levels: int) -> list[int]:
    """Members of a group per level (innermost first) for a group spanning ``axes`` of ``mesh``."""
    counts = [1] * n_levels
    for a in axes:
        ax = mesh[a]
        counts[ax.level] *= ax.size
    return counts


def collective_time(kind: str, nbytes, counts, levels, link_eff=1.0):
    """Seconds for one collective of ``nbytes`` over a group with ``counts`` members per level."""
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind}")
    total = 0
    inner = 1  # product of the members of the levels inside this one
    group = 1
    for c in counts:
        group *= c
    for level, p in zip(levels, counts):
        if p == 1:
            continue
        alpha = level.latency
        measured = getattr(level, "link_efficiency", ())
        beta = 1 / (level.bandwidth * (dict(measured).get(kind, link_eff) if measured else link_eff))
        if kind == "all_reduce":
            m = nbytes / inner
            total += 2 * (p - 1) * alpha + 2 * (p - 1) / p * m * beta
        elif kind in ("all_gather", "reduce_scatter"):
            m = nbytes / inner
            total += (p - 1) * alpha + (p - 1) / p * m * beta
        elif kind == "all_to_all":
            # the share of the buffer that leaves the inner groups but stays inside this level
            share = (inner * p - inner) / group
            total += (p - 1) * alpha + share * nbytes * beta
        else:  # send_recv between two members of this level
            total += alpha + nbytes * beta
        inner *= p
    return total


def wire_bytes(kind: str, nbytes, group: int):
    """Bytes one device sends for a collective (ring/pairwise algorithms), for reporting."""
    if group <= 1:
        return 0
    if kind == "all_reduce":
        return 2 * (group - 1) / group * nbytes
    if kind == "send_recv":
        return nbytes
    return (group - 1) / group * nbytes
