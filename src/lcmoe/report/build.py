"""Gather what a report shows: the plan payload, every fitting candidate, a sequence-length
sweep (the same search at other lengths), the emitted config of plan 1, the rule titles and the
models' measured error figures. Writing is ``write_report`` (atomic, like every lcmoe output)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from lcmoe.emit.bridge import overrides_text
from lcmoe.emit.megatron_lm import megatron_lm_text
from lcmoe.emit.writer import atomic_write_text, install_directory
from lcmoe.errors import LcmoeError
from lcmoe.estimate.memory import shipped_coefficients
from lcmoe.estimate.time import shipped_time_coefficients
from lcmoe.plan.payload import plan_payload
from lcmoe.plan.search import PlanRequest, SearchResult, search
from lcmoe.report.content import Figure, ReportInputs, figures
from lcmoe.report.html_page import render_html
from lcmoe.report.markdown import render_markdown
from lcmoe.report.strings import say
from lcmoe.rules.advice import PLANNER_ONLY, RULES
from lcmoe.units import format_tokens

DEFAULT_SWEEP = (4096, 16384, 32768, 65536, 131072, 262144)


def _number(record: dict[str, Any], key: str) -> float | None:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def accuracy_figures(request: PlanRequest, calibration: str | None = None) -> dict[str, Any]:
    """The error figures printed with the numbers, read from the fit records (never typed in):
    the time model's in-sample and leave-one-model-out MAPE (data/time_coefficients.yaml ``fit``,
    benchmarks/fit_time.py; a calibration's own error instead when given) and the memory model's
    held-out median / p90 (data/memory_coefficients.yaml ``fit.grouped_5fold_cv``,
    benchmarks/fit_memory.py). A figure the record lacks is None and its sentence is left out."""
    time_fit = (request.time_coefficients or shipped_time_coefficients(request.hardware.architecture)).fit
    memory_fit = shipped_coefficients().fit
    held_out = memory_fit.get("grouped_5fold_cv") or memory_fit.get("in_sample")
    memory: dict[str, Any] = held_out if isinstance(held_out, dict) else {}
    factors = time_fit.get("containers")
    runs = _number(time_fit, "n")
    return {
        "time_in_sample_pct": _number(time_fit, "mape_all"),
        "time_lomo_pct": _number(time_fit, "lomo_mape"),
        "time_lomo_moe_pct": _number(time_fit, "lomo_mape_moe"),
        "time_runs": int(runs) if runs is not None else None,
        "memory_median_pct": _number(memory, "median_abs_pct_err"),
        "memory_p90_pct": _number(memory, "p90_abs_pct_err"),
        "memory_runs": memory.get("n"),
        "calibration": calibration,
        "reference_container": time_fit.get("reference_container"),
        "slowest_container_factor": min(factors.values(), default=1.0) if isinstance(factors, dict) else 1.0,
    }


def build_report(
    request: PlanRequest,
    result: SearchResult,
    *,
    sweep_lengths: Sequence[int] = DEFAULT_SWEEP,
    calibration: str | None = None,
    advance: Callable[[], None] | None = None,
) -> tuple[ReportInputs, list[Figure]]:
    """The report's inputs and plots; ``advance`` is called once per sweep length done (the
    CLI's progress bar)."""
    payload = plan_payload(request, result)
    sweep = []
    for seq in sorted(set(sweep_lengths) | {request.seq_len}):
        found = result if seq == request.seq_len else search(replace(request, seq_len=seq, top_k=1))
        if advance is not None:
            advance()
        sweep.append(
            {
                "seq_len": seq,
                "seq_len_label": format_tokens(seq),
                "plan": found.plans[0].as_dict() if found.plans else None,
            }
        )
    best = result.plans[0].run if result.plans else None
    titles = {rule.id: rule.summary for rule in RULES} | {rule: say("planner") for rule in PLANNER_ONLY}
    inputs = ReportInputs(
        payload=payload,
        fitting_points=list(result.fitting_points),
        sweep=sweep,
        overrides=overrides_text(best) if best else say("no_plan"),
        megatron_args=megatron_lm_text(best) if best else say("no_plan"),
        accuracy=accuracy_figures(request, calibration),
        rules=titles,
    )
    return inputs, figures(inputs)


def _check_target(path: Path, *, directory: bool = False) -> None:
    """Refuse to replace anything but a regular file (or a directory for the plots): ``--out
    /dev/full`` run as root would otherwise rename a report over the device node."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _unwritable(path, exc) from None
    wanted = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if not wanted:
        raise LcmoeError(
            "--out",
            str(path),
            f"exists and is not a {'directory' if directory else 'regular file'}; lcmoe will not replace it",
            "choose another path",
        )


def _unwritable(path: Path, exc: OSError) -> LcmoeError:
    reason = exc.strerror or exc.__class__.__name__
    return LcmoeError("--out", str(path), f"cannot be written ({reason})", "choose a writable directory")


def write_report(html_path: Path, inputs: ReportInputs, figs: list[Figure]) -> list[Path]:
    """report.html (self-contained), report.md and report_plots/*.svg for the Markdown, each
    replaced atomically: an interrupted write leaves the previous report whole. An OS error
    (read-only folder, a path under a file, a full disk) is one LcmoeError sentence."""
    html_path = Path(html_path)
    plots_name = f"{html_path.stem}_plots"
    plots_dir = html_path.parent / plots_name
    md_path = html_path.with_suffix(".md")
    for target in (html_path, md_path):
        _check_target(target)
    _check_target(plots_dir, directory=True)
    try:
        html_path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=html_path.parent, prefix=f".{plots_name}.staging."))
        try:
            for fig in figs:
                (staging / f"{fig.name}.svg").write_text(fig.svg, encoding="utf-8")
            install_directory(staging, plots_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        atomic_write_text(md_path, render_markdown(inputs, figs, plots_name))
        atomic_write_text(html_path, render_html(inputs, figs))
    except OSError as exc:
        raise _unwritable(Path(exc.filename) if exc.filename else html_path, exc) from None
    return [html_path, md_path, plots_dir]
