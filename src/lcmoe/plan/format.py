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
    "band",
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


# What the step time of a DSA model rests on (docs/how-numbers-are-made.md; benchmarks/throughput_accuracy.py).
# No figure here: the measured ratio lives with the benchmark, not in a literal (issue #33 item 5).
DSA_TIME_NOTE = (
    "DSA step times are not calibrated on measured sparse-attention kernels: lcmoe predicts the two "
    "published GLM-5.2 H100 runs (untuned, deterministic) faster than they logged; rank the plans, do "
    "not trust their absolute throughput"
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


def offload_text(p: dict[str, Any]) -> str:
    """What a plan (or estimate's inputs) moves to the host: the optimizer's share, then the
    activation-offload modules (with their fraction when not all) and the paged stash's host pages
    when present, e.g. ``0.5 + act core_attn,expert_fc1@0.5``."""
    parts = [f"{p.get('optimizer_offload_fraction') or 0:g}"]
    act = p.get("activation_offload")
    if act:
        fraction = act.get("fraction", 1.0)
        parts.append("act " + ",".join(act["modules"]) + (f"@{fraction:g}" if fraction != 1.0 else ""))
    stash = p.get("paged_stash") or {}
    if stash.get("stash") and stash.get("cpu_factor"):
        parts.append(f"stash host {stash['cpu_factor']:g}x")
    return " + ".join(parts)


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
        offload_text(p),
        f"{mem['peak_reserved_bytes'] / GIB:.1f} / {mem['capacity_bytes'] / GIB:.0f}"
        + (AT_RISK if mem.get("oom_risk") else ""),
        f"{time['step_seconds']:.2f}",
        f"{time['tokens_per_sec_per_gpu']:.0f}",
        band_text(time),
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


# The settings PLAN_COLUMNS leaves out; shown beside the plans table (CLI and report) so that
# every setting a plan uses is on screen.
SETTING_COLUMNS = ("optimizer", "EP overlap", "CP exchange", "sequence parallel", "pipeline layout")


def optimizer_text(entry: dict[str, Any]) -> str:
    """The optimizer as a plan (or estimate's inputs) sets it: precision-aware or not, the Adam
    moments' and the gradient buffer's dtype, and the share offloaded to the host when estimate
    reports it."""
    aware = bool(entry.get("precision_aware_optimizer"))
    moments = str(entry.get("exp_avg_dtype") or ("bf16" if aware else "fp32")).upper()
    grads = str(entry.get("main_grads_dtype") or "fp32").upper()
    text = f"{'precision-aware' if aware else 'plain'} Adam, {moments} moments, {grads} main grads"
    if entry.get("optimizer") == "muon":
        steps, mode = entry.get("muon_num_ns_steps") or 5, entry.get("muon_tp_mode") or "blockwise"
        text = f"Muon, {steps} NS steps, {mode} TP, FP32 momentum, {grads} main grads"
    offload = entry.get("optimizer_offload_fraction")
    if "exp_avg_dtype" in entry and offload:
        text += f", {100 * float(offload):g}% on the host"
    return text


def recompute_spec(plan: dict[str, Any]) -> str:
    """Recompute as `lcmoe estimate --recompute` takes it (full:METHOD:N keeps method and count)."""
    rc = plan["recompute"]
    if rc["granularity"] == "full":
        return f"full:{rc.get('method') or 'uniform'}:{rc.get('num_layers') or 1}"
    if rc["granularity"] == "selective":
        return ",".join(rc["modules"]) or "none"
    return "none"


def cp_exchange_text(lay: dict[str, Any]) -> str:
    """The CP exchange as plan cards show it: ``p2p``, ``a2a+p2p [8,2]`` (a2a size, p2p size), or
    ``-`` without CP."""
    if lay["cp"] <= 1:
        return "-"
    sizes = lay.get("hierarchical_context_parallel_sizes")
    return f"{lay['cp_comm_type']} [{','.join(map(str, sizes))}]" if sizes else str(lay["cp_comm_type"])


def setting_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(SETTING_COLUMNS label, value) for the settings PLAN_COLUMNS leaves out."""
    lay = plan["layout"]
    pipeline = lay.get("pipeline_layout") or ("-" if lay["pp"] == 1 else "Megatron's even split")
    values = (
        optimizer_text(plan),
        "on" if plan.get("overlap_moe_expert_parallel_comm") else "off",
        cp_exchange_text(lay),
        "on" if lay.get("sequence_parallel") else "off",
        str(pipeline),
    )
    return list(zip(SETTING_COLUMNS, values, strict=True))


def labelled_entries(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The plans in labelled_rows' order: the plans, then the fallback and the guidance layout."""
    return [*payload["plans"], *(payload[k] for k in ("fallback", "reference") if payload.get(k))]


def settings_table_rows(payload: dict[str, Any]) -> list[list[str]]:
    """["#" label, *SETTING_COLUMNS values] per labelled row, recompute spelled whole first
    (``full:METHOD:N``, as `lcmoe estimate --recompute` takes it): the table beside the plans."""
    rows = []
    for row, entry in zip(labelled_rows(payload), labelled_entries(payload), strict=True):
        rows.append([row[0], recompute_spec(entry), *(value for _, value in setting_rows(entry))])
    return rows


def peft_text(peft: dict[str, Any] | None) -> str:
    """One sentence for a LoRA plan ("" for full training), the same on every surface."""
    if not peft:
        return ""
    return f"LoRA finetuning: frozen base, rank {peft['rank']} adapters on {', '.join(peft['targets'])}"


def packing_text(doc_lengths: dict[str, Any] | None, packing: dict[str, Any] | None) -> str:
    """One sentence for packed documents ("" for fixed length): documents per sample, core
    attention against one seq_len document, and Bridge's over-count at CP > 1."""
    if not doc_lengths or not packing:
        return ""
    text = (
        f"Packed documents ({doc_lengths['name']}): {packing['docs_per_pack']:.1f} per sample, core attention "
        f"{100 * packing['attention_share_of_fixed']:.1f}% of one full-length document's"
    )
    ratio = packing.get("counted_over_real_flops", 1.0)
    if ratio > 1.001:
        text += f"; Bridge's TFLOP/s count {ratio:.2f}× the real work at CP > 1"
    return text


# ----- time bands, rank mode and the common GBS (estimate.band; docs/json-schema.md) -----------------
def band_text(time: dict[str, Any]) -> str:
    """The band column: ± percent of tokens/s/GPU ("-" without evidence)."""
    band = time.get("band_pct")
    return "-" if band is None else f"±{band:.0f}%"


def evidence_text(time: dict[str, Any]) -> str:
    """Where a band comes from: the nearest measured run and each step away from it."""
    evidence = time.get("evidence")
    if not evidence:
        return ""
    steps = [f"{name} {d:.2g}" for name, d in evidence["distance"].items() if d]
    away = f"; away from it by {', '.join(steps)}" if steps else " (the same shape)"
    return (
        f"±{time['band_pct']:.0f}% = {evidence['base_pct']:.0f}% (leave-one-model-out error of the runs nearest it) "
        f"+ {evidence['penalty_pct']:.0f}% extrapolation; nearest measured run: {evidence['run']}{away}"
    )


def plans_title(payload: dict[str, Any]) -> str:
    """The plans table's title, naming what the plans are ranked by."""
    rank = payload.get("rank") or {}
    if rank.get("mode") == "conservative" and rank.get("bands"):
        return "plans, best first by the band's lower edge of tok/s/GPU (memory = worst stage, reserved)"
    return "plans, fastest first (memory = worst stage, reserved)"


def ranking_notes(payload: dict[str, Any]) -> list[str]:
    """The common GBS and why; how the plans are ranked and what a band is; plan 1's evidence."""
    notes = []
    gbs = payload.get("gbs") or {}
    if gbs.get("why"):
        notes.append(str(gbs["why"]))
    rank = payload.get("rank") or {}
    if rank.get("bands"):
        how = (
            "ranked by the band's lower edge (--rank conservative): a layout far from any measured run wins only "
            "if it wins when the model is as wrong as it has been"
            if rank.get("mode") == "conservative"
            else "ranked by the prediction (--rank expected)"
        )
        evidence = rank.get("evidence") or {}
        held = (
            f" (it held {100 * evidence['coverage']:.0f}% of the {evidence['runs']} measured runs, each predicted "
            "without its own model)"
            if evidence.get("coverage") is not None
            else ""
        )
        notes.append(f"{how}; band = how far measured tokens/s has fallen from predictions like it{held}")
        if payload["plans"]:
            notes.append("plan 1 " + evidence_text(payload["plans"][0]["time"]))
    return notes


def reference_text(ref: dict[str, Any]) -> str:
    """The guidance layout's line: legality, fit, rank, and whether plan 1's gain over it is
    larger than plan 1's band."""
    verdict = "legal" if not ref["violations"] else "illegal: " + "; ".join(v["message"] for v in ref["violations"])
    fits = "fits" if ref["memory"]["fits"] else "does not fit"
    text = f"{ref['name']}: {verdict}, {fits}, predicted rank {ref['rank_among_plans']}"
    band_of_ref = f"its band {band_text(ref['time'])}" if ref["time"].get("band_pct") is not None else ""
    gain, exceeds = ref.get("gain_of_best_pct"), ref.get("gain_exceeds_band")
    if gain is None:
        return text + (f" ({band_of_ref})" if band_of_ref else "") + "."
    if gain <= 0:
        return (
            text + f" (predicted {-gain:.0f}% faster than plan 1" + (f"; {band_of_ref}" if band_of_ref else "") + ")."
        )
    text += f" (plan 1 predicts {gain:.0f}% more tokens/s/GPU"
    if exceeds is None:
        return text + "). The time model has no measurements of the faster layouts it prefers; A/B before trusting it."
    if exceeds:
        judged = "larger than plan 1's band: plan 1 is faster even at its band's lower edge"
    else:
        judged = "within plan 1's band: a hypothesis to A/B, not a fact"
    return text + f"; the gain is {judged}; {band_of_ref})."
