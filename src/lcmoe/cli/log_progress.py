"""A bytes-read progress bar for ``lcmoe diagnose`` on a long log (issue 34 item 7).

``read_log`` (diagnose/logs.py) reads the file itself and reports nothing while it streams, so the
bar follows the file's offset from outside: while ``read_log`` runs, a helper thread reads the
offset of the descriptor it opened on the log (``/proc/self/fdinfo/<fd>``, ``pos:``) every
``POLL_SECONDS`` and moves the bar on by the bytes read since. For a .gz log the offset is in
compressed bytes, like the total (the file's size). Where /proc is missing (not Linux), for
standard input, and when stderr is not a terminal (cli/progress.py decides), no bar is drawn and
``read_log`` runs alone."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from rich.console import Console

from lcmoe.cli.progress import Advance, is_terminal, progress
from lcmoe.diagnose.logs import LogSummary, read_log

POLL_SECONDS = 0.2
PROC_FD = Path("/proc/self/fd")


def open_offset(target: Path) -> int | None:
    """The offset of this process's first open descriptor on ``target``, or None when none is
    open (yet) or /proc cannot be read."""
    try:
        names = os.listdir(PROC_FD)
    except OSError:
        return None
    for name in names:
        try:
            if Path(os.readlink(PROC_FD / name)) != target:
                continue
            fdinfo = (PROC_FD.parent / "fdinfo" / name).read_text(encoding="ascii")
        except OSError:  # a descriptor closed while we looked
            continue
        for line in fdinfo.splitlines():
            if line.startswith("pos:"):
                return int(line.split()[1])
    return None


def _follow(target: Path, advance: Advance, stop: threading.Event) -> None:
    """Move the bar to the descriptor's offset until ``stop`` is set."""
    shown = 0
    while not stop.wait(POLL_SECONDS):
        offset = open_offset(target)
        if offset is not None and offset > shown:
            advance(offset - shown)
            shown = offset


def read_log_with_progress(source: str, *, enabled: bool = True, console: Console | None = None) -> LogSummary:
    """``read_log(source)`` with a bar of bytes read on stderr when ``enabled`` and on a terminal."""
    from lcmoe.cli.common import stderr

    if source == "-" or not enabled or not PROC_FD.is_dir() or not is_terminal(console or stderr):
        return read_log(source)
    target = Path(source).resolve()
    try:
        size = target.stat().st_size
    except OSError:
        return read_log(source)  # read_log says why in one sentence
    with progress(size, "reading log", unit="bytes", console=console) as advance:
        stop = threading.Event()
        follower = threading.Thread(target=_follow, args=(target, advance, stop), daemon=True)
        follower.start()
        try:
            return read_log(source)
        finally:
            stop.set()
            follower.join()
