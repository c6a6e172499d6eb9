"""Shared CLI plumbing: consoles, JSON output, resolving --model / --gpu, and the one abort path.

Data (tables, JSON) goes to stdout; messages go to stderr.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn

import typer
from rich.console import Console
from rich.errors import MarkupError
from rich.markup import escape
from rich.text import Text

from lcmoe.errors import LcmoeError
from lcmoe.i18n import Hanging
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec

# Off a terminal (a file, CI logs) rich would assume 80 columns and wrap every table: 200 unless
# COLUMNS says otherwise (``COLUMNS=80 lcmoe plan … > plan.txt`` gets the narrow layout). Piped
# into a pager or ``head`` on a terminal (stderr still on it), the terminal's own width.
PIPED_WIDTH = 200
SCHEMA_VERSION = "2"


def _stderr_terminal_columns() -> int | None:
    """The width of the terminal stderr is on, or None when it is not on one."""
    try:
        return os.get_terminal_size(2).columns if sys.stderr is not None and sys.stderr.isatty() else None
    except (OSError, ValueError):
        return None


def output_width(
    environ: Mapping[str, str] | None = None,
    *,
    is_tty: bool | None = None,
    terminal_columns: int | Literal["ask"] | None = "ask",
) -> int | None:
    """The width of stdout's console: COLUMNS when set to a positive whole number; otherwise the
    terminal's own (None: rich asks it); off a terminal, the width of the terminal stderr is on
    (``lcmoe plan | less``; ``terminal_columns``, "ask": find out), else PIPED_WIDTH."""
    columns = (os.environ if environ is None else environ).get("COLUMNS", "").strip()
    if columns.isdigit() and len(columns) <= 5 and int(columns) > 0:
        return int(columns)
    if is_tty is None:
        is_tty = sys.stdout is not None and sys.stdout.isatty()
    if is_tty:
        return None
    if terminal_columns == "ask":
        terminal_columns = _stderr_terminal_columns()
    return terminal_columns if terminal_columns and terminal_columns > 0 else PIPED_WIDTH


class _Console(Console):
    """A Console that never fails on markup: a user string holding ``[/bold]`` (a log line, a
    model name) that reached a markup string unescaped is printed as plain text instead of
    raising MarkupError (issue #31: no input ends in a traceback), wherever rich renders it.
    Call sites escape user text with ``rich.markup.escape``; this is the safety net."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        """As rich prints, except that one indented line of text ("  [LC-CP] …", "    fits …")
        wraps under its own indent (a hanging indent) instead of at the left edge."""
        soft_wrap = kwargs.get("soft_wrap")
        if (
            len(objects) == 1
            and isinstance(objects[0], str)
            and not (self.soft_wrap if soft_wrap is None else soft_wrap)
        ):
            text = objects[0]
            body = text.lstrip(" ")
            indent = len(text) - len(body)
            if indent and body and "\n" not in text:
                keys = ("markup", "highlight", "emoji")
                rendered = self.render_str(body, **{k: kwargs[k] for k in keys if k in kwargs})
                objects = (Hanging(rendered, indent),)
        super().print(*objects, **kwargs)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        # Every string rich renders (print arguments, table titles and cells) passes here.
        try:
            return super().render_str(text, **kwargs)
        except MarkupError:
            return super().render_str(text, **{**kwargs, "markup": False})


# Sentences wrap between words at the width (a line the terminal breaks would cut a word, and a
# COLUMNS=80 pipe would get 300-column lines); a --quiet line for scripts passes soft_wrap=True.
stdout = _Console(soft_wrap=False, width=output_width())
stderr = _Console(stderr=True, soft_wrap=True)

EXIT_OK, EXIT_FINDINGS, EXIT_BAD_INPUT = 0, 1, 2
JSON = typer.Option(False, "--json", help="print JSON (docs/json-schema.md; JSON Schema in docs/schema/)")
QUIET = typer.Option(False, "--quiet", "-q", help="one short line for scripts")


def abort(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    stderr.print(f"[bold red]error:[/] {escape(message)}", highlight=False, markup=True)
    raise typer.Exit(code)


def _json_default(value: object) -> object:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, set | tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _finite(value: Any) -> Any:
    """Replace non-finite floats by None so the output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def print_json(payload: Any) -> None:
    """One strict-JSON document on stdout; a mapping starts with ``schema_version`` (the version
    of the documents' shapes, docs/schema/; lcmoe_version is the program's)."""
    if isinstance(payload, dict):
        payload = {"schema_version": SCHEMA_VERSION, **{k: v for k, v in payload.items() if k != "schema_version"}}
    text = json.dumps(_finite(payload), indent=2, default=_json_default, allow_nan=False)
    typer.echo(text)


def resolve_model(name_or_path: str) -> ModelSpec:
    """A catalog name, an lcmoe model YAML, or a Hugging Face config.json / model directory."""
    from lcmoe.catalog import load_model, load_model_file

    path = Path(name_or_path)
    looks_like_path = name_or_path.endswith((".json", ".yaml", ".yml")) or "/" in name_or_path
    if looks_like_path:
        if not path.exists():
            raise LcmoeError(
                "--model",
                name_or_path,
                "is neither a catalog model nor an existing file",
                "run `lcmoe models` for the catalog",
            )
        return load_model_file(path)
    return load_model(name_or_path)


def parse_overrides(pairs: list[str], *, option: str) -> dict[str, Any]:
    """``field=value`` pairs; values are parsed as YAML scalars (numbers, booleans, strings)."""
    from lcmoe.safe_io import check_int_literals, load_yaml

    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise LcmoeError(option, pair, "must be FIELD=VALUE", f"e.g. {option} gpus_per_node=4")
        check_int_literals(raw, origin=f"{option} {key.strip()}")
        try:
            result[key.strip()] = load_yaml(raw, origin=option)
        except LcmoeError:
            raise LcmoeError(option, pair, "has a value that is not a number, boolean or string", "quote it") from None
    return result


def resolve_hardware(
    gpu: str,
    *,
    hardware_file: Path | None = None,
    overrides: list[str] | None = None,
    scaleout_gbps: float | None = None,
    gpus_per_node: int | None = None,
) -> HardwareSpec:
    """A catalog GPU or a user YAML, with single fields overridden from the command line."""
    from lcmoe.catalog import load_hardware, load_hardware_file

    extra = parse_overrides(overrides or [], option="--hw")
    if scaleout_gbps is not None:
        if not (math.isfinite(scaleout_gbps) and scaleout_gbps > 0):
            raise LcmoeError("--scaleout-gbps", scaleout_gbps, "must be a positive number of Gb/s", "e.g. 400")
        extra["scaleout_bandwidth"] = scaleout_gbps * 1e9 / 8
    if gpus_per_node is not None:
        extra["gpus_per_node"] = gpus_per_node
    if hardware_file is not None:
        return load_hardware_file(hardware_file, extra)
    return load_hardware(gpu, extra)
