"""``lcmoe check`` on every file ``--emit`` writes, misspelled keys and flags, exit codes, and plans
of custom (Hugging Face) models that work without their config file (issue #30 items 4–5)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers import write_hf_config

REQUEST = ["--model", "qwen3-30b-a3b", "--gpu", "h100", "--gpus", "16", "--seq-len", "16k", "--top", "1", "-q"]
CONFIGS = [
    "plan.json",
    "overrides.txt",
    "config.yaml",
    "megatron_lm_args.txt",
    "launch.sbatch",
    "nemo_run_launch.py",
    "apply_plan.py",
    "fallback/launch.sbatch",
    "fallback/apply_plan.py",
]


@pytest.fixture(scope="module")
def emitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("emit") / "plan"
    code, _, err = run_cli("plan", *REQUEST, "--emit", str(out))
    assert code == 0, err
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_check_reads_every_emitted_config_with_the_plans_numbers(emitted: Path, name: str) -> None:
    code, out, err = run_cli("check", str(emitted / name), "--json")
    assert code in (0, 1), err
    checked = json.loads(out)
    doc = json.loads((emitted / "plan.json").read_text(encoding="utf-8"))
    plan = doc["fallback"] if name.startswith("fallback/") else doc["plans"][0]
    assert checked["errors"] == []
    assert checked["memory"]["peak_reserved_bytes"] == pytest.approx(plan["memory"]["peak_reserved_bytes"])
    assert checked["time"]["step_seconds"] == pytest.approx(plan["time"]["step_seconds"])
    if name.endswith((".sbatch", ".py", ".json")):
        assert checked["format"] == name.rsplit("/", 1)[-1]


@pytest.mark.parametrize("name", ["prediction.json", "RUN.md", ".lcmoe-manifest.json"])
def test_check_refuses_the_files_that_are_not_configs(emitted: Path, name: str) -> None:
    code, _, err = run_cli("check", str(emitted / name))
    assert code == 2 and "Traceback" not in err
    assert "not a config" in err and "launch.sbatch" in err and len(err.strip().splitlines()) == 1


def test_misspelled_bridge_key_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "o.txt"
    path.write_text("model.tensor_model_parallel_size=2\nmodel.moe_token_dispatcher_typo=alltoall\n")
    code, out, _ = run_cli("check", str(path), "--model", "qwen3-30b-a3b", "--gpus", "16", "--json")
    assert code == 2
    errors = json.loads(out)["errors"]
    assert errors[0]["rule"] == "L-UNKNOWN-FIELD" and "moe_token_dispatcher_type" in errors[0]["fix"]


def test_misspelled_megatron_flag_is_an_error_with_a_suggestion(tmp_path: Path) -> None:
    path = tmp_path / "args.txt"
    path.write_text("--tensor-model-paralel-size 4\n--num-layers 48\n")
    code, out, _ = run_cli("check", str(path), "--model", "qwen3-30b-a3b", "--gpus", "16", "--json")
    assert code == 2
    (error,) = json.loads(out)["errors"]
    assert "--tensor-model-parallel-size" in error["fix"]


def test_predicted_oom_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "o.txt"
    path.write_text("model.expert_model_parallel_size=1\nmodel.recompute_granularity=null\n")
    code, out, _ = run_cli("check", str(path), "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq-len", "128k", "--json")
    assert not json.loads(out)["memory"]["fits"]
    assert code == 2


def test_field_table_matches_the_released_wheels() -> None:
    """data/config_fields.yaml is what tools/gen_config_fields.py reads from the wheels .ci/run downloads."""
    from tests import bridge_fields as bf

    if not bf.available():
        pytest.skip("megatron wheels not downloaded (.ci-wheels)")
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gen", Path(__file__).resolve().parent.parent / "tools" / "gen_config_fields.py"
    )
    assert spec and spec.loader
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    from lcmoe.config_io.known_fields import known_fields

    table = known_fields()
    assert {k: frozenset(v) for k, v in gen.section_fields().items()} == table.sections
    assert frozenset(gen.megatron_lm_flags(bf.WHEELS)) == table.flags


def test_custom_model_plan_works_without_its_config(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    write_hf_config(folder)
    out = tmp_path / "out"
    code, _, err = run_cli(
        "plan",
        "--model",
        str(folder / "config.json"),
        "--gpu",
        "h100",
        "--gpus",
        "8",
        "--seq-len",
        "4k",
        "--top",
        "1",
        "-q",
        "--emit",
        str(out),
    )
    assert code == 0, err
    shutil.rmtree(folder)
    for name in ("plan.json", "overrides.txt", "launch.sbatch"):
        code, _, err = run_cli("check", str(out / name), "-q")
        assert code in (0, 1), (name, err)
    log = tmp_path / "run.log"
    log.write_text(
        " iteration       10/     100 | elapsed time per iteration (ms): 1500.0 | global batch size:    32 |\n"
    )
    code, _, err = run_cli("diagnose", str(log), "--plan", str(out / "plan.json"))
    assert "no model of that name" not in err and "Traceback" not in err
    code, _, err = run_cli("preflight", "--plan", str(out / "plan.json"))
    assert "no model of that name" not in err and "Traceback" not in err
    sbatch = (out / "launch.sbatch").read_text(encoding="utf-8")
    assert "ships no recipe" in sbatch and "AutoBridge" in sbatch
    assert os.path.exists(out / "RUN.md") and "AutoBridge" in (out / "RUN.md").read_text(encoding="utf-8")
