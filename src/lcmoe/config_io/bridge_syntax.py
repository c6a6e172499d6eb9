"""Bridge ``KEY=VALUE`` override text: Hydra's spelling of values, written and read back, and
nested YAML flattened to the same dotted keys."""

from __future__ import annotations

from typing import Any

from lcmoe.errors import LcmoeError


def override_key(key: str) -> str:
    """A ``KEY=VALUE`` override's spelling: ``cfg.peft`` is declared as the PEFT base class, so
    Hydra's struct mode knows none of LoRA's fields and they must be appended (``+peft.dim=…``;
    megatron-bridge 0.6.2 refuses ``peft.dim=…`` and ``++``, tests/test_bridge_runtime.py)."""
    return "+" + key if key.startswith("peft.") else key


def format_override_value(value: Any) -> str:
    """Hydra/OmegaConf spelling: null, true/false, [a,b] lists, {k:v,…} dictionaries, plain numbers
    and strings."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{format_override_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    """Nested YAML mapping → dotted keys (``model: {tensor_model_parallel_size: 2}`` →
    ``model.tensor_model_parallel_size``)."""
    if not isinstance(data, dict):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and not str(key).startswith("_"):
            out.update(flatten(value, path))
        else:
            out[path] = value
    return out


def parse_override_lines(text: str) -> dict[str, Any]:
    """``KEY=VALUE`` lines (``overrides.txt``, ``#`` comments) as Hydra reads their values, the
    inverse of ``format_override_value``: YAML scalars and lists, and ``{k:v,…}`` dictionaries,
    which YAML would read as keys "k:v" without values. A leading ``+`` (append) is dropped; a
    value YAML cannot read stays text. At most MAX_OVERRIDE_LINES lines of at most
    MAX_OVERRIDE_CHARS characters each (bounded work, issue #31)."""
    values: dict[str, Any] = {}
    count = 0
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        count += 1
        if count > MAX_OVERRIDE_LINES:
            raise LcmoeError(
                "overrides",
                f"{count:,}+ lines",
                f"are more than {MAX_OVERRIDE_LINES:,}",
                "pass the run's overrides only",
            )
        key, _, raw = line.partition("=")
        key, raw = key.strip().lstrip("+"), raw.strip()
        if len(raw) > MAX_OVERRIDE_CHARS:
            raise LcmoeError(key, raw, f"is longer than {MAX_OVERRIDE_CHARS:,} characters", "check the value")
        if raw.startswith("{"):
            values[key] = parse_fields(raw)
            continue
        values[key] = _override_scalar(raw, key) if raw else None
    return values


# A Bridge config has ~1,500 fields and its longest value (a pipeline layout of 128 stages)
# is < 2,000 characters: these bounds are ~10× that.
MAX_OVERRIDE_LINES = 20_000
MAX_OVERRIDE_CHARS = 20_000


def _override_scalar(raw: str, key: str) -> Any:
    """One override value read as YAML (bounded: safe_io.load_yaml); text when YAML cannot read
    it, but a number too long for any field is refused outright."""
    from lcmoe.safe_io import check_int_literals, load_yaml

    check_int_literals(raw, origin=key)
    try:
        return load_yaml(raw, origin=key)
    except LcmoeError:
        return raw


def parse_fields(text: str) -> dict[str, Any]:
    """Hydra's ``{k:v,…}`` (flat, as ``format_override_value`` writes it) as a dict."""
    from lcmoe.safe_io import load_yaml

    out: dict[str, Any] = {}
    for item in text.strip().strip("{}").split(","):
        key, sep, raw = item.partition(":")
        if not sep:
            raise LcmoeError(
                "mixed_precision", text, "is not a {key:value,…} mapping", "write mixed_precision={fp8:hybrid,…}"
            )
        out[key.strip()] = load_yaml(raw.strip(), origin=f"mixed_precision.{key.strip()}") if raw.strip() else None
    return out
