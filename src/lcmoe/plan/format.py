"""Plain-text formatting of plan dictionaries, shared by the CLI tables and the report (so a
number prints the same everywhere)."""

from __future__ import annotations

from typing import Any

GIB = 1024.0**3
PLAN_COLUMNS = (
    "#",
    "layout",
    "recompute",
    "precision",
    "dispatcher",
    "graphs",
    "offload",
    "peak GiB / cap",
    "step s",
    "tok/s/GPU",
    "TFLOP/s/GPU",
    "MFU",
)


# Marks a peak that fits by less than the estimator's error band (MemoryEstimate.oom_risk).
AT_RISK = " !"


def at_risk_note(payload: dict[str, Any]) -> str:
    """The footnote for AT_RISK, when a listed plan carries it ("" otherwise)."""
    listed = [*payload["plans"], payload.get("fallback"), payload.get("reference")]
    marked = [p["memory"] for p in listed if p and p["memory"].get("oom_risk")]
    if not marked:
        return ""
    return (
        f"{AT_RISK.strip()} fits by less than the estimator's {marked[0]['error_band_pct']:.1f}% error band "
        "(its held-out 90th percentile): it may OOM; the fallback is picked for headroom"
    )


# What the step time of a DSA model rests on (README "Step time"; benchmarks/throughput_accuracy.py).
DSA_TIME_NOTE = (
    "DSA step times are not calibrated on measured sparse-attention kernels: lcmoe predicts the two "
    "GLM-5.2 H100 runs of Bridge's verification card (untuned, deterministic) 1.6-2.1x faster than "
    "logged; rank the plans, do not trust their absolute throughput"
)


def model_notes(payload: dict[str, Any]) -> list[str]:
    """Caveats that hold for every plan of this model (the DSA time calibration)."""
    return [DSA_TIME_NOTE] if payload["inputs"].get("attention") == "MLA+DSA" else []


def layout_text(layout: dict[str, Any]) -> str:
    return (
        f"TP{layout['tp']} CP{layout['cp']} EP{layout['ep']} ETP{layout['etp']} PP{layout['pp']} "
        f"VPP{layout['vpp']} DP{layout['dp']} MBS{layout['mbs']} GBS{layout['gbs']}"
    )


def recompute_text(plan: dict[str, Any]) -> str:
    rc = plan["recompute"]
    return ",".join(rc["modules"]) if rc["granularity"] == "selective" else str(rc["granularity"])


def plan_row(label: str, p: dict[str, Any]) -> list[str]:
    """One row of the plans table (PLAN_COLUMNS)."""
    mem, time = p["memory"], p["time"]
    return [
        label,
        layout_text(p["layout"]),
        recompute_text(p),
        p["precision"],
        p["dispatcher"],
        ",".join(p["cuda_graph_scope"]) or "-",
        f"{p['optimizer_offload_fraction']:g}",
        f"{mem['peak_reserved_bytes'] / GIB:.1f} / {mem['capacity_bytes'] / GIB:.0f}"
        + (AT_RISK if mem.get("oom_risk") else ""),
        f"{time['step_seconds']:.2f}",
        f"{time['tokens_per_sec_per_gpu']:.0f}",
        f"{time['model_tflops_per_gpu']:.0f}",
        f"{100 * time['mfu']:.1f}%",
    ]


def labelled_rows(payload: dict[str, Any]) -> list[list[str]]:
    """The plans, then the fallback and the guidance's layout when present."""
    rows = [plan_row(str(i + 1), p) for i, p in enumerate(payload["plans"])]
    if payload.get("fallback"):
        rows.append(plan_row("fallback", payload["fallback"]))
    if payload.get("reference"):
        rows.append(plan_row("guidance", payload["reference"]))
    return rows


def peft_text(peft: dict[str, Any] | None) -> str:
    """One sentence for a LoRA plan ("" for full training), the same on every surface."""
    if not peft:
        return ""
    return f"LoRA finetuning: frozen base, rank {peft['rank']} adapters on {', '.join(peft['targets'])}"
