"""The typed plan request (cli/request.py), sequence-length ranges, the at-risk mark in sweep and
-q, plan --report failing late, and the sweep's progress bar (issues 33 item 6, 34 items 4, 7)."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import json
from typing import Any

import pytest

from lcmoe.errors import LcmoeError
from tests.conftest import run_cli

SWEEP = ("sweep", "-m", "qwen3-30b-a3b", "-n", "8", "--seq-lens", "4k..8k")
PLAN = ("plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--top", "1")


@pytest.mark.parametrize(
    ("text", "lengths"),
    [
        ("16k..256k", [16384, 32768, 65536, 131072, 262144]),  # powers of two between, inclusive
        ("16K...256K", [16384, 32768, 65536, 131072, 262144]),
        ("16K–256K", [16384, 32768, 65536, 131072, 262144]),  # README's "16K–256K"
        ("4K to 256K", [4096, 8192, 16384, 32768, 65536, 131072, 262144]),  # README's sweep row
        ("4k,…,256k", [4096, 8192, 16384, 32768, 65536, 131072, 262144]),
        ("4k,16k,32k,64k,128k,256k", [4096, 16384, 32768, 65536, 131072, 262144]),  # docs/commands.md
        ("12k..96k", [12288, 16384, 32768, 65536, 98304]),  # ends kept, powers of two inside
        ("32k,16k..64k", [32768, 16384, 65536]),  # repeats dropped, order kept
        ("8k..8k", [8192]),
        ("16k-256k", [16384, 32768, 65536, 131072, 262144]),  # a hyphen: lengths are never negative
    ],
)
def test_sequence_length_lists_and_ranges(text: str, lengths: list[int]) -> None:
    from lcmoe.cli.run_options import seq_lengths

    assert seq_lengths(text, field="--seq-lens") == lengths


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("256k..16k", "longer to a shorter"),
        ("…,4k", "without a length on each side"),
        ("4k,…", "without a length on each side"),
        (",,,", "names no sequence length"),
        ("1..1M", "more than 32"),  # 21 lengths is fine; 1..2^40 is not
        ("1..1099511627776", "more than 32"),
    ],
)
def test_bad_sequence_length_lists_are_one_sentence(text: str, needle: str) -> None:
    from lcmoe.cli.run_options import seq_lengths

    if text == "1..1M":
        assert len(seq_lengths(text, field="--seq-lens")) == 21
        return
    with pytest.raises(LcmoeError, match=needle):
        seq_lengths(text, field="--seq-lens")


def test_every_plan_option_is_a_parameter_of_the_commands() -> None:
    """PlanOptions.from_params picks fields by parameter name: a renamed option must not fall
    silently back to the default."""
    from lcmoe.cli.plan_cmd import plan, report, sweep
    from lcmoe.cli.request import PlanOptions

    names = {f.name for f in dataclasses.fields(PlanOptions)}
    assert names <= set(inspect.signature(plan).parameters)
    fixed = {"top", "seq_len", "gbs", "margin", "megatron_core_version", "no_offload", "no_cuda_graphs"}
    assert names - fixed <= set(inspect.signature(sweep).parameters)
    assert names - {"no_offload", "no_cuda_graphs"} <= set(inspect.signature(report).parameters)


def test_rank_choices_match_the_search() -> None:
    from lcmoe.cli.request import RANK_CHOICES
    from lcmoe.plan.search import RANK_MODES

    assert RANK_CHOICES == RANK_MODES


def test_rank_completes_its_choices() -> None:
    from lcmoe.cli import run_options as ro
    from lcmoe.cli.request import RANK_CHOICES

    assert ro.complete_one(RANK_CHOICES)("e") == ["expected"]


@pytest.fixture(scope="module")
def sweep_json() -> dict[str, Any]:
    code, out, err = run_cli(*SWEEP, "--json")
    assert code == 0, err
    return dict(json.loads(out))


def test_sweep_takes_a_range(sweep_json: dict[str, Any]) -> None:
    assert [row["seq_len"] for row in sweep_json["sweep"]] == [4096, 8192]


def _at_risk(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` with the first plan at risk and every other one not (whatever the search found)."""
    marked = json.loads(json.dumps(rows))
    for index, row in enumerate(marked):
        row["plan"]["memory"]["oom_risk"] = index == 0
    return list(marked)


def test_sweep_table_and_quiet_show_the_at_risk_mark(sweep_json: dict[str, Any]) -> None:
    from lcmoe.cli.common import stdout
    from lcmoe.cli.sweep_cmd import _print_quiet, _print_table

    rows = _at_risk(sweep_json["sweep"])
    with stdout.capture() as captured:
        _print_quiet(rows)
        _print_table(rows, "t")
    quiet, table = captured.get().split("\n", 2)[:2], captured.get()
    assert quiet[0].endswith("! may OOM") and "!" not in quiet[1]
    assert "may OOM" in table.splitlines()[-1]  # the at-risk footnote under the table


def test_narrow_sweep_gets_a_card_per_length_with_every_value_whole(sweep_json: dict[str, Any]) -> None:
    import io

    from rich.console import Console

    import lcmoe.cli.sweep_cmd as sweep_cmd

    rows = _at_risk(sweep_json["sweep"])
    for width, cards in ((80, True), (200, False)):
        buffer = io.StringIO()
        narrow = Console(file=buffer, width=width, color_system=None)
        original, sweep_cmd.stdout = sweep_cmd.stdout, narrow
        try:
            sweep_cmd._print_table(rows, "best plan per sequence length")
        finally:
            sweep_cmd.stdout = original
        out = buffer.getvalue()
        assert "…" not in out and all(len(line) <= width for line in out.splitlines()), out
        assert ("┏" not in out) is cards and (f"seq {rows[0]['seq_len']}" in out) is cards, out
        for row in rows:
            for value in sweep_cmd._cells(row["plan"]):
                assert value in out, (value, out)
    assert " !" in sweep_cmd._cells(rows[0]["plan"])[4]  # the at-risk mark on its card


def test_plan_quiet_shows_the_at_risk_mark(sweep_json: dict[str, Any]) -> None:
    from lcmoe.cli.common import stdout
    from lcmoe.cli.plan_cmd import _print_quiet

    plan = _at_risk(sweep_json["sweep"])[0]["plan"]
    with stdout.capture() as captured:
        _print_quiet({"plans": [plan]})
    assert captured.get().rstrip().endswith("! may OOM")


def test_plan_report_failing_late_exits_1_with_the_plan_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    import lcmoe.cli.plan_cmd as plan_cmd

    def unwritable(*_: object, **__: object) -> list[object]:
        raise LcmoeError("--out", "/ro/report.html", "cannot be written (Read-only file system)", "choose another")

    monkeypatch.setattr(plan_cmd, "write_report", unwritable)
    code, out, err = run_cli(*PLAN, "-q", "--report", "/ro")
    assert code == 1
    assert out.startswith("TP")  # the plan line is not lost
    assert err.count("\n") == 1 and "report was not written" in err and "Traceback" not in err


class _FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run_with_stderr(stream: io.StringIO, *args: str) -> tuple[int, str]:
    from lcmoe.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(stream):
        try:
            main(list(args))
        except SystemExit as exc:
            return int(exc.code or 0), out.getvalue()
    return 0, out.getvalue()


def test_sweep_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    from lcmoe.cli.common import stderr

    # rich decides "interactive" when the console is made (at import, under pytest: no terminal).
    monkeypatch.setattr(stderr, "is_interactive", True)
    piped, tty = io.StringIO(), _FakeTty()
    code_piped, out_piped = _run_with_stderr(piped, *SWEEP, "-q")
    code_tty, out_tty = _run_with_stderr(tty, *SWEEP, "-q")
    assert code_piped == code_tty == 0
    assert out_piped == out_tty  # stdout is the same either way
    assert piped.getvalue() == ""
    assert "sweep" in tty.getvalue() and "2/2" in tty.getvalue()
    json_tty = _FakeTty()
    _run_with_stderr(json_tty, *SWEEP, "--json")
    assert json_tty.getvalue() == ""  # never with --json


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("lcmoe plan --rank ex", ["expected"]),
        ("lcmoe plan -m deepseek-v", ["deepseek-v3"]),
        ("lcmoe sweep -g gb2", ["gb200"]),
    ],
)
def test_shell_completion_of_rank_models_and_gpus(words: str, expected: list[str]) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "_LCMOE_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": "3"}
    command = [sys.executable, "-c", "from lcmoe.cli import main; main()"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert set(expected) <= set(done.stdout.split()), done.stdout
