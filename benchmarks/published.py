"""Shared loading of the published reference tables (../shared/reference) for the benchmarks.

Maps the published model labels to catalog models; everything here is benchmark plumbing, not
library code, so the library never depends on where the reference data lives.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lcmoe.catalog import load_model
from lcmoe.specs.model import ModelSpec

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("LCMOE_REFERENCE", REPO.parent / "shared" / "reference"))

# Published label (perf_summary.csv model_base) → catalog model.
MODEL_BASE_TO_CATALOG = {
    "DeepSeekV3": "deepseek-v3",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "LLAMA3_70B": "llama3-70b",
    "LLAMA3.1_405B": "llama3.1-405b",
    "LLAMA3_8B": "llama3-8b",
    "Nemotron_3_Nano": "nemotron-3-nano-30b-a3b",
    "Nemotron_3_Super": "nemotron-3-super-120b-a12b",
}


def read_rows(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def catalog_model_for_row(row: dict[str, str]) -> ModelSpec | None:
    """The catalog model a published row measured, with the row's MTP setting; None if unknown."""
    name = MODEL_BASE_TO_CATALOG.get(row.get("model_base", ""))
    if name is None:
        return None
    spec = load_model(name)
    if "w/o MTP" in row.get("model_qualifier", "") or "w/o MTP" in row.get("model", ""):
        spec = spec.model_copy(update={"mtp_num_layers": 0})
    return spec


def as_int(text: str | None, default: int = 1) -> int:
    """A published integer cell; empty, "n/a" or "-" mean the default."""
    if text is None:
        return default
    cleaned = text.strip().lstrip("~").replace(",", "")
    try:
        return int(float(cleaned))
    except ValueError:
        return default


def as_float(text: str | None) -> float | None:
    if text is None or text.strip() == "":
        return None
    return float(text.strip().lstrip("~").replace(",", ""))


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Atomic write: temp file in the same folder, then rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, target)


def write_coefficients(path: Path, payload: dict[str, Any], *, script: str) -> None:
    """Write a fitted-coefficient YAML shipped in the package (atomic, with a do-not-edit header)."""
    import yaml

    text = f"# Written by {script} --write; do not edit by hand.\n" + yaml.safe_dump(payload, sort_keys=False)
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, target)
