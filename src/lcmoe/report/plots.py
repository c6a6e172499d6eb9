"""The report's figures, drawn with matplotlib (Agg) and returned as SVG text.

Text stays text (``svg.fonttype = none``) so the page is searchable and small, and ids are
salted deterministically (``svg.hashsalt``) so the same plan gives the same file."""

from __future__ import annotations

import io
from typing import Any

from lcmoe.errors import LcmoeError

GIB = 1024.0**3
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
    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "lcmoe", "font.size": 9})
    import matplotlib.pyplot as plt

    return plt


def _svg(fig: Any) -> str:
    plt = _pyplot()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def memory_by_stage(plan: dict[str, Any], title: str) -> str:
    """Stacked bars: every pipeline stage's memory by component (GiB) against the GPU's capacity."""
    plt = _pyplot()
    stages = plan["memory"]["stages"]
    capacity = plan["memory"]["capacity_bytes"] / GIB
    fig, ax = plt.subplots(figsize=(max(4.0, 0.55 * len(stages) + 3), 3.2))
    x = list(range(len(stages)))
    bottom = [0.0] * len(stages)
    for name, color in COMPONENTS:
        values = [s["components"].get(name, 0.0) / GIB for s in stages]
        if any(v > 0 for v in values):
            ax.bar(x, values, bottom=bottom, color=color, label=name, width=0.7)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.axhline(capacity, color="#c0392b", linestyle="--", linewidth=1.2, label=f"GPU capacity {capacity:.0f} GiB")
    ax.set_xticks(x, [str(s["stage"]) for s in stages])
    ax.set_xlabel("pipeline stage")
    ax.set_ylabel("GiB per GPU (reserved)")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_ylim(0, max(capacity, max(bottom)) * 1.08)
    return _svg(fig)


def time_breakdown(plan: dict[str, Any], title: str) -> str:
    """Where one step's seconds go on the critical pipeline stage (the terms sum to the step)."""
    plt = _pyplot()
    items = [(k, v) for k, v in plan["time"]["breakdown"].items() if v > 0]
    items.sort(key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(6.0, 0.28 * len(items) + 1.2))
    ax.barh([k for k, _ in items], [v for _, v in items], color="#4e79a7")
    step = plan["time"]["step_seconds"]
    for i, (_, v) in enumerate(items):
        ax.text(v, i, f" {v:.2f} s ({100 * v / step:.0f}%)", va="center", fontsize=7)
    ax.set_xlabel("seconds per step")
    ax.set_title(title)
    ax.set_xlim(0, max(v for _, v in items) * 1.35)
    return _svg(fig)


def pareto_scatter(points: list[tuple[float, float]], pareto: list[dict[str, Any]], plans: list[dict[str, Any]]) -> str:
    """Every fitting candidate: peak reserved memory against predicted tokens/s/GPU."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    ax.scatter([m / GIB for m, _ in points], [t for _, t in points], s=8, color="#bab0ac", label="fitting candidates")
    front = sorted(pareto, key=lambda p: p["peak_reserved_bytes"])
    ax.plot(
        [p["peak_reserved_bytes"] / GIB for p in front],
        [p["tokens_per_sec_per_gpu"] for p in front],
        color="#f28e2b",
        marker="o",
        markersize=3,
        label="Pareto front",
    )
    for i, plan in enumerate(plans):
        x, y = plan["memory"]["peak_reserved_bytes"] / GIB, plan["time"]["tokens_per_sec_per_gpu"]
        ax.scatter([x], [y], s=30, color="#4e79a7", zorder=3)
        ax.annotate(f"{i + 1}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("peak reserved GiB per GPU (worst stage)")
    ax.set_ylabel("tokens/s/GPU (predicted)")
    ax.set_title("memory vs throughput of every plan that fits")
    ax.legend(fontsize=7, frameon=False)
    return _svg(fig)


def sweep_curves(rows: list[dict[str, Any]], capacity_gib: float) -> str:
    """Best plan per sequence length: MFU and peak memory (the guidance's CP-scaling table)."""
    plt = _pyplot()
    fitted = [r for r in rows if r["plan"] is not None]
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.0, 3.0))
    labels = [r["seq_len_label"] for r in fitted]
    left.plot(labels, [100 * r["plan"]["time"]["mfu"] for r in fitted], marker="o", color="#4e79a7")
    left.set_ylabel("MFU % (of dense BF16 peak)")
    left.set_xlabel("sequence length")
    left.set_title("MFU of the best plan")
    right.plot(labels, [r["plan"]["memory"]["peak_reserved_bytes"] / GIB for r in fitted], marker="o", color="#59a14f")
    right.axhline(capacity_gib, color="#c0392b", linestyle="--", linewidth=1.0)
    right.set_ylabel("peak reserved GiB per GPU")
    right.set_xlabel("sequence length")
    right.set_title("memory of the best plan")
    for ax in (left, right):
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    return _svg(fig)
