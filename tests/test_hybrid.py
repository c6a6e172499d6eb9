"""Hybrid Mamba models (Nemotron-3): pattern, parameters, Bridge's FLOPs, memory and time terms
checked by hand, and the rules Megatron applies to them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lcmoe.catalog import load_model
from lcmoe.config_io.megatron_args import parse_megatron_args
from lcmoe.errors import LcmoeError
from lcmoe.estimate.flops import flops_per_token
from lcmoe.estimate.memory import TokenShape, estimate_memory, layer_activation_bytes, mamba_activation_bytes
from lcmoe.estimate.params import attention_kind, count_params, mamba_mixer_params
from lcmoe.estimate.time import (
    TimeCoefficients,
    estimate_time,
    layer_host_seconds,
    mamba_scan_flops_per_layer,
    shipped_time_coefficients,
    time_amounts,
)
from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig
from lcmoe.specs.hf import model_from_hf_config
from lcmoe.specs.layer_patterns import AttentionKind, split_hybrid_pattern
from lcmoe.specs.model import model_from_dict
from lcmoe.workload import TrainingOptions
from tests.helpers import make_run, with_layout, with_options

NANO = "nemotron-3-nano-30b-a3b"


def nano_run(**layout: int) -> RunConfig:
    values = {"seq_len": 8192, "tp": 1, "cp": 1, "ep": 8, "pp": 1, "vpp": 1, "gpus": 8, "gbs": 64} | layout
    return make_run(NANO, "h100", **values)


def test_pattern_split_as_megatron_reads_it() -> None:
    assert split_hybrid_pattern("M*-E|ME/*E/*E") == ("M*-EME", "*E", 2)
    assert split_hybrid_pattern("MEM*E") == ("MEM*E", "", 0)
    with pytest.raises(ValueError, match="differ"):
        split_hybrid_pattern("ME/*E/*-")
    with pytest.raises(ValueError, match="not modelled"):
        split_hybrid_pattern("MGM*")


def test_nano_layer_kinds() -> None:
    nano = load_model(NANO)
    kinds = [attention_kind(nano, i) for i in range(nano.num_layers)]
    assert kinds.count(AttentionKind.MAMBA) == 23
    assert kinds.count(AttentionKind.GQA) == 6
    assert kinds.count(AttentionKind.NONE) == 23  # the MoE layers
    assert sum(nano.moe_layer_pattern()) == 23
    assert not any(nano.has_mlp(i) for i in range(nano.num_layers) if kinds[i] is not AttentionKind.NONE)


def test_pattern_must_match_num_layers() -> None:
    base = load_model(NANO).model_dump(exclude={"published"})
    with pytest.raises(LcmoeError, match="num_layers"):
        model_from_dict(base | {"num_layers": 51}, origin="test")
    with pytest.raises(LcmoeError, match="MTP depths"):
        model_from_dict(base | {"hybrid_layer_pattern": base["hybrid_layer_pattern"] + "/*E"}, origin="test")


def test_mamba_mixer_params_by_hand() -> None:
    # h 2688, d_i = 64·64 = 4096, 2·G·N = 2·8·128 = 2048, nh 64, conv kernel 4.
    in_proj = 2688 * (2 * 4096 + 2048 + 64) + 2688
    conv = (4096 + 2048) * (4 + 1)
    expected = in_proj + conv + 3 * 64 + 4096 + 4096 * 2688
    assert mamba_mixer_params(load_model(NANO)) == expected


def test_bridge_hybrid_flops_by_hand() -> None:
    # flop_utils.py hybrid_flops, per token at s = 8192 (×3 for training): 6 attention,
    # 23 Mamba (Bridge's d_in = 2h), 23 MoE layers, squared ReLU (no GLU), no MTP.
    h, s, q, kv, vocab = 2688, 8192, 32 * 128, 2 * 128, 131072
    attention = 6 * 3 * (4 * h * q * (1 + 2 / 32) + 2 * q * s)
    d_in = 2 * h
    mamba = 23 * 3 * (2 * h * (2 * d_in + 2 * 8 * 128 + 64) + 7 * d_in * 128 + 2 * d_in * h)
    moe = 23 * 3 * 4 * h * (1856 * 6 + 3712)
    logits = 3 * 2 * h * vocab
    breakdown = flops_per_token(load_model(NANO), s)
    assert breakdown.total == pytest.approx(attention + mamba + moe + logits, rel=1e-12)
    assert breakdown.mtp_projection == 0.0
    assert breakdown.attention_projections == pytest.approx(6 * 6 * (2 * q * h + 2 * h * kv))


def test_mamba_activation_by_hand() -> None:
    nano = load_model(NANO)
    shape = TokenShape(tokens=8192, tp=2, sp=2, etp=1, ep=8, stored_gemm_input=2, seq_len=8192, mbs=1, cp=1)
    options = TrainingOptions(seq_len=8192)
    # norm input + output 2·2·T·h/sp; z·x·B·C·dt 2·T·(8192 + 2048 + 64)/tp; scan output and norm
    # input 2·2·T·4096/tp; out_proj input 2·T·4096/tp; no dropout.
    t = 8192
    expected = 2 * 2 * t * 2688 / 2 + 2 * t * 10304 / 2 + 2 * 2 * t * 4096 / 2 + 2 * t * 4096 / 2
    assert mamba_activation_bytes(nano, shape, options) == pytest.approx(expected)
    moe_layer = 1  # 'E': no mixer
    assert attention_kind(nano, moe_layer) is AttentionKind.NONE
    assert layer_activation_bytes(nano, 0, shape, options) == pytest.approx(expected)


def test_hybrid_mtp_depth_holds_attention_and_moe() -> None:
    spec = load_model(NANO).model_dump(exclude={"published"})
    spec |= {"hybrid_layer_pattern": spec["hybrid_layer_pattern"] + "/*E/*E", "mtp_num_layers": 2}
    model = model_from_dict(spec, origin="test")
    assert attention_kind(model, model.mtp_layer) is AttentionKind.GQA
    assert model.is_moe_layer(model.mtp_layer) and model.has_mlp(model.mtp_layer)
    counts = model.hybrid_layer_counts()
    assert (counts["*"], counts["E"], counts["M"]) == (8, 25, 23)


def test_repeated_mtp_layer_holds_weights_once() -> None:
    """``mtp_use_repeated_layer`` (Nemotron-3.5 Lightning): one MTP layer applied at both depths,
    so its weights count once while both depths keep activations. The catalog entry's count
    matches the verification card's 32,913,266,240 parameters; two separate depths would not."""
    lightning = load_model("nemotron-3.5-lightning-30b-a3b")
    separate = lightning.model_copy(update={"mtp_use_repeated_layer": False})
    assert (lightning.mtp_num_layers, lightning.mtp_weight_layers, separate.mtp_weight_layers) == (2, 1, 2)
    nano = count_params(load_model(NANO)).total
    per_depth = count_params(separate).total - count_params(lightning).total
    assert count_params(lightning).total - nano == per_depth
    assert count_params(lightning).total == pytest.approx(32_913_266_240, rel=1e-6)
    run = make_run("nemotron-3.5-lightning-30b-a3b", "gb200", seq_len=8192, cp=1, ep=8, pp=1, vpp=1, gpus=8)
    twice = dataclasses.replace(run, model=separate)
    shared = estimate_memory(run.model, run.hardware, run.layout, run.options).stages[0]
    unshared = estimate_memory(twice.model, twice.hardware, twice.layout, twice.options).stages[0]
    assert shared.weights < unshared.weights and shared.activations == unshared.activations


def test_hybrid_memory_properties() -> None:
    base = nano_run(seq_len=32768, cp=1, gpus=8)
    peaks = []
    for cp in (1, 2, 4):
        run = with_layout(base, cp=cp, dp=8 // cp)
        peaks.append(estimate_memory(run.model, run.hardware, run.layout, run.options).peak_allocated_bytes)
    assert peaks == sorted(peaks, reverse=True)
    recomputed = with_options(base, recompute_granularity="selective", recompute_modules=frozenset({"moe"}))
    plain = estimate_memory(base.model, base.hardware, base.layout, base.options).peak_allocated_bytes
    less = estimate_memory(recomputed.model, recomputed.hardware, recomputed.layout, recomputed.options)
    assert less.peak_allocated_bytes < plain


def test_scan_rate_moves_step_time_of_mamba_layers_only() -> None:
    run = nano_run()
    c = shipped_time_coefficients(run.hardware.architecture)
    faster = dataclasses.replace(c, mamba_scan_flops_per_second=2 * c.mamba_scan_flops_per_second)
    assert estimate_time(run, faster).step_seconds < estimate_time(run, c).step_seconds
    scan = sum(
        g.mamba_scan_flops * count
        for st in time_amounts(run).stages
        for g, count in zip(st.groups, st.counts, strict=True)
    )
    tokens = 8192 * 1  # one microbatch on this GPU
    assert scan == pytest.approx(23 * mamba_scan_flops_per_layer(run.model) * tokens)
    dense = make_run("qwen3-30b-a3b", "h100", seq_len=8192, tp=1, cp=1, ep=8, pp=1, vpp=1, gpus=8, gbs=64)
    assert estimate_time(dense, faster).step_seconds == pytest.approx(estimate_time(dense, c).step_seconds)


def test_hybrid_host_time_per_block() -> None:
    c = TimeCoefficients(layer_overhead_seconds=1e-3, cuda_graph_overhead_saving=1.0)
    none: frozenset[str] = frozenset()
    mamba = layer_host_seconds(none, False, c, kind=AttentionKind.MAMBA, has_mlp=False)
    assert mamba == pytest.approx(0.5e-3)
    assert layer_host_seconds(frozenset({"mamba"}), False, c, kind=AttentionKind.MAMBA, has_mlp=False) == 0.0
    assert layer_host_seconds(frozenset({"attn"}), False, c, kind=AttentionKind.GQA, has_mlp=False) == 0.0
    moe_only = layer_host_seconds(none, True, c, kind=AttentionKind.NONE, has_mlp=True)
    assert moe_only == pytest.approx(c.moe_layer_overhead_seconds)


def test_hybrid_legality() -> None:
    run = nano_run()
    assert violations(run) == []
    wide = make_run(NANO, "h100", seq_len=8192, tp=16, cp=1, ep=1, pp=1, vpp=1, gpus=16, gbs=64)
    assert "L-MAMBA-TPCP" in {v.rule for v in violations(wide)}  # 8 Mamba groups over TP 16
    piped = make_run(NANO, "h100", seq_len=8192, tp=1, cp=1, ep=8, pp=2, vpp=2, gpus=16, gbs=64)
    assert "L-HYBRID-PIPELINE" in {v.rule for v in violations(piped)}


def test_megatron_hybrid_args_parse() -> None:
    args = (
        "--num-layers 5 --hidden-size 256 --ffn-hidden-size 512 --num-attention-heads 8 "
        "--group-query-attention --num-query-groups 2 --kv-channels 32 --num-experts 8 --moe-router-topk 2 "
        "--moe-ffn-hidden-size 128 --hybrid-layer-pattern MEM*E/*E --mtp-num-layers 1 --mtp-use-repeated-layer "
        "--mamba-num-heads 8 --mamba-head-dim 64 --mamba-state-dim 64 --mamba-num-groups 2 "
        "--squared-relu --tensor-model-parallel-size 1 --expert-model-parallel-size 2 "
        "--seq-length 4096 --micro-batch-size 1 --global-batch-size 8 --vocab-size 1024"
    )
    parsed = parse_megatron_args(args, world_size=2)
    assert parsed.model.is_hybrid and parsed.model.mtp_num_layers == 1 and parsed.model.mtp_use_repeated_layer
    assert parsed.model.mamba_inner_size == 512
    assert flops_per_token(parsed.model, 4096).mamba > 0


def test_hf_nemotron_h_config_reads_as_the_catalog_model(tmp_path: Path) -> None:
    config = {
        "model_type": "nemotron_h",
        "num_hidden_layers": 52,
        "hidden_size": 2688,
        "intermediate_size": 1856,
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "vocab_size": 131072,
        "tie_word_embeddings": False,
        "hybrid_override_pattern": load_model(NANO).hybrid_layer_pattern,
        "mamba_num_heads": 64,
        "mamba_head_dim": 64,
        "ssm_state_size": 128,
        "n_groups": 8,
        "n_routed_experts": 128,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 1856,
        "moe_shared_expert_intermediate_size": 3712,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = model_from_hf_config(tmp_path)
    assert count_params(spec) == count_params(load_model(NANO))
    assert flops_per_token(spec, 8192).total == flops_per_token(load_model(NANO), 8192).total
    (tmp_path / "config.json").write_text(json.dumps(config | {"moe_latent_size": 1024}))
    assert model_from_hf_config(tmp_path).moe_latent_size == 1024


def test_latent_moe_by_hand() -> None:
    """LatentMoE (Nemotron-3 Super): experts work in d_l = moe_latent_size, with an h→d_l and a
    d_l→h projection per MoE layer that every TP rank holds in full; dispatch carries d_l."""
    from lcmoe.estimate.flops import routed_flops_per_moe_layer
    from lcmoe.estimate.memory import moe_dispatch_transient_bytes, stage_params_per_gpu
    from lcmoe.estimate.params import expert_params, latent_projection_params, layer_params
    from lcmoe.layout import pipeline_stages

    super_ = load_model("nemotron-3-super-120b-a12b")
    h, latent, f, k = 4096, 1024, 2688, 22
    assert expert_params(super_) == 2 * latent * f  # squared ReLU: up and down, no gate
    assert latent_projection_params(super_) == 2 * h * latent
    moe_layer = next(i for i in range(super_.num_layers) if super_.is_moe_layer(i))
    assert layer_params(super_, moe_layer).tp_replicated == 2 * h * latent
    assert routed_flops_per_moe_layer(super_) == 6 * 2 * latent * f * k + 12 * h * latent
    # Bridge's hybrid count (flop_utils.py:708-731) for a non-GLU latent MoE layer, ×3 for training.
    assert routed_flops_per_moe_layer(super_) == 3 * (4 * latent * f * k + 4 * h * latent)
    shape = TokenShape(tokens=4096, tp=1, sp=1, etp=1, ep=32, stored_gemm_input=2, seq_len=4096, mbs=1, cp=1)
    options = TrainingOptions(seq_len=4096)
    assert moe_dispatch_transient_bytes(super_, shape, options) == 2 * 2 * 4096 * k * latent
    run = make_run("nemotron-3-super-120b-a12b", "h100", seq_len=4096, tp=2, cp=1, ep=32, pp=2, vpp=1, gpus=64)
    tp1 = with_layout(run, tp=1, dp=32, sequence_parallel=False)
    stage = pipeline_stages(run.model, run.layout)[0]
    replicated = sum(count * layer_params(super_, first).tp_replicated for first, count in stage.layer_groups)
    split = stage_params_per_gpu(super_, run.layout, stage).dense
    whole = stage_params_per_gpu(super_, tp1.layout, pipeline_stages(tp1.model, tp1.layout)[0]).dense
    assert split == pytest.approx((whole - replicated) / 2 + replicated)


def test_megatron_latent_moe_args_parse() -> None:
    args = (
        "--num-layers 3 --hidden-size 256 --ffn-hidden-size 512 --num-attention-heads 8 "
        "--group-query-attention --num-query-groups 2 --kv-channels 32 --num-experts 8 --moe-router-topk 2 "
        "--moe-latent-size 64 --hybrid-layer-pattern MEM --mamba-num-heads 8 --squared-relu "
        "--seq-length 4096 --micro-batch-size 1 --global-batch-size 8 --vocab-size 1024"
    )
    assert parse_megatron_args(args, world_size=1).model.moe_latent_size == 64
