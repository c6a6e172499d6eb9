"""Sync-free experts and the MoE paged stash (Megatron-Core ``moe_expert_rank_capacity_factor``,
``moe_paged_stash`` and its buffer factors): the rules (one passing and one failing case each),
the expert bytes recomputed by hand (static budget, GPU pages, the working layer, host pages),
the time terms recomputed from their docstrings, the band's widening, the emitters' round trip
through the readers ``check`` uses, and Megatron Bridge 0.6.2 + Megatron-Core 0.19.2 judging an
emitted config."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lcmoe.config_io.bridge import overrides_from_run, parse_override_lines, run_from_overrides
from lcmoe.config_io.megatron_args import options_from_args, tokenize_args
from lcmoe.emit.bridge import overrides_text
from lcmoe.emit.environment import environment
from lcmoe.emit.mcore import transformer_config_kwargs
from lcmoe.emit.megatron_lm import megatron_lm_args
from lcmoe.errors import LcmoeError
from lcmoe.estimate.band import TimeBand, widened
from lcmoe.estimate.memory import estimate_memory, shipped_coefficients, token_shape
from lcmoe.estimate.memory.activations import moe_activation_bytes
from lcmoe.estimate.memory.paged_stash import balanced_dispatched_tokens, expert_bytes_per_token
from lcmoe.estimate.time import estimate_time, time_amounts
from lcmoe.estimate.time.offload import activation_offload_doubt, activation_offload_seconds
from lcmoe.estimate.time.paged_stash import ASSUMED_OVERFLOW_RATE, STASH_HBM_PASSES
from lcmoe.layout import inflight_microbatch_chunks
from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig
from tests.helpers import make_run, with_options

STASH = {"moe_expert_rank_capacity_factor": 1.5, "moe_paged_stash": True}


def _qwen(gpu: str = "b200", **changes: object) -> RunConfig:
    """Qwen3-30B-A3B at 32K on 16 B200: CP 2, EP 8, PP 2 (stage 0 keeps 2 microbatches in flight),
    HybridEP, the busiest rank at 1.2x the balanced tokens."""
    run = make_run("qwen3-30b-a3b", gpu, seq_len=32768, tp=1, cp=2, ep=8, pp=2, vpp=1, gpus=16, dispatcher="hybridep")
    return with_options(run, **{"moe_token_imbalance": 1.2, **changes})


def _broken(run: RunConfig) -> set[str]:
    return {v.rule for v in violations(run)}


# ----- the rules ------------------------------------------------------------------------------
def test_the_stash_and_its_prerequisites() -> None:
    good = _qwen(**STASH, moe_paged_stash_buffer_size_factor_cuda=1.2)
    assert violations(good) == []
    assert "L-STASH-CAPACITY" in _broken(_qwen(moe_paged_stash=True))
    assert "L-STASH-DISPATCHER" in _broken(with_options(good, dispatcher="alltoall"))
    assert "L-STASH-FUSED-MLP" in _broken(_qwen("h100", **STASH, moe_paged_stash_buffer_size_factor_cuda=1.2))
    assert "L-STASH-FUSED-MLP" in _broken(with_options(good, moe_grouped_gemm=False))
    off = with_options(good, activation_offload_modules=frozenset({"expert_fc1"}))
    assert "L-STASH-OFFLOAD" in _broken(off)
    assert "L-STASH-OFFLOAD" not in _broken(with_options(good, activation_offload_modules=frozenset({"core_attn"})))


def test_lcmoe_load_model_says_when_every_step_re_runs() -> None:
    """A budget below the busiest rank's load drops tokens every step; pages (GPU + host) below it
    overflow every step: both re-run the step (PagedStashRunner)."""
    assert "L-STASH-BUDGET" in _broken(_qwen(moe_expert_rank_capacity_factor=1.1))
    assert "L-STASH-BUDGET" not in _broken(_qwen(moe_expert_rank_capacity_factor=1.2))
    assert "L-STASH-POOL" in _broken(_qwen(**STASH))  # 1.10 GPU pages < 1.2
    assert "L-STASH-POOL" not in _broken(_qwen(**STASH, moe_paged_stash_buffer_size_factor_cpu=0.1))
    # A negative factor sizes the pages over the actual tokens: |-1| x 1.2 holds them.
    assert "L-STASH-POOL" not in _broken(_qwen(**STASH, moe_paged_stash_buffer_size_factor_cuda=-1.0))


def test_options_refuse_bad_factors() -> None:
    with pytest.raises(LcmoeError, match="moe_expert_rank_capacity_factor"):
        _qwen(moe_expert_rank_capacity_factor=0.0)
    with pytest.raises(LcmoeError, match="moe_paged_stash_buffer_size_factor_cuda"):
        _qwen(moe_paged_stash_buffer_size_factor_cuda=1e6)


# ----- memory: the experts' tensors by what holds them ------------------------------------------
def _per_layer(run: RunConfig) -> tuple[float, float]:
    shape = token_shape(run.layout, run.options)
    balanced = balanced_dispatched_tokens(run.model, shape.tokens, shape.sp, shape.etp)
    return balanced, expert_bytes_per_token(run.model, shape.stored_gemm_input, shape.etp, run.options)


def test_expert_bytes_by_hand() -> None:
    """Per token: FC1 input 2·h, FC1 output 2·2f (SwiGLU), FC2 input 2·f (BF16). Dynamic: 1.2x the
    balanced T·k; static budget: 1.5x; GPU pages: 1.1x."""
    dyn = _qwen()
    balanced, per_token = _per_layer(dyn)
    h, f = dyn.model.hidden_size, dyn.model.expert_ffn
    assert per_token == 2 * h + 2 * 2 * f + 2 * f
    assert balanced == 32768 / 2 * dyn.model.moe_router_topk
    shape = token_shape(dyn.layout, dyn.options)
    base = moe_activation_bytes(dyn.model, shape, dyn.options)
    cap = _qwen(moe_expert_rank_capacity_factor=1.5)
    stash = _qwen(**STASH, moe_paged_stash_buffer_size_factor_cpu=0.1)
    assert moe_activation_bytes(cap.model, shape, cap.options) - base == pytest.approx(0.3 * balanced * per_token)
    assert moe_activation_bytes(stash.model, shape, stash.options) - base == pytest.approx(-0.1 * balanced * per_token)


def test_stage_memory_adds_the_working_layer_and_the_host_pages() -> None:
    """Stage 0: 24 MoE layers, 2 microbatches in flight. Against the dynamic run, its activations
    change by scale·(48·(1.1 − 1.2) + 1.5)·Td·bytes (the pages, one layer at the budget), and the
    host holds 0.1 × 48 layers' expected tokens."""
    dyn, stash = _qwen(), _qwen(**STASH, moe_paged_stash_buffer_size_factor_cpu=0.1)
    balanced, per_token = _per_layer(dyn)
    inflight = inflight_microbatch_chunks(dyn.layout, 0)
    layers = dyn.model.num_layers // 2
    assert inflight == 2
    scale = shipped_coefficients().activation_scale
    before = estimate_memory(dyn.model, dyn.hardware, dyn.layout, dyn.options).stages[0]
    after = estimate_memory(stash.model, stash.hardware, stash.layout, stash.options).stages[0]
    expected = scale * (inflight * layers * (1.1 - 1.2) + 1.5) * balanced * per_token
    assert after.activations - before.activations == pytest.approx(expected)
    assert after.activations_host == pytest.approx(0.1 * inflight * layers * balanced * per_token)
    assert before.activations_host == 0.0


# ----- time: the page copies and the assumed re-run ----------------------------------------------
def test_stash_time_recomputed_from_the_docstring() -> None:
    """Each MoE layer stashes the received 1.2·Td tokens: 4 HBM passes of what stays on the GPU
    (1.1·Td), 2 host-link passes of what spills (0.1·Td); the re-run is 1% of the step's
    forward/backward with those copies."""
    plain, stash = _qwen(), _qwen(**STASH, moe_paged_stash_buffer_size_factor_cpu=0.1)
    balanced, per_token = _per_layer(stash)
    layers = stash.model.num_layers // 2
    hw = stash.hardware
    per_microbatch = (
        STASH_HBM_PASSES * layers * 1.1 * balanced * per_token / hw.hbm_bandwidth
        + 2 * layers * 0.1 * balanced * per_token / hw.host_link_bandwidth
    )
    a = time_amounts(stash)
    t, base = estimate_time(stash), estimate_time(plain)
    assert t.breakdown["paged_stash"] == pytest.approx(per_microbatch * a.num_microbatches)
    tail = t.breakdown["dp_comm"] + t.breakdown["optimizer"]
    forward_backward = t.step_seconds - tail - t.breakdown["paged_stash_rerun"]
    assert t.breakdown["paged_stash_rerun"] == pytest.approx(ASSUMED_OVERFLOW_RATE * forward_backward)
    extra = t.breakdown["paged_stash"] + t.breakdown["paged_stash_rerun"]
    assert t.step_seconds - base.step_seconds == pytest.approx(extra)
    assert t.unmeasured_seconds == pytest.approx(extra)
    # Sync-free experts alone change no term: dropless HybridEP's sync is not charged (time.host).
    assert estimate_time(_qwen(moe_expert_rank_capacity_factor=1.5)).step_seconds == pytest.approx(base.step_seconds)
    assert base.unmeasured_seconds == 0.0


def test_the_band_widens_by_what_no_measured_run_prices() -> None:
    band = TimeBand(pct=12.0, base_pct=10.0, penalty_pct=2.0, nearest="r", nearest_model="m", distance=(0.0,) * 6)
    assert widened(band, 0.5, 10.0).pct == pytest.approx(17.0)
    assert widened(band, 0.5, 10.0).unmeasured_pct == pytest.approx(5.0)
    assert widened(band, 0.0, 10.0) is band


def test_activation_offload_doubt_spans_its_possible_exposure() -> None:
    """Copy 0.04 s behind 1 s of compute: charged 10% (0.004 s), the truth between 0 and 0.04 s:
    off by up to 0.036 s. Copy 0.4 s behind 0.1 s: charged 0.3 s, between 0.3 and 0.4 s: 0.1 s."""
    assert activation_offload_seconds(1e9, 50e9, 1.0) == pytest.approx(0.004)
    assert activation_offload_doubt(1e9, 50e9, 1.0) == pytest.approx(0.036)
    assert activation_offload_doubt(10e9, 50e9, 0.1) == pytest.approx(0.1)
    assert activation_offload_doubt(0.0, 50e9, 1.0) == 0.0


# ----- emitted and read back -------------------------------------------------------------------
def test_bridge_overrides_round_trip() -> None:
    run = _qwen(**STASH, moe_paged_stash_buffer_size_factor_cuda=1.2, moe_paged_stash_buffer_size_factor_cpu=1.0)
    out = overrides_from_run(run)
    assert out["model.moe_expert_rank_capacity_factor"] == 1.5
    assert out["model.use_transformer_engine_op_fuser"] is True
    assert out["model.moe_paged_stash"] is True
    assert out["model.moe_paged_stash_buffer_size_factor_cuda"] == 1.2
    assert out["model.moe_paged_stash_buffer_size_factor_cpu"] == 1.0
    back = run_from_overrides(
        parse_override_lines(overrides_text(run)), model=run.model, hardware=run.hardware, num_gpus=16
    )
    for field in (
        "moe_expert_rank_capacity_factor",
        "moe_paged_stash",
        "moe_paged_stash_buffer_size_factor_cuda",
        "moe_paged_stash_buffer_size_factor_cpu",
    ):
        assert getattr(back.options, field) == getattr(run.options, field), field
    assert not any("stash" in key or "capacity" in key for key in overrides_from_run(_qwen()))
    assert environment(run)["NVTE_CUTEDSL_FUSED_GROUPED_MLP"][0] == "1"
    assert "NVTE_CUTEDSL_FUSED_GROUPED_MLP" not in environment(_qwen())


def test_readers_refuse_what_megatron_core_refuses() -> None:
    run = _qwen(**STASH, moe_paged_stash_buffer_size_factor_cuda=1.2)
    text = overrides_text(run)
    read = {"model": run.model, "hardware": run.hardware, "num_gpus": 16}
    with pytest.raises(LcmoeError, match="TE op fuser"):
        run_from_overrides(parse_override_lines(text.replace("op_fuser=true", "op_fuser=false")), **read)
    with pytest.raises(LcmoeError, match="cpu_offloading"):
        run_from_overrides(parse_override_lines(text + "\nmodel.cpu_offloading=true"), **read)


def test_megatron_lm_args_and_mcore_kwargs_round_trip() -> None:
    run = _qwen(**STASH, moe_paged_stash_buffer_size_factor_cuda=1.2, moe_paged_stash_buffer_size_factor_cpu=0.5)
    args = megatron_lm_args(run)
    assert "--moe-expert-rank-capacity-factor=1.5" in args
    assert "--use-transformer-engine-op-fuser" in args and "--moe-paged-stash" in args
    back = options_from_args(tokenize_args(args))
    assert back.moe_expert_rank_capacity_factor == 1.5 and back.moe_paged_stash
    assert back.moe_paged_stash_buffer_size_factor_cuda == 1.2
    assert back.moe_paged_stash_buffer_size_factor_cpu == 0.5
    _, kwargs = transformer_config_kwargs(run)
    assert kwargs["moe_paged_stash"] is True and kwargs["use_transformer_engine_op_fuser"] is True
    assert "moe_paged_stash" not in transformer_config_kwargs(_qwen())[1]


def test_plan_json_reads_back() -> None:
    from lcmoe.config_io.plan_json import run_from_plan
    from lcmoe.plan.plans import Plan

    run = _qwen(**STASH, moe_paged_stash_buffer_size_factor_cuda=1.2)
    memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
    entry = Plan(run, memory, estimate_time(run)).as_dict()
    assert entry["paged_stash"] == {"rank_capacity_factor": 1.5, "stash": True, "cuda_factor": 1.2, "cpu_factor": 0.0}
    doc = {"inputs": {"model": "qwen3-30b-a3b", "gpu": "b200", "seq_len": 32768}, "plans": [entry]}
    back = run_from_plan(doc)
    assert back.options.moe_paged_stash and back.options.moe_expert_rank_capacity_factor == 1.5
    plain = _qwen()
    assert "paged_stash" not in Plan(plain, memory, estimate_time(plain)).as_dict()


def test_estimate_flags_and_check_read_back(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    layout = ("-m", "qwen3-30b-a3b", "-g", "b200", "-n", "16", "-s", "32k", "--cp", "2", "--ep", "8", "--pp", "2")
    base = (*layout, "--dispatcher", "hybridep", "--moe-imbalance", "1.2", "--json")
    flags = ("--moe-rank-capacity-factor", "1.5", "--paged-stash", "--paged-stash-cuda-factor", "1.2")
    code, out, err = run_cli("estimate", *base, *flags)
    assert code in (0, 1), err
    doc = json.loads(out)
    assert doc["inputs"]["paged_stash"]["stash"] is True
    assert doc["time"]["breakdown"]["paged_stash"] > 0
    code, _, err = run_cli("estimate", *base, "--paged-stash")
    assert code != 0 and "L-STASH-CAPACITY" in err
    run = _qwen(**STASH, moe_paged_stash_buffer_size_factor_cuda=1.2)
    path = tmp_path / "stash.txt"
    path.write_text(overrides_text(run))
    code, out, err = run_cli("check", str(path), "--model", "qwen3-30b-a3b", "--gpu", "b200", "--gpus", "16", "--json")
    checked = json.loads(out)
    assert not [e for e in checked["errors"] if e["rule"].startswith("L-STASH")], err


# ----- Megatron Bridge 0.6.2 + Megatron-Core 0.19.2 judge the emitted config -------------------
BRIDGE_PYTHON = os.environ.get("LCMOE_BRIDGE_PYTHON", "")


@pytest.mark.skipif(
    not (BRIDGE_PYTHON and Path(BRIDGE_PYTHON).exists()),
    reason="LCMOE_BRIDGE_PYTHON (an interpreter with megatron-bridge 0.6.2) is not set; .ci/run builds one",
)
def test_bridge_and_megatron_core_run_the_emitted_stash(tmp_path: Path) -> None:
    """The emitted overrides go through Bridge's recipe, override machinery and
    ``runtime_config_update`` (TransformerConfig.__post_init__). The emitted stash starts; without
    the rank capacity factor Megatron-Core refuses (transformer_config.py:1907-1911) as
    L-STASH-CAPACITY does, without the op fuser (:1699-1705), and beside expert_fc1 offloading
    (:1912-1921) as L-STASH-OFFLOAD does."""
    from tests.test_bridge_runtime import _case, bridge_results

    good = _qwen(**STASH, moe_paged_stash_buffer_size_factor_cuda=1.2, moe_paged_stash_buffer_size_factor_cpu=1.0)
    assert violations(good) == []
    case = _case("stash", good, tmp_path)
    overrides = case["overrides"]
    no_capacity = [o for o in overrides if "rank_capacity_factor" not in o]
    no_fuser = [o for o in overrides if "op_fuser" not in o]
    offloaded = [*overrides, "model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]"]
    cases = [
        case,
        {**_case("stash/yaml", good, tmp_path, as_yaml=True)},
        {**case, "name": "stash/no-capacity", "overrides": no_capacity},
        {**case, "name": "stash/no-fuser", "overrides": no_fuser},
        {**case, "name": "stash/expert-offload", "overrides": offloaded, "env": {"NVTE_CPU_OFFLOAD_V1": "1"}},
    ]
    results = bridge_results(cases)
    for name in ("stash", "stash/yaml"):
        assert results[name]["ok"], (name, results[name].get("error"))
    assert "requires moe_expert_rank_capacity_factor" in results["stash/no-capacity"]["error"]
    assert "use_transformer_engine_op_fuser" in results["stash/no-fuser"]["error"]
    assert "paged stash covers those activations" in results["stash/expert-offload"]["error"]


# ----- activation-offloading loose ends: the plan table's offload column and LC-OFFLOAD-128K ------
def test_offload_column_names_activation_offloading_and_host_pages() -> None:
    from lcmoe.plan.format import offload_text

    assert offload_text({"optimizer_offload_fraction": 0.5}) == "0.5"
    act = {"modules": ["core_attn", "expert_fc1"], "fraction": 0.5}
    assert offload_text({"optimizer_offload_fraction": 0.0, "activation_offload": act}) == (
        "0 + act core_attn,expert_fc1@0.5"
    )
    stash = {"rank_capacity_factor": 1.5, "stash": True, "cuda_factor": 1.2, "cpu_factor": 1.0}
    assert offload_text({"optimizer_offload_fraction": 0.0, "paged_stash": stash}) == "0 + stash host 1x"


def test_offload_advice_counts_activation_offloading() -> None:
    from lcmoe.rules.advice import RULES

    advice = next(rule for rule in RULES if rule.id == "LC-OFFLOAD-128K")
    run = make_run("qwen3-30b-a3b", seq_len=131072, tp=1, cp=8, ep=8, pp=2, vpp=1, gpus=16)
    assert "fits without" in (advice.when(run) or "")
    offloaded = with_options(run, activation_offload_modules=frozenset({"expert_fc1"}))
    assert "activation offloading of expert_fc1" in (advice.when(offloaded) or "")
    both = with_options(offloaded, optimizer_offload_fraction=0.5)
    text = advice.when(both) or ""
    assert text.startswith("optimizer CPU offload 50% and activation offloading of expert_fc1 over")


def test_the_planner_leaves_the_stash_out_at_forced_balance() -> None:
    """The planner plans at forced balance (moe_token_imbalance 1.0): GPU pages for the expected
    tokens then hold as much as the dynamic tensors, and the working layer and the copies only add
    memory and time, so the stash is no choice there (docs/support-matrix.md)."""
    plain = _qwen(moe_token_imbalance=1.0)
    stash = with_options(plain, **STASH, moe_paged_stash_buffer_size_factor_cuda=1.0)
    assert violations(stash) == []
    before = estimate_memory(plain.model, plain.hardware, plain.layout, plain.options)
    after = estimate_memory(stash.model, stash.hardware, stash.layout, stash.options)
    assert after.stages[0].peak_reserved > before.stages[0].peak_reserved
    assert estimate_time(stash).step_seconds > estimate_time(plain).step_seconds
