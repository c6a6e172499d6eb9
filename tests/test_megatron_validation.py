"""Megatron-Core's own validation judges lcmoe's values (needs the `validate` extra:
megatron-core + CPU torch; skipped otherwise). Plans from the catalog-wide planner test are also
built there (tests/test_planner.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig
from tests import megatron_core
from tests.helpers import make_run, with_layout, with_options

pytestmark = pytest.mark.skipif(not megatron_core.available(), reason="megatron-core not installed")
INSTALLED = "0.16.1"


def _gdn_with_cp() -> RunConfig:
    return make_run("qwen3-next-80b-a3b", seq_len=32768, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=64)


def _dsa_with_cp() -> RunConfig:
    run = make_run("glm-5.2", seq_len=65536, tp=1, cp=2, ep=32, pp=1, vpp=1, gpus=512)
    # 0.16 has no top-k sharing fields: a GLM-5.2 that runs an indexer in every layer.
    unshared = run.model.model_copy(update={"dsa_indexer_topk_freq": 1, "dsa_indexer_skip_topk_offset": 0})
    return with_layout(replace(run, model=unshared), cp_comm_type="all_gather")


KNOWN_BAD: list[tuple[str, Callable[[], RunConfig], str, str]] = [
    (
        "heads not divisible by TP",
        lambda: make_run("qwen3-235b-a22b", cp=4, gpus=96, tp=3),
        "L-HEADS-TP",
        "multiple of tensor_model_parallel_size",
    ),
    (
        "EP on a dense model",
        lambda: make_run("llama3-70b", cp=4, ep=8, pp=8, vpp=5, gpus=256),
        "L-EXPERTS-EP",
        "num_moe_experts must be non None",
    ),
    ("Gated DeltaNet with CP on 0.16", _gdn_with_cp, "L-GDN-CP-VERSION", "context parallel"),
    ("DSA with CP on 0.16", _dsa_with_cp, "L-DSA-VERSION", "context parallelism is not supported by DSAttention"),
    (
        "EP overlap with PP and no VPP",
        lambda: with_options(
            with_layout(make_run(), vpp=1, pipeline_layout="Et*7|t*8|t*8|t*8|t*8|t*8|t*8|t*6mL"),
            overlap_moe_expert_parallel_comm=True,
        ),
        "L-EP-OVERLAP",
        "virtual_pipeline_model_parallel_size",
    ),
    (
        "EP overlap with MTP and PP 1",
        lambda: with_options(make_run(cp=8, pp=1, vpp=1), overlap_moe_expert_parallel_comm=True),
        "L-EP-OVERLAP",
        "Pipeline model parallel size must be larger than 1",
    ),
    (
        "moe_act recompute on a dense model",
        lambda: make_run(
            "llama3-70b",
            cp=4,
            ep=1,
            pp=8,
            vpp=5,
            gpus=256,
            recompute_granularity="selective",
            recompute_modules=frozenset({"moe_act"}),
        ),
        "L-RECOMPUTE-MODULES",
        "moe_act",
    ),
]


@pytest.mark.parametrize("name,build_run,rule,megatron_says", KNOWN_BAD, ids=[k[0] for k in KNOWN_BAD])
def test_lcmoe_and_megatron_refuse_for_the_same_reason(
    name: str, build_run: Callable[[], RunConfig], rule: str, megatron_says: str
) -> None:
    run = build_run()
    assert rule in {v.rule for v in violations(run, megatron_core_version=INSTALLED)}
    with pytest.raises((ValueError, AssertionError)) as info:
        megatron_core.build(run)
    assert megatron_says in str(info.value)


def test_guidance_layouts_are_accepted() -> None:
    from lcmoe.catalog import load_hardware, load_model
    from lcmoe.plan.reference import reference_entries, reference_run

    for entry in reference_entries():
        found = reference_run(load_model(entry["model"]), load_hardware(entry["gpu"]), entry["gpus"], entry["seq_len"])
        assert found is not None
        megatron_core.build(found[1])


def test_precision_does_not_change_the_config_megatron_sees() -> None:
    run = make_run()
    fp8 = replace(run, options=replace(run.options, precision="fp8-blockwise"))
    assert megatron_core.build(fp8).context_parallel_size == 32


def test_native_fused_cross_entropy_keeps_one_fp32_buffer_per_head() -> None:
    """memory.logits_loss_bytes charges each head one FP32 softmax (4 B) plus the cast head's BF16
    logits: Megatron's fused cross entropy (fusions/fused_cross_entropy.py, torch.compile'd by
    ``jit_fuser``) casts the logits once and then subtracts, exponentiates and normalises that
    FP32 buffer in place, so what it saves for backward is the cast buffer itself."""
    import torch
    from megatron.core.fusions import fused_cross_entropy as fused

    logits = torch.randn(64, 1, 1024, dtype=torch.bfloat16)
    target = torch.randint(0, 1024, (64, 1))
    cast, logits_max = fused.calculate_logits_max(logits)
    assert cast.dtype == torch.float32 and cast.data_ptr() != logits.data_ptr()
    _, _, predicted_and_sum, exp_logits = fused.calculate_predicted_logits(cast, target, logits_max, 0, 1024)
    softmax, _ = fused.calculate_cross_entropy_loss(exp_logits, predicted_and_sum)
    assert exp_logits.data_ptr() == cast.data_ptr() == softmax.data_ptr()


def test_hierarchical_cp_sizes_reach_megatron_core() -> None:
    """a2a+p2p's sizes are a ModelParallelConfig field (model_parallel_config.py:103) that the
    emitted kwargs set; Megatron-Core builds the config with them."""
    run = with_layout(
        make_run("llama3-70b", seq_len=65536, tp=1, cp=16, ep=1, pp=4, vpp=1, gpus=64),
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes=(8, 2),
    )
    assert violations(run) == []
    config = megatron_core.build(run)
    assert (config.cp_comm_type, config.hierarchical_context_parallel_sizes) == ("a2a+p2p", [8, 2])
