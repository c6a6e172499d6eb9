"""CLI conventions (issue #34 items 1, 2, 6): output that fits the terminal, every plan setting
shown and reproducible with `estimate --from-plan`, --version, completion, examples in --help,
schema_version in every --json document and the shipped JSON Schema files."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.conftest import REPO, run_cli

QWEN = ("-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k")  # MoE: EP overlap and offload vary
LLAMA = ("--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4k")  # ~1 s
SCHEMA_DIR = REPO / "docs" / "schema"


@pytest.fixture(scope="module")
def qwen_plans(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    code, out, err = run_cli("plan", *QWEN, "--top", "3", "--json")
    assert code == 0, err
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(out, encoding="utf-8")
    return path, json.loads(out)


def _render(payload: dict[str, Any], width: int) -> str:
    from lcmoe.cli.plan_view import print_plans

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, soft_wrap=True, color_system=None)
    print_plans(console, payload, "plans, best first by the band's lower edge of tok/s/GPU (memory = worst stage)")
    return buffer.getvalue()


def _values(plan: dict[str, Any]) -> list[str]:
    """Every value a plan's card shows, as the plan JSON spells it."""
    from lcmoe.cli.plan_view import recompute_spec, setting_rows
    from lcmoe.plan.format import layout_text

    time = plan["time"]
    return [
        layout_text(plan["layout"]),
        ", ".join(recompute_spec(plan).split(",")),
        plan["precision"],
        plan["dispatcher"],
        ", ".join(plan["cuda_graph_scope"]) or "-",
        f"{plan['optimizer_offload_fraction']:g}",
        f"{plan['memory']['peak_reserved_bytes'] / 1024**3:.1f} / {plan['memory']['capacity_bytes'] / 1024**3:.0f}"
        + (" !" if plan["memory"]["oom_risk"] else ""),
        f"{time['step_seconds']:.2f}",
        f"{time['tokens_per_sec_per_gpu']:.0f}",
        f"{time['model_tflops_per_gpu']:.0f}",
        f"{100 * time['mfu']:.1f}%",
        *(value for _, value in setting_rows(plan)),
    ]


def _squeezed(text: str) -> str:
    """The text without whitespace: a value that wrapped or folded onto more lines reads whole."""
    return re.sub(r"\s+", "", text)


# ----- 1. output that fits the terminal -------------------------------------------------------
def test_narrow_terminal_gets_cards_with_every_value_whole(qwen_plans: tuple[Path, dict[str, Any]]) -> None:
    _, payload = qwen_plans
    text = _render(payload, 80)
    assert "…" not in text and "┏" not in text, text  # cards, not a squeezed table
    assert all(len(line) <= 80 for line in text.splitlines())
    for i, plan in enumerate(payload["plans"][:3]):
        assert f"plan {i + 1}" in text
        for value in _values(plan):
            assert re.search(rf"(^|\s){re.escape(value)}\s*$", text, re.M), (i + 1, value, text)


def test_values_longer_than_the_line_fold_instead_of_being_cut(qwen_plans: tuple[Path, dict[str, Any]]) -> None:
    _, payload = qwen_plans
    text = _render(payload, 44)
    assert "…" not in text
    assert all(len(line) <= 44 for line in text.splitlines())
    squeezed = _squeezed(text.split("plan 2", 1)[0])
    for value in _values(payload["plans"][0]):
        assert _squeezed(value) in squeezed, (value, text)


def test_wide_terminal_gets_the_tables(qwen_plans: tuple[Path, dict[str, Any]]) -> None:
    _, payload = qwen_plans
    text = _render(payload, 240)
    assert "┏" in text and "…" not in text
    assert "the rest of each plan's settings" in text
    for value in _values(payload["plans"][0]):
        assert value in text, value


def test_long_comma_lists_wrap_between_entries_in_the_table(qwen_plans: tuple[Path, dict[str, Any]]) -> None:
    """A plan with long recompute and graph lists keeps the table at 200 columns (the lists wrap
    between entries, never cut) and turns into cards where even that cannot fit."""
    _, payload = qwen_plans
    doc = json.loads(json.dumps(payload))
    plan = doc["plans"][0]
    plan["recompute"] = {"granularity": "selective", "modules": ["layernorm", "mla_up_proj", "moe_act"]}
    plan["cuda_graph_scope"] = ["attn", "moe_preprocess", "moe_router"]
    plan["layout"]["pipeline_layout"] = "Et*3|" + "t*4|" * 14 + "t*2mL"
    wide = _render(doc, 200)
    assert "┏" in wide and "…" not in wide
    assert all(name in wide for name in ("layernorm,", "mla_up_proj,", "moe_act", "moe_preprocess,", "moe_router"))
    assert "Et*3|" + "t*4|" * 14 + "t*2mL" in wide
    narrow = _render(doc, 120)
    assert "┏" not in narrow and "…" not in narrow
    assert "layernorm, mla_up_proj, moe_act" in narrow and "attn, moe_preprocess, moe_router" in narrow


def test_columns_is_respected_when_piped() -> None:
    from lcmoe.cli.common import PIPED_WIDTH, output_width

    assert output_width({"COLUMNS": "80"}, is_tty=False) == 80
    assert output_width({"COLUMNS": "80"}, is_tty=False, terminal_columns=120) == 80
    assert output_width({}, is_tty=False, terminal_columns=None) == PIPED_WIDTH  # a file, a CI log
    assert output_width({"COLUMNS": "wide"}, is_tty=False, terminal_columns=None) == PIPED_WIDTH
    assert output_width({"COLUMNS": "9" * 5000}, is_tty=False, terminal_columns=None) == PIPED_WIDTH
    assert output_width({}, is_tty=False, terminal_columns=80) == 80  # `lcmoe plan | less` on 80 columns
    assert output_width({}, is_tty=True) is None


def test_columns_80_plan_shows_the_top_plans_whole() -> None:
    """End to end: `COLUMNS=80 lcmoe plan … | cat` prints cards whose values are all whole."""
    env = {**os.environ, "COLUMNS": "80"}
    command = [sys.executable, "-c", "from lcmoe.cli import main; main()", "plan", *LLAMA, "--top", "3"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    code, out, err = run_cli("plan", *LLAMA, "--top", "3", "--json")
    assert code == 0, err
    cards = done.stdout.split("plans, ", 1)[1].split("\n! ", 1)[0].split("\nGBS ", 1)[0]
    assert "…" not in done.stdout and "┏" not in done.stdout
    assert all(len(line) <= 80 for line in cards.splitlines())
    for plan in json.loads(out)["plans"][:3]:
        for value in _values(plan):
            assert re.search(rf"\s{re.escape(value)}\s*$", cards, re.M), (value, cards)
    # The sentences under the cards wrap between words too: no line wider than COLUMNS.
    assert all(len(line) <= 80 for line in done.stdout.splitlines()), done.stdout
    quiet = subprocess.run([*command, "-q"], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert quiet.returncode == 0 and len(quiet.stdout.splitlines()) == 1, quiet.stdout  # -q: one line for scripts


def test_an_indented_line_wraps_under_its_indent() -> None:
    """A reason or a ladder rung ("  [LC-X] …") wraps with a hanging indent, without trailing
    padding; a --quiet line (soft_wrap) stays one line."""
    from lcmoe.cli.common import _Console

    buffer = io.StringIO()
    console = _Console(file=buffer, width=40, soft_wrap=False, color_system=None)
    console.print("  [LC-CP-START] " + "the guidance starts CP at this length " * 3, highlight=False)
    console.print("x " * 30, soft_wrap=True)
    lines = buffer.getvalue().splitlines()
    wrapped, quiet = lines[:-1], lines[-1]
    assert len(wrapped) >= 3 and all(line.startswith("  ") and len(line) <= 40 for line in wrapped), lines
    assert wrapped[0].startswith("  [LC-CP-START] the") and not any(line.endswith("  ") for line in wrapped)
    assert quiet == ("x " * 30).rstrip() or quiet == "x " * 30


def test_help_is_readable_at_80_columns() -> None:
    from lcmoe.cli import app

    runner = CliRunner()
    names = [str(c.name) for c in app.registered_commands]
    arg_lists: list[list[str]] = [[], *([name] for name in names)]
    for args in arg_lists:
        result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "80"}, prog_name="lcmoe")
        assert result.exit_code == 0, result.output
        assert "…" not in result.output, args
        # click cuts a command's summary with "..." where it is too long: every summary whole.
        listed = result.output.split("Commands:", 1)[1] if "Commands:" in result.output else ""
        assert not [line for line in listed.splitlines() if line.rstrip().endswith("...")], listed
        assert all(len(line) <= 80 for line in result.output.splitlines()), args
        if args:
            command = next(c for c in app.registered_commands if c.name == args[0])
            assert command.epilog and "Example:" in result.output, args
            flags = re.findall(r"--[a-z][a-z0-9-]*", result.output)
            assert "--help" in flags


# ----- 4. edges say why ---------------------------------------------------------------------------
def test_nothing_fits_names_the_closest_plan_with_every_saving_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSeek-V3 at 128K on 16 H100s: the search prunes every layout before estimating it (the
    weights alone exceed the GPU); the answer still names the closest one and how far over it is."""
    monkeypatch.setenv("COLUMNS", "200")  # the closest-plan sentence on one line
    args = ("plan", "-m", "deepseek-v3", "-n", "16", "-s", "128k")
    code, out, err = run_cli(*args, "--json")
    assert code == 1, err
    closest = json.loads(out)["closest"]
    assert closest is not None and closest["recompute"]["granularity"] == "full"
    assert closest["optimizer_offload_fraction"] == 1.0 or closest["precision"]
    assert closest["memory"]["peak_reserved_bytes"] > closest["memory"]["capacity_bytes"]
    code, out, err = run_cli(*args)
    assert code == 1 and "smallest count that fits is" in out and re.search(r"closest: TP\d.*GiB over", out), out


def test_a_count_with_a_large_odd_factor_also_names_the_nearest_smaller_count_that_fits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """250 = 2 · 125 fits nothing: below it, the counts with small factors are tried largest first
    (248 = 8 · 31 and 240 = 16 · 15 are skipped; 224 = 32 · 7 is the first), at most two searches."""
    from dataclasses import dataclass, field

    import lcmoe.plan.search as search_module
    from lcmoe.cli import request as rq

    @dataclass
    class Found:
        plans: list[object] = field(default_factory=list)

    tried: list[int] = []

    def fake_search(request: Any, progress: object = None) -> Found:
        tried.append(request.num_gpus)
        return Found(plans=[object()] if request.num_gpus == 192 else [])

    monkeypatch.setattr(search_module, "search", fake_search)
    request = rq.plan_request(rq.PlanOptions(model="qwen3-30b-a3b", gpu="h100", gpus=250, seq_len="32k"))
    assert rq.fewer_gpus_that_fit(request) == 192 and tried == [224, 192]
    assert rq.fewer_gpus_that_fit(request, tries=1) is None
    tried.clear()
    assert (
        rq.fewer_gpus_that_fit(
            rq.plan_request(rq.PlanOptions(model="qwen3-30b-a3b", gpu="h100", gpus=96, seq_len="4k"))
        )
        is None
    )
    assert tried == []  # 96 = 32 · 3: small factors already, nothing to suggest


def test_closest_text_gives_each_stage_over_or_fitting() -> None:
    from lcmoe.cli.plan_cmd import closest_text

    gib = 1024**3
    layout = {k: 1 for k in ("tp", "cp", "ep", "etp", "vpp", "dp", "mbs")} | {"pp": 2, "gbs": 8}
    closest = {
        "layout": layout,
        "recompute": {"granularity": "full", "modules": []},
        "precision": "bf16",
        "optimizer_offload_fraction": 1.0,
        "memory": {
            "peak_reserved_bytes": 90 * gib,
            "capacity_bytes": 80 * gib,
            "stages": [{"stage": 0, "peak_reserved_bytes": 90 * gib}, {"stage": 1, "peak_reserved_bytes": 70 * gib}],
        },
    }
    text = closest_text(closest)
    assert "10.0 GiB over" in text and "stage 0 90.0 GiB (10.0 over)" in text and "stage 1 70.0 GiB (fits)" in text
    assert "-" not in text.split("over;", 1)[1].split(";")[0]  # never a negative "over"


# ----- 8. no internal jargon in what people read ----------------------------------------------------
JARGON = re.compile(r"§|\bskill\b|verification card|\bfacts\b|\b[\w/-]+\.(?:py|md|yaml):\d+", re.I)


def test_user_output_names_no_internal_sources(tmp_path: Path) -> None:
    """Rule sources (file:line), reference-note sections and internal names stay in --json and the
    code, never in the sentences a person reads (checked on a rule violation, a DSA model's note
    and the zh catalog)."""
    config = tmp_path / "args.txt"
    config.write_text(
        "--expert-model-parallel-size 8 --seq-length 4096 --global-batch-size 64 --micro-batch-size 1 "
        "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 "
        "--overlap-moe-expert-parallel-comm",
        encoding="utf-8",
    )
    outputs = [
        run_cli("check", str(config), *QWEN),
        run_cli("estimate", *QWEN, "--ep", "8", "--recompute", "full", "--ep-overlap"),
        run_cli("plan", "-m", "glm-5.2", "-n", "64", "-s", "32k", "--top", "1"),
    ]
    assert "L-EP-OVERLAP" in outputs[0][1] and "L-EP-OVERLAP" in outputs[1][2]
    for _code, out, err in outputs:
        assert not JARGON.search(out + err), JARGON.search(out + err)
    import yaml

    catalog = yaml.safe_load((REPO / "src" / "lcmoe" / "data" / "messages_zh.yaml").read_text(encoding="utf-8"))
    for english, chinese in catalog.items():
        assert not JARGON.search(english + chinese), (english, chinese)


# ----- 2. every setting shown; estimate --from-plan reproduces the plan -------------------------
def test_plan_json_records_every_setting(qwen_plans: tuple[Path, dict[str, Any]]) -> None:
    _, payload = qwen_plans
    for plan in payload["plans"]:
        for key in (
            "precision_aware_optimizer",
            "main_grads_dtype",
            "overlap_moe_expert_parallel_comm",
            "cuda_graph_scope",
            "optimizer_offload_fraction",
        ):
            assert key in plan, key
        assert "pipeline_layout" in plan["layout"]


@pytest.mark.parametrize("rank", [1, 2, 3])
def test_estimate_from_plan_reproduces_the_plan(qwen_plans: tuple[Path, dict[str, Any]], rank: int) -> None:
    path, payload = qwen_plans
    code, out, err = run_cli("estimate", "--from-plan", str(path), "--rank", str(rank), "--json")
    assert code in (0, 1), err
    estimate, plan = json.loads(out), payload["plans"][rank - 1]
    assert estimate["memory"]["peak_reserved_bytes"] == plan["memory"]["peak_reserved_bytes"]
    assert estimate["time"]["step_seconds"] == plan["time"]["step_seconds"]
    assert estimate["inputs"]["from_plan"] == {"path": str(path), "rank": rank}


def _estimate_flags(plan: dict[str, Any]) -> list[str]:
    """The estimate command line of a plan, from the settings its card shows."""
    from lcmoe.cli.plan_view import recompute_spec

    lay = plan["layout"]
    flags = [f"--{k}={lay[k]}" for k in ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs")]
    flags += [
        f"--recompute={recompute_spec(plan)}",
        f"--precision={plan['precision']}",
        f"--dispatcher={plan['dispatcher']}",
        f"--cuda-graph={','.join(plan['cuda_graph_scope']) or 'none'}",
        f"--optimizer-offload={plan['optimizer_offload_fraction']}",
        "--ep-overlap" if plan["overlap_moe_expert_parallel_comm"] else "--no-ep-overlap",
        f"--main-grads-dtype={plan['main_grads_dtype']}",
        f"--cp-comm-type={lay['cp_comm_type']}",
        "--sequence-parallel" if lay["sequence_parallel"] else "--no-sequence-parallel",
    ]
    if plan["precision_aware_optimizer"]:
        flags.append("--precision-aware-optimizer")
    if lay["pipeline_layout"]:
        flags.append(f"--pipeline-layout={lay['pipeline_layout']}")
    return flags


def test_the_shown_settings_entered_into_estimate_reproduce_the_plan(
    qwen_plans: tuple[Path, dict[str, Any]],
) -> None:
    _, payload = qwen_plans
    for plan in payload["plans"][:2]:
        code, out, err = run_cli("estimate", *QWEN, *_estimate_flags(plan), "--json")
        assert code in (0, 1), err
        estimate = json.loads(out)
        assert estimate["memory"]["peak_reserved_bytes"] == plan["memory"]["peak_reserved_bytes"]
        assert estimate["time"]["step_seconds"] == plan["time"]["step_seconds"]


def test_from_plan_refuses_run_knobs_and_a_rank_out_of_range(qwen_plans: tuple[Path, dict[str, Any]]) -> None:
    path, _ = qwen_plans
    code, _, err = run_cli("estimate", "--from-plan", str(path), "--tp", "2")
    assert code == 2 and "--tp" in err and "--from-plan" in err
    code, _, err = run_cli("estimate", "--from-plan", str(path), "--rank", "9")
    assert code == 2 and "--rank" in err
    code, _, err = run_cli("estimate", *QWEN, "--rank", "2")
    assert code == 2 and "--from-plan" in err
    code, _, err = run_cli("estimate", "-n", "8", "-s", "4k")
    assert code == 2 and "--model" in err


def test_estimate_ep_overlap_changes_the_step_and_is_reported() -> None:
    base = ("estimate", *QWEN, "--ep", "8", "--dispatcher", "alltoall", "--json")
    off, on = (json.loads(run_cli(*base, flag)[1]) for flag in ("--no-ep-overlap", "--ep-overlap"))
    assert off["inputs"]["overlap_moe_expert_parallel_comm"] is False
    assert on["inputs"]["overlap_moe_expert_parallel_comm"] is True
    assert on["time"]["step_seconds"] != off["time"]["step_seconds"]


# ----- 6. conventions -------------------------------------------------------------------------
def test_version() -> None:
    from lcmoe import __version__

    code, out, _ = run_cli("--version")
    assert code == 0 and out.strip() == f"lcmoe {__version__}"


def test_debug_is_a_documented_option_and_accepted_anywhere() -> None:
    from lcmoe.cli import app

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert "--debug" in result.output and "LCMOE_DEBUG" in result.output
    assert "--install-completion" in result.output and "--version" in result.output
    assert run_cli("--debug", "hardware", "-q")[0] == 0
    assert run_cli("hardware", "-q", "--debug")[0] == 0


@pytest.mark.parametrize(
    ("command", "flag", "choices"),
    [
        ("plan", "--precision", ("bf16", "fp8-blockwise", "mxfp8", "nvfp4")),
        ("plan", "--dispatchers", ("alltoall", "deepep", "hybridep")),
        ("plan", "--peft", ("none", "lora")),
        ("plan", "--rank", ("conservative", "expected")),
        ("sweep", "--rank", ("conservative", "expected")),
        ("report", "--rank", ("conservative", "expected")),
        ("estimate", "--precision", ("bf16", "fp8-tensorwise", "fp8-blockwise", "nvfp4")),
        ("estimate", "--cuda-graph", ("attn", "moe_router", "moe_preprocess", "full_iteration")),
        ("estimate", "--recompute", ("core_attn", "mla_up_proj", "moe_act", "full")),
        ("estimate", "--dispatcher", ("allgather", "deepep")),
        ("estimate", "--cp-comm-type", ("a2a+p2p", "all_gather")),
    ],
)
def test_enum_options_list_their_choices(command: str, flag: str, choices: tuple[str, ...]) -> None:
    from lcmoe.cli import app

    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "100"})
    block = result.output.split(flag + " ", 1)[1].split("\n  -", 1)[0]
    for choice in choices:
        assert choice in block, (flag, choice, block)


def test_comma_list_completion() -> None:
    from lcmoe.cli import run_options as ro
    from lcmoe.workload import DISPATCHERS, PRECISIONS

    precisions = ro.complete_list(PRECISIONS, exclusive=())
    assert precisions("bf16,fp8-b") == ["bf16,fp8-blockwise"]
    assert "bf16" not in "".join(precisions("bf16,")[0].split(",")[1:])
    assert ro.complete_list(DISPATCHERS, exclusive=())("alltoall,d") == ["alltoall,deepep"]
    graphs = ro.complete_list(ro.GRAPH_CHOICES)
    assert graphs("")[0] == "none" and "attn,moe_router" in graphs("attn,moe_r")
    assert not [c for c in graphs("attn,") if c.endswith(",none")]
    assert ro.complete_one(ro.PEFT_SCHEMES)("l") == ["lora"]


def test_shell_completion_is_wired() -> None:
    env = {
        **os.environ,
        "_LCMOE_COMPLETE": "complete_bash",
        "COMP_WORDS": "lcmoe estimate --cuda-graph attn,moe_p",
        "COMP_CWORD": "3",
    }
    command = [sys.executable, "-c", "from lcmoe.cli import main; main()"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["attn,moe_preprocess"]


def _validate(document: dict[str, Any], schema_file: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SCHEMA_DIR / schema_file).read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)


def test_json_documents_carry_schema_version_and_match_the_shipped_schema(
    qwen_plans: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    from lcmoe.cli.common import SCHEMA_VERSION

    path, payload = qwen_plans
    legal = tmp_path / "args.txt"
    legal.write_text(
        "--tensor-model-parallel-size 1 --expert-model-parallel-size 8 --seq-length 4096 "
        "--global-batch-size 64 --micro-batch-size 1",
        encoding="utf-8",
    )
    illegal = tmp_path / "bad.txt"
    illegal.write_text("--expert-model-parallel-size 8 --seq-length 4096", encoding="utf-8")  # GBS 1 < DP
    documents = {
        "plan": (payload, "plan.schema.json"),
        "estimate": (json.loads(run_cli("estimate", "--from-plan", str(path), "--json")[1]), "estimate.schema.json"),
        "check": (json.loads(run_cli("check", str(legal), *QWEN, "--json")[1]), "check.schema.json"),
        "check (illegal)": (json.loads(run_cli("check", str(illegal), *QWEN, "--json")[1]), "check.schema.json"),
        "models": (json.loads(run_cli("models", "--json")[1]), "models.schema.json"),
        "hardware": (json.loads(run_cli("hardware", "--json")[1]), "hardware.schema.json"),
        "flops": (json.loads(run_cli("flops", "-m", "qwen3-30b-a3b", "--json")[1]), "flops.schema.json"),
    }
    assert "memory" in documents["check"][0] and documents["check (illegal)"][0]["errors"]
    for name, (document, schema_file) in documents.items():
        assert next(iter(document)) == "schema_version" and document["schema_version"] == SCHEMA_VERSION, name
        _validate(document, schema_file)
        assert json.loads((SCHEMA_DIR / schema_file).read_text(encoding="utf-8"))["x-schema-version"] == SCHEMA_VERSION


def test_a_document_missing_a_named_key_fails_the_schema(qwen_plans: tuple[Path, dict[str, Any]]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    _, payload = qwen_plans
    broken = json.loads(json.dumps(payload))
    del broken["plans"][0]["overlap_moe_expert_parallel_comm"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(broken, "plan.schema.json")


def test_shipped_schemas_are_generated_from_the_models() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_json_schema", REPO / "tools" / "gen_json_schema.py")
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    expected = generator.rendered()
    assert sorted(p.name for p in SCHEMA_DIR.glob("*.schema.json")) == sorted(expected)
    for name, text in expected.items():
        assert (SCHEMA_DIR / name).read_text(encoding="utf-8") == text, f"{name} is stale: run tools/gen_json_schema.py"
