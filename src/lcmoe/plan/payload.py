"""The JSON document of a plan search: what `lcmoe plan --json` prints, plan.json holds and the
report embeds (docs/json-schema.md)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lcmoe.estimate.band import plan_band, widened
from lcmoe.estimate.memory import estimate_memory
from lcmoe.estimate.time import estimate_time
from lcmoe.plan.reference import reference_run
from lcmoe.plan.search import Plan, PlanRequest, SearchResult, base_options
from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig


def plan_payload(request: PlanRequest, result: SearchResult) -> dict[str, Any]:
    """The stable JSON document of a plan search (docs/json-schema.md)."""
    from lcmoe import __version__

    payload: dict[str, Any] = {
        "lcmoe_version": __version__,
        "inputs": {
            "model": request.model.name,
            "attention": request.model.attention_label,
            "gpu": request.hardware.name,
            "num_gpus": request.num_gpus,
            "seq_len": request.seq_len,
            "gbs": request.gbs,
            "memory_margin": request.memory_margin,
            "megatron_core_version": request.megatron_core_version,
            "peft": base_options(request, "bf16").peft_summary(),
            **_doc_lengths(request),
            # The full specs, so that --plan works without the model or hardware file it came from.
            "model_spec": request.model.model_dump(mode="json"),
            "hardware_spec": request.hardware.model_dump(mode="json"),
        },
        "plans": [p.as_dict() for p in result.plans],
        "fallback": result.fallback.as_dict() if result.fallback else None,
        "pareto": [
            {
                "peak_reserved_bytes": p.memory.peak_reserved_bytes,
                "tokens_per_sec_per_gpu": p.tokens_per_sec_per_gpu,
                "layout": p.as_dict()["layout"],
            }
            for p in result.pareto
        ],
        "searched": result.searched,
        "legal": result.legal,
        "fit": result.fit,
        "rank": {
            "mode": result.rank,
            "by": "time.tokens_per_sec_per_gpu_low" if result.rank == "conservative" else "time.tokens_per_sec_per_gpu",
            "bands": request.time_evidence is not None,
            "evidence": _evidence_summary(request),
        },
        "gbs": {"value": result.gbs, "chosen_by": "user" if request.gbs else "lcmoe", "why": result.gbs_reason},
    }
    reference = reference_run(
        request.model, request.hardware, request.num_gpus, request.seq_len, gbs=request.gbs or result.gbs
    )
    if reference:
        name, run = reference
        if request.doc_lengths is not None:  # the guidance layout, run on the same packed data
            run = replace(run, options=replace(run.options, doc_lengths=request.doc_lengths))
        payload["reference"] = _reference(request, result, name, run)
    if not result.plans:
        payload["closest"] = result.closest.as_dict() if result.closest else None
        payload["min_gpus_needed"] = result.min_gpus_needed
    return payload


def _reference(request: PlanRequest, result: SearchResult, name: str, run: RunConfig) -> dict[str, Any]:
    """The guidance layout's prediction, its rank among the plans (by the request's rank mode) and
    whether plan 1's predicted gain over it is larger than plan 1's band (``gain_exceeds_band``:
    plan 1's lower edge still beats the guidance's prediction)."""
    memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
    band = plan_band(run, request.time_evidence) if request.time_evidence and request.time_evidence.runs else None
    time = estimate_time(run, request.time_coefficients)
    band = widened(band, time.unmeasured_seconds, time.step_seconds) if band else None
    plan = Plan(run, memory, time, band=band)
    ref = plan.as_dict()
    ref["name"] = name
    ref["violations"] = [v.as_dict() for v in violations(run, megatron_core_version=request.megatron_core_version)]
    ref["rank_among_plans"] = 1 + sum(p.rank_value(result.rank) > plan.rank_value(result.rank) for p in result.plans)
    best = result.plans[0] if result.plans else None
    speed = plan.tokens_per_sec_per_gpu
    ref["gap_to_best_pct"] = 100 * (1 - speed / best.tokens_per_sec_per_gpu) if best else None
    gain = 100 * (best.tokens_per_sec_per_gpu / speed - 1) if best and speed > 0 else None
    ref["gain_of_best_pct"] = gain
    ref["gain_exceeds_band"] = best.tokens_per_sec_per_gpu_low > speed if best and best.band else None
    return ref


def _doc_lengths(request: PlanRequest) -> dict[str, Any]:
    """``doc_lengths`` (the packed documents' histogram and its expectations at seq_len) when the
    request packs documents; nothing for fixed-length samples, whose JSON stays as it was."""
    if request.doc_lengths is None:
        return {}
    return {"doc_lengths": request.doc_lengths.summary(request.seq_len)}


def _evidence_summary(request: PlanRequest) -> dict[str, Any] | None:
    """Where the bands come from and how well they held under leave-one-model-out."""
    evidence = request.time_evidence
    if evidence is None:
        return None
    summary = evidence.summary
    keys = ("date", "runs", "coverage", "median_band_pct", "nested_coverage", "nested_median_band_pct")
    return {k: summary.get(k) for k in keys} | {"formula": summary.get("formula")}
