"""Robustness: every input surface fuzzed (small budget here; benchmarks/fuzz.py runs ≥ 10,000
per surface), interrupted runs leave nothing half-written, no network at run time, and a large
log is read in bounded memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from lcmoe.diagnose.logs import MAX_ITERATIONS, read_log
from tests import log_fixtures as lf
from tests.conftest import run_cli
from tests.fuzz_surfaces import SURFACES, run_surface

REPO = Path(__file__).resolve().parent.parent
CLI = "import sys; from lcmoe.cli import main; main(sys.argv[1:])"
NO_NETWORK = (
    "import socket, sys\n"
    "def refuse(*a, **k):\n"
    "    raise OSError('network disabled by test_robustness')\n"
    "socket.socket = refuse; socket.create_connection = refuse; socket.getaddrinfo = refuse\n"
    "from lcmoe.cli import main\n"
    "main(sys.argv[1:])\n"
)
# The search announces itself on stderr and then waits, so the SIGINT lands inside it whatever
# the machine's load (a fixed sleep raced a search that can take 1 s or 20 s).
SLOW_SEARCH_CLI = (
    "import sys, time\n"
    "import lcmoe.plan.search as plan_search\n"
    "real_search = plan_search.search\n"
    "def waiting_search(*args, **kwargs):\n"
    "    sys.stderr.write('search started\\n'); sys.stderr.flush()\n"
    "    time.sleep(120)\n"
    "    return real_search(*args, **kwargs)\n"
    "plan_search.search = waiting_search\n"
    "from lcmoe.cli import main\n"
    "main(sys.argv[1:])\n"
)


@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_surface_never_fails(surface: str) -> None:
    report = run_surface(surface, max_examples=60, seed_value=2026)
    assert report.cases >= 30
    assert report.failures == [], report.failures[:3]


def _leftovers(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def test_non_empty_emit_target_is_refused_before_the_search(tmp_path: Path) -> None:
    target = tmp_path / "plan"
    target.mkdir()
    (target / "keep.txt").write_text("old plan\n", encoding="utf-8")
    started = time.monotonic()
    code, _, err = run_cli("plan", "-m", "deepseek-v3", "-g", "h100", "-n", "512", "-s", "256k", "--emit", str(target))
    assert code == 2 and "not empty" in err and time.monotonic() - started < 5
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]


def test_sigint_during_search_leaves_no_files(tmp_path: Path) -> None:
    target = tmp_path / "plan"
    target.mkdir()
    (target / "keep.txt").write_text("old plan\n", encoding="utf-8")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            SLOW_SEARCH_CLI,
            "plan",
            "-m",
            "deepseek-v3",
            "-g",
            "h100",
            "-n",
            "512",
            "-s",
            "256k",
            "--emit",
            str(target),
            "--force",  # a non-empty target is refused before the search without it
            "--yes",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        # A user's shell starts lcmoe with SIGINT at its default; an xdist worker may ignore it,
        # and a child that inherits SIG_IGN never sees the Ctrl-C this test sends.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    started = proc.stderr.readline()
    assert started == "search started\n", started
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out[-500:], err[-500:])
    assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in target.iterdir()) == ["keep.txt"]
    assert (target / "keep.txt").read_text(encoding="utf-8") == "old plan\n"
    assert _leftovers(tmp_path, "plan") == []


# The interrupted --emit cases (old or new directory, at every step of the write) are in
# tests/test_emit_safety.py.


def test_interrupted_atomic_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lcmoe.emit import writer

    path = tmp_path / "cluster.yaml"
    path.write_text("old\n", encoding="utf-8")

    def interrupt(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(writer.os, "replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        writer.atomic_write_text(path, "new\n")
    assert path.read_text(encoding="utf-8") == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml"]


def test_cli_runs_with_networking_disabled(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    log.write_text("\n".join(lf.steady_iterations(10, 1000.0)), encoding="utf-8")
    commands = [
        ["models"],
        ["hardware"],
        ["flops", "-m", "deepseek-v3", "-s", "128k"],
        ["plan", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "32k", "--top", "1", "-q"],
        [
            "estimate",
            "-m",
            "deepseek-v3",
            "-n",
            "256",
            "-s",
            "128k",
            "--cp",
            "32",
            "--ep",
            "32",
            "--pp",
            "8",
            "--vpp",
            "4",
            "--recompute",
            "full",
            "-q",
        ],
        ["diagnose", str(log)],
        ["preflight"],
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="0", NO_PROXY="", no_proxy="")
    for argv in commands:
        done = subprocess.run(
            [sys.executable, "-c", NO_NETWORK, *argv],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=tmp_path,
        )
        text = done.stdout + done.stderr
        assert "network disabled" not in text and "Traceback" not in text, (argv, text[-800:])
        assert done.returncode in (0, 1, 2), argv
        if argv[0] != "preflight":  # preflight fails here for want of a GPU, not of a network
            assert done.returncode in (0, 1), (argv, text[-800:])


def test_large_log_is_read_in_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "big.log"
    block = "\n".join(lf.with_rank_prefix(lf.steady_iterations(1000, 1500.0), 5)) + "\n"
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(120):
            handle.write(block)
    tracemalloc.start()
    summary = read_log(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert summary.lines == 120_000 and len(summary.iterations) == MAX_ITERATIONS
    assert peak < 48 * 1024**2, peak
