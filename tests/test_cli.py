"""CLI surface: JSON shapes, unknown names, exit codes, no tracebacks."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli


def test_models_json_lists_the_catalog() -> None:
    code, out, _ = run_cli("models", "--json")
    assert code == 0
    names = {m["name"] for m in json.loads(out)["models"]}
    assert "deepseek-v3" in names


def test_hardware_json_lists_the_catalog() -> None:
    code, out, _ = run_cli("hardware", "--json")
    assert code == 0
    assert {h["name"] for h in json.loads(out)["hardware"]} >= {"h100", "gb200"}


def test_unknown_model_exits_2_with_suggestion() -> None:
    code, out, err = run_cli("flops", "--model", "deepsek-v3")
    assert code == 2
    assert "did you mean" in err and "deepseek-v3" in err
    assert "Traceback" not in err + out


def test_bad_sequence_length_exits_2() -> None:
    code, _, err = run_cli("flops", "--model", "deepseek-v3", "--seq-len", "-1")
    assert code == 2 and "seq_len" in err


def test_model_may_be_an_hf_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 2,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 1000,
            }
        )
    )
    code, out, _ = run_cli("flops", "--model", str(path), "--json")
    assert code == 0 and json.loads(out)["flops_per_token"] > 0


def test_estimate_refuses_illegal_layout_with_rule_id() -> None:
    code, out, err = run_cli(
        "estimate", "--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "48", "--seq-len", "32k", "--tp", "3"
    )
    assert code == 2
    assert "L-HEADS-TP" in err and "Traceback" not in err + out


def test_estimate_fp8_params_follow_the_bridge_recipe_unless_told() -> None:
    """Tensor-wise FP8 on H100: Bridge's recipe keeps FP8 parameters (1 B) and TE their 1 B
    transpose; --no-fp8-params keeps BF16 parameters and both FP8 copies."""

    def stage0(*extra: str) -> dict[str, float]:
        args = ("--model", "qwen3-30b-a3b", "--gpus", "8", "--seq-len", "4k", "--ep", "8")
        code, out, _ = run_cli("estimate", *args, "--precision", "fp8-tensorwise", *extra, "--json")
        assert code in (0, 1)
        return json.loads(out)["memory"]["stages"][0]["components"]  # type: ignore[no-any-return]

    code, _, err = run_cli("estimate", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq-len", "4k", "--fp8-params")
    assert code == 2 and "fp8_param_gather" in err and "Traceback" not in err
    recipe, bf16_params = stage0(), stage0("--no-fp8-params")
    assert 0 < recipe["weight_copies"] < recipe["weights"]  # the embedding and output layer stay BF16
    assert bf16_params["weights"] > recipe["weights"]
    assert bf16_params["weight_copies"] == pytest.approx(2 * recipe["weight_copies"])


def test_estimate_json_has_the_documented_keys() -> None:
    code, out, _ = run_cli(
        "estimate",
        "--model",
        "qwen3-30b-a3b",
        "--gpu",
        "h100",
        "--gpus",
        "16",
        "--seq-len",
        "32k",
        "--cp",
        "4",
        "--ep",
        "4",
        "--recompute",
        "moe_act",
        "--json",
    )
    assert code in (0, 1)
    payload = json.loads(out)
    for key in ("peak_allocated_bytes", "peak_reserved_bytes", "fits", "oom_risk", "error_band_pct", "stages"):
        assert key in payload["memory"]
    for key in ("step_seconds", "tokens_per_sec_per_gpu", "model_tflops_per_gpu", "mfu", "breakdown"):
        assert key in payload["time"]
    assert all("components" in stage for stage in payload["memory"]["stages"])
