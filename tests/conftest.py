"""Shared fixtures: the reference data folder and a CLI runner."""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping
from pathlib import Path

import pytest

from tests.bridge_service import BRIDGE_PYTHON, BridgeService
from tests.bridge_service import FIXTURE as BRIDGE_FIXTURE
from tests.bridge_service import GROUP as BRIDGE_GROUP
from tests.bridge_service import available as bridge_available

REPO = Path(__file__).resolve().parent.parent
# The published reference tables the accuracy gates read (shared/reference); LCMOE_REFERENCE
# points elsewhere (benchmarks/published.py reads the same variable).
REFERENCE = Path(os.environ.get("LCMOE_REFERENCE", REPO.parent / "shared" / "reference"))
REFERENCE_FILES = (
    "perf_summary.csv",
    "perf_recipes.csv",
    "long_context.csv",
    "megatron_golden.csv",
    "memory_points.csv",
)
# Set (and not 0/false), either one makes missing reference data a failure: CI services set CI,
# and .ci/run exports LCMOE_REQUIRE_REFERENCE=1.
REQUIRE_REFERENCE_ENV = ("CI", "LCMOE_REQUIRE_REFERENCE")


def reference_required(environ: Mapping[str, str]) -> bool:
    return any(environ.get(name, "").strip().lower() not in ("", "0", "false") for name in REQUIRE_REFERENCE_ENV)


def reference_folder(folder: Path, environ: Mapping[str, str]) -> Path:
    """``folder`` when it holds every file the accuracy gates read; otherwise the test fails
    under CI (an accuracy gate that cannot run must not pass as a skip) and is skipped elsewhere."""
    missing = [name for name in REFERENCE_FILES if not (folder / name).is_file()]
    if missing:
        message = f"reference data not found at {folder}: no {', '.join(missing)} (set LCMOE_REFERENCE)"
        if reference_required(environ):
            pytest.fail(message)
        pytest.skip(message)
    return folder


@pytest.fixture(scope="session")
def reference() -> Path:
    return reference_folder(REFERENCE, os.environ)


@pytest.fixture(scope="session")
def bridge_service() -> Generator[BridgeService, None, None]:
    """The session's one Megatron Bridge process (tests/bridge_service.py); skipped when
    ``LCMOE_BRIDGE_PYTHON`` is not there (the tests that use it carry the same skip mark)."""
    if not bridge_available():
        pytest.skip("LCMOE_BRIDGE_PYTHON (an interpreter with megatron-bridge 0.6.2) is not set; .ci/run builds one")
    service = BridgeService(BRIDGE_PYTHON)
    yield service
    service.close()


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


def pytest_configure(config: pytest.Config) -> None:
    # Known without pytest-xdist too (-p no:xdist runs one file alone).
    config.addinivalue_line("markers", "xdist_group(name): run on the worker of the group's other tests")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Generator[None, None, None]:
    """Spread tests over the xdist workers one by one (``--dist loadgroup``), except that every
    test using a module-scoped fixture (a Bridge process, an emitted directory, a report) stays on
    one worker with its module, so the fixture is built once.

    pytest-xdist (3.8) puts a test in its group by appending ``@group`` to ``item._nodeid`` in its
    own collection hook, but pytest 9 reads a node id from ``item._id``: the suffix never reached
    the scheduler, and every module fixture was built once per worker (the Bridge process and the
    report twice). After the other hooks, the suffix is written where pytest 9 reads it."""
    for item in items:
        group = _module_fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    yield
    if getattr(config.option, "loadgroup", False):
        for item in items:
            group = _module_fixture_group(item)
            if group is not None and not item.nodeid.endswith("@" + group) and hasattr(item, "_id"):
                item._id = type(item._id).parse(f"{item.nodeid}@{group}")


def _module_fixture_group(item: pytest.Item) -> str | None:
    """One group for every test that asks the session's Bridge process (whatever its file: the
    process starts once); else the test's file when it uses a module-scoped fixture; else None."""
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs if info is not None else {}
    if BRIDGE_FIXTURE in defs:
        return BRIDGE_GROUP
    if any(chain and chain[-1].scope == "module" for chain in defs.values()):
        return item.nodeid.split("::", 1)[0]
    return None
