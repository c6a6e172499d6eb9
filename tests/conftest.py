"""Shared fixtures: the reference data folder and a CLI runner."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("LCMOE_REFERENCE", REPO.parent / "shared" / "reference"))


@pytest.fixture(scope="session")
def reference() -> Path:
    if not (REFERENCE / "perf_summary.csv").exists():
        message = f"reference data not found at {REFERENCE} (set LCMOE_REFERENCE)"
        if os.environ.get("CI"):  # an accuracy gate that cannot run is a failure in CI, not a skip
            pytest.fail(message)
        pytest.skip(message)
    return REFERENCE


@pytest.fixture(autouse=True)
def _no_inherited_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts without COLUMNS, as output piped from a shell that sets none: pytest-xdist
    gives its workers COLUMNS=80 (the controller's terminal), which lcmoe honours, so without this
    the same test wraps at 80 columns under ``-n 2`` and at 200 alone. A test about widths sets
    COLUMNS itself."""
    monkeypatch.delenv("COLUMNS", raising=False)


def run_cli(*args: str) -> tuple[int, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    import contextlib
    import io

    from lcmoe.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return code, out.getvalue(), err.getvalue()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Spread tests over the xdist workers one by one (``--dist loadgroup``), except that every
    test using a module-scoped fixture (a Bridge process, an emitted directory, a report) stays on
    one worker with its module, so the fixture is built once."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(chain and chain[-1].scope == "module" for chain in defs):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
