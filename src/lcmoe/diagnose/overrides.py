"""Overrides a recipe silently re-set (issue #35 item 7, rule DG-OVERRIDE-RESET): the KEY=VALUE
overrides a user meant to run with, against the resolved config Bridge saved at start-up
(``logger.save_config_filepath``; Bridge ``training/setup.py:797-800`` writes ``cfg.to_yaml`` after
the recipe, the overrides and ``finalize``/``validate`` have run).

Bridge can change a field after the user's override without failing: ``apply_flex_dispatcher_backend``
replaces ``deepep`` by ``alltoall`` on GPUs off its allow-list and forces
``moe_shared_expert_overlap=False`` whenever it applies a flex backend; post-init defaults used to be
computed before overrides were applied; and a launcher can drop overrides it does not parse. The
saved YAML is the only record of what ran, so each intended key is compared with it.

The saved YAML writes enums and torch dtypes as objects (Megatron-LM
``megatron/training/config/yaml_utils.py``: ``{_target_, _call_, _args_, _name_}`` and
``{_target_: torch.bfloat16, _call_: false}``); they compare equal to their name, value or dtype."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RULE = "DG-OVERRIDE-RESET"
GH = "https://github.com/"
BRIDGE = "NVIDIA-NeMo/Megatron-Bridge@067f987:"
SOURCES = (
    GH + "NVIDIA-NeMo/Megatron-Bridge/pull/627",
    GH + "NVIDIA-NeMo/Megatron-Bridge/pull/2957",
    BRIDGE + "src/megatron/bridge/training/setup.py:800",
)
# Fields Bridge itself is known to re-set, with the line that does it and the public report.
KNOWN_RESETTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "model.moe_token_dispatcher_type": (
        "apply_flex_dispatcher_backend falls back to alltoall on a GPU off the DeepEP/HybridEP allow-list "
        "(GB200/GB300 for DeepEP), with a rank-0 warning only",
        (
            GH + "NVIDIA-NeMo/Megatron-Bridge/issues/5992",
            BRIDGE + "src/megatron/bridge/training/flex_dispatcher_backend.py:29",
        ),
    ),
    "model.moe_flex_dispatcher_backend": (
        "apply_flex_dispatcher_backend clears the backend when it falls back to alltoall",
        (
            GH + "NVIDIA-NeMo/Megatron-Bridge/issues/5992",
            BRIDGE + "src/megatron/bridge/training/flex_dispatcher_backend.py:30",
        ),
    ),
    "model.moe_shared_expert_overlap": (
        "apply_flex_dispatcher_backend sets moe_shared_expert_overlap=False whenever it applies DeepEP or HybridEP",
        (BRIDGE + "src/megatron/bridge/training/flex_dispatcher_backend.py:85",),
    ),
    "model.microbatch_group_size_per_vp_stage": (
        "a default computed in __post_init__ before the override kept its first value",
        (GH + "NVIDIA-NeMo/Megatron-Bridge/pull/627",),
    ),
}
# Fields a newer Megatron-Core saves under another name: Megatron-Core 0.19 moves
# cuda_graph_scope to cuda_graph_modules.
ALIASES: dict[str, str] = {"model.cuda_graph_scope": "model.cuda_graph_modules"}
_NULLS = frozenset({"none", "null", "~", ""})
_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}


@dataclass(frozen=True, slots=True)
class OverrideCheck:
    """One intended override and what the saved config holds for it."""

    key: str
    intended: Any
    saved: Any
    status: str  # "reset" | "missing" | "not comparable"
    why: str
    sources: tuple[str, ...]

    def as_dict(self) -> dict[str, object]:
        return {
            "rule": RULE,
            "key": self.key,
            "status": self.status,
            "intended": _show(self.intended),
            "saved": _show(self.saved),
            "why": self.why,
            "sources": list(self.sources),
        }


def resolved_fields(data: Any, prefix: str = "") -> dict[str, Any]:
    """The saved YAML as dotted keys; an object written as ``{_target_: …}`` (an enum, a dtype, a
    class) is one value, not a subtree."""
    if not isinstance(data, dict) or (prefix and "_target_" in data and _is_value_object(data)):
        return {prefix: data} if prefix else {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and not (("_target_" in value) and _is_value_object(value)):
            out.update(resolved_fields(value, path))
        else:
            out[path] = value
    return out


def _is_value_object(node: Mapping[Any, Any]) -> bool:
    """An enum or dtype written by Megatron's YAML representers (not a config object with fields)."""
    return set(map(str, node)) <= {"_target_", "_call_", "_args_", "_name_"}


def _forms(value: Any) -> set[str]:
    """The spellings a saved or intended scalar may take: an enum's name and value, a dtype with
    and without ``torch.``, a number as a float, text without case."""
    if isinstance(value, dict) and "_target_" in value:
        forms = set()
        if "_name_" in value:
            forms |= _forms(value["_name_"])
        args = value.get("_args_")
        if isinstance(args, list) and len(args) == 1:
            forms |= _forms(args[0])
        if not value.get("_call_", True) or not forms:
            target = str(value["_target_"])
            forms |= {target.lower(), target.rsplit(".", 1)[-1].lower()}
        return forms
    if value is None:
        return {"none"}
    if isinstance(value, bool):
        return {str(value).lower()}
    text = str(value).strip()
    lowered = text.lower()
    if lowered in _NULLS:
        return {"none"}
    try:
        number = float(text)
    except ValueError:
        tail = lowered.rsplit(".", 1)[-1]  # torch.bfloat16, CudaGraphScope.attn
        return {lowered, tail, _DTYPES.get(tail, tail)}
    return {lowered, repr(number)} if math.isfinite(number) else {lowered}


def same_value(intended: Any, saved: Any) -> bool:
    """Whether the saved value is the intended one: scalars by their spellings (``_forms``), lists
    element by element (flat lists of names in any order: module and scope lists are sets)."""
    if isinstance(intended, (list, tuple)) or isinstance(saved, (list, tuple)):
        if not isinstance(intended, (list, tuple)) or not isinstance(saved, (list, tuple)):
            return False
        if len(intended) != len(saved):
            return False
        if all(same_value(a, b) for a, b in zip(intended, saved, strict=True)):
            return True
        flat = all(not isinstance(v, (list, tuple)) for v in (*intended, *saved))
        return flat and all(any(same_value(a, b) for b in saved) for a in intended)
    return bool(_forms(intended) & _forms(saved))


def _show(value: Any) -> Any:
    if isinstance(value, dict) and "_target_" in value:
        return value.get("_name_", value["_target_"])
    if isinstance(value, (list, tuple)):
        return [_show(v) for v in value]
    return value


def _expand(intended: Mapping[str, Any]) -> dict[str, Any]:
    """A dict-valued override (``mixed_precision={grad_reduce_in_fp32:false}``) is one check per field."""
    out: dict[str, Any] = {}
    for key, value in intended.items():
        key = key.lstrip("+")
        if isinstance(value, dict):
            out.update(_expand({f"{key}.{k}": v for k, v in value.items()}))
        else:
            out[key] = value
    return out


def check_intended(intended: Mapping[str, Any], saved: Mapping[str, Any]) -> list[OverrideCheck]:
    """Each intended override the saved config does not hold: ``reset`` (another value),
    ``missing`` (no such field: misspelled, or dropped before it reached the config) and
    ``not comparable`` (a name the config expanded into an object, e.g. a precision recipe name)."""
    fields = resolved_fields(dict(saved))
    out = []
    for key, value in _expand(intended).items():
        where = key if key in fields else ALIASES.get(key, key)
        if where in fields:
            if same_value(value, fields[where]):
                continue
            why, sources = KNOWN_RESETTERS.get(
                key, ("the recipe, Bridge's finalize/validation or the launcher set it after the override", SOURCES)
            )
            out.append(OverrideCheck(key, value, fields[where], "reset", why, sources))
        elif any(name.startswith(key + ".") for name in fields):
            out.append(
                OverrideCheck(
                    key,
                    value,
                    None,
                    "not comparable",
                    "the saved config holds an object here (the override named a preset); compare its fields",
                    SOURCES,
                )
            )
        else:
            out.append(
                OverrideCheck(
                    key,
                    value,
                    None,
                    "missing",
                    "the saved config has no such field: the key is misspelled or the launcher dropped it",
                    (GH + "NVIDIA-NeMo/Megatron-Bridge/pull/2957",),
                )
            )
    return out
