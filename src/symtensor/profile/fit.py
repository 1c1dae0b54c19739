"""Curves through the measurements of ``symtensor profile``: one saturating law for every table.

Every measured point is some work (FLOPs, bytes, bus bytes) done in some seconds at a size ``x``.
Its rate follows ``rate(x) = a * x / (x + knee)``: a small kernel or message pays a fixed cost
(launch, wave quantisation, latency) worth ``knee`` units of size, a large one runs at ``a``.

    table        x               work                         a, knee in the cluster file
    gemm         FLOPs 2MNK      FLOPs                        gemm * peak, gemm_knee
    bmm          FLOPs           FLOPs                        bmm * peak, (gemm_knee)
    attention    key tokens      FLOPs as the kernel runs     attention(_bwd) * peak, attention_knee
                                 them (4bhs^2d, causal halved; backward 2.5x)
    memory       bytes           bytes (inputs + outputs)     hbm * HBM bandwidth, (none)
    collectives  message bytes   bus bytes (nccl-tests)       (see below)

The collective row is the alpha-beta cost of ``symtensor.cost.collectives`` rewritten: over ``p``
members of one level a collective takes ``t = c_a * latency + c_b * m / B`` (B = bandwidth x link
efficiency; ``alpha_beta`` asks ``collective_time`` for c_a and c_b), and its bus bandwidth
``F * m / t`` (F = ``BUS_FACTOR``) is ``a * m / (m + knee)`` with ``a = F * B / c_b`` and
``knee = c_a * latency * a / F`` (a ring within a node: c_a / F = p).

Fits minimise the squared *relative* error of the rates (points span orders of magnitude): for a
given knee, ``a`` has a closed form; the knee is the best of a log-spaced scan, refined by golden
section. A ``Curve`` holds the points and the constants, so the fit's residuals and ``symtensor
calibrate --cluster`` (the file's constants against its own measurements) are one computation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# bus bytes per message byte for p members (nccl-tests' busbw convention, cost.collectives' sizes)
BUS_FACTOR = {"all_reduce": lambda p: 2 * (p - 1) / p, "all_gather": lambda p: (p - 1) / p,
              "reduce_scatter": lambda p: (p - 1) / p, "all_to_all": lambda p: (p - 1) / p}
KNEE_STEPS = 400  # knee candidates, log-spaced from 1e-3 of the smallest size to 10x the largest
GOLDEN, GOLDEN_STEPS = (5**0.5 - 1) / 2, 30  # then a golden-section refinement around the best


@dataclass(frozen=True, slots=True)
class Point:
    """One measurement: ``work`` units done in ``seconds`` at size ``x``."""

    label: str
    x: float
    work: float
    seconds: float

    @property
    def rate(self) -> float:
        return self.work / self.seconds


@dataclass(frozen=True, slots=True)
class Curve:
    """``rate(x) = a * x / (x + knee)`` through ``points``; ``unit`` names the rate (FLOP/s, B/s)."""

    name: str
    unit: str
    points: tuple[Point, ...]
    a: float
    knee: float

    def rate(self, x: float) -> float:
        return self.a * x / (x + self.knee)

    def predicted_s(self, p: Point) -> float:
        return p.work / self.rate(p.x)

    def errors(self) -> list[float]:
        """Per point: predicted seconds / measured seconds - 1."""
        return [self.predicted_s(p) / p.seconds - 1 for p in self.points]

    def summary(self) -> dict:
        errs = [abs(e) for e in self.errors()]
        return {"curve": self.name, "n": len(errs), "a": self.a, "knee": self.knee, "unit": self.unit,
                "mean_abs_error": sum(errs) / len(errs), "max_abs_error": max(errs)}


def _best_a(points, knee: float) -> tuple[float, float]:
    """The ``a`` minimising sum((a u_i / y_i - 1)^2), u_i = x_i / (x_i + knee), and that sum."""
    us = [p.x / (p.x + knee) / p.rate for p in points]
    a = sum(us) / sum(u * u for u in us)
    return a, sum((a * u - 1) ** 2 for u in us)


def fit_curve(name: str, unit: str, points: list[Point], knee: float | None = None) -> Curve:
    """The least-relative-squares curve; ``knee`` fixed when given (0: a constant rate).

    Example:
        >>> pts = [Point(str(x), x, x, (x + 100) / 5e3) for x in (10, 100, 1000, 1e4)]
        >>> c = fit_curve("toy", "1/s", pts)
        >>> round(c.a), round(c.knee)
        (5000, 100)
    """
    assert points, name
    if knee is not None:
        return Curve(name, unit, tuple(points), _best_a(points, knee)[0], knee)
    lo, hi = min(p.x for p in points) * 1e-3, max(p.x for p in points) * 10
    candidates = [0.0] + [lo * (hi / lo) ** (i / (KNEE_STEPS - 1)) for i in range(KNEE_STEPS)]
    i = min(range(len(candidates)), key=lambda j: _best_a(points, candidates[j])[1])
    best = candidates[i]
    if i >= 1:  # refine between the neighbours by golden section on log(knee)
        a, b = math.log(candidates[max(i - 1, 1)]), math.log(candidates[min(i + 1, len(candidates) - 1)])
        for _ in range(GOLDEN_STEPS):
            c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
            if _best_a(points, math.exp(c))[1] < _best_a(points, math.exp(d))[1]:
                b = d
            else:
                a = c
        best = min((best, math.exp((a + b) / 2)), key=lambda k: _best_a(points, k)[1])
    return Curve(name, unit, tuple(points), _best_a(points, best)[0], best)


def alpha_beta(kind: str, p: int, level: int) -> tuple[float, float]:
    """(c_a, c_b) of ``cost.collectives.collective_time`` for ``p`` members of level ``level``
    (0: within a node) and no other: t = c_a * latency + c_b * bytes / bandwidth."""
    from symtensor.cost.collectives import collective_time
    from symtensor.hardware import Level

    counts = [1] * level + [p]

    def levels(latency: float) -> list:
        return [Level(name=f"level{i}", fanout=0, bandwidth=1.0, latency=latency) for i in range(level + 1)]

    return collective_time(kind, 0.0, counts, levels(1.0)), collective_time(kind, 1.0, counts, levels(0.0))


def gemm_points(rows: list[dict]) -> list[Point]:
    return [Point(f"{r['m']}x{r['n']}x{r['k']}", 2 * r["m"] * r["n"] * r["k"], 2 * r["m"] * r["n"] * r["k"],
                  r["seconds"]) for r in rows]


def bmm_points(rows: list[dict]) -> list[Point]:
    out = []
    for r in rows:
        flops = 2 * r["batch"] * r["m"] * r["n"] * r["k"]
        out.append(Point(f"{r['batch']}x{r['m']}x{r['n']}x{r['k']}", flops, flops, r["seconds"]))
    return out


def attention_flops(r: dict) -> float:
    """Forward FLOPs as a fused kernel runs them: QK^T and PV, causal kernels skip the masked half
    (graph.kinds counts the same; the backward runs 2.5x these)."""
    return 4 * r["batch"] * r["heads"] * r["seq"] ** 2 * r["head_dim"] * (0.5 if r["causal"] else 1)


def attention_points(rows: list[dict], backward: bool, gemm_knee: float = 0.0) -> list[Point]:
    """Points whose rate is ``attention(_bwd) * peak * seq / (seq + attention_knee)``: the cost model
    (``cost.opcost``) charges an attention kernel ``(FLOPs + gemm_knee) / rate`` at a rate that also
    scales with its head-dim factor, so the work is divided by that factor."""
    from types import SimpleNamespace

    from symtensor.cost.opcost import attention_shape_factor

    no_seq = SimpleNamespace(attention_knee=0.0)  # the head-dim part of the shape factor alone
    key, times = ("bwd_seconds", 2.5) if backward else ("fwd_seconds", 1.0)
    out = []
    for r in rows:
        head_dim = attention_shape_factor({"t": r["seq"], "d": r["head_dim"]}, no_seq)
        work = (attention_flops(r) + gemm_knee) * times / head_dim
        out.append(Point(f"s{r['seq']} d{r['head_dim']}{' causal' if r['causal'] else ''}", r["seq"], work, r[key]))
    return out


def memory_points(rows: list[dict]) -> list[Point]:
    return [Point(f"{r['kernel']} {r['elements']}", r["bytes"], r["bytes"], r["seconds"]) for r in rows]


def collective_points(kind: str, group: int, rows: list[dict]) -> list[Point]:
    factor = BUS_FACTOR[kind](group)
    return [Point(f"{r['bytes']} B", r["bytes"], r["bytes"] * factor, r["seconds"]) for r in rows]


def median(values) -> float:
    v = sorted(values)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2
