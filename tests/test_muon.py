"""The Muon optimizer (``optimizer=muon``, Megatron-Core's TensorParallelMuon under the layer-wise
distributed optimizer): each cost term recomputed from its formula (estimate.muon), the memory
it keeps, the rules (one passing and one failing case each), plan and estimate, the emitters'
round trip through the readers ``check`` uses, and Megatron Bridge 0.6.2 + Megatron-Core 0.19.2
judging an emitted config."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lcmoe.config_io.bridge import overrides_from_run, parse_override_lines, run_from_overrides
from lcmoe.config_io.megatron_args import options_from_args, tokenize_args
from lcmoe.emit.bridge import overrides_text
from lcmoe.emit.megatron_lm import megatron_lm_args
from lcmoe.errors import LcmoeError
from lcmoe.estimate.memory import estimate_memory, stage_params_per_gpu
from lcmoe.estimate.muon import (
    MuonMatrix,
    distributed_ns_step_flops,
    layer_matrices,
    matrix_step_cost,
    muon_step_seconds,
    ns_step_flops,
    stage_ns_cost,
)
from lcmoe.estimate.params import layer_params
from lcmoe.estimate.time import estimate_time, time_amounts
from lcmoe.layout import pipeline_stages
from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig
from lcmoe.workload import TrainingOptions
from tests.helpers import make_run, with_options

MUON_RULES = {"L-MUON-FSDP", "L-MUON-PRECISION-AWARE", "L-MUON-OFFLOAD", "L-MUON-FP16", "L-MUON-INSTANCES"}


def _qwen(*, muon: bool = True, **changes: object) -> RunConfig:
    """Qwen3-30B-A3B at 32K on 16 H100: CP 2, EP 8, no PP; FP32 moments and main grads (Muon's)."""
    run = make_run("qwen3-30b-a3b", seq_len=32768, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16)
    fields: dict[str, object] = {"main_grads_dtype": "fp32", "exp_avg_dtype": "fp32"}
    if muon:
        fields["optimizer"] = "muon"
    return with_options(run, **(fields | changes))


def _broken(run: RunConfig) -> set[str]:
    return {v.rule for v in violations(run)} & MUON_RULES


# ----- the Newton-Schulz step ---------------------------------------------------------------------
def test_ns_step_flops_count_the_three_gemms() -> None:
    """A 3×5 matrix: X·Xᵀ (3×5 @ 5×3) = 2·3·5·3 = 90, A·A (3×3 @ 3×3) = 2·27 = 54, B·X (3×3 @
    3×5) = 90: 234 = 4·p²·q + 2·p³ with p = 3, q = 5; the transpose makes 5×3 the same."""
    assert ns_step_flops(3, 5) == 234 == ns_step_flops(5, 3)
    # A square n×n matrix: 6·n³.
    assert ns_step_flops(7168, 7168) == 6 * 7168**3


def test_distributed_ns_keeps_the_unsplit_dim() -> None:
    """X kept×split/tp = 4×(6/2): X·Xᵀ 2·4·3·4 = 96, A·A 2·4³ = 128, B·X 96: 320."""
    assert distributed_ns_step_flops(4, 6, 2) == 320


def test_matrix_step_cost_by_tp_mode() -> None:
    """A column-split 4096×2048 matrix (Qwen3-30B's q) over TP 4, 5 steps."""
    m = MuonMatrix(4096, 2048, "column")
    blockwise = TrainingOptions(seq_len=4096, optimizer="muon")
    # blockwise: each 1024×2048 shard alone, no traffic.
    assert matrix_step_cost(m, 4, blockwise) == (5 * ns_step_flops(1024, 2048), 0.0)
    # duplicated: the FP32 shards gathered (3/4 of 4096·2048·4 B), NS on the whole matrix.
    dup = TrainingOptions(seq_len=4096, optimizer="muon", muon_tp_mode="duplicated")
    assert matrix_step_cost(m, 4, dup) == (5 * ns_step_flops(4096, 2048), 0.75 * 4096 * 2048 * 4)
    # distributed: kept = 2048 (the input dim), rows split; A = 2048² BF16 all-reduced per step.
    dist = TrainingOptions(seq_len=4096, optimizer="muon", muon_tp_mode="distributed")
    flops, traffic = matrix_step_cost(m, 4, dist)
    assert flops == 5 * (4 * 2048**2 * 4096 / 4 + 2 * 2048**3)
    assert traffic == 5 * 2 * 0.75 * 2048**2 * 2
    # Unsplit matrices (the router) and TP 1 cost the same in every mode.
    router = MuonMatrix(128, 2048, "none")
    assert matrix_step_cost(router, 4, dup) == matrix_step_cost(router, 1, dup) == (5 * ns_step_flops(128, 2048), 0)


def test_matrices_cover_every_2d_weight() -> None:
    """Muon's matrices of a layer hold the layer's parameters less its norms (qk-norm 2·d, input
    and pre-MLP norms h each), which stay on Adam: Qwen3-30B-A3B (GQA + 128 experts) and Kimi-K2
    (MLA with q LoRA, shared expert)."""
    for name, layer, norms in (
        ("qwen3-30b-a3b", 0, lambda m: 2 * m.hidden_size + 2 * m.head_dim),
        ("kimi-k2", 5, None),
    ):
        from lcmoe.catalog import load_model

        spec = load_model(name)
        lp = layer_params(spec, layer)
        experts = spec.num_moe_experts or 0
        held = sum(m.rows * m.cols * (experts if m.expert else 1) for m in layer_matrices(spec, layer))
        total = lp.attention + lp.mlp_dense + lp.routed_experts
        if norms is not None:
            assert held == total - norms(spec)
        else:  # MLA: input norm h, q and kv LoRA norms, pre-MLP norm h
            assert held == total - 2 * spec.hidden_size - (spec.q_lora_rank or 0) - spec.kv_lora_rank


def test_stage_ns_cost_adds_the_layers_and_local_experts() -> None:
    run = _qwen()
    stage = pipeline_stages(run.model, run.layout)[0]
    dense, expert, _, _ = stage_ns_cost(run.model, run.layout, stage, run.options)
    spec = run.model
    per_layer = {m.expert: 0.0 for m in layer_matrices(spec, 0)}
    for m in layer_matrices(spec, 0):
        per_layer[m.expert] += 5 * ns_step_flops(m.rows, m.cols)
    assert dense == pytest.approx(spec.num_layers * per_layer[False])
    assert expert == pytest.approx(spec.num_layers * per_layer[True] * 128 / 8)  # 16 local experts


# ----- the step's seconds and the layer-wise optimizer's DP traffic ------------------------------
def test_step_time_adds_exactly_the_muon_terms() -> None:
    """Against Adam with the same FP32 buffers, only the optimizer step changes, by the Muon
    terms: NS FLOPs over the BF16 GEMM rate, and the DP traffic the layer-wise optimizer adds."""
    muon, adam = _qwen(), _qwen(muon=False)
    amounts = time_amounts(muon).stages[0]
    m = amounts.muon
    assert m is not None and time_amounts(adam).stages[0].muon is None
    stage = pipeline_stages(muon.model, muon.layout)[0]
    params = stage_params_per_gpu(muon.model, muon.layout, stage)
    dense, expert, _, _ = stage_ns_cost(muon.model, muon.layout, stage, muon.options)
    # Layer-wise ownership: dense over DP·CP = 16, experts over EDP = 2.
    assert m.ns_flops == pytest.approx(dense / 16 + expert / 2)
    gathered = params.dense * 15 / 16 + params.expert * 1 / 2
    assert m.param_gather_bytes == pytest.approx(2 * gathered)
    assert m.grad_allreduce_extra_bytes == pytest.approx(4 * gathered)
    t_muon, t_adam = estimate_time(muon), estimate_time(adam)
    extra = t_muon.breakdown["optimizer"] - t_adam.breakdown["optimizer"]
    assert t_muon.step_seconds - t_adam.step_seconds == pytest.approx(extra)
    assert extra > 0


def test_muon_step_seconds_formula() -> None:
    from lcmoe.estimate.muon import MuonStepAmounts

    m = MuonStepAmounts(ns_flops=6e12, tp_bytes=1e9, param_gather_bytes=2e9, grad_allreduce_extra_bytes=4e9)
    ns, tp, dp = muon_step_seconds(
        m, gemm_flops_per_second=6e14, tp_bytes_per_second=1e11, dp_bytes_per_second=1e10, dp_exposed_fraction=0.25
    )
    assert (ns, tp) == (0.01, 0.01)
    assert dp == pytest.approx((0.75 * 2e9 + 0.25 * 4e9) / 1e10)
    assert muon_step_seconds(
        None, gemm_flops_per_second=1, tp_bytes_per_second=1, dp_bytes_per_second=1, dp_exposed_fraction=0
    ) == (0.0, 0.0, 0.0)


# ----- memory: FP32 master + one FP32 momentum, the vocabulary on Adam ---------------------------
def test_optimizer_memory_is_one_momentum_and_adam_for_the_vocabulary() -> None:
    muon, adam = _qwen(), _qwen(muon=False)
    stage = pipeline_stages(muon.model, muon.layout)[0]
    p = stage_params_per_gpu(muon.model, muon.layout, stage)
    got = [estimate_memory(r.model, r.hardware, r.layout, r.options).stages[0].optimizer for r in (muon, adam)]
    # Muon: (dense − vocab)·8 + vocab·12 over DP·CP = 16, experts·8 over EDP = 2; Adam: 12 each.
    assert got[0] == pytest.approx(((p.dense - p.vocab) * 8 + p.vocab * 12) / 16 + p.expert * 8 / 2)
    assert got[1] == pytest.approx(p.dense * 12 / 16 + p.expert * 12 / 2)
    # Without the layer-wise optimizer every rank keeps the whole state.
    plain = with_options(muon, distributed_optimizer=False)
    whole = estimate_memory(plain.model, plain.hardware, plain.layout, plain.options).stages[0].optimizer
    assert whole == pytest.approx((p.dense - p.vocab) * 8 + p.vocab * 12 + p.expert * 8)


# ----- the rules ---------------------------------------------------------------------------------
def test_muon_alone_breaks_no_rule() -> None:
    assert not _broken(_qwen())
    assert not _broken(with_options(_qwen(), distributed_optimizer=False))


@pytest.mark.parametrize(
    ("rule", "changes"),
    [
        ("L-MUON-FSDP", {"megatron_fsdp": True}),
        ("L-MUON-PRECISION-AWARE", {"exp_avg_dtype": "bf16"}),
        ("L-MUON-OFFLOAD", {"optimizer_offload_fraction": 0.5}),
        ("L-MUON-FP16", {"precision": "fp16"}),
        ("L-MUON-INSTANCES", {"num_distributed_optimizer_instances": 2}),
    ],
)
def test_each_rule_refuses_its_combination(rule: str, changes: dict[str, object]) -> None:
    assert rule in _broken(_qwen(**changes))
    assert rule not in _broken(_qwen(muon=False, **changes))


def test_ns_steps_must_be_whole_quintic_sets() -> None:
    with pytest.raises(LcmoeError, match="multiple of 5"):
        TrainingOptions(seq_len=4096, optimizer="muon", muon_num_ns_steps=7)
    assert TrainingOptions(seq_len=4096, optimizer="muon", muon_num_ns_steps=10).muon_num_ns_steps == 10


# ----- emitted and read back ---------------------------------------------------------------------
def test_bridge_overrides_round_trip() -> None:
    for distributed, name in ((True, "dist_muon"), (False, "muon")):
        run = with_options(_qwen(), distributed_optimizer=distributed, muon_tp_mode="duplicated")
        out = overrides_from_run(run)
        assert out["optimizer.optimizer"] == name
        assert out["ddp.use_distributed_optimizer"] is False and out["optimizer.use_distributed_optimizer"] is False
        assert out["ddp.overlap_param_gather"] is False and out["optimizer.overlap_param_gather"] is False
        back = run_from_overrides(
            parse_override_lines(overrides_text(run)), model=run.model, hardware=run.hardware, num_gpus=16
        )
        assert back.options.muon_summary() == run.options.muon_summary()
        assert back.options.distributed_optimizer is distributed
    assert "optimizer.optimizer" not in overrides_from_run(_qwen(muon=False))


def test_megatron_lm_args_round_trip() -> None:
    args = megatron_lm_args(_qwen())
    assert "--optimizer=muon" in args and "--use-distributed-optimizer" in args
    assert "--overlap-param-gather" not in args
    back = options_from_args(tokenize_args(args))
    assert back.optimizer == "muon" and back.distributed_optimizer and back.muon_num_ns_steps == 5
    plain = megatron_lm_args(with_options(_qwen(), distributed_optimizer=False))
    assert "--use-distributed-optimizer" not in plain
    assert not options_from_args(tokenize_args(plain)).distributed_optimizer
    # The deprecated dist_muon turns the layer-wise optimizer on (arguments.py:1672-1678).
    assert options_from_args(tokenize_args(["--optimizer=dist_muon"])).distributed_optimizer
    assert "--optimizer=muon" not in megatron_lm_args(_qwen(muon=False))


# ----- plan and estimate -------------------------------------------------------------------------
def test_plan_keeps_muon_and_never_offloads_the_optimizer() -> None:
    from lcmoe.catalog import load_hardware, load_model
    from lcmoe.plan.search import PlanRequest, search

    chosen = (("optimizer", "muon"), ("muon_num_ns_steps", 5), ("muon_tp_mode", "blockwise"))
    request = PlanRequest(
        model=load_model("qwen3-30b-a3b"),
        hardware=load_hardware("h100"),
        num_gpus=16,
        seq_len=32768,
        top_k=2,
        dispatchers=("alltoall",),
        precisions=("bf16",),
        optimizer=chosen,
    )
    plans = search(request).plans
    assert plans
    for plan in plans:
        o = plan.run.options
        assert o.optimizer == "muon" and o.optimizer_offload_fraction == 0 and not o.precision_aware_optimizer
        assert plan.as_dict()["optimizer"] == "muon"
        assert not _broken(plan.run)


def test_estimate_flag_and_check_read_back(tmp_path: Path) -> None:
    from tests.conftest import run_cli

    base = ("-m", "qwen3-30b-a3b", "-g", "h100", "-n", "16", "-s", "32k", "--cp", "2", "--ep", "8", "--json")
    code, out, err = run_cli("estimate", *base, "--optimizer", "muon", "--muon-tp-mode", "duplicated")
    assert code in (0, 1), err
    doc = json.loads(out)
    assert (doc["inputs"]["optimizer"], doc["inputs"]["muon_tp_mode"]) == ("muon", "duplicated")
    code, _, err = run_cli("estimate", *base, "--optimizer", "muon", "--precision-aware-optimizer")
    assert code != 0 and "L-MUON-PRECISION-AWARE" in err
    for name, run in (("muon", _qwen()), ("adam", _qwen(muon=False))):
        path = tmp_path / f"{name}.txt"
        path.write_text(overrides_text(run))
        _, out, err = run_cli("check", str(path), "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "16", "--json")
        doc = json.loads(out)
        assert doc["inputs"].get("optimizer", "adam") == name, err


# ----- Megatron Bridge 0.6.2 + Megatron-Core 0.19.2 judge the emitted config ---------------------
BRIDGE_PYTHON = os.environ.get("LCMOE_BRIDGE_PYTHON", "")


@pytest.mark.skipif(
    not (BRIDGE_PYTHON and Path(BRIDGE_PYTHON).exists()),
    reason="LCMOE_BRIDGE_PYTHON (an interpreter with megatron-bridge 0.6.2) is not set; .ci/run builds one",
)
def test_bridge_and_megatron_core_run_the_emitted_muon(tmp_path: Path) -> None:
    """The emitted overrides (and YAML) go through Bridge's recipe, overrides and
    ``runtime_config_update`` (the distributed-optimizer and param-gather syncing of
    config.py:1955-1981, comm_overlap's DP overlap, then OptimizerConfig.finalize =
    Megatron-Core's __post_init__): Muon starts with ``dist_muon`` (or ``muon``), the distributed
    optimizer and the parameter-gather overlap off; beside the precision-aware optimizer
    Megatron-Core refuses as L-MUON-PRECISION-AWARE does."""
    from tests.test_bridge_runtime import _case, bridge_results

    good, plain = _qwen(), with_options(_qwen(), distributed_optimizer=False)
    aware = _qwen(exp_avg_dtype="bf16", main_grads_dtype="bf16")
    assert not _broken(good) and "L-MUON-PRECISION-AWARE" in _broken(aware)
    cases = [
        _case("muon", good, tmp_path),
        _case("muon/yaml", good, tmp_path, as_yaml=True),
        _case("muon/plain", plain, tmp_path),
        _case("muon/precision-aware", aware, tmp_path),
    ]
    results = bridge_results(cases)
    for name, optimizer in (("muon", "dist_muon"), ("muon/yaml", "dist_muon"), ("muon/plain", "muon")):
        result = results[name]
        assert result["ok"], (name, result.get("error"))
        summary = result["optimizer"]
        assert summary["optimizer"] == optimizer
        assert not summary["ddp.use_distributed_optimizer"] and not summary["optimizer.use_distributed_optimizer"]
        assert not summary["ddp.overlap_param_gather"] and not summary["optimizer.overlap_param_gather"]
        assert (summary["muon_num_ns_steps"], summary["muon_tp_mode"]) == (5, "blockwise")
        # The optimizer dtypes are written fp32 and read back as torch.float32: the same value.
        changed = result["changed_overrides"]
        assert all(final == "torch.float32" for key, (_, final) in changed.items() if key.endswith("_dtype"))
        assert not {key for key in changed if not key.endswith("_dtype")}, changed
    refused = results["muon/precision-aware"]
    assert not refused["ok"] and "only supported with adam" in refused["error"]
