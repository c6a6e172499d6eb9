"""`lcmoe check FILE|-`: legality, memory verdict, time estimate and every LC-* rule for an
existing config — Megatron-LM arguments, Bridge KEY=VALUE overrides, or a Bridge YAML dump.
A file inside a directory written by ``lcmoe plan --emit`` (or its ``fallback/``) takes the model,
GPU and GPU count from that directory's ``plan.json`` unless the options give them.

Exit codes: 0 clean, 1 warnings (including OOM risk), 2 errors (illegal or unreadable)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.markup import escape

from lcmoe.cli import run_options as ro
from lcmoe.cli.common import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, JSON, print_json, resolve_hardware, stdout
from lcmoe.errors import LcmoeError
from lcmoe.specs.model import ModelSpec
from lcmoe.units import whole_number

if TYPE_CHECKING:
    from lcmoe.run import RunConfig
    from lcmoe.specs.doc_lengths import DocLengths
    from lcmoe.specs.hardware import HardwareSpec

MAX_INPUT_BYTES = 16 * 1024 * 1024


def read_input(source: str) -> str:
    """The config text: standard input (``-``) or a regular file (never a FIFO or a device such
    as /dev/zero), at most 16 MiB either way; undecodable bytes become U+FFFD."""
    from lcmoe.safe_io import read_text_capped

    if source == "-":
        try:
            text = sys.stdin.read(MAX_INPUT_BYTES + 1)
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.__class__.__name__
            raise LcmoeError("FILE", "-", f"cannot be read ({reason})", "pipe the config as UTF-8 text") from None
    else:
        text = read_text_capped(source, field="FILE", max_bytes=MAX_INPUT_BYTES, errors="replace")
    if len(text) > MAX_INPUT_BYTES:
        raise LcmoeError("FILE", source, "is larger than 16 MiB", "pass the config, not a log")
    return text


def emitted_plan_inputs(source: str) -> dict[str, Any]:
    """The ``inputs`` of the plan.json next to (or one level above) an emitted file; {} if none."""
    from lcmoe.config_io.plan_json import read_plan

    if source == "-":
        return {}
    here = Path(source).resolve().parent
    for folder in (here, here.parent):
        if (folder / "plan.json").is_file():
            try:
                return dict(read_plan(folder)["inputs"])
            except LcmoeError:  # not lcmoe's plan.json: the options must say it
                continue
    return {}


def detect_format(text: str) -> str:
    stripped = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if any(tok.startswith("--") for line in stripped for tok in line.split()):
        return "megatron-args"
    if stripped and all("=" in line and ":" not in line.split("=", 1)[0] for line in stripped):
        return "overrides"
    return "yaml"


def parse_run(
    text: str,
    *,
    model: str | ModelSpec | None,
    gpu: str,
    gpus: int,
    seq_len: str | None,
    hardware: HardwareSpec,
    source: str = "-",
    doc_lengths: str | None = None,
) -> tuple[str, RunConfig | None, list[dict[str, Any]]]:
    """The run a config describes: (format, run, unknown keys or flags). Unknown flags stop the
    parse (run None); ``gpu`` is unused (the hardware is resolved) and kept for the callers."""
    from lcmoe.cli.common import resolve_model
    from lcmoe.config_io.bridge import flatten, parse_override_lines, run_from_overrides
    from lcmoe.config_io.emitted import read_emitted
    from lcmoe.config_io.known_fields import unknown_override_keys
    from lcmoe.specs.doc_lengths import load_doc_lengths
    from lcmoe.units import parse_token_count

    docs = load_doc_lengths(doc_lengths) if doc_lengths else None
    emitted = read_emitted(source, text)
    if emitted is not None and emitted.plan is not None:
        from dataclasses import replace

        from lcmoe.config_io.plan_json import run_from_plan

        run = run_from_plan(emitted.plan, hardware=hardware)
        if docs is not None:  # --doc-lengths replaces the plan's documents
            run = replace(run, options=replace(run.options, doc_lengths=docs))
        return emitted.kind, run, []
    fmt = emitted.kind if emitted is not None else detect_format(text)
    if fmt == "megatron-args":
        return _megatron_args_run(text, model=model, gpus=gpus, hardware=hardware, docs=docs, source=source)
    if model is None:
        raise LcmoeError(
            "--model", None, "is needed for Bridge overrides/YAML (the recipe's model)", "e.g. --model deepseek-v3"
        )
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    if emitted is not None:
        values = emitted.overrides
    elif fmt == "overrides":
        values = parse_override_lines(text)
    else:
        from lcmoe.catalog import read_yaml_text

        values = flatten(read_yaml_text(text, origin="config YAML"))
    unknown = unknown_override_keys(values)
    seq = parse_token_count(seq_len) if seq_len else None
    run = run_from_overrides(values, model=spec, hardware=hardware, num_gpus=gpus, seq_len=seq, doc_lengths=docs)
    return fmt, _planned_documents(run, source), unknown


def _megatron_args_run(
    text: str,
    *,
    model: str | ModelSpec | None,
    gpus: int,
    hardware: HardwareSpec,
    docs: DocLengths | None,
    source: str,
) -> tuple[str, RunConfig | None, list[dict[str, Any]]]:
    """``parse_run`` of Megatron-LM arguments: the architecture from ``model`` when given, else
    from the arguments themselves."""
    from lcmoe.cli.common import resolve_model
    from lcmoe.config_io.known_fields import unknown_flags
    from lcmoe.config_io.megatron_args import layout_from_args, options_from_args, parse_megatron_args, tokenize_args
    from lcmoe.run import RunConfig

    fmt = "megatron-args"
    unknown = unknown_flags("--" + name for name in tokenize_args(text))
    if unknown:  # a misspelled flag would stop Megatron-LM at start-up: report it, read nothing more
        return fmt, None, unknown
    if model is None:
        parsed = parse_megatron_args(text, world_size=gpus)
        options = options_from_args(parsed.args, doc_lengths=docs) if docs is not None else parsed.options
        return fmt, _planned_documents(RunConfig(parsed.model, hardware, parsed.layout, options), source), []
    # The architecture comes from --model; the arguments give layout and options only.
    spec = model if isinstance(model, ModelSpec) else resolve_model(model)
    args = tokenize_args(text)
    layout = layout_from_args(args, world_size=gpus, num_layers=spec.num_layers)
    run = RunConfig(spec, hardware, layout, options_from_args(args, doc_lengths=docs))
    return fmt, _planned_documents(run, source), []


def _planned_documents(run: RunConfig, source: str) -> RunConfig:
    """A packing config read without --doc-lengths: the documents of the plan.json beside it,
    when there is one, instead of ``unknown_lengths``."""
    from dataclasses import replace

    from lcmoe.config_io.plan_json import plan_doc_lengths
    from lcmoe.specs.doc_lengths import UNKNOWN

    if run.options.doc_lengths is None or run.options.doc_lengths.name != UNKNOWN:
        return run
    planned = plan_doc_lengths(emitted_plan_inputs(source).get("doc_lengths"))
    return replace(run, options=replace(run.options, doc_lengths=planned)) if planned is not None else run


def check(
    source: str = typer.Argument(..., help="config file, or - for standard input"),
    model: str | None = typer.Option(None, "--model", "-m", help="model (needed for Bridge overrides/YAML)"),
    gpu: str | None = typer.Option(None, "--gpu", "-g", help="catalog GPU (default: the plan.json's, else h100)"),
    gpus: int | None = typer.Option(
        None, "--gpus", "-n", help="total GPUs (default: the plan.json's)", callback=ro.check_gpus
    ),
    seq_len: str = typer.Option(None, "--seq-len", "-s", help="if the config does not set it"),
    doc_lengths: str = typer.Option(
        None,
        "--doc-lengths",
        metavar="PRESET|FILE",
        help="the documents a packing config (dataset.inter_document_masking, "
        "--dataloader-inter-document-masking) packs; default: the plan.json's, else one seq_len document per pack",
    ),
    megatron_core_version: str = typer.Option("0.19.2", "--megatron-core-version"),
    hardware_file: Path = ro.HW_FILE,
    hw: list[str] = ro.HW_SET,
    calibration: Path = ro.CALIBRATION,
    intended: Path | None = typer.Option(
        None,
        "--intended",
        help="KEY=VALUE overrides you meant to run with; FILE is the YAML Bridge saved at start-up "
        "(logger.save_config_filepath): report each override it does not hold [DG-OVERRIDE-RESET]",
    ),
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="one verdict line"),
) -> None:
    """Check an existing config: legality with fixes, the memory verdict, the time estimate and the LC-* rules."""
    spec_model, gpu_name, world, hardware = _check_inputs(source, model, gpu, gpus, hardware_file, hw)
    text = read_input(source)
    fmt, run, unknown = parse_run(
        text,
        model=spec_model,
        gpu=gpu_name,
        gpus=world,
        seq_len=seq_len,
        hardware=hardware,
        source=source,
        doc_lengths=doc_lengths,
    )
    not_held = _intended_overrides(intended, text, fmt) if intended is not None else None
    result = _findings(run, unknown, fmt, not_held, megatron_core_version, calibration)
    if json_output:
        print_json(result)
    elif quiet:
        _print_quiet(result)
    else:
        _render(result)
    raise typer.Exit(result["exit_code"])


def _check_inputs(
    source: str, model: str | None, gpu: str | None, gpus: int | None, hardware_file: Path | None, hw: list[str]
) -> tuple[str | ModelSpec | None, str, int, HardwareSpec]:
    """Model, GPU name, GPU count and hardware: the options, else the plan.json beside the file."""
    from lcmoe.config_io.plan_json import plan_specs

    planned = emitted_plan_inputs(source)
    spec_model: str | ModelSpec | None = model
    if model is None and planned.get("model") is not None:
        spec_model = plan_specs(planned)[0] if isinstance(planned.get("model_spec"), dict) else str(planned["model"])
    gpu_name = str(gpu or planned.get("gpu") or "h100")
    world = gpus
    if world is None and planned.get("num_gpus") is not None:
        world = ro.check_gpus(whole_number(planned["num_gpus"], field="plan.json num_gpus"))
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        raise LcmoeError("--gpus", world, "is needed (no plan.json next to the file says it)", "e.g. --gpus 256")
    planned_hardware = plan_specs(planned)[1] if isinstance(planned.get("hardware_spec"), dict) else None
    if planned_hardware is not None and gpu is None and hardware_file is None and not hw:
        return spec_model, gpu_name, world, planned_hardware
    return spec_model, gpu_name, world, resolve_hardware(gpu_name, hardware_file=hardware_file, overrides=hw)


def _findings(
    run: RunConfig | None,
    unknown: list[dict[str, Any]],
    fmt: str,
    intended: list[dict[str, object]] | None,
    mcore: str,
    calibration: Path | None,
) -> dict[str, Any]:
    """The check's JSON document: legality errors, advice, the --intended overrides not held, the
    estimate when legal, and the exit code."""
    from lcmoe.estimate.report import estimate_run
    from lcmoe.rules.advice import advise
    from lcmoe.rules.legality import violations

    errors = unknown + ([v.as_dict() for v in violations(run, megatron_core_version=mcore)] if run else [])
    advice = [a.as_dict() for a in advise(run)] if run else []
    result: dict[str, Any] = {"format": fmt, "errors": errors, "advice": advice}
    if intended is not None:
        result["intended"] = intended
    if not errors and run is not None:
        result.update(estimate_run(run, ro.time_coefficients(calibration, run.hardware)))
    return _with_exit_code(result)


def _warnings(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in result["advice"] if a["severity"] in ("warn", "error")]


def _with_exit_code(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with its ``exit_code`` (last key): 2 for errors or a predicted OOM (the run would
    not start; exit 2 gates a CI job), 1 for warnings or intended overrides not held, else 0."""
    if result["errors"] or not result["memory"]["fits"]:
        code = EXIT_BAD_INPUT
    elif _warnings(result) or result.get("intended"):
        code = EXIT_FINDINGS
    else:
        code = EXIT_OK
    return {**result, "exit_code": code}


def _print_quiet(result: dict[str, Any]) -> None:
    errors, memory = result["errors"], result.get("memory", {})
    fits = "" if errors else ("OOM" if not memory["fits"] else "fits, at risk" if memory["oom_risk"] else "fits")
    lost = f", {len(result['intended'])} intended overrides not held" if result.get("intended") else ""
    stdout.print(
        f"{len(errors)} errors, {len(_warnings(result))} warnings {fits}".strip() + lost,
        highlight=False,
        soft_wrap=True,
    )


def _intended_overrides(path: Path, saved_text: str, fmt: str) -> list[dict[str, object]]:
    """``--intended``: each override in ``path`` that the saved resolved config does not hold."""
    from lcmoe.catalog import read_yaml_text
    from lcmoe.config_io.bridge import parse_override_lines
    from lcmoe.diagnose.overrides import check_intended
    from lcmoe.safe_io import read_text_capped

    if fmt != "yaml":
        raise LcmoeError(
            "--intended",
            str(path),
            f"needs FILE to be a saved Bridge YAML, not {fmt}",
            "pass logger.save_config_filepath",
        )
    wanted = parse_override_lines(read_text_capped(path, field="--intended", max_bytes=MAX_INPUT_BYTES))
    saved = read_yaml_text(saved_text, origin="saved config")
    return [c.as_dict() for c in check_intended(wanted, saved)]


def _render(result: dict[str, Any]) -> None:
    from lcmoe.cli.estimate_cmd import render_estimate

    stdout.print(f"read as: {result['format']}")
    for e in result["errors"]:
        text = escape(f"[{e['rule']}] {e['message']} — fix: {e['fix']}")  # the source file:line: --json
        stdout.print(f"[red]error[/] {text}", highlight=False)
    if not result["errors"]:
        render_estimate(result)
    for a in result["advice"]:
        color = {"warn": "yellow", "error": "red"}.get(a["severity"], "cyan")
        text = escape(f"[{a['rule']}] {a['text']}")
        stdout.print(f"[{color}]{a['severity']}[/] {text}", highlight=False)
    for o in result.get("intended", []):
        held = f", saved {o['saved']}" if o["status"] == "reset" else ""
        sources = ", ".join(o["sources"])
        text = escape(f"[{o['rule']}] {o['key']}: intended {o['intended']}{held} — {o['why']} ({sources})")
        stdout.print(f"[yellow]override {o['status']}[/] {text}", highlight=False)
