"""A progress bar on stderr for long commands (issue 34 item 7): sweep cases, bytes of a log.

Shown only when stderr is a terminal, so piped output, ``--json`` and CI logs never see it; the bar
is transient (it disappears when done) and never touches stdout. Usage::

    with progress(len(cases), "sweep", enabled=not as_json) as advance:
        for case in cases:
            ...
            advance(1)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

Unit = Literal["items", "bytes"]


class Advance(Protocol):
    """Moves the bar on by ``amount`` items or bytes (default 1)."""

    def __call__(self, amount: float = 1) -> None: ...


def _skip(amount: float = 1) -> None:
    """The advance function when no bar is shown: does nothing."""


def is_terminal(console: Console) -> bool:
    """Whether the console writes to a real, interactive terminal. Asks the file itself as well as
    rich's ``is_interactive`` (off for TERM=dumb and TTY_INTERACTIVE=0), because FORCE_COLOR makes
    rich call a pipe a terminal and a bar's redraws would fill a CI log."""
    isatty = getattr(console.file, "isatty", None)
    return bool(isatty and isatty()) and console.is_interactive


def _columns(unit: Unit, *, counted: bool) -> tuple[ProgressColumn, ...]:
    if not counted:  # an unknown amount of work: a pulsing bar and the time so far
        return TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn()
    done: ProgressColumn = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    return TextColumn("{task.description}"), BarColumn(), done, TimeRemainingColumn()


@contextmanager
def progress(
    total: float | None,
    label: str,
    *,
    enabled: bool = True,
    unit: Unit = "items",
    console: Console | None = None,
) -> Iterator[Advance]:
    """Yield ``advance(amount=1)``; a bar of ``total`` items (or bytes) labelled ``label`` is drawn
    on ``console`` (default: lcmoe's stderr console) only if ``enabled``, ``total`` > 0 and that
    console is a terminal. Otherwise ``advance`` does nothing and nothing is printed. ``total``
    None: work whose size is unknown (a pulsing bar with the elapsed time)."""
    from lcmoe.cli.common import stderr

    target = stderr if console is None else console
    if not (enabled and (total is None or total > 0) and is_terminal(target)):
        yield _skip
        return
    with Progress(*_columns(unit, counted=total is not None), console=target, transient=True) as bar:
        task = bar.add_task(label, total=total)

        def advance(amount: float = 1) -> None:
            bar.advance(task, amount)

        yield advance
