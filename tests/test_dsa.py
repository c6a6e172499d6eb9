"""DeepSeek Sparse Attention (GLM-5.2): the model, its parameters and FLOPs checked against the
published checkpoint and the two logged runs of Bridge's verification card, the legality rules
Megatron enforces for it, and its memory terms."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from lcmoe.catalog import load_model
from lcmoe.errors import LcmoeError
from lcmoe.estimate.flops import dsa_contexts, dsa_layer_flops_per_token, flops_per_step, flops_per_token
from lcmoe.estimate.memory import TokenShape, dsa_attention_activation_bytes, estimate_memory
from lcmoe.estimate.params import count_params, dsa_indexer_params
from lcmoe.estimate.time import layer_flops_per_token
from lcmoe.layout import auto_pipeline_layout, needs_explicit_layout, pipeline_stages
from lcmoe.rules.legality import violations
from lcmoe.specs.hf import model_from_hf_config
from lcmoe.specs.model import model_from_dict
from lcmoe.workload import TrainingOptions
from tests.helpers import make_run, with_layout

GLM = "glm-5.2"
PP11 = "Etttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttttttt|tttt|ttttmL"


def test_indexer_sharing_follows_megatron_numbering() -> None:
    """Offset 3, every 4th: layers 1-3 compute, 4-6 reuse layer 3's top-k, 7 computes, …; the
    MTP layer restarts at 1 and computes (dsa.py is_dsa_skip_topk_layer)."""
    m = load_model(GLM)
    computing = [i + 1 for i in range(m.num_layers) if m.has_dsa_indexer(i)]
    assert computing[:5] == [1, 2, 3, 7, 11] and computing[-1] == 75 and len(computing) == 21
    assert m.has_dsa_indexer(m.mtp_layer)


def test_parameters_reproduce_the_checkpoint() -> None:
    """753 329 940 480 checkpoint elements (MTP included) = lcmoe's count + the 76 routers'
    expert-bias buffers (256 each), which are not parameters; without MTP it is transformers'
    743 377 000 704 exactly."""
    m = load_model(GLM)
    assert dsa_indexer_params(m) == 2048 * 32 * 128 + 6144 * 128 + 2 * 128 + 6144 * 32
    assert count_params(m, include_mtp=False).total == 743_377_000_704
    assert count_params(m).total + 76 * 256 == 753_329_940_480


def test_flops_match_bridge_logs_of_the_card_runs() -> None:
    """The GLM-5.2 card logs 54.595 TFLOP/s/GPU for 1024 × 2048 tokens in 31.204920 s on 352 H100,
    39.648 for 13 × 200 000 tokens in 36.60337 s on 608 H100, and 102.520 for 1024 × 4096 tokens
    in 64.78654 s on 192 GB200 (Bridge's DSA count)."""
    m = load_model(GLM)
    pretrain = flops_per_step(m, 2048, 1024) / 31.204920 / 352 / 1e12
    long_sft = flops_per_step(m, 200_000, 13) / 36.60337 / 608 / 1e12
    gb200 = flops_per_step(m, 4096, 1024) / 64.78654 / 192 / 1e12
    assert pretrain == pytest.approx(54.595, rel=2e-4)
    assert long_sft == pytest.approx(39.648, rel=2e-4)
    assert gb200 == pytest.approx(102.520, rel=2e-4)


def test_dsa_flops_by_hand() -> None:
    m = load_model(GLM)
    dense, sparse = dsa_contexts(m, 200_000)
    assert dense == pytest.approx(100_000.5)
    assert sparse == pytest.approx(2048 - 2048 * 2047 / 400_000)
    assert dsa_contexts(m, 1024) == (512.5, 512.5)  # below top-k every causal pair is read
    plain_proj, plain_core = dsa_layer_flops_per_token(m, 200_000, indexer=False)
    proj, core = dsa_layer_flops_per_token(m, 200_000, indexer=True)
    assert plain_core == pytest.approx(6 * sparse * 64 * (576 + 512))
    # trained indexer (loss 0.001, sparse KL): projections ×4, dense scoring, sparse backward + target
    assert proj - plain_proj == pytest.approx(4 * (2048 * 32 * 128 + 6144 * 128 + 6144 * 32))
    assert core - plain_core == pytest.approx(2 * dense * 32 * 129 + 4 * sparse * 32 * 129 + 2 * sparse * 64 * 576)
    # the per-layer split the time model uses sums to Bridge's total
    per_layer = [layer_flops_per_token(m, i, 200_000) for i in (*range(m.num_layers), m.mtp_layer)]
    total = flops_per_token(m, 200_000)
    assert sum(f.attention_core for f in per_layer) == pytest.approx(total.attention_core)


def test_hf_config_maps_like_bridge(tmp_path: Path) -> None:
    config = {
        "model_type": "glm_moe_dsa",
        **dict(vocab_size=154880, hidden_size=6144, intermediate_size=12288, moe_intermediate_size=2048),
        **dict(num_hidden_layers=78, num_nextn_predict_layers=1, num_attention_heads=64, num_key_value_heads=64),
        **dict(q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192, qk_rope_head_dim=64, v_head_dim=256),
        **dict(n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, topk_method="noaux_tc"),
        **dict(first_k_dense_replace=3, index_topk=2048, index_n_heads=32, index_head_dim=128),
        **dict(index_topk_freq=4, index_skip_topk_offset=3, tie_word_embeddings=False),
    }
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    spec = model_from_hf_config(tmp_path)
    assert count_params(spec).total == count_params(load_model(GLM)).total
    assert spec.dsa_indexer_loss_coeff == 0.001 and spec.dsa_indexer_use_sparse_loss


def test_dsa_needs_mla() -> None:
    base = load_model("qwen3-30b-a3b").model_dump()
    with pytest.raises(LcmoeError, match="DSA needs multi_latent_attention"):
        model_from_dict(
            {**base, "dsa_indexer_n_heads": 8, "dsa_indexer_head_dim": 64, "dsa_indexer_topk": 256}, origin="test"
        )


def test_dsa_cp_must_all_gather() -> None:
    run = make_run(GLM, seq_len=131072, cp=8, ep=32, pp=16, vpp=1, gpus=512)
    rules = {v.rule for v in violations(run)}
    assert "L-DSA-CP" in rules
    fixed = with_layout(run, cp_comm_type="all_gather")
    assert "L-DSA-CP" not in {v.rule for v in violations(fixed)}
    assert "L-DSA-VERSION" in {v.rule for v in violations(fixed, megatron_core_version="0.16.1")}


def test_pipeline_chunks_start_on_indexer_layers() -> None:
    """Top-k cannot cross pipeline stages: the even 2-way split (layer 40 reuses layer 39's) is
    refused, lcmoe's balanced layout snaps its boundaries to computing layers, and the recipe
    layouts (PP11, PP13·VPP2 with its empty chunks, PP19) all pass."""
    m = load_model(GLM)
    assert needs_explicit_layout(m, 2, 1) and not needs_explicit_layout(load_model("qwen3-30b-a3b"), 2, 1)
    even = make_run(GLM, seq_len=4096, cp=1, ep=32, pp=2, vpp=1, gpus=512)
    even = with_layout(even, pipeline_layout=None)
    assert "L-DSA-INDEX-SHARING" in {v.rule for v in violations(even)}
    for pp, vpp in ((2, 1), (4, 1), (8, 2), (16, 1)):
        layout = auto_pipeline_layout(m, pp, vpp)
        assert layout is not None
        run = with_layout(make_run(GLM, seq_len=4096, cp=1, ep=32, pp=pp, vpp=vpp, gpus=512), pipeline_layout=layout)
        assert violations(run) == [], layout
        for stage in pipeline_stages(m, run.layout):
            for chunk in stage.chunks:
                assert not chunk.decoder_layers or m.has_dsa_indexer(chunk.decoder_layers[0])
    for key, layout in m.recipe_pipeline_layouts.items():
        pp, vpp = map(int, key.split("x"))
        run = with_layout(
            make_run(GLM, seq_len=2048, cp=1, ep=32, pp=pp, vpp=vpp, gpus=pp * 32), pipeline_layout=layout
        )
        assert "L-DSA-INDEX-SHARING" not in {v.rule for v in violations(run)}, key


def test_dsa_activations_by_hand() -> None:
    """One layer, T = 200 000/32 local tokens, CP 32 all-gathered latent keys, TP 1."""
    m = load_model(GLM)
    t, keys = 6250.0, 200_000.0
    shape = TokenShape(tokens=t, tp=1, sp=1, etp=1, ep=32, stored_gemm_input=2, seq_len=200_000, mbs=1, cp=32)
    options = TrainingOptions(seq_len=200_000)
    plain = dsa_attention_activation_bytes(m, shape, options, indexer=False)
    expected = 2 * t * 6144 + 2 * t * 6144  # input norm: its input and output
    expected += 2 * 2 * t * (2048 + 512 + 64)  # down projections and their norms
    expected += 2 * t * 64 * (192 + 512 + 64) + 2 * keys * (512 + 64)  # q no-RoPE, absorbed q, latent keys
    expected += 2 * t * 64 * 512 + 4 * t * 64 + 2 * t * 64 * 256  # latent output, LSE, up-projected output
    assert plain == pytest.approx(expected)
    indexer = dsa_attention_activation_bytes(m, shape, options, indexer=True)
    assert indexer - plain == pytest.approx(8 * t * 2048 + 2 * t * (32 * 128 + 128) + 2 * keys * 128 + 4 * t * 32)
    up = replace(options, recompute_granularity="selective", recompute_modules=frozenset({"mla_up_proj"}))
    assert plain - dsa_attention_activation_bytes(m, shape, up, indexer=False) == pytest.approx(
        2 * t * 64 * (192 + 512 + 64) + 2 * keys * (512 + 64)
    )


def test_card_runs_are_predicted_to_fit() -> None:
    """Both GLM-5.2 H100 runs of the card fit (peak 79.1 GiB observed on each)."""
    pretrain = with_layout(
        make_run(GLM, seq_len=2048, cp=1, ep=32, pp=11, vpp=1, gpus=352, gbs=1024, recompute_granularity="full"),
        pipeline_layout=PP11,
    )
    long_sft = with_layout(
        make_run(GLM, seq_len=200_000, cp=32, ep=32, pp=19, vpp=1, gpus=608, gbs=13, recompute_granularity="full"),
        pipeline_layout=load_model(GLM).recipe_pipeline_layouts["19x1"],
        cp_comm_type="all_gather",
    )
    for run in (pretrain, long_sft):
        assert violations(run) == []
        assert estimate_memory(run.model, run.hardware, run.layout, run.options).fits()


def test_cudnn_kernel_scratch_is_capped() -> None:
    """Index scores FP32 per (query, key) pair capped at 1 GiB, top-k scratch 8 B per pair capped
    at 2 GiB: 3 GiB at 200K over CP 32, a few MiB at 2K, nothing for a model without DSA."""
    from lcmoe.estimate.memory import dsa_kernel_scratch_bytes

    m = load_model(GLM)
    long = TokenShape(tokens=6250, tp=1, sp=1, etp=1, ep=32, stored_gemm_input=2, seq_len=200_000, mbs=1, cp=32)
    short = replace(long, tokens=2048, seq_len=2048, cp=1)
    assert dsa_kernel_scratch_bytes(m, long) == 3 * 1024**3
    assert dsa_kernel_scratch_bytes(m, short) == pytest.approx(12 * 2048 * 2048)
    assert dsa_kernel_scratch_bytes(load_model("deepseek-v3"), long) == 0.0


def test_plans_of_a_dsa_model_carry_the_time_caveat() -> None:
    from lcmoe.plan.format import model_notes

    assert load_model(GLM).attention_label == "MLA+DSA"
    assert load_model("deepseek-v3").attention_label == "MLA"
    assert model_notes({"inputs": {"attention": "MLA+DSA"}}) and not model_notes({"inputs": {"attention": "MLA"}})
