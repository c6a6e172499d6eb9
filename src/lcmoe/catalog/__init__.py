"""Built-in model and hardware catalogs (YAML shipped in the package) and user YAML loading.

No network: every catalog value ships inside the package with its source.
"""

from __future__ import annotations

import functools
import re
from importlib import resources
from pathlib import Path
from typing import Any

from lcmoe.errors import LcmoeError, UnknownNameError
from lcmoe.safe_io import MAX_YAML_CHARS, load_yaml, read_text_capped
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
    """Parse YAML that must be a mapping; any other shape is one clear error. Parsing is bounded
    (``safe_io.load_yaml``: size, nesting, alias expansion, integer length)."""
    data = load_yaml(text, origin=origin)
    if not isinstance(data, dict):
        raise LcmoeError(origin, type(data).__name__, "must be a YAML mapping of field: value", "see the catalog files")
    return data


def read_yaml_file(path: str | Path, *, field: str = "file") -> dict[str, Any]:
    """A user YAML file: a regular file of bounded size (never a FIFO or device), then
    ``read_yaml_text``."""
    p = Path(path)
    text = read_text_capped(p, field=field, max_bytes=MAX_YAML_CHARS)
    return read_yaml_text(text, origin=str(p))


def load_model(name: str) -> ModelSpec:
    """A catalog model by name (case and ``_``/``-`` insensitive)."""
    files = _catalog_files("models")
    key = _normalise(name)
    if key not in files:
        raise UnknownNameError("model", name, list(files))
    return model_from_dict(read_yaml_text(files[key], origin=f"catalog model {key}"), origin=key)


def _label_key(text: str) -> str:
    """A published label reduced to lower-case letters and digits ("Qwen3_235B_a22B" →
    "qwen3235ba22b"); a Hugging Face organisation prefix ("deepseek-ai/…") is dropped."""
    text = text.strip()
    if re.fullmatch(r"[\w.-]+/[\w.-]+", text):
        text = text.split("/", 1)[1]
    return re.sub(r"[^a-z0-9]", "", text.lower())


@functools.cache
def _published_name_index() -> tuple[tuple[str, str], ...]:
    """(label key, catalog name) for every catalog model's own name and its ``published_names``,
    longest key first."""
    pairs = {
        (_label_key(label), name)
        for name in model_names()
        for label in (name, *load_model(name).published_names)
        if _label_key(label)
    }
    return tuple(sorted(pairs, key=lambda pair: (-len(pair[0]), pair[1])))


def catalog_name_for_label(label: str) -> str | None:
    """The catalog model a published label names, or None: the model whose name or one of whose
    ``published_names`` is, on letters and digits, a prefix of the label (the longest such
    name wins, so "DSV3 685B w/ MTP" is deepseek-v3 and "Qwen3 30B-A3B" is not qwen3-235b)."""
    key = _label_key(label)
    return next((name for prefix, name in _published_name_index() if key.startswith(prefix)), None) if key else None


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
    return model_from_dict(read_yaml_file(p, field="--model"), origin=str(p))


def load_hardware_file(path: str | Path, overrides: dict[str, Any] | None = None) -> HardwareSpec:
    data = read_yaml_file(path, field="--hardware-file")
    return hardware_from_dict({**data, **(overrides or {})}, origin=str(path))
