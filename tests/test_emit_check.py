"""Emitters and check: round trips, quoting, atomic writes, the cost gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcmoe.catalog import load_hardware, load_model
from lcmoe.emit.megatron_lm import megatron_lm_args
from lcmoe.emit.writer import write_plan_directory
from lcmoe.errors import LcmoeError
from lcmoe.plan.search import PlanRequest, search
from tests.conftest import run_cli
from tests.helpers import make_run, with_options


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("emit") / "plan"
    code, _, err = run_cli(
        "plan",
        "--model",
        "deepseek-v3",
        "--gpu",
        "h100",
        "--gpus",
        "256",
        "--seq-len",
        "128k",
        "--top",
        "2",
        "--emit",
        str(out),
        "--yes",
        "--quiet",
    )
    assert code == 0, err
    return out


def test_emit_writes_every_file(emitted: Path) -> None:
    for name in (
        "plan.json",
        "overrides.txt",
        "config.yaml",
        "apply_plan.py",
        "megatron_lm_args.txt",
        "launch.sbatch",
        "nemo_run_launch.py",
        "RUN.md",
        "fallback/overrides.txt",
    ):
        assert (emitted / name).is_file(), name
    assert json.loads((emitted / "plan.json").read_text())["target"]["megatron_core"]


@pytest.mark.parametrize("name", ["overrides.txt", "config.yaml", "megatron_lm_args.txt"])
def test_check_round_trip_reproduces_the_plan(emitted: Path, name: str) -> None:
    code, out, _ = run_cli(
        "check", str(emitted / name), "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "256", "--json"
    )
    assert code in (0, 1)
    checked = json.loads(out)
    plan = json.loads((emitted / "plan.json").read_text())["plans"][0]
    assert checked["errors"] == []
    for key in ("tp", "cp", "ep", "pp", "vpp", "dp", "gbs"):
        assert checked["layout"][key] == plan["layout"][key]
    assert checked["memory"]["peak_reserved_bytes"] == pytest.approx(plan["memory"]["peak_reserved_bytes"])
    assert checked["time"]["step_seconds"] == pytest.approx(plan["time"]["step_seconds"])


@pytest.mark.parametrize("name", ["overrides.txt", "fallback/config.yaml"])
def test_check_of_an_emitted_file_needs_no_flags(emitted: Path, name: str) -> None:
    """The issue's acceptance command: `lcmoe check out/overrides.txt` (model, GPU, GPUs from plan.json)."""
    code, out, _ = run_cli("check", str(emitted / name), "--json")
    assert code in (0, 1)
    assert json.loads(out)["errors"] == []


def test_check_without_gpus_or_plan_json_is_one_sentence(tmp_path: Path) -> None:
    path = tmp_path / "o.txt"
    path.write_text("model.tensor_model_parallel_size=2\n")
    code, _, err = run_cli("check", str(path), "--model", "deepseek-v3")
    assert code == 2
    assert "--gpus" in err and "Traceback" not in err


def test_check_flags_illegal_config(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("model.tensor_model_parallel_size=3\nmodel.expert_model_parallel_size=32\n")
    code, out, _ = run_cli("check", str(path), "--model", "deepseek-v3", "--gpus", "96", "--json")
    assert code == 2
    assert "L-HEADS-TP" in {e["rule"] for e in json.loads(out)["errors"]}


# Launcher injection, directory safety and the launchers' argv: tests/test_emit_safety.py.


def test_cost_gate_needs_yes(tmp_path: Path) -> None:
    request = PlanRequest(
        model=load_model("llama3-8b"), hardware=load_hardware("h100"), num_gpus=128, seq_len=4096, top_k=1
    )  # any 128-GPU plan: the gate counts GPUs, and this one searches in a second
    result = search(request)
    with pytest.raises(LcmoeError) as info:
        write_plan_directory(
            tmp_path / "out",
            {
                "plans": [p.as_dict() for p in result.plans],
                "fallback": None,
                "inputs": {"megatron_core_version": "0.19.2"},
            },
            result,
            steps=10,
            confirmed=False,
        )
    assert "--yes" in str(info.value)
    assert not (tmp_path / "out").exists()


def test_megatron_lm_args_carry_the_layout() -> None:
    args = megatron_lm_args(make_run())
    assert "--context-parallel-size=32" in args and "--expert-model-parallel-size=32" in args
    assert any(a.startswith("--pipeline-model-parallel-layout=") for a in args)


@pytest.mark.parametrize(
    ("precision", "flag"), [("mxfp8", "--fp8-param-gather"), ("nvfp4", "--fp4-param-gather"), ("fp8-blockwise", None)]
)
def test_megatron_lm_args_keep_the_parameters_the_estimate_assumed(precision: str, flag: str | None) -> None:
    """Bridge's MXFP8, tensor-wise and NVFP4 recipes keep quantized parameters and its blockwise
    recipe BF16 ones; the estimate follows the recipe, and Megatron-LM (where both flags default
    off) gets the flag spelled out, and reads it back."""
    from lcmoe.config_io.megatron_args import options_from_args, tokenize_args

    run = with_options(make_run(), precision=precision)
    args = megatron_lm_args(run)
    gathers = [a for a in args if a in ("--fp8-param-gather", "--fp4-param-gather")]
    assert gathers == ([flag] if flag else [])
    read = options_from_args(tokenize_args(args))
    assert (read.precision, read.quantized_params) == (precision, run.options.quantized_params)


def test_reader_takes_bf16_gradient_buffer_from_ddp_flag() -> None:
    """Perf recipes set ddp.grad_reduce_in_fp32=False: the DDP gradient buffer is BF16."""
    from lcmoe.catalog import load_hardware, load_model
    from lcmoe.config_io.bridge import run_from_overrides

    spec, gpu = load_model("qwen3-30b-a3b"), load_hardware("h100")
    base = {"model.expert_model_parallel_size": 8}
    fp32 = run_from_overrides(base, model=spec, hardware=gpu, num_gpus=8)
    bf16 = run_from_overrides({**base, "ddp.grad_reduce_in_fp32": False}, model=spec, hardware=gpu, num_gpus=8)
    assert (fp32.options.main_grads_dtype, bf16.options.main_grads_dtype) == ("fp32", "bf16")


def test_bridge_precision_is_merged_into_a_recipe_config_object() -> None:
    """A recipe holding a MixedPrecisionConfig object gets its precision fields (so a BF16 gradient
    buffer survives start-up); a recipe naming its precision gets the name, which reduces
    gradients in FP32, and the planner counts that buffer. Both read back to the same run."""
    import yaml

    from lcmoe.config_io.bridge import flatten, overrides_from_run, parse_override_lines, run_from_overrides
    from lcmoe.emit.bridge import overrides_text, yaml_config

    qwen = with_options(
        make_run("qwen3-30b-a3b", "h100", seq_len=4096, cp=1, ep=8, pp=1, vpp=1, gpus=8), precision="mxfp8"
    )
    fields = overrides_from_run(qwen)["mixed_precision"]
    assert isinstance(fields, dict)
    assert (fields["grad_reduce_in_fp32"], fields["fp8_recipe"], fields["fp8_param_gather"]) == (False, "mxfp8", True)
    for values in (
        parse_override_lines(overrides_text(qwen)),
        flatten(yaml.safe_load(yaml_config(qwen))),
    ):
        back = run_from_overrides(values, model=qwen.model, hardware=qwen.hardware, num_gpus=8)
        assert (back.options.precision, back.options.main_grads_dtype, back.options.quantized_params) == (
            "mxfp8",
            "bf16",
            True,
        )
    named = make_run("qwen3-235b-a22b", "gb200", seq_len=4096, cp=1, ep=8, pp=4, vpp=1, gpus=64)
    assert overrides_from_run(named)["mixed_precision"] == "bf16_mixed"
    # The name's grad_reduce_in_fp32=True overwrites ddp.* at start-up (MixedPrecisionConfig.setup).
    values = parse_override_lines(overrides_text(named) + "ddp.grad_reduce_in_fp32=false\n")
    assert (
        run_from_overrides(values, model=named.model, hardware=named.hardware, num_gpus=64).options.main_grads_dtype
        == "fp32"
    )


def test_planner_counts_the_gradient_buffer_bridge_will_run() -> None:
    from lcmoe.plan.search import base_options

    def grads(model: str) -> str:
        request = PlanRequest(model=load_model(model), hardware=load_hardware("h100"), num_gpus=64, seq_len=32768)
        return base_options(request, "bf16").main_grads_dtype

    assert (grads("qwen3-30b-a3b"), grads("qwen3-235b-a22b")) == ("bf16", "fp32")


def test_megatron_lm_bf16_gradient_buffer_without_precision_aware_optimizer() -> None:
    from lcmoe.config_io.megatron_args import options_from_args, tokenize_args

    run = with_options(make_run(), main_grads_dtype="bf16", exp_avg_dtype="fp32")
    args = megatron_lm_args(run)
    assert "--grad-reduce-in-bf16" in args and "--use-precision-aware-optimizer" not in args
    read = options_from_args(tokenize_args(args))
    assert (read.main_grads_dtype, read.precision_aware_optimizer) == ("bf16", False)


def test_megatron_lm_reader_takes_the_full_iteration_impl_spelling() -> None:
    """Megatron-Core 0.19 spells the local full-iteration graph ``--cuda-graph-impl=full_iteration``."""
    from lcmoe.config_io.megatron_args import options_from_args, tokenize_args

    for spelling in (["--cuda-graph-impl=full_iteration"], ["--cuda-graph-impl=local"]):
        read = options_from_args(tokenize_args(["--seq-length=4096", *spelling]))
        assert read.cuda_graph_scope == frozenset({"full_iteration"}), spelling
