"""`lcmoe estimate --explain`: every printed term can be redone by hand (amount / rate × factor =
seconds), the terms add up to the stage's microbatch, and the microbatches, bubble and step terms
add up to the printed step time."""

from __future__ import annotations

import json
import re
from collections import defaultdict

import pytest

from lcmoe.estimate.time import shipped_time_coefficients, stage_terms, stage_time, time_amounts
from tests.conftest import run_cli
from tests.helpers import make_run


def _args(line: str) -> tuple[str, ...]:
    return tuple(line.split())


RUNS = {
    # MoE, long context: CP ring, EP over NVLink and the NIC, PP.
    "deepseek-v3 128K": _args("-m deepseek-v3 -g h100 -n 256 -s 128k --tp 8 --cp 8 --ep 32 --pp 4"),
    # Small MoE at 16K: no PP, EP inside the node.
    "qwen3-30b 16K": _args("-m qwen3-30b-a3b -n 16 -s 16k --ep 8"),
    # Hybrid (Gated DeltaNet) with CP, TP and interleaved PP.
    "qwen3-next 64K": _args("-m qwen3-next-80b-a3b -g h100 -n 64 -s 64k --tp 2 --cp 4 --ep 8 --pp 2 --vpp 2"),
}
NUMBER = r"([0-9.]+(?:e[+-]?[0-9]+)?)"
TERM = re.compile(rf"^  (.+?): {NUMBER} (\S+) / {NUMBER} (\S+)(?: × {NUMBER})? = {NUMBER} s")
MICROBATCH = re.compile(rf"^  microbatch of stage \d+ = sum of the terms = {NUMBER} s")
STEP = re.compile(
    rf"^step = {NUMBER} s \(stage \d+ microbatch\) × \((\d+) microbatches \+ {NUMBER} bubble\) \+ {NUMBER} s "
    rf"\(step terms\) = {NUMBER} s"
)
DIGITS = 5e-4  # printed to 4 significant digits: each number within half a unit of its 4th digit


def _explain(args: tuple[str, ...]) -> tuple[list[tuple[str, float, float, float, float]], str]:
    code, out, err = run_cli("estimate", *args, "--explain")
    assert code in (0, 1), err  # 1: the layout does not fit (the time is still estimated)
    terms = []
    for line in out.splitlines():
        match = TERM.match(line)
        if match:
            name, amount, _, rate, _, factor, seconds = match.groups()
            terms.append((name, float(amount), float(rate), float(factor or 1.0), float(seconds)))
    return terms, out


@pytest.mark.parametrize("name", list(RUNS))
def test_each_printed_term_is_its_amount_over_its_rate(name: str) -> None:
    terms, out = _explain(RUNS[name])
    assert len(terms) >= 5, out
    for term, amount, rate, factor, seconds in terms:
        by_hand = amount / rate * factor
        assert by_hand == pytest.approx(seconds, rel=4 * DIGITS, abs=1e-4 * max(seconds, 1e-9)), term


@pytest.mark.parametrize("name", list(RUNS))
def test_terms_add_up_to_the_microbatch_and_the_step(name: str) -> None:
    terms, out = _explain(RUNS[name])
    lines = out.splitlines()
    stage_lines = lines[: next(i for i, line in enumerate(lines) if MICROBATCH.match(line))]
    stage_sum = sum(
        seconds for term, *_, seconds in terms if any(line.startswith(f"  {term}:") for line in stage_lines)
    )
    microbatch = float(next(m.group(1) for line in lines if (m := MICROBATCH.match(line))))
    assert stage_sum == pytest.approx(microbatch, rel=len(terms) * DIGITS)
    step = next(m for line in lines if (m := STEP.match(line)))
    critical, count, bubble, extra, total = (float(x) for x in step.groups())
    assert critical * (count + bubble) + extra == pytest.approx(total, rel=4 * DIGITS)
    _, json_out, _ = run_cli("estimate", *RUNS[name], "--json")
    assert total == pytest.approx(json.loads(json_out)["time"]["step_seconds"], rel=DIGITS)


def test_expected_terms_appear_for_a_moe_long_context_run() -> None:
    names = {term for term, *_ in _explain(RUNS["deepseek-v3 128K"])[0]}
    assert {"dense GEMM", "expert GEMM", "attention core", "EP dispatch+combine, NIC", "CP ring KV exchange"} <= names
    assert "GDN recurrence" in {term for term, *_ in _explain(RUNS["qwen3-next 64K"])[0]}


def test_terms_group_into_the_stage_time_fields_exactly() -> None:
    """The terms restate stage_time: summed by field they give every StageTime field, every stage."""
    for run in (make_run(), make_run("qwen3-next-80b-a3b", seq_len=65536, tp=2, cp=4, ep=8, pp=2, vpp=2, gpus=64)):
        c = shipped_time_coefficients(run.hardware.architecture)
        amounts = time_amounts(run)
        for stage in amounts.stages:
            time = stage_time(amounts, stage, c)
            fields: dict[str, float] = defaultdict(float)
            for term in stage_terms(amounts, stage, c, time.pp_comm):
                assert term.seconds == pytest.approx(term.amount / term.rate * term.factor)
                fields[term.field] += term.seconds
            for field, seconds in time.as_dict().items():
                assert fields[field] == pytest.approx(seconds, rel=1e-9, abs=1e-15), field


def test_json_explain_is_additive_and_stage_is_checked() -> None:
    args = RUNS["qwen3-30b 16K"]
    plain = json.loads(run_cli("estimate", *args, "--json")[1])
    explained = json.loads(run_cli("estimate", *args, "--json", "--explain")[1])
    block = explained["time"].pop("explain")
    assert explained == plain
    assert block["stage"] == block["critical_stage"] == 0 and block["terms"]
    assert sum(t["seconds"] for t in block["terms"]) == pytest.approx(block["microbatch_seconds"])
    code, _, err = run_cli("estimate", *args, "--explain", "--stage", "3")
    assert code == 2 and "--stage" in err and "0 to 0" in err
    code, _, err = run_cli("estimate", *args, "--stage", "0")
    assert code == 2 and "add --explain" in err


def test_explain_other_stage_says_which_is_slowest() -> None:
    out = _explain((*RUNS["deepseek-v3 128K"], "--stage", "0"))[1]
    assert "step-time terms of stage 0" in out


def test_a_missing_coefficient_file_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from lcmoe.errors import LcmoeError
    from lcmoe.estimate.time import coefficients

    coefficients._shipped.cache_clear()
    monkeypatch.setattr(coefficients, "SHIPPED_COEFFICIENTS_FILE", "no_such_coefficients.yaml")
    try:
        with pytest.raises(LcmoeError, match=re.escape("no_such_coefficients.yaml")):
            shipped_time_coefficients("hopper")
    finally:
        coefficients._shipped.cache_clear()
