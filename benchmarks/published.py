"""Shared loading of the published reference tables (../shared/reference) for the benchmarks.

Maps the published model labels to catalog models through the catalog's ``published_names``;
everything here is benchmark plumbing, not library code, so the library never depends on where
the reference data lives.
"""

from __future__ import annotations

import csv
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from lcmoe.catalog import catalog_name_for_label, load_model
from lcmoe.specs.model import ModelSpec

REPO = Path(__file__).resolve().parent.parent
REFERENCE = Path(os.environ.get("LCMOE_REFERENCE", REPO.parent / "shared" / "reference"))


def read_rows(path: str | Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def catalog_model_for_label(label: str) -> ModelSpec | None:
    """The catalog model a published label names (``catalog.catalog_name_for_label``: the model
    YAMLs' ``published_names``), with MTP off when the label says "w/o MTP"; None if unknown."""
    name = catalog_name_for_label(label)
    if name is None:
        return None
    spec = load_model(name)
    if re.search(r"w/o\s*MTP", label, re.IGNORECASE):
        spec = spec.model_copy(update={"mtp_num_layers": 0})
    return spec


def catalog_model_for_row(row: dict[str, str]) -> ModelSpec | None:
    """The catalog model a published perf_summary row measured, with the row's MTP setting."""
    label = " ".join(filter(None, (row.get("model_base") or row.get("model", ""), row.get("model_qualifier", ""))))
    return catalog_model_for_label(label if "w/o MTP" not in row.get("model", "") else f"{label} w/o MTP")


def not_in_catalog(label: str) -> str:
    """The skip reason of a row whose model the catalog does not know."""
    return f"model not in catalog: {label}"


def skip_summary(skipped: list[dict[str, str]]) -> list[tuple[str, int]]:
    """Skipped rows counted by reason, most frequent first."""
    counts: dict[str, int] = {}
    for entry in skipped:
        counts[entry["reason"]] = counts.get(entry["reason"], 0) + 1
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


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
