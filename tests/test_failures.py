"""Failures users report (issue #35 item 7): ``lcmoe diagnose`` names each class from a log written
from the public report's own text (tests/log_fixtures.py), with the fix, the rule id and the
citation, and exits 1; ``lcmoe check --intended`` reports overrides a resolved config lost."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from lcmoe.config_io.megatron_args import tokenize_args
from lcmoe.diagnose.failure_patterns import PATTERNS, PATTERNS_BY_ID, TRIGGERS
from lcmoe.diagnose.failures import match_line
from lcmoe.diagnose.logs import parse_log_lines
from lcmoe.emit.megatron_lm import megatron_lm_args
from lcmoe.rules.advice import FAILURE_RULES, RULE_IDS
from tests import log_fixtures as lf
from tests.conftest import run_cli
from tests.helpers import make_run

SOURCE = re.compile(
    r"^(https://github\.com/[\w.-]+/[\w.-]+/(issues|pull)/\d+|[\w.-]+/[\w.-]+@[0-9a-f]{7}:[\w./-]+:\d+)$"
)


def _dump(**options: Any) -> list[str]:
    """A Megatron-LM argument dump (what ``_print_args`` prints) for a small Qwen3-30B run."""
    run = make_run("qwen3-30b-a3b", seq_len=16384, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16, gbs=64, **options)
    dests: dict[str, object] = {"world_size": 16}
    for flag, value in tokenize_args(" ".join(megatron_lm_args(run))).items():
        dests["add_bias_linear" if flag == "disable-bias-linear" else flag.replace("-", "_")] = (
            "False" if flag == "disable-bias-linear" else value
        )
    if "cuda_graph_impl" not in dests:
        dests["cuda_graph_impl"] = "none"
    return lf.argument_dump(dests)


def _diagnose(tmp_path: Path, lines: list[str], *args: str) -> tuple[int, str, dict[str, Any]]:
    log = tmp_path / "run.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), *args)
    assert code in (0, 1), err
    code_json, out_json, err_json = run_cli("diagnose", str(log), *args, "--json")
    assert code_json == code, err_json
    return code, out, json.loads(out_json)


def _named(out: str, doc: dict[str, Any], pattern_id: str, *citations: str) -> dict[str, Any]:
    """The finding for ``pattern_id``: its class, rule, fix and citations are printed."""
    found = {f["pattern"]: f for f in doc.get("failures", [])}
    assert pattern_id in found, doc.get("failures")
    finding = found[pattern_id]
    pattern = PATTERNS_BY_ID[pattern_id]
    assert finding["class"] == pattern.failure_class and finding["rule"] == pattern.rule
    for text in (pattern.failure_class, pattern.rule, pattern_id, pattern.fix[:60], *citations):
        assert text in out, text
    for citation in citations:
        assert citation in finding["sources"]
    assert doc["exit_code"] == 1
    return finding


# ----- the table ----------------------------------------------------------------------------------
def test_every_pattern_is_a_cited_row() -> None:
    assert len({p.id for p in PATTERNS}) == len(PATTERNS)
    for pattern in PATTERNS:
        assert pattern.rule in FAILURE_RULES, pattern.id
        assert pattern.explanation and pattern.fix and pattern.sources, pattern.id
        assert all(SOURCE.match(source) for source in pattern.sources), pattern.sources
        for needle in pattern.needles:
            assert any(trigger in needle for trigger in TRIGGERS), needle  # the line pre-screen sees it
    # Every class cites at least one public report, not only the source that prints it.
    classes = {p.failure_class for p in PATTERNS}
    for name in classes:
        rows = [p for p in PATTERNS if p.failure_class == name]
        assert any(s.startswith("https://github.com/") for p in rows for s in p.sources), name
    assert not set(FAILURE_RULES) & RULE_IDS  # diagnose rules are not the guide's LC-* rules


def test_matching_is_linear_on_hostile_lines() -> None:
    """64 KiB lines of near-needles (every trigger, needle prefixes, unclosed details) parse in
    bounded time: substring tests plus one anchored match per hit."""
    hostile = [
        "DeepEP dispatch forwarder timeout" + " (RDMA meta" * 6000,
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=" + "9" * 60000,
        " ".join(TRIGGERS) * 700,
        "DeepEP is only applicable to " + "x" * 65000,
        "get_batch_on_this_cp_rank " * 2000,
        "is invalid for input of size " * 2000,
    ]
    start = time.perf_counter()
    summary = parse_log_lines(hostile * 20)
    assert time.perf_counter() - start < 5.0
    assert {f.pattern.id for f in summary.failures} >= {"deepep-internode-kernel-timeout", "deepep-fallback-alltoall"}


# ----- (a) DeepEP timeouts ------------------------------------------------------------------------
def test_deepep_dispatch_cpu_and_internode_timeouts(tmp_path: Path) -> None:
    code, out, doc = _diagnose(tmp_path, lf.deepep_dispatch_cpu_timeout() + lf.deepep_internode_kernel_timeout())
    assert code == 1
    cpu = _named(
        out,
        doc,
        "deepep-dispatch-cpu-timeout",
        "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/1335",
        "deepseek-ai/DeepEP@dd758ca:csrc/legacy/buffer.hpp:1105",
    )
    assert cpu["count"] == 2 and cpu["rank"] == 428
    internode = _named(out, doc, "deepep-internode-kernel-timeout", "https://github.com/deepseek-ai/DeepEP/issues/137")
    assert internode["count"] == 4 and internode["detail"] == ["3", "1"]  # channel 3, RDMA rank 1
    # The lines a known failure explains are not repeated as generic DeepEP failures.
    assert doc["comm_failures"] == []
    # DeepEP's newer elastic buffer words the same timeout as an EPException (exception.cuh).
    elastic = "RuntimeError: Dispatch CPU wait exception (csrc/elastic/buffer.hpp:1063): CPU side received count"
    assert [p.id for p, _ in match_line(elastic)] == ["deepep-dispatch-cpu-timeout"]
    code, quiet, _ = _diagnose(tmp_path, lf.deepep_dispatch_cpu_timeout(), "--quiet")
    assert "deepep-timeout [DG-DEEPEP-TIMEOUT]" in quiet


# ----- (b) a requested dispatcher replaced or unavailable ------------------------------------------
def test_deepep_replaced_by_alltoall_on_gb200(tmp_path: Path) -> None:
    code, out, doc = _diagnose(tmp_path, lf.deepep_replaced_on_gb200())
    assert code == 1
    finding = _named(
        out,
        doc,
        "deepep-fallback-alltoall",
        "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/5992",
        "NVIDIA-NeMo/Megatron-Bridge@067f987:src/megatron/bridge/training/flex_dispatcher_backend.py:65",
    )
    assert finding["detail"] == ["NVIDIA GB200"]
    assert "hybridep" in finding["fix"]


def test_hybridep_not_installed(tmp_path: Path) -> None:
    code, out, doc = _diagnose(tmp_path, lf.hybridep_not_installed())
    assert code == 1
    _named(out, doc, "flex-backend-not-installed", "https://github.com/NVIDIA-NeMo/Megatron-Bridge/pull/3867")


# ----- (c) CUDA graphs in the MoE path ------------------------------------------------------------
def test_cuda_graph_attn_scope_nan(tmp_path: Path) -> None:
    """Confirmed by the log's own argument dump (attn graphed); unconfirmed when the log does not
    say; not reported when the dump shows graphs off."""
    attn = _dump(cuda_graph_scope=frozenset({"attn"}))
    iterations = lf.steady_iterations(5, 1000.0)
    code, out, doc = _diagnose(tmp_path, attn + iterations + lf.cuda_graph_attn_nan(), "-m", "qwen3-30b-a3b")
    assert code == 1
    finding = _named(out, doc, "cuda-graph-attn-nan", "https://github.com/NVIDIA/Megatron-LM/issues/5966")
    assert finding["confirmed"]

    code, out, doc = _diagnose(tmp_path, iterations + lf.cuda_graph_attn_nan())
    assert code == 1 and not _named(out, doc, "cuda-graph-attn-nan")["confirmed"]
    assert "unconfirmed: the log does not say whether cuda_graph_scope has attn" in out

    off = _dump()
    code, out, doc = _diagnose(tmp_path, off + iterations + lf.cuda_graph_attn_nan(), "-m", "qwen3-30b-a3b")
    assert "failures" not in doc


def test_cuda_graph_moe_hang_from_the_bridge_config(tmp_path: Path) -> None:
    """A Bridge log has no argument dump: the run's overrides (--config) say graphs were on."""
    config = tmp_path / "overrides.txt"
    config.write_text(
        "\n".join(
            [
                "model.tensor_model_parallel_size=1",
                "model.pipeline_model_parallel_size=2",  # the report: PP 8 with uneven stages
                "model.expert_model_parallel_size=32",
                "model.seq_length=4096",
                "model.cuda_graph_impl=transformer_engine",
                "model.cuda_graph_scope=[attn,moe_router,moe_preprocess]",
            ]
        ),
        encoding="utf-8",
    )
    bridge = ("--config", str(config), "-m", "qwen3-235b-a22b", "-g", "gb200", "-n", "256")
    code, out, doc = _diagnose(tmp_path, lf.cuda_graph_moe_hang(), *bridge)
    assert code == 1
    _named(out, doc, "cuda-graph-moe-hang", "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/3517")
    assert "a2a-overlap-deadlock" not in out
    # The watchdog line is still an NCCL failure.
    assert [c["library"] for c in doc["comm_failures"]] == ["nccl", "nccl"]

    # Without the run's settings a watchdog timeout is only an NCCL failure: no cause is guessed.
    code, out, doc = _diagnose(tmp_path, lf.cuda_graph_moe_hang())
    assert code == 1 and "failures" not in doc and doc["comm_failures"]


def test_bridge_logs_say_their_own_settings(tmp_path: Path) -> None:
    """Bridge prints the model fields that differ from Megatron-Core's defaults at start-up: graphs
    on there confirm the hang without --config; a summary without them rules the graph causes out."""
    graphed = lf.bridge_config_summary(
        {
            "expert_model_parallel_size": ("32", "1"),
            "cuda_graph_impl": ("'transformer_engine'", "'none'"),
            "cuda_graph_modules": (
                "[<CudaGraphScope.attn: 1>, <CudaGraphScope.moe_router: 4>, <CudaGraphScope.moe_preprocess: 5>]",
                "[]",
            ),
        }
    )
    prefixed = lf.with_rank_prefix(graphed, 0)
    code, out, doc = _diagnose(tmp_path, prefixed + lf.cuda_graph_moe_hang())
    assert code == 1
    assert _named(out, doc, "cuda-graph-moe-hang", "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/3517")
    assert "a2a-overlap-deadlock" not in out

    plain = lf.bridge_config_summary({"expert_model_parallel_size": ("32", "1")})
    code, out, doc = _diagnose(tmp_path, plain + lf.cuda_graph_moe_hang() + lf.cuda_graph_attn_nan())
    assert "failures" not in doc  # graphs and overlap at their defaults: off

    overlap = lf.bridge_config_summary({"overlap_moe_expert_parallel_comm": ("True", "False")})
    code, out, doc = _diagnose(tmp_path, overlap + lf.a2a_overlap_deadlock())
    _named(out, doc, "a2a-overlap-deadlock", "https://github.com/NVIDIA/Megatron-LM/issues/1810")


def test_cuda_graph_capture_with_dynamic_shapes(tmp_path: Path) -> None:
    code, out, doc = _diagnose(tmp_path, lf.cuda_graph_capture_dynamic())
    assert code == 1
    _named(out, doc, "cuda-graph-capture-dynamic", "https://github.com/NVIDIA/Megatron-LM/issues/1598")


# ----- (d) A2A-overlap deadlock -------------------------------------------------------------------
def test_a2a_overlap_deadlock(tmp_path: Path) -> None:
    dump = _dump(overlap_moe_expert_parallel_comm=True)
    lines = dump + lf.steady_iterations(3, 1000.0) + lf.a2a_overlap_deadlock()
    code, out, doc = _diagnose(tmp_path, lines, "-m", "qwen3-30b-a3b")
    assert code == 1
    finding = _named(out, doc, "a2a-overlap-deadlock", "https://github.com/NVIDIA/Megatron-LM/issues/1810")
    assert finding["detail"] == ["216", "ALLTOALL_BASE"]
    assert "overlap_moe_expert_parallel_comm=false" in finding["fix"]
    assert "cuda-graph-moe-hang" not in out  # graphs are off in this run


# ----- (e) CP / THD / SP divisibility -------------------------------------------------------------
CP_CITATIONS = {
    "cp-seq-not-divisible": "NVIDIA-NeMo/Megatron-Bridge@067f987:src/megatron/bridge/training/config.py:1576",
    "sp-first-dim-not-divisible": "https://github.com/NVIDIA-NeMo/RL/issues/2110",
    "te-cp-seq-per-gpu-odd": (
        "NVIDIA/TransformerEngine@d0067d0:transformer_engine/pytorch/attention/dot_product_attention/"
        "context_parallel.py:1571"
    ),
    "thd-cp-reshape": "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/1964",
}


@pytest.mark.parametrize("pattern_id", sorted(CP_CITATIONS))
def test_cp_divisibility_errors(pattern_id: str, tmp_path: Path) -> None:
    code, out, doc = _diagnose(tmp_path, lf.cp_divisibility_failures()[pattern_id])
    assert code == 1
    _named(out, doc, pattern_id, CP_CITATIONS[pattern_id])


def test_a_reshape_error_elsewhere_is_not_a_cp_error() -> None:
    """``shape … is invalid`` means CP only inside get_batch_on_this_cp_rank's traceback."""
    far = ['  File "megatron/core/utils.py", line 1861, in get_batch_on_this_cp_rank'] + ["x"] * 50
    for lines in (
        ["RuntimeError: shape '[16, 128]' is invalid for input of size 8192"],
        [*far, "RuntimeError: shape '[16, 128]' is invalid for input of size 8192"],
    ):
        assert not parse_log_lines(lines).failures
    assert match_line("RuntimeError: shape '[1, 64, 0]' is invalid for input of size 5")[0][1] == ("5",)


# ----- check --intended: an override the recipe silently re-set ----------------------------------
INTENDED = """# what the launcher was given
model.moe_token_dispatcher_type=flex
model.moe_flex_dispatcher_backend=deepep
model.expert_model_parallel_size=8
model.cuda_graph_scope=[attn]
model.params_dtype=bf16
train.global_batch_size=64
optimizer.lr=3e-4
model.moe_shared_expert_overlap=false
model.moe_router_dtpye=fp32
"""


def _check(tmp_path: Path, saved: str, intended: str, *extra: str) -> tuple[int, str, dict[str, Any]]:
    (tmp_path / "saved.yaml").write_text(saved, encoding="utf-8")
    (tmp_path / "intended.txt").write_text(intended, encoding="utf-8")
    args = ("check", str(tmp_path / "saved.yaml"), "-m", "qwen3-30b-a3b", "-n", "16", *extra)
    code, out, err = run_cli(*args, "--intended", str(tmp_path / "intended.txt"))
    code_json, out_json, _ = run_cli(*args, "--intended", str(tmp_path / "intended.txt"), "--json")
    assert code_json == code, err
    return code, out, json.loads(out_json)


def test_check_reports_the_dispatcher_bridge_replaced_on_gb200(tmp_path: Path) -> None:
    """NVIDIA-NeMo/Megatron-Bridge#5992: flex/deepep asked for, alltoall saved."""
    saved = lf.saved_bridge_config(dispatcher="alltoall", backend=None, shared_expert_overlap=False)
    code, out, doc = _check(tmp_path, saved, INTENDED, "-g", "gb200")
    assert code == 1
    by_key = {o["key"]: o for o in doc["intended"]}
    # Equal values in other spellings are not reported: the enum list under its 0.19 name, a dtype,
    # an exponent, a bool.
    assert set(by_key) == {
        "model.moe_token_dispatcher_type",
        "model.moe_flex_dispatcher_backend",
        "model.moe_router_dtpye",
    }
    reset = by_key["model.moe_token_dispatcher_type"]
    assert (reset["status"], reset["intended"], reset["saved"], reset["rule"]) == (
        "reset",
        "flex",
        "alltoall",
        "DG-OVERRIDE-RESET",
    )
    assert "https://github.com/NVIDIA-NeMo/Megatron-Bridge/issues/5992" in reset["sources"]
    assert by_key["model.moe_router_dtpye"]["status"] == "missing"
    # The finding's sentence, wrapped at the output's width (lines joined back).
    start = out.rindex("override", 0, out.index("model.moe_token_dispatcher_type"))
    line = " ".join(out[start:].split("\noverride ", 1)[0].split())
    assert "[DG-OVERRIDE-RESET]" in line and "intended flex, saved alltoall" in line and "issues/5992" in line


def test_check_reports_the_shared_expert_overlap_flex_turns_off(tmp_path: Path) -> None:
    """Bridge's apply_flex_dispatcher_backend sets moe_shared_expert_overlap=False (line 85)."""
    saved = lf.saved_bridge_config(dispatcher="flex", backend="deepep", shared_expert_overlap=False)
    intended = "model.moe_token_dispatcher_type=flex\nmodel.moe_flex_dispatcher_backend=deepep\n"
    b200 = ("-g", "b200")  # DeepEP is applied there (and the layout fits: check's own exit code is 0 or 1)
    code, _, doc = _check(tmp_path, saved, intended + "model.moe_shared_expert_overlap=true\n", *b200)
    assert code == 1
    [reset] = doc["intended"]
    assert reset["key"] == "model.moe_shared_expert_overlap" and reset["saved"] is False
    assert any(s.endswith("flex_dispatcher_backend.py:85") for s in reset["sources"])
    code, _, doc = _check(tmp_path, saved, intended, *b200)
    plain, _, _ = run_cli("check", str(tmp_path / "saved.yaml"), "-m", "qwen3-30b-a3b", "-n", "16", *b200)
    assert doc["intended"] == [] and code == plain  # nothing lost: the exit code is check's own


def test_a_lost_override_alone_makes_check_exit_1(tmp_path: Path) -> None:
    saved = lf.saved_bridge_config(dispatcher="alltoall", backend=None, shared_expert_overlap=False, graphs=False)
    code, quiet, doc = _check(tmp_path, saved, "model.moe_token_dispatcher_type=flex\n", "-g", "gb200", "-q")
    plain, _, _ = run_cli("check", str(tmp_path / "saved.yaml"), "-m", "qwen3-30b-a3b", "-n", "16", "-g", "gb200")
    assert plain == 0 and code == 1 and [o["key"] for o in doc["intended"]] == ["model.moe_token_dispatcher_type"]
    assert quiet.strip().endswith("1 intended overrides not held")


def test_intended_needs_the_saved_yaml(tmp_path: Path) -> None:
    (tmp_path / "args.txt").write_text("--tensor-model-parallel-size 1 --seq-length 4096", encoding="utf-8")
    (tmp_path / "intended.txt").write_text("model.seq_length=4096\n", encoding="utf-8")
    args = ("check", str(tmp_path / "args.txt"), "-m", "qwen3-30b-a3b", "-n", "16")
    code, _, err = run_cli(*args, "--intended", str(tmp_path / "intended.txt"))
    assert code == 2 and "--intended" in err and "saved Bridge YAML" in err


@pytest.mark.parametrize(
    "intended,saved,same",
    [
        ("3e-4", 0.0003, True),
        (8, 8.0, True),
        ("1.0001", 2.0001, False),
        ("bf16", {"_target_": "torch.bfloat16", "_call_": False}, True),
        ("attn", {"_target_": "m.CudaGraphScope", "_call_": True, "_args_": [1], "_name_": "attn"}, True),
        (["moe_router", "attn"], ["attn", "moe_router"], True),
        ([[1, 2], [3]], [[3], [1, 2]], False),
        (None, "null", True),
        (True, False, False),
    ],
)
def test_override_values_compare_by_meaning(intended: Any, saved: Any, same: bool) -> None:
    from lcmoe.diagnose.overrides import same_value

    assert same_value(intended, saved) is same


def test_other_communication_failures_keep_their_generic_handling(tmp_path: Path) -> None:
    """Lines the table does not know stay NCCL failures with the library's fix, next to known ones."""
    lines = [
        "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.21.5",
        *lf.deepep_dispatch_cpu_timeout(),
    ]
    code, _, doc = _diagnose(tmp_path, lines)
    assert code == 1 and [f["pattern"] for f in doc["failures"]] == ["deepep-dispatch-cpu-timeout"]
    assert [c["library"] for c in doc["comm_failures"]] == ["nccl"]
    assert "NCCL_DEBUG=INFO" in doc["comm_failures"][0]["fix"]


def test_log_and_override_text_is_printed_not_read_as_markup(tmp_path: Path) -> None:
    line = "[rank0]: RuntimeError: DeepEP error: timeout (dispatch CPU) [bold] [/] [/x]"
    code, out, _ = _diagnose(tmp_path, [line])
    assert code == 1 and "timeout (dispatch CPU) [bold] [/] [/x]" in out
    saved = lf.saved_bridge_config(dispatcher="alltoall", backend=None, shared_expert_overlap=False)
    code, out, _ = _check(tmp_path, saved, "model.moe_token_dispatcher_type=[/x]\n", "-g", "gb200")
    assert "intended ['/x'], saved alltoall" in out  # YAML reads [/x] as a list; printed, not parsed as markup
