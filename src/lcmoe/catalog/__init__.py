"""Built-in model and hardware catalogs (YAML shipped in the package) and user YAML loading.

No network: every catalog value ships inside the package with its source.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from lcmoe.errors import LcmoeError, UnknownNameError
from lcmoe.specs.hardware import HardwareSpec, hardware_from_dict
from lcmoe.specs.model import ModelSpec, model_from_dict


def _normalise(name: str) -> str:
    return name.strip().lower().replace("_", "-")


@functools.cache
def _catalog_files(kind: str) -> dict[str, str]:
    """name → YAML text for one catalog folder (``models`` or ``hardware``)."""
    folder = resources.files("lcmoe.catalog").joinpath(kind)
    return {
        entry.name.removesuffix(".yaml"): entry.read_text(encoding="utf-8")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    }


def model_names() -> list[str]:
    return sorted(_catalog_files("models"))


def hardware_names() -> list[str]:
    return sorted(_catalog_files("hardware"))


def read_yaml_text(text: str, *, origin: str) -> dict[str, Any]:
    """Parse YAML that must be a mapping; any other shape is one clear error."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise LcmoeError(origin, "(file)", f"is not valid YAML{where}", "fix the syntax") from None
    if not isinstance(data, dict):
        raise LcmoeError(origin, type(data).__name__, "must be a YAML mapping of field: value", "see the catalog files")
    return data


def read_yaml_file(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LcmoeError("file", str(p), f"cannot be read ({exc.__class__.__name__})", "check the path") from None
    return read_yaml_text(text, origin=str(p))


def load_model(name: str) -> ModelSpec:
    """A catalog model by name (case and ``_``/``-`` insensitive)."""
    files = _catalog_files("models")
    key = _normalise(name)
    if key not in files:
        raise UnknownNameError("model", name, list(files))
    return model_from_dict(read_yaml_text(files[key], origin=f"catalog model {key}"), origin=key)


def load_hardware(name: str, overrides: dict[str, Any] | None = None) -> HardwareSpec:
    """A catalog GPU by name, with single fields optionally overridden (e.g. scale-out bandwidth)."""
    files = _catalog_files("hardware")
    key = _normalise(name)
    if key not in files:
        raise UnknownNameError("gpu", name, list(files))
    data = read_yaml_text(files[key], origin=f"catalog hardware {key}")
    return hardware_from_dict({**data, **(overrides or {})}, origin=key)


def load_model_file(path: str | Path) -> ModelSpec:
    """A user model: lcmoe YAML, or a Hugging Face ``config.json`` (detected by ``model_type``)."""
    p = Path(path)
    if p.suffix == ".json" or p.is_dir():
        from lcmoe.specs.hf import model_from_hf_config

        return model_from_hf_config(p)
    return model_from_dict(read_yaml_file(p), origin=str(p))


def load_hardware_file(path: str | Path, overrides: dict[str, Any] | None = None) -> HardwareSpec:
    return hardware_from_dict({**read_yaml_file(path), **(overrides or {})}, origin=str(path))
