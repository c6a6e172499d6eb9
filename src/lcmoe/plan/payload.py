"""The JSON document of a plan search: what `lcmoe plan --json` prints, plan.json holds and the
report embeds (docs/json-schema.md)."""

from __future__ import annotations

from typing import Any

from lcmoe.estimate.memory import estimate_memory
from lcmoe.estimate.time import estimate_time
from lcmoe.plan.reference import reference_run
from lcmoe.plan.search import Plan, PlanRequest, SearchResult, base_options
from lcmoe.rules.legality import violations


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
    }
    reference = reference_run(request.model, request.hardware, request.num_gpus, request.seq_len)
    if reference:
        name, run = reference
        memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
        ref = Plan(run, memory, estimate_time(run, request.time_coefficients)).as_dict()
        ref["name"] = name
        ref["violations"] = [v.as_dict() for v in violations(run, megatron_core_version=request.megatron_core_version)]
        best = result.plans[0].tokens_per_sec_per_gpu if result.plans else 0.0
        ref_speed = float(ref["time"]["tokens_per_sec_per_gpu"])  # type: ignore[index]
        ref["rank_among_plans"] = 1 + sum(p.tokens_per_sec_per_gpu > ref_speed for p in result.plans)
        ref["gap_to_best_pct"] = 100 * (1 - ref_speed / best) if best else None
        payload["reference"] = ref
    if not result.plans:
        payload["closest"] = result.closest.as_dict() if result.closest else None
        payload["min_gpus_needed"] = result.min_gpus_needed
    return payload
