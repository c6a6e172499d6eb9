"""Gather what a report shows: the plan payload, every fitting candidate, a sequence-length
sweep (the same search at other lengths), the emitted config of plan 1, the rule titles and the
models' measured error figures. Writing is ``write_report`` (atomic, like every lcmoe output)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Sequence
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
from lcmoe.report.render import Figure, ReportInputs, figures, render_html, render_markdown
from lcmoe.rules.advice import PLANNER_ONLY, RULES
from lcmoe.units import format_tokens

DEFAULT_SWEEP = (4096, 16384, 32768, 65536, 131072, 262144)


def accuracy_figures(request: PlanRequest, calibration: str | None = None) -> dict[str, Any]:
    """The error bands printed with the numbers: the time model's fit MAPE for this hardware
    family (or the calibration's) and the memory model's median / p90 on Megatron-LM CI runs."""
    time_fit = (request.time_coefficients or shipped_time_coefficients(request.hardware.architecture)).fit
    in_sample = shipped_coefficients().fit.get("in_sample")
    memory_fit: dict[str, Any] = in_sample if isinstance(in_sample, dict) else {}
    mape = time_fit.get("mape_all")
    factors = time_fit.get("containers")
    return {
        "time_mape_pct": float(mape) if isinstance(mape, (int, float)) else 15.0,
        "time_source": "your calibration" if calibration else f"{time_fit.get('n', '?')} published Bridge runs",
        "memory_median_pct": float(memory_fit.get("median_abs_pct_err", 0.0)),
        "memory_p90_pct": float(memory_fit.get("p90_abs_pct_err", 0.0)),
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
) -> tuple[ReportInputs, list[Figure]]:
    payload = plan_payload(request, result)
    sweep = []
    for seq in sorted(set(sweep_lengths) | {request.seq_len}):
        found = result if seq == request.seq_len else search(replace(request, seq_len=seq, top_k=1))
        sweep.append(
            {
                "seq_len": seq,
                "seq_len_label": format_tokens(seq),
                "plan": found.plans[0].as_dict() if found.plans else None,
            }
        )
    best = result.plans[0].run if result.plans else None
    titles = {rule.id: rule.summary for rule in RULES} | {rule: "planner" for rule in PLANNER_ONLY}
    inputs = ReportInputs(
        payload=payload,
        fitting_points=list(result.fitting_points),
        sweep=sweep,
        overrides=overrides_text(best) if best else "(no plan fits)",
        megatron_args=megatron_lm_text(best) if best else "(no plan fits)",
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
