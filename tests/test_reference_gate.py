"""The accuracy gates' reference data: found through LCMOE_REFERENCE, and a failure, not a skip,
when it is missing under CI (issue #33 item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REFERENCE_FILES, reference_folder, reference_required


def test_ci_or_the_dedicated_variable_requires_the_reference_data() -> None:
    assert reference_required({"CI": "true"}) and reference_required({"LCMOE_REQUIRE_REFERENCE": "1"})
    assert not reference_required({}) and not reference_required({"CI": "false", "LCMOE_REQUIRE_REFERENCE": "0"})


def test_missing_reference_data_fails_under_ci_and_skips_elsewhere(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception, match="reference data not found"):
        reference_folder(tmp_path, {"LCMOE_REQUIRE_REFERENCE": "1"})
    with pytest.raises(pytest.skip.Exception, match="set LCMOE_REFERENCE"):
        reference_folder(tmp_path, {})
    for name in REFERENCE_FILES[:-1]:  # one file missing is still missing
        (tmp_path / name).write_text("")
    with pytest.raises(pytest.fail.Exception, match=REFERENCE_FILES[-1]):
        reference_folder(tmp_path, {"CI": "1"})
    (tmp_path / REFERENCE_FILES[-1]).write_text("")
    assert reference_folder(tmp_path, {"CI": "1"}) == tmp_path
