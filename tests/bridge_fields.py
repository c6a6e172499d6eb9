"""Dataclass fields of the released Megatron Bridge ``ConfigContainer``, read from the wheels'
source with ``ast`` (megatron-bridge 0.6.2 needs Python ≥ 3.12 to import; reading works anywhere).

``.ci/run`` downloads the wheels into ``.ci-wheels/`` (LCMOE_BRIDGE_WHEELS overrides); tests skip
when they are absent."""

from __future__ import annotations

import ast
import os
import zipfile
from functools import cache
from pathlib import Path

WHEELS = Path(os.environ.get("LCMOE_BRIDGE_WHEELS", Path(__file__).resolve().parent.parent / ".ci-wheels"))

# ConfigContainer section → (module, class) in the bridge wheel.
SECTIONS = {
    "model": ("megatron.bridge.models.gpt_provider", "GPTModelProvider"),
    "train": ("megatron.bridge.training.config", "TrainingConfig"),
    "optimizer": ("megatron.bridge.training.config", "OptimizerConfig"),
    "ddp": ("megatron.bridge.training.config", "DistributedDataParallelConfig"),
    "dataset": ("megatron.bridge.training.config", "GPTDatasetConfig"),
    "comm_overlap": ("megatron.bridge.training.comm_overlap", "CommOverlapConfig"),
    "rng": ("megatron.bridge.training.config", "RNGConfig"),
    "rerun_state_machine": ("megatron.bridge.training.config", "RerunStateMachineConfig"),
    "peft": ("megatron.bridge.peft.lora", "LoRA"),  # what a PEFT recipe's cfg.peft holds under --mode lora
}


def available() -> bool:
    return any(WHEELS.glob("megatron_bridge-*.whl")) and any(WHEELS.glob("megatron_core-*.whl"))


_PACKAGES: set[str] = set()


@cache
def _sources() -> dict[str, ast.Module]:
    modules: dict[str, ast.Module] = {}
    for wheel in sorted(WHEELS.glob("megatron_*.whl")):
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                if name.startswith("megatron/") and name.endswith(".py"):
                    module = name[:-3].replace("/", ".")
                    if module.endswith(".__init__"):
                        module = module.removesuffix(".__init__")
                        _PACKAGES.add(module)
                    try:
                        modules[module] = ast.parse(archive.read(name).decode("utf-8", "replace"))
                    except SyntaxError:
                        continue
    return modules


def _resolve(module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """Find class ``name`` as seen from ``module`` (defined there, or imported, maybe renamed)."""
    tree = _sources().get(module)
    if tree is None or depth > 10:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    base = node.module if node.level == 0 else _relative(module, node.module, node.level)
                    return _resolve(base, alias.name, depth + 1)
    return None


def _relative(module: str, target: str, level: int) -> str:
    """``from .x import y`` inside ``module``: level 1 is the module's package (itself for a package)."""
    parts = module.split(".")
    keep = len(parts) - level + (1 if module in _PACKAGES else 0)
    return ".".join([*parts[:keep], target])


@cache
def fields_of(module: str, name: str) -> dict[str, str]:
    """Annotated fields (name → annotation source) of a class and all its bases."""
    found = _resolve(module, name)
    if found is None:
        return {}
    where, node = found
    out: dict[str, str] = {}
    for base in node.bases:
        base_name = ast.unparse(base).split("[")[0].split(".")[-1]
        out.update(fields_of(where, base_name))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out[stmt.target.id] = ast.unparse(stmt.annotation)
    return out


def container_fields() -> dict[str, str]:
    return fields_of("megatron.bridge.training.config", "ConfigContainer")


def accepts(annotation: str, value: object) -> bool:
    """Coarse type check of a value against a field's annotation text."""
    text = annotation.replace(" ", "")
    if value is None:
        return "Optional" in text or "None" in text or text in ("Any", "object")
    if isinstance(value, bool):
        return "bool" in text or "Any" in text
    if isinstance(value, int):
        return any(t in text for t in ("int", "float", "Any"))
    if isinstance(value, float):
        return any(t in text for t in ("float", "Any"))
    if isinstance(value, str):
        return any(t in text for t in ("str", "Literal", "Any", "dtype", "Enum", "Layout"))
    if isinstance(value, list | tuple):
        return any(t in text for t in ("list", "List", "tuple", "Tuple", "Sequence", "Any"))
    return True
