"""Plots of a plan as inline SVG strings (matplotlib, no pyplot state): the HTML report embeds them.

    breakdown_plot   step-time components of the plan and each baseline, stacked bars
    memory_plot      memory per device by part, against the device's capacity and usable memory
    layout_map       per layer and op position, the parallel degrees of the plan's cuts
    sweep_plot       step time (stacked components) and memory across a sweep, breakpoints marked

Text stays text (``svg.fonttype = none``), so the page is small and searchable, and each figure
gets its own id salt, so several figures share one page without clashing ids.
"""

from __future__ import annotations

import io

import matplotlib
import matplotlib.patches
from matplotlib.figure import Figure

from symtensor.hardware import MEMORY_HEADROOM

# one color per step-time component and memory part, the same in every plot
COMPONENT_COLORS = {"compute": "#4e79a7", "recompute": "#a0cbe8", "tp_comm": "#f28e2b", "cp_comm": "#ffbe7d",
                    "ep_comm": "#59a14f", "dp_comm": "#e15759", "pp_comm": "#b07aa1", "pp_bubble": "#d4a6c8",
                    "optimizer": "#9c755f"}
MEMORY_COLORS = {"params": "#4e79a7", "grads": "#f28e2b", "optimizer": "#e15759", "activations": "#59a14f",
                 "recompute_transient": "#b6992d"}
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
           "#bab0ac", "#86bcb6", "#d37295")


def to_svg(fig: Figure, name: str) -> str:
    """The figure as an ``<svg>`` element (the XML prologue dropped), ids salted by ``name``."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _stacked_barh(ax, labels, rows, colors: dict, scale: float = 1.0) -> None:
    """Horizontal stacked bars: ``rows`` is a list of {component: value} in ``labels`` order."""
    keys = [k for k in colors if any(r.get(k, 0) > 0 for r in rows)]
    keys += sorted({k for r in rows for k, v in r.items() if v > 0 and k not in colors})
    left = [0.0] * len(rows)
    for i, k in enumerate(keys):
        vals = [r.get(k, 0.0) * scale for r in rows]
        ax.barh(labels, vals, left=left, color=colors.get(k, PALETTE[i % len(PALETTE)]), label=k, height=0.6)
        left = [a + b for a, b in zip(left, vals)]
    ax.invert_yaxis()


def breakdown_plot(entries: list[dict]) -> str:
    """``entries``: [{"label", "breakdown": {component: s}, "step_time_s", "fits"}], plan first."""
    fig = Figure(figsize=(9, 0.55 * len(entries) + 1.6))
    ax = fig.subplots()
    labels = [e["label"] + ("" if e["fits"] else " (does not fit)") for e in entries]
    _stacked_barh(ax, labels, [e["breakdown"] for e in entries], COMPONENT_COLORS)
    for i, e in enumerate(entries):
        ax.text(e["step_time_s"], i, f" {e['step_time_s']:.3f} s", va="center", fontsize=9)
    ax.set_xlabel("seconds per training step")
    ax.set_title("Step time by component: SymTensor plan vs baselines (same cost model)")
    ax.set_xlim(0, max(e["step_time_s"] for e in entries) * 1.18)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8, ncols=5, frameon=False)
    return to_svg(fig, "breakdown")


def memory_plot(entries: list[dict], capacity_gib: float, usable_gib: float) -> str:
    """``entries``: [{"label", "memory_gib": {part: GiB}, "memory_gib_per_device"}], plan first."""
    fig = Figure(figsize=(9, 0.55 * len(entries) + 1.6))
    ax = fig.subplots()
    labels = [e["label"] for e in entries]
    parts = [{k: v for k, v in e["memory_gib"].items() if k in MEMORY_COLORS} for e in entries]
    _stacked_barh(ax, labels, parts, MEMORY_COLORS)
    ax.axvline(capacity_gib, color="black", lw=1.5, label=f"capacity {capacity_gib:.0f} GiB")
    ax.axvline(usable_gib, color="black", lw=1, ls="--", label=f"usable {usable_gib:.0f} GiB")
    for i, e in enumerate(entries):
        ax.text(e["memory_gib_per_device"], i, f" {e['memory_gib_per_device']:.1f}", va="center", fontsize=9)
    ax.set_xlabel("GiB per device (peak stage)")
    ax.set_title("Memory per device vs capacity")
    ax.set_xlim(0, max([capacity_gib] + [e["memory_gib_per_device"] for e in entries]) * 1.15)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), fontsize=8, ncols=4, frameon=False)
    return to_svg(fig, "memory")


def _span(text: str, layers: int) -> list[int]:
    """Column indices of a layer span: embedding 0, layer i -> i + 1, head -> layers + 1."""
    if text == "embedding":
        return [0]
    if text == "head":
        return [layers + 1]
    lo, _, hi = text.partition("-")
    return list(range(int(lo) + 1, int(hi or lo) + 2))


def degree_label(row: dict) -> str:
    parts = [f"{k}{row[k]}" for k in ("dp", "tp", "cp", "ep") if row.get(k, 1) > 1]
    dims = ",".join(sorted(row["cuts"]))
    return (" ".join(parts) or "replicated") + (f" ({dims})" if dims else "")


def layout_map(layer_types: list[dict], layers: int) -> str:
    """A grid of op positions (rows) by layers (columns), colored by each op's parallel degrees."""
    blocks = list(dict.fromkeys(r["block"] for r in layer_types))
    labels = list(dict.fromkeys(degree_label(r) for r in layer_types))
    color = {lab: PALETTE[i % len(PALETTE)] for i, lab in enumerate(labels)}
    fig = Figure(figsize=(min(16, 3 + 0.22 * (layers + 2)), 0.3 * len(blocks) + 2.2))
    ax = fig.subplots()
    for r in layer_types:
        y = blocks.index(r["block"])
        for x in _span(r["layers"], layers):
            ax.add_patch(matplotlib.patches.Rectangle((x, y), 0.92, 0.85, color=color[degree_label(r)]))
    ax.set_xlim(-0.2, layers + 2.2)
    ax.set_ylim(len(blocks), -0.2)
    ax.set_yticks([i + 0.42 for i in range(len(blocks))], blocks, fontsize=8)
    step = max(1, (layers + 2) // 16)
    ticks = list(range(0, layers + 2, step))
    ax.set_xticks([t + 0.46 for t in ticks], ["emb" if t == 0 else "head" if t == layers + 1 else str(t - 1)
                                              for t in ticks], fontsize=8)
    ax.set_xlabel("layer")
    ax.set_title("Per-layer layout map: parallel degrees of each op (cut dims)")
    handles = [matplotlib.patches.Patch(color=color[lab], label=lab) for lab in labels]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncols=min(3, len(labels)),
              fontsize=8, frameon=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return to_svg(fig, "layout-map")


def sweep_plot(sweep: dict) -> str:
    """Step time (stacked components) and memory per device across a sweep; breakpoints dashed."""
    pts = [p for p in sweep["points"] if "error" not in p]
    xs = [p["value"] for p in pts]
    fig = Figure(figsize=(12, 4.6))
    ax1, ax2 = fig.subplots(1, 2)
    keys = [k for k in COMPONENT_COLORS if any(p["breakdown"].get(k, 0) > 0 for p in pts)]
    ax1.stackplot(xs, [[p["breakdown"].get(k, 0.0) for p in pts] for k in keys], labels=keys,
                  colors=[COMPONENT_COLORS[k] for k in keys], alpha=0.9)
    ax1.plot(xs, [p["step_time_s"] for p in pts], "k.-", lw=1, label="step time")
    ax1.set_ylabel("seconds per step")
    ax1.set_title("Step time across the sweep")
    ax1.legend(fontsize=7, loc="upper left")
    ax2.plot(xs, [p["memory_gib_per_device"] for p in pts], "o-", color="#59a14f", label="memory per device")
    ax2.axhline(pts[0]["capacity_gib"], color="black", lw=1.5, label="capacity")
    ax2.axhline(MEMORY_HEADROOM * pts[0]["capacity_gib"], color="black", lw=1, ls="--", label="usable")
    ax2.set_ylabel("GiB per device")
    ax2.set_ylim(0, max(pts[0]["capacity_gib"], max(p["memory_gib_per_device"] for p in pts)) * 1.12)
    ax2.set_title("Memory across the sweep")
    ax2.legend(fontsize=7, loc="lower right")
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs, [str(x) for x in xs], fontsize=8, rotation=30)
        ax.set_xlabel(sweep["param"])
        for b in sweep["breakpoints"]:
            x = (b["between"][0] * b["between"][1]) ** 0.5
            ax.axvline(x, color="#555555", ls=":", lw=1)
    top = ax1.get_ylim()[1]
    for p in pts:
        ax1.annotate(p["layout"], (p["value"], p["step_time_s"]), textcoords="offset points", xytext=(0, 6),
                     ha="center", fontsize=6.5, rotation=20)
    ax1.set_ylim(0, top * 1.15)
    fig.suptitle(f"{sweep['model']} on {sweep['cluster']}: plans across {sweep['param']} "
                 f"(dotted lines: breakpoints)", fontsize=11)
    return to_svg(fig, "sweep")
