"""docs/json-schema.md's `keys:` lines match what each command prints with --json."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests import log_fixtures as lf
from tests.conftest import REPO, run_cli

SMALL = ("-m", "qwen3-30b-a3b", "-n", "16", "-s", "16k")


def documented() -> dict[str, tuple[set[str], set[str]]]:
    text = (REPO / "docs" / "json-schema.md").read_text(encoding="utf-8")
    out: dict[str, tuple[set[str], set[str]]] = {}
    for heading, keys in re.findall(r"^## `lcmoe ([^`]+)`.*?\nkeys: ([^\n]+)", text, re.M | re.S):
        names = [k.strip() for k in keys.split(",")]
        out[heading] = (
            {k for k in names if not k.startswith("[")},
            {k.strip("[]") for k in names if k.startswith("[")},
        )
    return out


def _commands(tmp: Path) -> dict[str, list[str]]:
    log = tmp / "run.log"
    log.write_text("\n".join(lf.steady_iterations(20, 1000.0)), encoding="utf-8")
    old = tmp / "old.log"
    old.write_text("\n".join(lf.steady_iterations(20, 900.0)), encoding="utf-8")
    config = tmp / "args.txt"
    config.write_text(
        "--tensor-model-parallel-size 1 --expert-model-parallel-size 8 --seq-length 16384", encoding="utf-8"
    )
    return {
        "models --json": ["models"],
        "hardware --json": ["hardware"],
        "flops --json": ["flops", "-m", "deepseek-v3"],
        "estimate --json": ["estimate", *SMALL, "--ep", "8"],
        "plan --json": ["plan", *SMALL, "--top", "1"],
        "report --json": ["report", *SMALL, "--top", "1", "--sweep", "16k", "--out", str(tmp / "r.html")],
        "sweep --json": ["sweep", "-m", "qwen3-30b-a3b", "-n", "16", "--seq-lens", "4k"],
        "check --json": ["check", str(config), "-m", "qwen3-30b-a3b", "-n", "16"],
        "diagnose LOG --json": ["diagnose", str(log), "--config", str(config), "-m", "qwen3-30b-a3b", "-n", "16"],
        "diagnose NEW --baseline OLD --json": ["diagnose", str(log), "--baseline", str(old)],
        "preflight --json": ["preflight"],
        "calibrate --json": [
            "calibrate",
            str(log),
            "--config",
            str(config),
            "-m",
            "qwen3-30b-a3b",
            "-n",
            "16",
            "--out",
            str(tmp / "c.yaml"),
        ],
    }


def test_every_command_is_documented() -> None:
    from lcmoe.cli import app

    names = {c.name for c in app.registered_commands}
    headings = {h.split()[0] for h in documented()}
    assert names <= headings, names - headings


# The JSON Schema in docs/schema/ each documented command's output must satisfy.
SCHEMAS = {
    "models --json": "models.schema.json",
    "hardware --json": "hardware.schema.json",
    "flops --json": "flops.schema.json",
    "estimate --json": "estimate.schema.json",
    "plan --json": "plan.schema.json",
    "report --json": "plan.schema.json",
    "sweep --json": "sweep.schema.json",
    "check --json": "check.schema.json",
    "diagnose LOG --json": "diagnose.schema.json",
    "diagnose NEW --baseline OLD --json": "regression.schema.json",
    "preflight --json": "preflight.schema.json",
    "calibrate --json": "calibrate.schema.json",
}


def test_every_documented_command_has_a_schema() -> None:
    assert set(SCHEMAS) == set(documented())
    for name in SCHEMAS.values():
        assert (REPO / "docs" / "schema" / name).is_file(), name


@pytest.mark.parametrize("heading", sorted(documented()))
def test_documented_keys_match_output(heading: str, tmp_path: Path) -> None:
    required, optional = documented()[heading]
    code, out, err = run_cli(*_commands(tmp_path)[heading], "--json")
    assert code in (0, 1, 2) and out.strip(), err
    document = json.loads(out)
    # Every document leads with schema_version (the doc's opening paragraph), not on the keys: lines.
    assert next(iter(document)) == "schema_version"
    keys = set(document) - {"schema_version"}
    assert required <= keys, required - keys
    assert keys <= required | optional, keys - required - optional
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((REPO / "docs" / "schema" / SCHEMAS[heading]).read_text(encoding="utf-8"))
    jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)
    document_schema = json.loads((REPO / "docs" / "schema" / "document.schema.json").read_text(encoding="utf-8"))
    jsonschema.validate(document, document_schema, cls=jsonschema.Draft202012Validator)
