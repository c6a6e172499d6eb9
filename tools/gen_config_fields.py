"""Write ``src/lcmoe/data/config_fields.yaml``: every field ``lcmoe check`` accepts, read from the
released packages (no import: ``ast`` over the wheels' source).

* Megatron Bridge ``ConfigContainer`` sections → the dataclass fields of every class a section can
  hold (``model``: every model provider / config class of ``megatron.bridge.models``; ``dataset``:
  each dataset config of the annotation; ``peft``: PEFT, LoRA and DoRA), bases included.
* Megatron-LM's command-line flags: every option string of ``add_argument`` in
  ``megatron/training/arguments.py`` (shipped in the megatron-core wheel).

    python tools/gen_config_fields.py [--wheels DIR]     # default .ci-wheels/ (see .ci/run)
"""

from __future__ import annotations

import argparse
import ast
import os
import sys
import warnings
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
OUT = REPO / "src" / "lcmoe" / "data" / "config_fields.yaml"

# Sections whose keys are free (a mapping, not a dataclass).
OPEN_SECTIONS = ("env_vars",)
EXTRA_CLASSES = {
    "peft": [
        ("megatron.bridge.peft.base", "PEFT"),
        ("megatron.bridge.peft.lora", "LoRA"),
        ("megatron.bridge.peft.dora", "DoRA"),
    ],
    "mixed_precision": [("megatron.bridge.training.mixed_precision", "MixedPrecisionConfig")],
}


def _version(wheels: Path, name: str) -> str:
    wheel = next(wheels.glob(f"{name}-*.whl"))
    return wheel.name.split("-")[1]


def section_fields() -> dict[str, list[str]]:
    from tests import bridge_fields as bf

    sources = bf._sources()
    out: dict[str, list[str]] = {}
    for section, annotation in bf.container_fields().items():
        if section.startswith("_") or section in OPEN_SECTIONS:
            continue
        names = {
            n
            for n in ast.unparse(ast.parse(annotation, mode="eval"))
            .replace("Optional[", "")
            .replace("Union[", "")
            .replace("]", "")
            .replace("|", ",")
            .split(",")
        }
        names = {n.strip() for n in names if n.strip() not in ("None", "str", "")}
        fields: set[str] = set()
        for cls in names:
            fields |= set(bf.fields_of("megatron.bridge.training.config", cls))
        for module, cls in EXTRA_CLASSES.get(section, []):
            fields |= set(bf.fields_of(module, cls))
        if section == "model":  # every provider / config class a recipe may put there
            for module, tree in sources.items():
                if not module.startswith("megatron.bridge.models"):
                    continue
                for node in tree.body:
                    if isinstance(node, ast.ClassDef) and node.name.endswith(
                        ("ModelProvider", "Provider", "ModelConfig")
                    ):
                        fields |= set(bf.fields_of(module, node.name))
        if fields:
            out[section] = sorted(fields)
    return out


def megatron_lm_flags(wheels: Path) -> list[str]:
    """Megatron-LM's flags: the option strings ``add_argument`` spells out in arguments.py, and the
    ones ``ArgumentGroupFactory(Config)`` derives from a config dataclass (argument_utils.py:
    ``--field-name``, plus ``--no-…``/``--disable-…`` for a boolean defaulting to True; every
    boolean gets all three here, and excludes are ignored: the set errs on accepting). Option
    strings written as ``arg_names`` metadata anywhere in megatron/ are included too."""
    from tests import bridge_fields as bf

    wheel = next(wheels.glob("megatron_core-*.whl"))
    flags: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if name.startswith("megatron/") and name.endswith(".py"):
                with warnings.catch_warnings():  # invalid escapes in the wheels' own source
                    warnings.simplefilter("ignore")
                    tree = ast.parse(archive.read(name).decode("utf-8", "replace"))
                flags |= {
                    node.value
                    for node in ast.walk(tree)
                    if isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and node.value.startswith("--")
                    and node.value[2:3].isalpha()
                    and " " not in node.value
                    and "=" not in node.value
                }
        tree = ast.parse(archive.read("megatron/training/arguments.py").decode("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ArgumentGroupFactory" and node.args:
            cls = ast.unparse(node.args[0]).split(".")[-1]
            for field, annotation in bf.fields_of("megatron.training.arguments", cls).items():
                flag = "--" + field.replace("_", "-")
                flags.add(flag)
                if "bool" in annotation:
                    flags |= {"--no-" + flag[2:], "--disable-" + flag[2:]}
    return sorted(flags)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, default=Path(os.environ.get("LCMOE_BRIDGE_WHEELS", REPO / ".ci-wheels")))
    args = parser.parse_args()
    os.environ["LCMOE_BRIDGE_WHEELS"] = str(args.wheels)
    import yaml

    sections = section_fields()
    flags = megatron_lm_flags(args.wheels)
    doc = {
        "generated_by": "tools/gen_config_fields.py",
        "megatron_bridge": _version(args.wheels, "megatron_bridge"),
        "megatron_core": _version(args.wheels, "megatron_core"),
        "open_sections": list(OPEN_SECTIONS),
        "bridge_sections": sections,
        "megatron_lm_flags": flags,
    }
    header = "# Written by tools/gen_config_fields.py from the released wheels; do not edit by hand.\n"
    OUT.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=120), encoding="utf-8")
    print(
        f"wrote {OUT}: {len(sections)} Bridge sections, {sum(map(len, sections.values()))} fields, {len(flags)} flags"
    )


if __name__ == "__main__":
    main()
