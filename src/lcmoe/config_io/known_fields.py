"""Every field name Megatron Bridge's ConfigContainer has and every flag Megatron-LM parses, so
``check`` can call a misspelled key an error instead of silently ignoring it.

The names are data (``data/config_fields.yaml``), generated from the released wheels by
``tools/gen_config_fields.py``; its header names the versions. A name is reported with the
closest known spellings (difflib).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

import yaml

RULE = "L-UNKNOWN-FIELD"


@dataclass(frozen=True, slots=True)
class KnownFields:
    megatron_bridge: str
    megatron_core: str
    sections: dict[str, frozenset[str]]
    open_sections: frozenset[str]
    flags: frozenset[str]


@functools.cache
def known_fields() -> KnownFields:
    """The shipped field table (package data, read once)."""
    text = resources.files("lcmoe.data").joinpath("config_fields.yaml").read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    return KnownFields(
        megatron_bridge=str(doc["megatron_bridge"]),
        megatron_core=str(doc["megatron_core"]),
        sections={name: frozenset(fields) for name, fields in doc["bridge_sections"].items()},
        open_sections=frozenset(doc["open_sections"]),
        flags=frozenset(doc["megatron_lm_flags"]),
    )


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f"did you mean {' or '.join(close)}?" if close else "remove it or check the spelling against your release"


def unknown_override_keys(keys: Iterable[str], table: KnownFields | None = None) -> list[dict[str, str]]:
    """A violation dict (rule, message, fix, source) for each ``section.field`` key that Bridge's
    ConfigContainer does not have. Hydra's ``+``/``++``/``~`` prefixes are dropped; keys of an
    open section (``env_vars``), names starting with ``_`` (``_target_``) and levels below the
    field are not checked."""
    table = table or known_fields()
    source = f"megatron-bridge {table.megatron_bridge} ConfigContainer (tools/gen_config_fields.py)"
    out: list[dict[str, str]] = []
    for key in keys:
        parts = key.lstrip("+~").split(".")
        section = parts[0]
        if section.startswith("_") or section in table.open_sections:
            continue
        if section not in table.sections:
            message = f"{key}: ConfigContainer has no section {section!r}"
            out.append({"rule": RULE, "message": message, "fix": _suggest(section, table.sections), "source": source})
            continue
        if len(parts) < 2 or parts[1].startswith("_") or parts[1] in table.sections[section]:
            continue
        message = f"{key}: {section} has no field {parts[1]!r} (it would be ignored or refused at start-up)"
        fix = _suggest(parts[1], table.sections[section])
        out.append({"rule": RULE, "message": message, "fix": fix, "source": source})
    return out


def unknown_flags(tokens: Iterable[str], table: KnownFields | None = None) -> list[dict[str, str]]:
    """A violation dict for each ``--flag`` (``--flag=value`` too) Megatron-LM does not parse."""
    table = table or known_fields()
    source = f"megatron-core {table.megatron_core} megatron/training/arguments.py (tools/gen_config_fields.py)"
    out: list[dict[str, str]] = []
    for token in tokens:
        flag = token.split("=", 1)[0]
        if flag.startswith("--") and len(flag) > 2 and flag not in table.flags:
            message = f"{flag}: Megatron-LM has no such argument (argparse would stop with 'unrecognized arguments')"
            out.append({"rule": RULE, "message": message, "fix": _suggest(flag, table.flags), "source": source})
    return out
