"""The progress helper (issue 34 item 7): a bar on a terminal's stderr, nothing anywhere else."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from lcmoe.cli.progress import progress


class _FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(console: Console, *, enabled: bool = True, unit: str = "items") -> None:
    with progress(3, "cases", enabled=enabled, console=console, unit=unit) as advance:  # type: ignore[arg-type]
        for _ in range(3):
            advance(1)


def test_bar_is_drawn_on_a_terminal() -> None:
    tty = _FakeTty()
    _run(Console(file=tty, force_terminal=True, width=80))
    assert "cases" in tty.getvalue()
    assert "3/3" in tty.getvalue()


def test_bytes_bar_counts_bytes() -> None:
    tty = _FakeTty()
    with progress(2048, "log", console=Console(file=tty, force_terminal=True, width=80), unit="bytes") as advance:
        advance(2048)
    assert "log" in tty.getvalue()
    assert "kB" in tty.getvalue()


def test_nothing_off_a_terminal_even_when_colour_is_forced() -> None:
    # FORCE_COLOR makes rich call a pipe a terminal; the helper asks the file itself.
    piped = io.StringIO()
    _run(Console(file=piped, force_terminal=True, width=80))
    assert piped.getvalue() == ""


def test_nothing_when_disabled() -> None:
    tty = _FakeTty()
    _run(Console(file=tty, force_terminal=True, width=80), enabled=False)
    assert tty.getvalue() == ""


def test_advance_is_callable_with_no_argument_when_off() -> None:
    with progress(0, "empty", console=Console(file=io.StringIO())) as advance:
        advance()


def test_unknown_total_pulses_with_the_elapsed_time() -> None:
    tty = _FakeTty()
    with progress(None, "report", console=Console(file=tty, force_terminal=True, width=80)):
        pass
    assert "report" in tty.getvalue() and "0:00:0" in tty.getvalue()


def test_report_bar_counts_the_sweep_lengths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`lcmoe report` on a terminal: one step of its bar per sequence length it searches."""
    import lcmoe.cli.common as common
    from lcmoe.cli import request as rq
    from lcmoe.cli.report_cmd import write_report

    tty = _FakeTty()
    monkeypatch.setattr(common, "stderr", Console(file=tty, force_terminal=True, width=80))
    options = rq.PlanOptions.from_params(
        {"model": "qwen3-30b-a3b", "gpu": "h100", "gpus": 8, "seq_len": "4k", "top": 1}, top=1
    )
    request = rq.plan_request(options)
    result = rq.search_with_progress(request, quiet=True)
    write_report(request, result, tmp_path / "report.html", "4k,8k", None, show_progress=True)
    assert "report: sweep" in tty.getvalue() and "2/2" in tty.getvalue()
