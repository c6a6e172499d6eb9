"""LoRA (Bridge ``cfg.peft = LoRA(...)``): frozen base, trainable adapters — parameters, state,
activations, time, emitted configs and the rules, each checked on a hand-computed case."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from lcmoe.catalog import load_model
from lcmoe.config_io.bridge import flatten, overrides_from_run, recipe_for, run_from_overrides
from lcmoe.emit.launchers import LaunchSettings, slurm_script
from lcmoe.emit.megatron_lm import NO_LORA, megatron_lm_text
from lcmoe.errors import LcmoeError
from lcmoe.estimate.flops import flops_per_token, lora_model_flops_per_token
from lcmoe.estimate.memory import (
    estimate_memory,
    layer_activation_bytes,
    stage_lora_params_per_gpu,
    stage_state_bytes,
    token_shape,
)
from lcmoe.estimate.params import lora_adapters
from lcmoe.estimate.time import estimate_time
from lcmoe.layout import pipeline_stages
from lcmoe.rules.legality import violations
from lcmoe.workload import LORA_TARGETS, TrainingOptions
from tests.conftest import run_cli
from tests.helpers import make_run, with_options

QKV = frozenset({"linear_qkv"})


def llama_lora(**changes: object):  # type: ignore[no-untyped-def]
    """Bridge's Llama3-70B LoRA perf recipe on 8 GB200: TP1 PP2 VPP20, MBS1 GBS32, seq 4096, qkv adapters."""
    run = make_run("llama3-70b", "gb200", seq_len=4096, cp=1, ep=1, pp=2, vpp=20, gpus=8, gbs=32)
    return with_options(run, peft="lora", lora_targets=QKV, **changes)


def test_adapter_widths_and_params_by_hand() -> None:
    """r·(in + out): Llama3-70B's linear_qkv 8192 → 8192 + 2·8·128 = 10240, r 32 → 589,824;
    linear_proj 8192 → 8192; linear_fc1 8192 → 2·28672; linear_fc2 28672 → 8192."""
    llama = load_model("llama3-70b")
    (qkv,) = lora_adapters(llama, 0, QKV)
    assert (qkv.in_features, qkv.out_features, qkv.column, qkv.expert) == (8192, 10240, True, False)
    assert qkv.params(32) == 32 * (8192 + 10240) == 589_824
    every = {a.target: a.params(32) for a in lora_adapters(llama, 0, LORA_TARGETS)}
    assert every == {
        "linear_qkv": 589_824,
        "linear_proj": 32 * (8192 + 8192),
        "linear_fc1": 32 * (8192 + 2 * 28672),
        "linear_fc2": 32 * (28672 + 8192),
    }
    # A MoE layer: the routed experts share one adapter per grouped linear (h 2048 → 2·768 and back).
    qwen = load_model("qwen3-30b-a3b")
    experts = [a for a in lora_adapters(qwen, 0, LORA_TARGETS) if a.expert]
    assert [(a.target, a.in_features, a.out_features) for a in experts] == [
        ("linear_fc1", 2048, 2 * 768),
        ("linear_fc2", 768, 2048),
    ]
    # MLA has no linear_qkv: only its output projection takes the default targets.
    dsv3 = load_model("deepseek-v3")
    assert [a.target for a in lora_adapters(dsv3, 0, LORA_TARGETS) if not a.target.startswith("linear_fc")] == [
        "linear_proj"
    ]


def test_only_the_adapters_carry_gradients_and_optimizer_state() -> None:
    """Stage 0 of PP2 holds 40 layers: 40 · 589,824 adapter parameters, with BF16 main grads (2 B)
    and BF16 Adam moments + FP32 master (8 B) over DP 4; the frozen base stays BF16 under FP8."""
    run = llama_lora(precision="fp8-tensorwise")
    stage = pipeline_stages(run.model, run.layout)[0]
    adapters = stage_lora_params_per_gpu(run.model, run.layout, stage, run.options)
    assert adapters.total == 40 * 589_824
    trained, state = stage_state_bytes(run.model, run.layout, stage, run.options, "blackwell")
    assert trained == adapters
    assert state.gradients == pytest.approx(2 * adapters.total)
    assert state.optimizer == pytest.approx((4 + 2 + 2) * adapters.total / 4)
    bf16_base = stage_state_bytes(run.model, run.layout, stage, replace(run.options, precision="bf16"), "blackwell")[1]
    assert state.weights == pytest.approx(bf16_base.weights)  # no FP8 primary weights under LoRA
    assert state.frozen_weights == pytest.approx(state.weights - 2 * adapters.total)
    assert state.weight_copies > 0  # Transformer Engine still quantizes the frozen weights for its GEMMs
    full = stage_state_bytes(run.model, run.layout, stage, replace(run.options, peft="none"), "blackwell")[1]
    assert full.gradients > 1000 * state.gradients


def test_frozen_linears_keep_no_inputs_and_adapters_keep_theirs() -> None:
    """One BF16 Llama3-70B layer at TP1, T = 4096, qkv adapters of rank 32: LoRA drops the inputs
    the frozen GEMMs kept for weight gradients — qkv's and fc1's norm outputs (2·T·h each) and
    fc2's input (2·T·ffn) — and adds the adapter's input 2·T·h and LoRA-A output 2·T·r."""
    run = llama_lora()
    full = replace(run.options, peft="none")
    t, h, ffn, r = 4096, 8192, 28672, 32
    lora_bytes = layer_activation_bytes(run.model, 0, token_shape(run.layout, run.options), run.options)
    full_bytes = layer_activation_bytes(run.model, 0, token_shape(run.layout, full), full)
    assert lora_bytes - full_bytes == pytest.approx(-2 * t * h - 2 * t * ffn + 2 * t * r)
    # Targets that read the attention output or the activation output store them in BF16.
    fc2 = replace(run.options, lora_targets=frozenset({"linear_fc2"}))
    fc2_bytes = layer_activation_bytes(run.model, 0, token_shape(run.layout, fc2), fc2)
    assert fc2_bytes - full_bytes == pytest.approx(-2 * t * h - 2 * t * h + 2 * t * r)


def test_a_moe_layers_qkv_adapter_keeps_its_own_input() -> None:
    """In a MoE layer only the shared expert's fc1 adapter reads the norm output the router keeps;
    the linear_qkv adapter reads the attention norm's output and stores it (2·T·h, TP1), plus its
    rank-r output (2·T·r)."""
    run = with_options(make_run("qwen3-30b-a3b", seq_len=4096, cp=1, ep=8, pp=1, vpp=1, gpus=8), peft="lora")
    t, h = 4096, 2048
    shape = token_shape(run.layout, run.options)
    qkv = replace(run.options, lora_targets=QKV)
    proj = replace(run.options, lora_targets=frozenset({"linear_proj"}))
    difference = layer_activation_bytes(run.model, 0, shape, qkv) - layer_activation_bytes(run.model, 0, shape, proj)
    assert difference == pytest.approx(2 * t * h)  # both keep their 2·T·r LoRA-A output


def test_lora_needs_less_than_full_training_and_regather_never_more() -> None:
    for tp in (1, 2, 4):
        run = make_run("qwen3-30b-a3b", "h100", seq_len=32768, tp=tp, cp=1, ep=8, pp=1, vpp=1, gpus=16)
        lora = with_options(run, peft="lora")
        regather = with_options(lora, lora_input_regather=True)
        peaks = [
            estimate_memory(r.model, r.hardware, r.layout, r.options).peak_allocated_bytes
            for r in (run, lora, regather)
        ]
        assert peaks[2] <= peaks[1] < peaks[0], tp
        if tp > 1:
            assert peaks[2] < peaks[1]  # the sequence-parallel adapters keep T·h/tp instead of T·h


def test_lora_time_skips_weight_gradients() -> None:
    """The frozen GEMMs run forward and data gradient only: the step is shorter, and TFLOP/s count
    total − (total − core attention)/3 per token (Bridge's LoRA count)."""
    run = make_run("llama3-70b", "gb200", seq_len=4096, cp=1, ep=1, pp=2, vpp=20, gpus=8, gbs=32)
    lora = with_options(run, peft="lora", lora_targets=QKV)
    full_time, lora_time = estimate_time(run), estimate_time(lora)
    assert lora_time.step_seconds < 0.8 * full_time.step_seconds
    breakdown = flops_per_token(run.model, 4096)
    assert lora_model_flops_per_token(breakdown) == pytest.approx(
        breakdown.attention_core + 2 / 3 * (breakdown.total - breakdown.attention_core)
    )
    per_token_ratio = (lora_time.model_tflops_per_gpu / lora_time.tokens_per_sec_per_gpu) / (
        full_time.model_tflops_per_gpu / full_time.tokens_per_sec_per_gpu
    )
    assert per_token_ratio == pytest.approx(lora_model_flops_per_token(breakdown) / breakdown.total)


def test_bridge_overrides_carry_the_adapters_and_read_back() -> None:
    run = llama_lora(lora_rank=16, lora_input_regather=True)
    overrides = overrides_from_run(run)
    assert (overrides["peft.dim"], overrides["peft.target_modules"]) == (16, ["linear_qkv"])
    assert overrides["peft.sequence_parallel_input_regather"] is True
    back = run_from_overrides(overrides, model=run.model, hardware=run.hardware, num_gpus=8)
    assert back.options.peft_summary() == run.options.peft_summary()
    assert run_from_overrides(
        flatten({"peft": "lora"}), model=run.model, hardware=run.hardware, num_gpus=8
    ).options.is_lora
    with pytest.raises(LcmoeError, match="dora"):
        run_from_overrides({"peft": "dora"}, model=run.model, hardware=run.hardware, num_gpus=8)
    assert recipe_for(run.model, run.options) == "llama3_70b_peft_config"
    script = slurm_script(run, LaunchSettings(recipe=recipe_for(run.model, run.options)))
    assert "--recipe \\\n  llama3_70b_peft_config \\\n  --mode \\\n  lora" in script
    assert megatron_lm_text(run) == NO_LORA
    with pytest.raises(LcmoeError, match="no Megatron Bridge recipe for deepseek-v3"):
        recipe_for(load_model("deepseek-v3"), run.options)


def test_lora_rules() -> None:
    mla = with_options(make_run("deepseek-v3"), peft="lora", lora_targets=QKV)
    assert [v.rule for v in violations(mla)] == ["L-LORA"]
    odd = with_options(make_run("qwen3-30b-a3b", tp=2, cp=1, ep=8, pp=1, vpp=1, gpus=16), peft="lora", lora_rank=33)
    assert "does not split over TP = 2" in violations(odd)[0].message
    with pytest.raises(LcmoeError, match="lora_targets"):
        TrainingOptions(seq_len=4096, peft="lora", lora_targets=frozenset({"in_proj"}))


def test_estimate_and_plan_take_peft_flags(tmp_path: object) -> None:
    code, out, _ = run_cli(
        "estimate", "-m", "llama3-70b", "-g", "gb200", "-n", "8", "-s", "4096", "--pp", "2", "--vpp", "20",
        "--gbs", "32", "--peft", "lora", "--lora-targets", "linear_qkv", "--json",
    )  # fmt: skip
    assert code == 0
    assert json.loads(out)["inputs"]["peft"] == {
        "scheme": "lora",
        "rank": 32,
        "targets": ["linear_qkv"],
        "input_regather": False,
    }
    code, _, err = run_cli(
        "estimate", "-m", "llama3-70b", "-n", "8", "-s", "4096", "--peft", "lora", "--lora-targets", "x"
    )
    assert code == 2 and "lora_targets" in err and "Traceback" not in err
    code, out, _ = run_cli(
        "plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "16k", "--peft", "lora", "--top", "1", "--json"
    )
    doc = json.loads(out)
    assert doc["inputs"]["peft"]["scheme"] == "lora" and doc["plans"][0]["peft"]["rank"] == 32
    from lcmoe.config_io.plan_json import run_from_plan

    assert run_from_plan(doc).options.is_lora
    code, out, _ = run_cli("sweep", "-m", "qwen3-30b-a3b", "-n", "8", "--seq-lens", "8k", "--peft", "lora", "--json")
    assert code == 0 and json.loads(out)["sweep"][0]["plan"]["peft"]["scheme"] == "lora"
    from lcmoe.plan.format import peft_text

    assert peft_text(doc["inputs"]["peft"]).startswith("LoRA finetuning: frozen base, rank 32 adapters on linear_fc1")
    assert peft_text(None) == ""
