"""diagnose: log parsing (clean, prefixed, truncated, interleaved, corrupted), OOM ladder, slow
runs, regressions, plan.json round trip."""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import random
import re
from pathlib import Path

import pytest
from rich.console import Console

from lcmoe.cli.diagnose_view import render_oom
from lcmoe.cli.log_progress import PROC_FD, open_offset, read_log_with_progress
from lcmoe.config_io.megatron_args import parse_megatron_args, parse_megatron_dump, tokenize_args
from lcmoe.config_io.plan_json import run_from_plan
from lcmoe.diagnose.logs import MAX_LINE_BYTES, parse_log_lines, read_log
from lcmoe.diagnose.oom import Target, diagnose_oom, judge
from lcmoe.diagnose.performance import diagnose_speed
from lcmoe.diagnose.regression import compare
from lcmoe.diagnose.remedies import Outcome, Remedy
from lcmoe.diagnose.steps import step_stats
from lcmoe.emit.megatron_lm import megatron_lm_args
from lcmoe.errors import LcmoeError
from lcmoe.estimate.report import estimate_run
from lcmoe.estimate.time import estimate_time
from tests import log_fixtures as lf
from tests.conftest import REPO, run_cli
from tests.helpers import make_run

GIB = 1024.0**3


def _dsv3_128k_no_recompute():  # type: ignore[no-untyped-def]
    """The guidance's DeepSeek-V3 128K layout on 256 × H100, without its recompute set."""
    return make_run(precision="fp8-blockwise", dispatcher="deepep", optimizer_offload_fraction=1.0)


# ----- parsing ---------------------------------------------------------------------------------
def test_parses_every_documented_line_kind() -> None:
    lines = [
        *lf.argument_dump({"tensor_model_parallel_size": 2, "world_size": 16, "recompute_modules": "['core_attn']"}),
        "Theoretical memory footprints: weight and optimizer=1524.73 MB, activation=2048.00 MB, total=3572.73 MB",
        *lf.steady_iterations(10, 1500.0, tflops=400.0, gbs=64),
        lf.step_time_line(1.50, 401.2),
        lf.bridge_memory_line(0, 2, 61.234, 70.5),
        lf.megatron_memory_line(8, 2, 50000.0, 52000.0),
        *lf.timers_block((100.0, 130.0)),
        lf.oom_line(2.0, 3, 79.19, 300.0, 5000.0),
        "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error, NCCL version 2.21.5",
    ]
    s = parse_log_lines(lines)
    assert len(s.iterations) == 10 and s.iterations[-1].tflops_per_gpu == 400.0
    assert s.iterations[0].global_batch_size == 64
    assert s.step_summaries == ((1.50, 401.2),)
    assert s.arguments["tensor_model_parallel_size"] == "2"
    assert s.theoretical_memory is not None and s.theoretical_memory.total_bytes == pytest.approx(3572.73 * 2**20)
    bridge = next(r for r in s.memory_reports if r.rank == 0)
    assert bridge.max_allocated == pytest.approx(61.234e9) and bridge.source == "bridge"
    mlm = next(r for r in s.memory_reports if r.rank == 8)
    assert mlm.max_allocated == pytest.approx(50000.0 * 2**20) and mlm.source == "megatron-lm"
    assert s.peak_memory() == bridge
    assert s.timers["forward-backward"] == (100.0, 130.0)
    oom = s.ooms[0]
    assert oom.gpu_index == 3 and oom.tried_bytes == pytest.approx(2 * GIB)
    assert oom.reserved_unallocated_bytes == pytest.approx(5000 * 2**20)
    assert [c.library for c in s.comm_failures] == ["nccl"]
    assert s.garbage_lines == 0 and s.missing == []


def test_launcher_prefixes_give_the_rank() -> None:
    for line, rank in (
        (f"[rank12]: {lf.oom_line(1, 0, 80, 10, 10)}", 12),
        (f"5: {lf.oom_line(1, 0, 80, 10, 10)}", 5),
        (f"[1,7]<stderr>: {lf.oom_line(1, 0, 80, 10, 10)}", 7),
        (f"[node03:4]: {lf.oom_line(1, 0, 80, 10, 10)}", 4),
    ):
        assert parse_log_lines([line]).ooms[0].rank == rank


def test_truncated_interleaved_and_corrupted_logs_never_crash() -> None:
    rng = random.Random(7)
    clean = lf.steady_iterations(200, 2000.0) + [lf.bridge_memory_line(r, 2, 60.0 + r, 65.0) for r in range(8)]
    mangled: list[str] = []
    for line in clean:
        roll = rng.random()
        if roll < 0.1:
            mangled.append(line[: rng.randrange(len(line))])  # cut
        elif roll < 0.2:
            other = rng.choice(clean)
            cut = rng.randrange(len(line))
            mangled.append(line[:cut] + other[rng.randrange(len(other)) :])  # two ranks in one line
        elif roll < 0.25:
            mangled.append("".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(200))))
        else:
            mangled.append(line)
    s = parse_log_lines(mangled)
    assert 100 < len(s.iterations) <= 200
    assert all(r.elapsed_ms > 0 for r in s.iterations)
    stats = step_stats(s)
    assert stats is not None and stats.median_seconds == pytest.approx(2.0, rel=0.05)


def test_random_bytes_file_is_read_without_error(tmp_path: Path) -> None:
    path = tmp_path / "noise.log"
    rng = random.Random(3)
    path.write_bytes(bytes(rng.randrange(256) for _ in range(300_000)))
    s = read_log(path)
    assert s.bytes_read == 300_000 and s.iterations == ()


def test_overlong_lines_are_cut_and_skipped(tmp_path: Path) -> None:
    path = tmp_path / "long.log"
    good = lf.iteration_line(5, 10, 1234.5)
    path.write_text("x" * (3 * MAX_LINE_BYTES) + "\n" + good + "\n" + "y" * MAX_LINE_BYTES, encoding="utf-8")
    s = read_log(path)
    assert s.overlong_lines >= 1
    assert [r.elapsed_ms for r in s.iterations] == [1234.5]


def test_gzip_and_truncated_gzip(tmp_path: Path) -> None:
    data = ("\n".join(lf.steady_iterations(50, 900.0)) + "\n").encode()
    path = tmp_path / "run.log.gz"
    path.write_bytes(gzip.compress(data))
    assert len(read_log(path).iterations) == 50
    cut = tmp_path / "cut.log.gz"
    cut.write_bytes(gzip.compress(data)[: len(gzip.compress(data)) // 2])
    assert len(read_log(cut).iterations) < 50  # what was readable, no exception


def test_missing_file_is_one_sentence() -> None:
    code, _, err = run_cli("diagnose", "/nonexistent/train.log")
    assert code == 2 and "LOG" in err and "Traceback" not in err


def test_step_stats_drop_warmup_and_keep_the_last_restart() -> None:
    first = lf.steady_iterations(20, 5000.0)
    second = lf.steady_iterations(20, 1000.0, seed=1)  # counter restarts at 1
    stats = step_stats(parse_log_lines(first + second))
    assert stats is not None
    assert stats.warmup_dropped == 2 and stats.intervals == 18
    assert stats.median_seconds == pytest.approx(1.0, rel=0.02)


# ----- the log's own configuration -----------------------------------------------------------
def _dump_from_args(args: dict[str, object], world: int, vocab: int | None) -> dict[str, str]:
    """What Megatron-LM's _print_args would print for these flags (dest names, str() values)."""
    dests: dict[str, str] = {"world_size": str(world)}
    if vocab:
        dests["padded_vocab_size"] = str(vocab)
    for flag, value in args.items():
        if flag == "disable-bias-linear":
            dests["add_bias_linear"] = "False"
            continue
        name = "fp8" if flag == "fp8-format" else flag.replace("-", "_")
        dests[name] = str(value)
    return dests


def test_argument_dump_reproduces_the_command_line(reference: Path) -> None:
    """Every parseable megatron_golden.csv row: the dump a run prints parses to the same run."""
    checked = 0
    with (reference / "megatron_golden.csv").open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if not row.get("world_size", "").strip():
                continue
            vocab = int(row["base_vocab_size"]) if row.get("base_vocab_size", "").isdigit() else None
            try:
                direct = parse_megatron_args(row["args_raw"], world_size=int(row["world_size"]), vocab_size=vocab)
            except LcmoeError:  # rows lcmoe cannot model are skipped, as in benchmarks/golden.py
                continue
            args = tokenize_args(row["args_raw"])
            padded = direct.model.vocab_size if vocab else None
            from_dump = parse_megatron_dump(
                parse_log_lines(lf.argument_dump(_dump_from_args(args, 0, None))).arguments
                | {"world_size": row["world_size"]}
                | ({"padded_vocab_size": str(padded)} if padded else {})
            )
            assert from_dump.layout == direct.layout, row["test_case"]
            assert from_dump.options == direct.options, row["test_case"]
            assert from_dump.model.model_dump(exclude={"name"}) == direct.model.model_dump(exclude={"name"})
            checked += 1
    assert checked > 100


# ----- OOM -------------------------------------------------------------------------------------
def test_dsv3_128k_oom_ladder_first_fit_is_selective() -> None:
    """Acceptance: an OOM of DeepSeek-V3 128K without recompute → the first rung that fits is a
    selective recompute set, not full recompute (LC-RECOMPUTE-SELECTIVE)."""
    run = _dsv3_128k_no_recompute()
    log = parse_log_lines([lf.oom_line(3.5, 0, 79.19, 120.0, 300.0)])
    result = diagnose_oom(run, log)
    assert not result.predicted_fits and result.over_stages
    assert result.recommended is not None
    assert result.recommended.remedy.kind == "recompute"
    assert result.recommended.remedy.label.startswith("selective recompute")
    assert result.recommended.remedy.rule == "LC-RECOMPUTE-SELECTIVE"
    full = next(r.outcome for r in result.ladder if r.outcome.remedy.label.startswith("full"))
    assert full.fits and full.tokens_per_sec_per_gpu < result.recommended.tokens_per_sec_per_gpu
    kinds = [r.outcome.remedy.kind for r in result.ladder]
    assert kinds == sorted(kinds, key=["allocator", "recompute", "precision", "offload", "layout"].index)


def test_fragmentation_evidence_puts_expandable_segments_first() -> None:
    run = make_run("qwen3-30b-a3b", seq_len=4096, tp=1, cp=1, ep=8, pp=1, vpp=1, gpus=8, gbs=64)
    log = parse_log_lines([lf.oom_line(1.0, 0, 79.19, 20.0, 20000.0)])
    result = diagnose_oom(run, log, search_more_gpus=False)
    assert any("fragmentation" in note for note in result.evidence)
    assert result.ladder[0].outcome.remedy.kind == "allocator"


def test_oom_cli_json_on_a_megatron_lm_config(tmp_path: Path) -> None:
    run = _dsv3_128k_no_recompute()
    config = tmp_path / "args.txt"
    config.write_text("\n".join(megatron_lm_args(run)), encoding="utf-8")
    log = tmp_path / "train.log"
    log.write_text("\n".join(lf.with_rank_prefix([lf.oom_line(3.5, 0, 79.19, 120.0, 300.0)], 3)), encoding="utf-8")
    code, out, err = run_cli(
        "diagnose", str(log), "--config", str(config), "--model", "deepseek-v3", "--gpus", "256", "--json"
    )
    assert code == 1, err
    doc = json.loads(out)
    assert doc["oom"]["recommended"]["change"].startswith("selective recompute")
    assert doc["log"]["ooms"][0]["rank"] == 3
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs" / "schema" / "diagnose.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(doc, schema, cls=jsonschema.Draft202012Validator)  # the oom part's shape too


def _dsv3_128k_plan_one():  # type: ignore[no-untyped-def]
    """`lcmoe plan -m deepseek-v3 -g h100 -n 256 -s 128k`'s plan 1 (issue 34): predicted to fit
    (~75 GiB of 79.6) with layernorm,mla_up_proj,moe_act recomputed."""
    return make_run(
        tp=4,
        cp=16,
        ep=64,
        pp=4,
        vpp=4,
        gbs=64,
        precision="fp8-blockwise",
        dispatcher="hybridep",
        recompute_granularity="selective",
        recompute_modules=frozenset({"layernorm", "mla_up_proj", "moe_act"}),
        optimizer_offload_fraction=0.25,
        precision_aware=True,
        overlap_moe_expert_parallel_comm=True,
    )


def test_ladder_offers_only_rungs_that_lower_the_peak_and_fit() -> None:
    """Issue 34 item 5: a rung predicting the failing config's own peak (adding mlp to recompute
    when DeepSeek-V3's MoE layers have no mlp) is rejected as no effect; every offered rung is
    legal, lower by at least what the log's allocation lacked, and fits; every rejected rung says
    why; no reason is a negative "over"."""
    run = _dsv3_128k_plan_one()
    log = parse_log_lines([lf.oom_line(3.5, 0, 79.19, 120.0, 300.0)])
    result = diagnose_oom(run, log, search_more_gpus=False)
    shortfall = 3.5 * GIB - 120 * 2**20
    assert result.needed_drop_bytes == pytest.approx(shortfall)
    mlp = next(r for r in result.ladder if "mlp," in r.outcome.remedy.label and "moe," not in r.outcome.remedy.label)
    assert mlp.verdict == "no effect" and not mlp.offered
    assert "the same as the config that ran out of memory" in mlp.reason
    for rung in result.offered:
        assert rung.outcome.legal and rung.outcome.fits
        assert -rung.peak_change_bytes >= shortfall
    for rung in result.rejected:
        assert rung.reason and not re.search(r"-\d", rung.reason), rung.reason
        if rung.verdict == "illegal":
            assert rung.outcome.problem_rule and rung.outcome.problem_rule in rung.reason
    assert result.recommended is None or result.recommended is result.offered[0].outcome


def _outcome(peak_gib: float, *, legal: bool = True, fits: bool = True):  # type: ignore[no-untyped-def]
    remedy = Remedy("recompute", "selective recompute x", "LC-RECOMPUTE-SELECTIVE", None)
    broken = None if legal else "L-RULE"
    return Outcome(remedy, legal, "it breaks" if broken else None, fits, peak_gib * GIB, 80 * GIB, 1.0, 0.0, broken)


@pytest.mark.parametrize(
    ("baseline_gib", "peak_gib", "legal", "fits", "verdict", "words"),
    [
        (85.0, 60.0, False, False, "illegal", "breaks L-RULE: it breaks"),
        (85.0, 85.02, True, False, "no effect", "no effect: predicts 85.0 GiB, the same as"),
        (85.0, 86.0, True, False, "no effect", "raises the predicted peak by 1.0 GiB"),
        (85.0, 82.5, True, False, "over", "still over capacity by 2.5 GiB"),
        (85.0, 77.0, True, False, "over", "inside capacity with 3.0 GiB free, but 1.0 GiB over the 5% safety margin"),
        (75.0, 73.0, True, True, "too little", "lowers the predicted peak by 2.0 GiB, less than the 3.0 GiB"),
        (75.0, 70.0, True, True, "fits", "fits with 10.0 GiB free"),
    ],
)
def test_each_rung_verdict_gives_its_reason(
    baseline_gib: float, peak_gib: float, legal: bool, fits: bool, verdict: str, words: str
) -> None:
    """On an 80 GiB GPU (76 GiB usable at a 5% margin) whose log lacked 3 GiB: illegal names the
    rule; the failing config's peak or higher is no effect; above capacity says by how much;
    inside capacity but over the margin says the GiB free (never a negative "over"); a drop
    smaller than the log's shortfall is too little; otherwise it fits, with the GiB left free."""
    target = Target(baseline_gib * GIB, capacity_bytes=80 * GIB, margin=0.05, log_shortfall_bytes=3 * GIB)
    rung = judge(_outcome(peak_gib, legal=legal, fits=fits), target)
    assert rung.verdict == verdict and words in rung.reason
    assert rung.offered == (verdict == "fits")


def test_oom_cli_text_lists_fitting_rungs_then_rejected_ones_with_reasons(tmp_path: Path) -> None:
    run = _dsv3_128k_plan_one()
    config = tmp_path / "args.txt"
    config.write_text("\n".join(megatron_lm_args(run)), encoding="utf-8")
    log = tmp_path / "train.log"
    log.write_text(lf.oom_line(3.5, 0, 79.19, 120.0, 300.0) + "\n", encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), "--config", str(config), "--model", "deepseek-v3", "--gpus", "256")
    assert code == 1, err
    assert "rejected:" in out and "no effect: predicts" in out
    assert not re.search(r"-\d+(\.\d+)? GiB over", out), out
    ladder = out[out.index("remediation ladder") : out.index("rejected:")].splitlines()[1:]
    rungs = [line.strip() for line in ladder if line.startswith("    ")]  # wrapped continuations are not indented
    assert rungs and all(line.startswith("fits ") or line == "(no single change fits)" for line in rungs), out


def test_a_stage_inside_capacity_is_never_negative_over() -> None:
    """Issue 34: "-3.8 GiB over capacity" for a stage above the margin but inside the GPU."""
    stage = {
        "stage": 2,
        "peak_reserved_bytes": 75.8 * GIB,
        "over_bytes": -3.8 * GIB,
        "free_bytes": 3.8 * GIB,
        "largest_components": {"weight_copies": 8 * GIB},
    }
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        render_oom({"over_stages": [stage], "evidence": [], "ladder": []})
    assert "fits with 3.8 GiB free" in out.getvalue() and "-3.8" not in out.getvalue()
    assert "weight copies (FP8) 8.0" in out.getvalue()


# ----- speed -----------------------------------------------------------------------------------
def _speed_log(step_seconds: float, count: int = 30, jitter: float = 0.01) -> list[str]:
    return lf.steady_iterations(count, step_seconds * 1000, jitter=jitter)


def test_slow_run_is_called_slow_with_evaluated_knobs() -> None:
    run = make_run(
        "deepseek-v3",
        seq_len=32768,
        cp=8,
        ep=32,
        pp=8,
        vpp=4,
        gpus=256,
        recompute_granularity="selective",
        recompute_modules=frozenset({"mla_up_proj", "layernorm", "moe", "mlp"}),
    )
    predicted = estimate_time(run).step_seconds
    summary = parse_log_lines(_speed_log(1.6 * predicted) + lf.timers_block((100.0, 140.0)))
    stats = step_stats(summary)
    assert stats is not None
    speed = diagnose_speed(run, stats, summary)
    assert speed.verdict == "slower than predicted"
    assert speed.ratio == pytest.approx(1.6, rel=0.02)
    assert any("straggler" in note for note in speed.notes)
    assert speed.knobs and all(k.legal and k.throughput_change > 0 for k in speed.knobs)
    assert speed.bottleneck in speed.breakdown


def test_run_at_prediction_is_as_predicted() -> None:
    run = make_run("qwen3-30b-a3b", seq_len=16384, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16, gbs=64)
    stats = step_stats(parse_log_lines(_speed_log(estimate_time(run).step_seconds)))
    assert stats is not None
    assert diagnose_speed(run, stats).verdict == "as predicted"


def test_speed_cli_from_the_logs_argument_dump(tmp_path: Path) -> None:
    """A Megatron-LM log carries its own configuration; no --config is needed."""
    run = make_run("qwen3-30b-a3b", seq_len=16384, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16, gbs=64)
    from lcmoe.emit.megatron_lm import megatron_lm_args

    args = tokenize_args(" ".join(megatron_lm_args(run)))
    dump = _dump_from_args(args, 16, None)
    log = tmp_path / "run.log"
    predicted = estimate_time(run).step_seconds
    log.write_text("\n".join(lf.argument_dump(dump) + _speed_log(predicted)), encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), "--model", "qwen3-30b-a3b", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["config_source"].startswith("the log's argument dump")
    assert doc["speed"]["verdict"] == "as predicted"
    assert doc["speed"]["predicted_step_seconds"] == pytest.approx(predicted, rel=1e-9)


def test_memory_report_is_compared_allocated_and_reserved(tmp_path: Path) -> None:
    """A log's max allocated is compared with peak allocated, its max reserved (PyTorch's) with
    the predicted PyTorch reserved, not with the nvidia-smi figure."""
    run = make_run("qwen3-30b-a3b", seq_len=16384, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16, gbs=64)
    from lcmoe.emit.megatron_lm import megatron_lm_args
    from lcmoe.estimate.memory import estimate_memory

    dump = _dump_from_args(tokenize_args(" ".join(megatron_lm_args(run))), 16, None)
    log = tmp_path / "run.log"
    memory_lines = [lf.megatron_memory_line(0, 2, 50_000.0, 52_000.0)]
    log.write_text("\n".join(lf.argument_dump(dump) + memory_lines), encoding="utf-8")
    code, out, err = run_cli("diagnose", str(log), "--model", "qwen3-30b-a3b", "--json")
    assert code == 0, err
    report = json.loads(out)["memory"]
    predicted = estimate_memory(run.model, run.hardware, run.layout, run.options)
    assert report["measured_max_reserved_bytes"] == pytest.approx(52_000.0 * 2**20)
    assert report["predicted_peak_torch_reserved_bytes"] == pytest.approx(predicted.peak_torch_reserved_bytes, rel=1e-6)
    assert report["reserved_error"] == pytest.approx(
        predicted.peak_torch_reserved_bytes / (52_000.0 * 2**20) - 1, rel=1e-6
    )


# ----- regression ------------------------------------------------------------------------------
def _run_log(step_ms: float, dests: dict[str, object], *, jitter: float = 0.01, seed: int = 0) -> list[str]:
    return lf.argument_dump(dests) + lf.steady_iterations(40, step_ms, jitter=jitter, seed=seed)


def test_regression_with_a_config_change_names_the_rule() -> None:
    a = parse_log_lines(_run_log(1000.0, {"recompute_granularity": "None", "save": "/ckpt/a"}))
    b = parse_log_lines(_run_log(1100.0, {"recompute_granularity": "full", "save": "/ckpt/b"}, seed=1))
    report = compare(a, b)
    assert report.step_verdict == "regression (slower)"
    assert report.step_change == pytest.approx(0.10, abs=0.01)
    assert list(report.config_diff) == ["recompute_granularity"]  # paths are not a cause
    assert report.causes[0]["rule"] == "LC-RECOMPUTE-SELECTIVE"


def test_noise_is_not_a_regression() -> None:
    a = parse_log_lines(_run_log(1000.0, {}, jitter=0.25, seed=2))
    b = parse_log_lines(_run_log(1030.0, {}, jitter=0.25, seed=3))
    assert compare(a, b).step_verdict == "within noise"


def test_unexplained_regression_points_at_drift(tmp_path: Path) -> None:
    a, b = tmp_path / "a.log", tmp_path / "b.log"
    a.write_text("\n".join(_run_log(1000.0, {"world_size": 64})), encoding="utf-8")
    b.write_text("\n".join(_run_log(1200.0, {"world_size": 64}, seed=4)), encoding="utf-8")
    code, out, _ = run_cli("diagnose", str(b), "--baseline", str(a), "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["step_time_verdict"] == "regression (slower)"
    assert doc["causes"][0]["rule"] == "LC-BASELINE-DRIFT"


# ----- plan.json ------------------------------------------------------------------------------
def test_plan_json_round_trip(tmp_path: Path) -> None:
    code, out, err = run_cli("plan", "-m", "qwen3-30b-a3b", "-g", "h100", "-n", "16", "-s", "32k", "--json")
    assert code == 0, err
    doc = json.loads(out)
    run = run_from_plan(doc)
    again = estimate_run(run)
    best = doc["plans"][0]
    assert again["memory"]["peak_reserved_bytes"] == pytest.approx(best["memory"]["peak_reserved_bytes"], rel=1e-12)
    assert again["time"]["step_seconds"] == pytest.approx(best["time"]["step_seconds"], rel=1e-12)


def test_bad_plan_json_is_one_sentence(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{not json", encoding="utf-8")
    code, _, err = run_cli("preflight", "--plan", str(bad))
    assert code == 2 and "--plan" in err and "Traceback" not in err


# ----- progress --------------------------------------------------------------------------------
class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.skipif(not PROC_FD.is_dir(), reason="the bar follows /proc/self/fdinfo (Linux)")
def test_log_offset_is_read_from_the_open_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "train.log"
    path.write_bytes(b"x" * 1000)
    with path.open("rb", buffering=0) as stream:
        stream.read(100)
        assert open_offset(path.resolve()) == 100
    assert open_offset(path.resolve()) is None


def test_diagnose_shows_bytes_read_only_on_a_terminal(tmp_path: Path) -> None:
    """The bar is drawn on a terminal and the summary is read_log's; a pipe gets nothing."""
    path = tmp_path / "train.log"
    path.write_text("\n".join(_speed_log(1.0, count=2000)) + "\n", encoding="utf-8")
    shown = _Tty()
    summary = read_log_with_progress(
        str(path), console=Console(file=shown, force_terminal=True, force_interactive=True)
    )
    assert summary == read_log(path)
    assert ("reading log" in shown.getvalue()) == PROC_FD.is_dir()
    piped = io.StringIO()
    assert read_log_with_progress(str(path), console=Console(file=piped)) == summary
    assert piped.getvalue() == ""
