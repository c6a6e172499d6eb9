"""`lcmoe calibrate`: the cluster's measured speed, fitted from its training logs (exit 0 written,
2 bad input)."""

from __future__ import annotations

from pathlib import Path

import typer

from lcmoe.cli.common import EXIT_OK, JSON, print_json, stdout
from lcmoe.cli.diagnose_cmd import CONFIG, GPU, GPUS, MODEL, PLAN, SEQ, resolve_log_run
from lcmoe.errors import LcmoeError


def _check_output_file(out: Path) -> None:
    """Refuse to replace anything but a regular file (``--out /dev/full`` as root would rename
    cluster.yaml over the device node) before any work is done."""
    import os
    import stat

    try:
        info = os.lstat(out)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise LcmoeError(
            "--out", str(out), f"cannot be written ({exc.strerror or exc.__class__.__name__})", "choose a writable path"
        ) from None
    if not stat.S_ISREG(info.st_mode):
        raise LcmoeError("--out", str(out), "exists and is not a regular file", "choose another path")


def calibrate(
    logs: list[str] = typer.Argument(..., help="training logs of this cluster (steady-state iteration lines)"),
    out: Path = typer.Option(..., "--out", "-o", help="where to write cluster.yaml"),
    plan: Path = PLAN,
    config: Path = CONFIG,
    model: str = MODEL,
    gpu: str = GPU,
    gpus: int = GPUS,
    seq_len: str = SEQ,
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="print only the written path"),
) -> None:
    """Refit the time model's efficiencies from your measured runs; use with --calibration FILE."""
    import yaml

    from lcmoe.diagnose.logs import read_log
    from lcmoe.diagnose.steps import step_stats
    from lcmoe.emit.writer import atomic_write_text
    from lcmoe.estimate.calibration import MeasuredRun
    from lcmoe.estimate.calibration import calibrate as fit

    _check_output_file(out)
    measured = []
    for log in logs:
        summary = read_log(log)
        stats = step_stats(summary)
        if stats is None:
            raise LcmoeError(
                "LOG", log, "has no iteration or Step Time lines", "pass a log of at least a few iterations"
            )
        run, _ = resolve_log_run(summary, plan=plan, config=config, model=model, gpu=gpu, gpus=gpus, seq_len=seq_len)
        if run is None:
            raise LcmoeError("LOG", log, "has no argument dump", "pass --plan, or --config with --gpus")
        measured.append(MeasuredRun(run, stats.median_seconds, source=str(log)))
    calibration = fit(measured)
    document = calibration.as_dict()
    try:
        atomic_write_text(out, "# Written by lcmoe calibrate; pass with --calibration.\n" + yaml.safe_dump(document))
    except OSError as exc:
        raise LcmoeError(
            "--out", str(out), f"cannot be written ({exc.strerror or exc.__class__.__name__})", "choose a writable path"
        ) from None
    if json_output:
        print_json(document)
        raise typer.Exit(EXIT_OK)
    if quiet:
        stdout.print(str(out), highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_OK)
    scales = ", ".join(f"{k} ×{v:.3f}" for k, v in calibration.scales.items())
    stdout.print(
        f"wrote {out}: {len(measured)} run(s) on {calibration.hardware}, scales {scales}; "
        f"error on these runs {calibration.mape_before:.1f}% → {calibration.mape_after:.1f}%",
        highlight=False,
    )
    raise typer.Exit(EXIT_OK)
