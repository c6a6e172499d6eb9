"""The memory estimator package: its shipped coefficients must exist, and its modules stay small."""

from __future__ import annotations

from pathlib import Path

import pytest

import lcmoe.estimate.memory as memory
from lcmoe.errors import LcmoeError
from lcmoe.estimate.memory import coefficients

PACKAGE = Path(memory.__file__).parent


def test_missing_coefficient_file_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    coefficients.shipped_coefficients.cache_clear()
    monkeypatch.setattr(coefficients, "COEFFICIENTS_FILE", "no_such_coefficients.yaml")
    try:
        with pytest.raises(LcmoeError, match=r"no_such_coefficients\.yaml.*missing"):
            coefficients.shipped_coefficients()
    finally:
        coefficients.shipped_coefficients.cache_clear()


def test_shipped_coefficients_load() -> None:
    assert coefficients.shipped_coefficients().fit, "memory_coefficients.yaml carries its fit record"


def test_every_exported_name_resolves() -> None:
    for name in memory.__all__:
        assert hasattr(memory, name), name


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_module_stays_small(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 400
