"""What ``lcmoe check`` reads from each file ``lcmoe plan --emit`` writes.

* ``plan.json``            → the plan itself (``config_io.plan_json``)
* ``launch.sbatch``        → the ``KEY=VALUE`` overrides of its run_recipe.py command (shell words)
* ``nemo_run_launch.py``   → the ``OVERRIDES`` list literal (read with ``ast``, never executed)
* ``apply_plan.py``        → every ``cfg.<path> = <literal>`` assignment (``torch`` dtypes mapped back)
* ``prediction.json``, ``RUN.md``, the manifest → not configs: refused in one sentence
* anything else            → Megatron-LM arguments, Bridge overrides or YAML (the caller's readers)
"""

from __future__ import annotations

import ast
import json
import shlex
from dataclasses import dataclass, field
from typing import Any

from lcmoe.errors import LcmoeError

CONFIG_FILES = (
    "plan.json, overrides.txt, config.yaml, megatron_lm_args.txt, launch.sbatch, nemo_run_launch.py, apply_plan.py"
)
# apply_plan.py's dtype spellings back to lcmoe's (emit/bridge.py TORCH_DTYPES).
_TORCH_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "uint8": "fp8"}


@dataclass(frozen=True, slots=True)
class EmittedConfig:
    """A file's kind and what it holds: ``plan`` (a plan document) or ``overrides`` (dotted keys)."""

    kind: str
    plan: dict[str, Any] | None = None
    overrides: dict[str, Any] = field(default_factory=dict)


def _refuse(source: str, what: str) -> LcmoeError:
    return LcmoeError(
        "FILE", source, f"is {what}, not a config", f"check one of the files --emit writes: {CONFIG_FILES}"
    )


def read_emitted(source: str, text: str) -> EmittedConfig | None:
    """The emitted file ``text`` (named ``source``) as an EmittedConfig; None when it is none of
    lcmoe's launcher/plan formats (the caller reads it as arguments, overrides or YAML)."""
    stripped = text.lstrip()
    name = source.rsplit("/", 1)[-1]
    if name == ".lcmoe-manifest.json":
        raise _refuse(source, "lcmoe's list of the files it wrote")
    if stripped.startswith("{"):
        return _json_document(source, text)
    if name.endswith(".md") or stripped.startswith("# lcmoe plan"):
        raise _refuse(source, "a Markdown runbook (RUN.md)")
    if stripped.startswith("#!") and "run_recipe.py" in text:
        return EmittedConfig("launch.sbatch", overrides=_sbatch_overrides(source, text))
    if "import nemo_run" in text:
        return EmittedConfig("nemo_run_launch.py", overrides=_nemo_run_overrides(source, text))
    if "recipe_fn()" in text or "ConfigContainer" in text.split("\n", 1)[0]:
        return EmittedConfig("apply_plan.py", overrides=_apply_plan_overrides(source, text))
    return None


def _json_document(source: str, text: str) -> EmittedConfig:
    from lcmoe.safe_io import load_json

    try:
        doc = load_json(text, origin=source)
    except (LcmoeError, ValueError, json.JSONDecodeError):
        raise _refuse(source, "JSON lcmoe cannot read") from None
    if isinstance(doc, dict) and isinstance(doc.get("plans"), list) and isinstance(doc.get("inputs"), dict):
        return EmittedConfig("plan.json", plan=doc)
    if isinstance(doc, dict) and "time" in doc and "memory" in doc:
        raise _refuse(source, "one plan's prediction (prediction.json)")
    raise _refuse(source, "JSON without a plan's 'inputs' and 'plans'")


def _sbatch_overrides(source: str, text: str) -> dict[str, Any]:
    """The ``KEY=VALUE`` words after ``run_recipe.py`` in the sbatch's command (line continuations
    joined, shell quoting undone; ``$VAR`` references are left as text)."""
    from lcmoe.config_io.bridge import parse_override_lines

    joined = text.replace("\\\n", " ")
    line = next((ln for ln in joined.splitlines() if "run_recipe.py" in ln and not ln.lstrip().startswith("#")), "")
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise LcmoeError("FILE", source, f"has a command lcmoe cannot split ({exc})", "re-emit it") from None
    after = words[next(i for i, w in enumerate(words) if w.endswith("run_recipe.py")) + 1 :] if line else []
    return parse_override_lines("\n".join(w for w in after if "=" in w and not w.startswith("-")))


def _assigned(tree: ast.Module, name: str) -> ast.expr | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    return None


def _parse_python(source: str, text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError) as exc:
        raise LcmoeError("FILE", source, f"is not valid Python ({exc.__class__.__name__})", "re-emit it") from None


def _nemo_run_overrides(source: str, text: str) -> dict[str, Any]:
    from lcmoe.config_io.bridge import parse_override_lines

    value = _assigned(_parse_python(source, text), "OVERRIDES")
    try:
        overrides = ast.literal_eval(value) if value is not None else None
    except (ValueError, SyntaxError, RecursionError):
        overrides = None
    if not isinstance(overrides, list) or not all(isinstance(item, str) for item in overrides):
        raise LcmoeError("FILE", source, "has no OVERRIDES list of strings", "re-emit it with lcmoe plan --emit")
    return parse_override_lines("\n".join(overrides))


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "cfg" and parts:
        return ".".join(reversed(parts))
    return None


def _apply_plan_overrides(source: str, text: str) -> dict[str, Any]:
    """``cfg.a.b = value`` assignments: Python literals, or ``torch.<dtype>``."""
    values: dict[str, Any] = {}
    for node in _parse_python(source, text).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        key = _dotted(node.targets[0])
        if key is None:
            continue
        value = node.value
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name) and value.value.id == "torch":
            if value.attr not in _TORCH_DTYPES:
                raise LcmoeError(key, f"torch.{value.attr}", "is not a dtype lcmoe plans", "use torch.float32/bfloat16")
            values[key] = _TORCH_DTYPES[value.attr]
            continue
        try:
            values[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError, RecursionError):
            raise LcmoeError(
                "FILE", source, f"sets {key} to an expression lcmoe cannot read", "use a literal value"
            ) from None
    if not values:
        raise LcmoeError("FILE", source, "sets no cfg field", "re-emit it with lcmoe plan --emit")
    return values
