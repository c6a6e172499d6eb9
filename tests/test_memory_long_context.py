"""Long-context memory of the non-standard sequence mixers, term by term against the formulas in
their docstrings (derived from Megatron-Core 0.19.2, flash-linear-attention and Transformer
Engine), and how the Gated DeltaNet and DSA peaks grow with the sequence length."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lcmoe.catalog import load_model
from lcmoe.estimate.memory import (
    GDN_CHUNK,
    TokenShape,
    cp_p2p_attention_forward_bytes,
    dsa_kernel_scratch_bytes,
    dsa_sparse_backward_bytes,
    estimate_memory,
    gdn_activation_bytes,
    gdn_chunk_backward_bytes,
    layer_activation_bytes,
    mamba_scan_backward_bytes,
    moe_dispatch_transient_bytes,
    norm_bytes,
    stage_mixer_transients,
    token_shape,
)
from lcmoe.layout import pipeline_stages
from lcmoe.specs.layer_patterns import AttentionKind
from lcmoe.specs.layers import attention_kind
from lcmoe.workload import TrainingOptions
from tests.helpers import make_run, with_layout

NEXT = "qwen3-next-80b-a3b"
GLM = "glm-5.2"


def shape_of(tokens: float, *, tp: int = 1, cp: int = 1, comm: str = "p2p", a: float = 2.0) -> TokenShape:
    return TokenShape(
        tokens=tokens,
        tp=tp,
        sp=tp,
        etp=1,
        ep=8,
        stored_gemm_input=a,
        seq_len=int(tokens * cp),
        mbs=1,
        cp=cp,
        cp_comm_type=comm,
    )


def first_layer(model_name: str, kind: AttentionKind) -> int:
    model = load_model(model_name)
    return next(i for i in range(model.num_layers) if attention_kind(model, i) is kind)


def test_gdn_stored_tensors_by_hand() -> None:
    """Qwen3-Next (Hk 16, Hv 32, dk = dv = 128, h 2048) at T = 100 local tokens, TP 2."""
    m = load_model(NEXT)
    t, tp = 100.0, 2
    shape = shape_of(t, tp=tp)
    options = TrainingOptions(seq_len=100)
    qk, vd, hk, hv = 16 * 128, 32 * 128, 16, 32
    expected = norm_bytes(shape, 2048, options, standalone=False)
    expected += 2 * t * (2 * qk + 2 * vd + 2 * hv) / tp  # in_proj output, kept by the conv's saved view
    expected += 2 * t * 2 * qk / tp + 4 * t * 2 * hk / tp  # l2-normalised q, k and their rstd
    expected += 2 * t * (2 * hv * 128 + vd) / tp  # q, k repeated to 32 heads; v
    expected += (4 + 2 + 2) * t * hv / tp + 2 * t * hv * 64 / tp  # g (FP32), beta, alpha; A
    expected += 3 * 2 * t * vd / tp + 2 * t * vd / tp  # gated norm in/out, z; out_proj input
    assert gdn_activation_bytes(m, shape, options) == pytest.approx(expected)
    assert GDN_CHUNK == 64


def test_gdn_chunk_backward_by_hand() -> None:
    """w, dq, dk, dw, dk2 (dk wide), u, v_new, dv, dv (dv wide), h and dh per 64-token chunk,
    two FP32 gate grads and db, per token and value head: 2·(5·128 + 4·128) + 2·2·128·128/64
    + 8 + 2 = 3338 bytes. Qwen3-Next at T = 4096 (64K over CP 16): 437 MB."""
    m = load_model(NEXT)
    per = 2 * (5 * 128 + 4 * 128) + 2 * 2 * 128 * 128 / 64 + 2 * 4 + 2
    assert per == 3338
    assert gdn_chunk_backward_bytes(m, shape_of(100, tp=2)) == pytest.approx(100 * 32 / 2 * per)
    assert gdn_chunk_backward_bytes(m, shape_of(4096, cp=16)) == pytest.approx(4096 * 32 * per)


def test_gdn_memory_depends_on_local_tokens_only() -> None:
    """Megatron's CP all-to-all gives each rank the whole sequence for 1/cp of the heads, so
    the stored tensors and the chunk backward are those of T = S/cp tokens: 64K over CP 16 is
    4K on one rank, and doubling S at fixed CP doubles both."""
    m = load_model(NEXT)
    options = TrainingOptions(seq_len=65536)
    split = shape_of(4096, cp=16)
    alone = shape_of(4096, cp=1)
    assert gdn_activation_bytes(m, split, options) == pytest.approx(gdn_activation_bytes(m, alone, options))
    assert gdn_chunk_backward_bytes(m, split) == pytest.approx(gdn_chunk_backward_bytes(m, alone))
    double = shape_of(8192, cp=16)
    assert gdn_activation_bytes(m, double, options) == pytest.approx(2 * gdn_activation_bytes(m, split, options))
    assert gdn_chunk_backward_bytes(m, double) == pytest.approx(2 * gdn_chunk_backward_bytes(m, split))


def test_gdn_peak_grows_with_sequence_length_as_the_local_tokens() -> None:
    """Qwen3-Next on 32 GB200 at CP 16 (every term per local token): from 32K to 64K the stored
    activations and the transient both double, and the stage's transient holds the GDN chunk
    backward on top of its largest layer."""
    base = make_run(NEXT, "gb200", seq_len=32768, tp=1, cp=16, ep=32, pp=1, vpp=1, gpus=32, dispatcher="hybridep")
    long = replace(base, options=replace(base.options, seq_len=65536))
    short_m = estimate_memory(base.model, base.hardware, base.layout, base.options).stages[0]
    long_m = estimate_memory(long.model, long.hardware, long.layout, long.options).stages[0]
    assert long_m.activations == pytest.approx(2 * short_m.activations)
    assert long_m.transient == pytest.approx(2 * short_m.transient)
    assert long_m.peak_allocated > short_m.peak_allocated
    stage = pipeline_stages(long.model, long.layout)[0]
    shape = shape_of(4096, cp=16)
    forward, backward = stage_mixer_transients(long.model, stage, shape, long.options)
    assert forward == 0.0
    assert backward == pytest.approx(gdn_chunk_backward_bytes(long.model, shape))


def test_dsa_sparse_backward_by_hand() -> None:
    """GLM-5.2 (64 heads, rkv 512, dr 64, top-k 2048) at T = 6250 over CP 32 (200K): two copies
    of q, out, dO, LSE and indices, dq and its scattered copy, FP32 dkv over all 200K keys."""
    m = load_model(GLM)
    t, keys, n, d_q, d_v, k = 6250.0, 200_000.0, 64, 576, 512, 2048
    expected = 2 * (2 * t * n * (d_q + 2 * d_v) + 4 * t * n + 4 * t * k)
    expected += 2 * 2 * t * n * d_q + 4 * keys * d_q
    assert dsa_sparse_backward_bytes(m, shape_of(t, cp=32)) == pytest.approx(expected)
    assert expected / 1024**3 == pytest.approx(3.76, abs=0.01)
    # TP 4 leaves 16 local heads, which FlashMLA pads back to 64: only dkv is unchanged.
    assert dsa_sparse_backward_bytes(m, shape_of(t, tp=4, cp=32)) == pytest.approx(expected)
    assert dsa_sparse_backward_bytes(load_model("deepseek-v3"), shape_of(t, cp=32)) == 0.0


def test_dsa_backward_grows_with_the_gathered_keys() -> None:
    """At fixed local tokens the DSA backward grows by 4 B per gathered key and latent channel
    (the all-gather CP keeps every key): doubling CP at T = 6250 adds 4·ΔS·576."""
    m = load_model(GLM)
    at32 = dsa_sparse_backward_bytes(m, shape_of(6250, cp=32))
    at64 = dsa_sparse_backward_bytes(m, shape_of(6250, cp=64))
    assert at64 - at32 == pytest.approx(4 * 6250 * 32 * 576)


def test_dsa_stage_transient_is_the_larger_of_scratch_and_backward() -> None:
    """GLM-5.2 200K card layout (full recompute): a middle stage (an indexer layer first) carries
    the indexer's capped 3 GiB scratch in the forward and the 3.8 GiB sparse backward; its
    transient is the largest layer + the dispatch buffers + the larger of the two. From 100K to
    200K at CP 32 the sparse backward doubles (T and S both double) while the scratch stays at
    its 3 GiB cap."""
    run = with_layout(
        make_run(GLM, seq_len=200_000, cp=32, ep=32, pp=19, vpp=1, gpus=608, gbs=13, recompute_granularity="full"),
        pipeline_layout=load_model(GLM).recipe_pipeline_layouts["19x1"],
        cp_comm_type="all_gather",
    )
    m = run.model
    stage = pipeline_stages(m, run.layout)[1]
    backwards = []
    for seq in (100_000, 200_000):
        r = replace(run, options=replace(run.options, seq_len=seq))
        shape = token_shape(r.layout, r.options)
        assert shape.cp_comm_type == "all_gather"
        forward, backward = stage_mixer_transients(m, stage, shape, r.options)
        assert forward == pytest.approx(dsa_kernel_scratch_bytes(m, shape)) == 3 * 1024**3
        assert backward == pytest.approx(dsa_sparse_backward_bytes(m, shape))
        backwards.append(backward)
        largest = max(layer_activation_bytes(m, first, shape, r.options) for first, _ in stage.layer_groups)
        expected = largest + moe_dispatch_transient_bytes(m, shape, r.options) + max(forward, backward)
        memory = estimate_memory(m, r.hardware, r.layout, r.options)
        assert memory.stages[1].transient == pytest.approx(expected)
        assert memory.fits()
    assert backwards[1] == pytest.approx(2 * backwards[0])


def test_ring_cp_attention_forward_by_hand() -> None:
    """TE's ring CP keeps cp K/V buffers, cp per-step outputs and LSEs and an FP32 corrected
    output: Qwen3-Next's full-attention layers (16 heads, 2 KV groups, head 256) at 64K over
    CP 16 and DeepSeek-V3's MLA (128 heads, K 192, V 128) at 128K over CP 32. Nothing for a2a,
    one CP rank, Gated DeltaNet or DSA."""
    nxt, dsv3 = load_model(NEXT), load_model("deepseek-v3")
    full = first_layer(NEXT, AttentionKind.GQA)
    t, s = 4096.0, 65536.0
    expected = 2 * s * 2 * (256 + 256) + 2 * s * 16 * 256 + 4 * s * 16 + 4 * t * 16 * 256
    assert cp_p2p_attention_forward_bytes(nxt, full, shape_of(t, cp=16)) == pytest.approx(expected)
    t, s = 4096.0, 131072.0
    expected = 2 * s * 128 * (192 + 128) + 2 * s * 128 * 128 + 4 * s * 128 + 4 * t * 128 * 128
    assert cp_p2p_attention_forward_bytes(dsv3, 0, shape_of(t, cp=32)) == pytest.approx(expected)
    assert cp_p2p_attention_forward_bytes(dsv3, 0, shape_of(t, cp=32, comm="a2a")) == 0.0
    assert cp_p2p_attention_forward_bytes(dsv3, 0, shape_of(t, cp=1)) == 0.0
    assert cp_p2p_attention_forward_bytes(nxt, first_layer(NEXT, AttentionKind.GDN), shape_of(t, cp=16)) == 0.0
    assert cp_p2p_attention_forward_bytes(load_model(GLM), 3, shape_of(t, cp=32)) == 0.0


def test_mamba_scan_backward_by_hand() -> None:
    """Nemotron-3 Nano (64 heads of 64, N 128, 8 groups, chunk 128) at T = 8192, TP 1: FP32 and
    BF16 states and state gradients, CB, the recomputed x·B·C and its gradient, dzxbcdt, the
    output-gradient copy and three FP32 [T, nh] buffers; per local token, so CP changes nothing
    at fixed T; nothing for a model without Mamba layers."""
    nano = load_model("nemotron-3-nano-30b-a3b")
    t, d_i, g, n, nh, cs = 8192.0, 64 * 64, 8, 128, 64, 128
    xbc = d_i + 2 * g * n
    expected = 12 * t * d_i * n / cs + 4 * t * g * cs + 2 * 2 * t * xbc + 2 * t * (d_i + xbc + nh)
    expected += 2 * t * d_i + 12 * t * nh
    assert mamba_scan_backward_bytes(nano, shape_of(t)) == pytest.approx(expected)
    assert expected / 1024**3 == pytest.approx(0.8, abs=0.05)
    assert mamba_scan_backward_bytes(nano, shape_of(t, cp=4)) == pytest.approx(expected)
    assert mamba_scan_backward_bytes(load_model(NEXT), shape_of(t)) == 0.0
