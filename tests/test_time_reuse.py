"""The planner's reuse of time amounts gives the same estimates as timing each run from scratch:
``relaunched_amounts`` (dispatcher × graph × overlap variants priced from one set of amounts), identical
pipeline stages timed once in ``combine``, and ``plan.fitting.priced_variants``."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from lcmoe.catalog import load_hardware, load_model
from lcmoe.estimate.memory import estimate_memory, staged_layout
from lcmoe.estimate.time import (
    combine,
    dispatch_bytes,
    estimate_time,
    exchanged_amounts,
    relaunched_amounts,
    shared_pricing,
    shipped_time_coefficients,
    stage_time,
    time_amounts,
    with_fields,
)
from lcmoe.plan.candidates import base_options
from lcmoe.plan.fitting import (
    SearchMemo,
    memory_twin_key,
    options_with,
    priced_variants,
    time_of,
    variants,
    with_options,
)
from lcmoe.plan.judge import judge_for
from lcmoe.plan.plans import Plan, PlanRequest
from tests.helpers import make_run
from tests.helpers import with_options as options_of

RUNS = {
    "dsv3-pp8-vpp4": dict(model="deepseek-v3"),
    "dsv3-pp16": dict(model="deepseek-v3", pp=16, vpp=1, cp=16, gpus=256),
    "qwen3-30b-pp1": dict(model="qwen3-30b-a3b", seq_len=32768, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16),
    "qwen3-235b-fp8": dict(
        model="qwen3-235b-a22b",
        gpu="gb200",
        seq_len=131072,
        tp=2,
        cp=4,
        ep=16,
        pp=4,
        vpp=1,
        gpus=64,
        precision="fp8-blockwise",
        dispatcher="hybridep",
    ),
}
SCOPES: tuple[frozenset[str], ...] = (
    frozenset(),
    frozenset({"attn"}),
    frozenset({"attn", "moe_router", "moe_preprocess"}),
)


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("dispatcher", ("alltoall", "deepep", "hybridep"))
@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: "+".join(sorted(s)) or "none")
@pytest.mark.parametrize("overlap", (False, True))
def test_relaunched_amounts_are_the_amounts_of_the_variant(
    name: str, dispatcher: str, scope: frozenset[str], overlap: bool
) -> None:
    run = make_run(**RUNS[name])  # type: ignore[arg-type]
    variant = options_of(run, dispatcher=dispatcher, cuda_graph_scope=scope, overlap_moe_expert_parallel_comm=overlap)
    if dispatch_bytes(variant.options) != dispatch_bytes(run.options):
        # FP8 dispatch (DeepEP / HybridEP under FP8) sends tokens at 1 B: every MoE layer's bytes change.
        with pytest.raises(ValueError, match="another width"):
            relaunched_amounts(time_amounts(run), variant)
        return
    assert relaunched_amounts(time_amounts(run), variant) == time_amounts(variant)


def test_relaunched_amounts_refuse_a_full_iteration_graph() -> None:
    # A full-iteration graph sizes the static MoE buffers (dispatched_tokens), so the amounts change.
    run = make_run()
    full = options_of(run, cuda_graph_scope=frozenset({"full_iteration"}))
    with pytest.raises(ValueError, match="full-iteration"):
        relaunched_amounts(time_amounts(run), full)
    with pytest.raises(ValueError, match="full-iteration"):
        relaunched_amounts(time_amounts(full), run)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_combine_times_identical_stages_once_with_the_same_result(name: str) -> None:
    run = make_run(**RUNS[name])  # type: ignore[arg-type]
    amounts = time_amounts(run)
    c = shipped_time_coefficients(run.hardware.architecture)
    per_stage = [stage_time(amounts, stage, c) for stage in amounts.stages]  # each from scratch
    critical = max(range(len(per_stage)), key=lambda i: per_stage[i].total)
    estimate = combine(amounts, c)
    assert estimate.critical_stage == amounts.stages[critical].rank
    slowest = per_stage[critical].as_dict(amounts.num_microbatches)
    assert {k: estimate.breakdown[k] for k in slowest} == slowest


def _request(model: str, gpu: str, gpus: int, seq_len: int) -> PlanRequest:
    hardware = load_hardware(gpu)
    return PlanRequest(
        model=load_model(model),
        hardware=hardware,
        num_gpus=gpus,
        seq_len=seq_len,
        time_coefficients=shipped_time_coefficients(hardware.architecture),
    )


@pytest.mark.parametrize("name", ["dsv3-pp8-vpp4", "qwen3-30b-pp1"])
@pytest.mark.parametrize("with_memo", [False, True])
def test_priced_variants_time_each_variant_as_estimate_time_does(name: str, with_memo: bool) -> None:
    spec = RUNS[name]
    run = make_run(**spec)  # type: ignore[arg-type]
    request = _request(run.model.name, run.hardware.name, run.layout.world_size, run.options.seq_len)
    start = with_options(run, base_options(request, "bf16"))
    staged = staged_layout(start.model, start.layout)
    memo = SearchMemo() if with_memo else None
    # With a memo, time_of keeps the fitted run's amounts and priced_variants starts from them.
    time = time_of(request, start, staged, memo)
    assert time == estimate_time(start)
    fitted = Plan(start, estimate_memory(start.model, start.hardware, start.layout, start.options), time)
    judge = judge_for(request.megatron_core_version)
    priced = priced_variants(request, fitted, staged, judge, memo)
    assert memo is None or not memo.amounts  # taken
    legal = [v for v in variants(request, start) if judge.legal(v)]
    assert [variant for variant, _, _ in priced] == legal
    assert len(legal) > 4  # several dispatchers, graph scopes and overlaps
    for variant, time, same in priced:
        assert same == (variant == start)
        assert time == estimate_time(variant, request.time_coefficients)


def test_search_memo_makes_each_option_copy_once() -> None:
    run = make_run()
    copies = SearchMemo().copy
    first = copies(run.options, dispatcher="deepep", overlap_moe_expert_parallel_comm=True)
    assert first == options_with(run.options, dispatcher="deepep", overlap_moe_expert_parallel_comm=True)
    assert copies(run.options, dispatcher="deepep", overlap_moe_expert_parallel_comm=True) is first
    # 1 == 1.0, but the plan JSON writes them differently: the copies keep them apart.
    assert type(copies(run.options, optimizer_offload_fraction=1).optimizer_offload_fraction) is int
    assert type(copies(run.options, optimizer_offload_fraction=1.0).optimizer_offload_fraction) is float


@pytest.mark.parametrize("name", sorted(RUNS))
@pytest.mark.parametrize("dispatcher", ("alltoall", "deepep", "hybridep"))
@pytest.mark.parametrize("scope", SCOPES, ids=lambda s: "+".join(sorted(s)) or "none")
def test_overlap_twins_have_the_same_memory_estimate(name: str, dispatcher: str, scope: frozenset[str]) -> None:
    # fastest_fitting_variant estimates one twin of each memory_twin_key for both.
    run = make_run(**RUNS[name])  # type: ignore[arg-type]
    off, on = (
        options_of(run, dispatcher=dispatcher, cuda_graph_scope=scope, overlap_moe_expert_parallel_comm=overlap)
        for overlap in (False, True)
    )
    assert memory_twin_key(off) == memory_twin_key(on)
    assert estimate_memory(off.model, off.hardware, off.layout, off.options) == estimate_memory(
        on.model, on.hardware, on.layout, on.options
    )


def test_unchecked_replace_is_dataclasses_replace_without_validation() -> None:
    run = make_run()
    changes: dict[str, Any] = dict(
        dispatcher="hybridep", cuda_graph_scope=frozenset({"attn"}), optimizer_offload_fraction=0.5
    )
    fast = options_with(run.options, **changes)
    assert fast == replace(run.options, **changes) and hash(fast) == hash(replace(run.options, **changes))
    assert fast is not run.options and options_with(run.options) == run.options
    with pytest.raises(TypeError, match="no field"):
        options_with(run.options, no_such_field=1)


def test_with_fields_is_dataclasses_replace() -> None:
    amounts = time_amounts(make_run())
    assert with_fields(amounts, dispatcher="deepep", ep_overlap=True) == replace(
        amounts, dispatcher="deepep", ep_overlap=True
    )
    with pytest.raises(TypeError, match="no field"):
        with_fields(amounts, no_such_field=1)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_exchanged_amounts_are_the_amounts_of_every_variant(name: str) -> None:
    # priced_variants exchanges the fitted run's amounts into each other CP exchange and dispatch width.
    run = make_run(**RUNS[name])  # type: ignore[arg-type]
    request = _request(run.model.name, run.hardware.name, run.layout.world_size, run.options.seq_len)
    staged = staged_layout(run.model, run.layout)
    seed = time_amounts(run, staged)
    tried = {(v.layout.cp_comm_type, dispatch_bytes(v.options)) for v in variants(request, run)}
    assert len(tried) > 1 or run.layout.cp == 1
    for variant in variants(request, run):
        assert exchanged_amounts(seed, variant, staged) == time_amounts(variant, staged)
    full = options_of(run, cuda_graph_scope=frozenset({"full_iteration"}))
    assert exchanged_amounts(seed, full, staged) == time_amounts(full, staged)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_shared_pricing_gives_each_variant_the_estimate_of_combine(name: str) -> None:
    # One SharedPricing serves every dispatcher × graph × overlap variant relaunched from one set of amounts.
    run = make_run(**RUNS[name])  # type: ignore[arg-type]
    c = shipped_time_coefficients(run.hardware.architecture)
    amounts = time_amounts(run)
    shared = shared_pricing(amounts)
    for dispatcher in ("alltoall", "deepep", "hybridep", "allgather"):
        for scope in SCOPES:
            for overlap in (False, True):
                variant = options_of(
                    run, dispatcher=dispatcher, cuda_graph_scope=scope, overlap_moe_expert_parallel_comm=overlap
                )
                if dispatch_bytes(variant.options) != amounts.dispatch_bytes:
                    continue
                relaunched = relaunched_amounts(amounts, variant)
                assert combine(relaunched, c, shared) == combine(relaunched, c) == estimate_time(variant)
    assert len(shared.rates) > 1 and shared.bases and shared.tail is not None
    with pytest.raises(ValueError, match="one set of stages"):
        combine(time_amounts(run), c, shared)
