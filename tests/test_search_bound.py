"""The search's exact pruning (``plan.bound``): it never changes what the search returns.

Two checks on small requests (few GPUs, short sequences, so each search is cheap): the ranked
plans, fallback, Pareto front and closest plan are the same with ``PlanRequest.prune`` on and off;
and the two bounds the pruning stands on hold for every candidate climbed — no plan a candidate
becomes beats its ``throughput_ceiling`` (prediction and rank value) or undercuts its
``peak_floor_bytes``, and no variant undercuts ``variant_peak_floor_bytes`` of the fitted set —
under Adam and Muon, with the activation-offload rung (128K+), for MoE and dense models.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from lcmoe.catalog import load_hardware, load_model
from lcmoe.cli.request import time_evidence
from lcmoe.estimate.band import TimeEvidence
from lcmoe.estimate.memory import staged_layout
from lcmoe.plan.bound import FloorMemo, peak_floor_bytes, throughput_ceiling, variant_peak_floor_bytes
from lcmoe.plan.candidates import base_options, precisions_for
from lcmoe.plan.fitting import fastest_fitting_variant, first_fitting, search_memo, time_coefficients_of
from lcmoe.plan.judge import judge_for
from lcmoe.plan.search import (
    Plan,
    PlanRequest,
    SearchResult,
    _Bands,
    common_global_batch,
    enumerate_layouts,
    layout_shapes,
    resolved,
    search,
)
from lcmoe.run import RunConfig

MUON = (("optimizer", "muon"),)

# (model, GPUs, seq_len, top_k, rank, optimizer): each prunes or climbs the activation-offload rung.
REQUESTS = {
    "moe": ("qwen3-30b-a3b", 8, 8192, 3, "conservative", ()),
    "moe-muon": ("qwen3-30b-a3b", 8, 8192, 3, "conservative", MUON),
    "dense": ("llama3-8b", 8, 8192, 1, "expected", ()),
    "dense-top2": ("llama3-8b", 8, 32768, 2, "conservative", ()),
    "activation-offload": ("qwen3-30b-a3b", 8, 131072, 3, "conservative", ()),
}


@cache
def _evidence() -> TimeEvidence:
    return time_evidence()


def _request(name: str) -> PlanRequest:
    model, gpus, seq_len, top_k, rank, optimizer = REQUESTS[name]
    return PlanRequest(
        model=load_model(model),
        hardware=load_hardware("h100"),
        num_gpus=gpus,
        seq_len=seq_len,
        top_k=top_k,
        rank=rank,
        optimizer=optimizer,
        time_evidence=_evidence(),
    )


def _output(result: SearchResult) -> dict[str, Any]:
    """What the search returns, less the counts the pruning changes (fit, pruned, fitting_points)."""

    def one(plan: Plan | None) -> dict[str, Any] | None:
        return plan.as_dict() if plan else None

    return {
        "plans": [p.as_dict() for p in result.plans],
        "fallback": one(result.fallback),
        "pareto": [
            (p.memory.peak_reserved_bytes, p.tokens_per_sec_per_gpu, p.as_dict()["layout"]) for p in result.pareto
        ],
        "closest": one(result.closest),
        "searched": result.searched,
        "legal": result.legal,
        "gbs": result.gbs,
    }


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_pruning_returns_the_same_plans(name: str) -> None:
    request = _request(name)
    pruned, full = search(request), search(replace(request, prune=False))
    assert full.pruned == 0
    assert pruned.plans
    assert _output(pruned) == _output(full)
    if name == "activation-offload":  # the rung is among what both return
        assert any(p.run.options.activation_offload_modules for p in full.pareto)


@pytest.mark.parametrize("name", ["moe-muon", "dense", "activation-offload"])
def test_every_climbed_plan_is_within_its_bounds(name: str) -> None:
    """For each legal candidate: the fitted set and its fastest variant stay at or under the
    candidate's ceiling (prediction and banded rank value) and at or over its peak floors."""
    request = resolved(_request(name))
    judge, memo, floors = judge_for(request.megatron_core_version), search_memo(request), FloorMemo()
    bands = _Bands(request.time_evidence)
    checked = 0
    gbs = common_global_batch([s.gbs_unit for s in layout_shapes(request)], request.seq_len)
    for layout in enumerate_layouts(request, gbs):
        for precision in precisions_for(request):
            run = RunConfig(request.model, request.hardware, layout, base_options(request, precision))
            if not judge.legal(run):
                continue
            staged = staged_layout(run.model, run.layout)
            ceiling = throughput_ceiling(run, staged, time_coefficients_of(request, run), floors)
            offloaded = memo.copy(run.options, optimizer_offload_fraction=1.0)
            floor = peak_floor_bytes(run, staged, offloaded, request.memory_coefficients)
            fitted = first_fitting(request, run, staged, judge, memo)
            if fitted is None:
                continue
            best = fastest_fitting_variant(request, fitted, staged, judge, memo)
            memo.amounts.clear()
            variant_floor = variant_peak_floor_bytes(fitted.memory, fitted.run.options, request.memory_coefficients)
            for plan in [fitted, *([best] if best else [])]:
                banded = bands(plan)
                assert banded.tokens_per_sec_per_gpu <= ceiling
                assert banded.rank_value(request.rank) <= ceiling
                assert plan.memory.peak_reserved_bytes >= floor
            if best is not None and best.run.options.dispatcher != "allgather":
                assert best.memory.peak_reserved_bytes >= variant_floor
            checked += 1
    assert checked
