"""The report's figures, drawn with matplotlib (Agg) and returned as SVG text.

Text stays text (``svg.fonttype = none``) so the page is searchable and small, and ids are
salted deterministically (``svg.hashsalt``) so the same plan gives the same file.

Sizes are chosen for a phone: the page scales every figure down to its column (about 350 CSS px
on a 390 px screen), so a figure ``FIG_WIDTH_IN`` wide (≈ 360 pt of SVG user space) with text no
smaller than ``MIN_FONT_PT`` keeps its text at ≥ 9 CSS px there (10 × 350 / 380 ≈ 9.2);
tests/test_report.py measures it in Chromium. Legends sit under the axes, not beside them, so
they never widen a figure."""

from __future__ import annotations

import io
import math
from typing import Any

from lcmoe.errors import LcmoeError
from lcmoe.report.strings import component_name, say, term_name

GIB = 1024.0**3
FIG_WIDTH_IN = 5.0
MIN_FONT_PT = 10.0
HEADROOM = 1.18  # y-axis top = 118% of the highest of bars and capacity: room for the capacity label
MAX_STAGE_TICKS = 12
CAPACITY_COLOR = "#c0392b"
# Allocated components first (they sum to peak allocated), then the reserved-only ones.
COMPONENTS = (
    ("weights", "#4e79a7"),
    ("weight_copies", "#76b7b2"),
    ("gradients", "#a0cbe8"),
    ("optimizer", "#f28e2b"),
    ("state_overhead", "#ffbe7d"),
    ("activations", "#59a14f"),
    ("logits_loss", "#8cd17d"),
    ("transient", "#b6992d"),
    ("workspace", "#f1ce63"),
    ("cuda_graphs", "#499894"),
    ("fragmentation", "#bab0ac"),
    ("cuda_context", "#d37295"),
    ("nccl_buffers", "#fabfd2"),
    ("dispatcher_buffers", "#b07aa1"),
)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise LcmoeError(
            "report", "matplotlib", "is not installed", "pip install 'lcmoe[report]' (matplotlib draws the plots)"
        ) from None
    matplotlib.use("Agg")
    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",
            "svg.hashsalt": "lcmoe",
            "font.size": MIN_FONT_PT,
            "axes.titlesize": MIN_FONT_PT + 1,
            "axes.labelsize": MIN_FONT_PT,
            "xtick.labelsize": MIN_FONT_PT,
            "ytick.labelsize": MIN_FONT_PT,
            "legend.fontsize": MIN_FONT_PT,
        }
    )
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any) -> str:
    plt = _pyplot()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def _capacity_line(ax: Any, capacity_gib: float) -> None:
    """The GPU's capacity as a dashed line, labelled on the plot just above the line at the
    right (the axis is padded by HEADROOM so line and label are inside)."""
    ax.axhline(capacity_gib, color=CAPACITY_COLOR, linestyle="--", linewidth=1.2)
    ax.annotate(
        say("capacity", gib=capacity_gib),
        xy=(1.0, capacity_gib),
        xycoords=("axes fraction", "data"),
        xytext=(-4, 3),
        textcoords="offset points",
        ha="right",
        va="bottom",
        color=CAPACITY_COLOR,
        bbox={"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8},
    )


def _stage_ticks(count: int) -> list[int]:
    """Every stage when they fit, else every k-th: at most MAX_STAGE_TICKS labels."""
    step = max(1, math.ceil(count / MAX_STAGE_TICKS))
    return list(range(0, count, step))


def memory_by_stage(plan: dict[str, Any], title: str) -> str:
    """Stacked bars: every pipeline stage's memory by component (GiB) against the GPU's capacity."""
    plt = _pyplot()
    stages = plan["memory"]["stages"]
    capacity = plan["memory"]["capacity_bytes"] / GIB
    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, 3.0))
    x = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for name, color in COMPONENTS:
        values = [s["components"].get(name, 0.0) / GIB for s in stages]
        if any(v > 0 for v in values):
            ax.bar(x, values, bottom=bottom, color=color, label=component_name(name), width=0.7)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    _capacity_line(ax, capacity)
    ticks = _stage_ticks(len(stages))
    ax.set_xticks(ticks, [str(stages[i]["stage"]) for i in ticks])
    ax.set_xlabel(say("pipeline_stage"))
    ax.set_ylabel(say("gib_reserved"))
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2, frameon=False)
    ax.set_ylim(0, max(capacity, max(bottom)) * HEADROOM)
    return _svg(fig)


def time_breakdown(plan: dict[str, Any], title: str) -> str:
    """Where one step's seconds go on the critical pipeline stage (the terms sum to the step).
    A term's value is written inside its bar when the bar is long, beside it otherwise."""
    plt = _pyplot()
    items = [(k, v) for k, v in plan["time"]["breakdown"].items() if v > 0]
    items.sort(key=lambda kv: kv[1])
    # Narrower axes: the term names on the left add about 1.5 in to the drawn width.
    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN - 0.8, 0.3 * len(items) + 1.2))
    ax.barh([term_name(k) for k, _ in items], [v for _, v in items], color="#4e79a7")
    step = plan["time"]["step_seconds"]
    longest = max((v for _, v in items), default=1.0)
    for i, (_, v) in enumerate(items):
        label = say("term_value", seconds=v, share=100 * v / step)
        inside = v > 0.55 * longest
        ax.text(
            v,
            i,
            f"{label} " if inside else f" {label}",
            va="center",
            ha="right" if inside else "left",
            color="white" if inside else "#222222",
        )
    ax.set_xlabel(say("seconds_per_step"))
    ax.set_title(title)
    ax.set_xlim(0, longest * 1.05)
    ax.set_ylim(-0.6, len(items) - 0.4)
    return _svg(fig)


def pareto_scatter(points: list[tuple[float, float]], pareto: list[dict[str, Any]], plans: list[dict[str, Any]]) -> str:
    """Every fitting candidate: peak reserved memory against predicted tokens/s/GPU."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(FIG_WIDTH_IN, 3.4))
    ax.scatter(
        [m / GIB for m, _ in points], [t for _, t in points], s=8, color="#bab0ac", label=say("fitting_candidates")
    )
    front = sorted(pareto, key=lambda p: p["peak_reserved_bytes"])
    ax.plot(
        [p["peak_reserved_bytes"] / GIB for p in front],
        [p["tokens_per_sec_per_gpu"] for p in front],
        color="#f28e2b",
        marker="o",
        markersize=3,
        label=say("pareto_front"),
    )
    span_x = (max((m for m, _ in points), default=1.0) - min((m for m, _ in points), default=0.0)) / GIB or 1.0
    span_y = max((t for _, t in points), default=1.0) or 1.0
    # Plans often sit within a label's width of each other: one label ("3,4,5") per such group.
    groups: list[tuple[float, float, list[str]]] = []
    for i, plan in enumerate(plans):
        x, y = plan["memory"]["peak_reserved_bytes"] / GIB, plan["time"]["tokens_per_sec_per_gpu"]
        ax.scatter([x], [y], s=30, color="#4e79a7", zorder=3)
        near = [g for g in groups if abs(g[0] - x) < 0.03 * span_x and abs(g[1] - y) < 0.05 * span_y]
        if near:
            near[0][2].append(str(i + 1))
        else:
            groups.append((x, y, [str(i + 1)]))
    right_side = min((m for m, _ in points), default=0.0) / GIB + 0.7 * span_x
    for x, y, names in groups:
        left = x > right_side  # a label near the right edge goes to the point's left, inside the axes
        ax.annotate(
            ",".join(names),
            (x, y),
            textcoords="offset points",
            xytext=(-4 if left else 4, 4),
            ha="right" if left else "left",
        )
    ax.margins(0.08, 0.12)
    ax.set_xlabel(say("pareto_x"))
    ax.set_ylabel(say("pareto_y"))
    ax.set_title(say("pareto_title"))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2, frameon=False)
    return _svg(fig)


def sweep_curves(rows: list[dict[str, Any]], capacity_gib: float) -> str:
    """Best plan per sequence length: MFU and peak memory (the guidance's CP-scaling table), one
    above the other. Both axes start at 0 and end above their highest point (and the capacity),
    and the x axis has a margin, so no point sits on an edge."""
    plt = _pyplot()
    fitted = [r for r in rows if r["plan"] is not None]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(FIG_WIDTH_IN, 5.2))
    x = list(range(len(fitted)))
    mfu = [100 * r["plan"]["time"]["mfu"] for r in fitted]
    peak = [r["plan"]["memory"]["peak_reserved_bytes"] / GIB for r in fitted]
    top.plot(x, mfu, marker="o", color="#4e79a7", clip_on=False)
    top.set_ylabel(say("mfu_y"))
    top.set_title(say("mfu_title"))
    top.set_ylim(0, max(mfu, default=1.0) * HEADROOM)
    bottom.plot(x, peak, marker="o", color="#59a14f", clip_on=False)
    _capacity_line(bottom, capacity_gib)
    bottom.set_ylabel(say("peak_y"))
    bottom.set_title(say("peak_title"))
    bottom.set_ylim(0, max([capacity_gib, *peak]) * HEADROOM)
    for ax in (top, bottom):
        ax.set_xticks(x, [r["seq_len_label"] for r in fitted])
        ax.set_xlim(-0.4, max(len(fitted) - 0.6, 0.4))
        ax.set_xlabel(say("sequence_length"))
    fig.tight_layout()
    return _svg(fig)
