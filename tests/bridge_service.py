"""One Megatron Bridge interpreter for the whole test session (tests/bridge_runtime.py ``--serve``).

Bridge's import chain costs ~25 s of CPU, once per process: every test that asks Bridge's
``runtime_config_update`` for a verdict (tests/test_bridge_runtime.py and the activation-offload,
delayed-wgrad, Muon and paged-stash start-up tests, through its ``bridge_answer`` /
``bridge_results``) sends its request to the one process the session fixture
``bridge_service`` (tests/conftest.py) starts, and gets the answer the one-shot
``bridge_runtime.py`` would print. Those tests share an xdist group, so one worker starts it.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
BRIDGE_PYTHON = os.environ.get("LCMOE_BRIDGE_PYTHON", "")
# The xdist group of every test that uses the fixture (tests/conftest.py).
GROUP = "bridge-runtime"
FIXTURE = "bridge_service"
START_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 900.0


def available() -> bool:
    return bool(BRIDGE_PYTHON) and Path(BRIDGE_PYTHON).exists()


class BridgeService:
    """A ``bridge_runtime.py --serve`` process: ``check(request)`` → its answer (``results`` by
    case, ``registered_precisions``). Started on the first request, closed by ``close``."""

    def __init__(self, python: str) -> None:
        self._python = python
        self._proc: subprocess.Popen[str] | None = None
        self._stderr: IO[str] | None = None

    def check(self, request: dict[str, Any]) -> dict[str, Any]:
        """Bridge's answer to ``request`` ({"hf_dirs", "cases", "mixed_precision_names"})."""
        proc = self._started()
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()
        return dict(json.loads(self._line(REQUEST_TIMEOUT_S)))

    def close(self) -> None:
        if self._proc is not None:
            if self._proc.stdin is not None:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            assert self._proc.stdout is not None
            self._proc.stdout.close()
            self._proc = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def _started(self) -> subprocess.Popen[str]:
        if self._proc is None:
            # Bridge writes many warnings to stderr: a file, so a full pipe never blocks it.
            self._stderr = tempfile.TemporaryFile("w+", encoding="utf-8")  # noqa: SIM115 (closed by close())
            self._proc = subprocess.Popen(
                [self._python, str(HERE / "bridge_runtime.py"), "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            )
            ready = self._line(START_TIMEOUT_S)
            assert ready == "ready", f"Bridge did not start: {ready!r}\n{self._stderr_tail()}"
        return self._proc

    def _line(self, timeout_s: float) -> str:
        """The next line the process writes; fails with its stderr when it exits or times out."""
        assert self._proc is not None and self._proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout_s)
        line = self._proc.stdout.readline() if ready else ""
        if not line:
            code = self._proc.poll()
            raise AssertionError(
                f"Bridge process {'exited ' + str(code) if code is not None else 'timed out'}:\n{self._stderr_tail()}"
            )
        return line.rstrip("\n")

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.flush()
        self._stderr.seek(0)
        return self._stderr.read()[-4000:]
