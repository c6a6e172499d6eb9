"""``lcmoe plan --emit DIR``: every file of the top plan and of the fallback, written atomically
(a new directory is built next to DIR and renamed into place; an existing DIR is replaced only
once the new one is complete, never half-overwritten)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from lcmoe.config_io.bridge import recipe_for
from lcmoe.emit.bridge import overrides_text, python_snippet, yaml_config
from lcmoe.emit.launchers import LaunchSettings, nemo_run_script, slurm_script
from lcmoe.emit.megatron_lm import megatron_lm_text
from lcmoe.errors import LcmoeError
from lcmoe.run import RunConfig

COST_GATE_GPUS = 64


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    """Temp file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a report or config is for the team
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plan_files(run: RunConfig, prediction: dict[str, Any], settings: LaunchSettings) -> dict[str, str]:
    return {
        "overrides.txt": overrides_text(run),
        "config.yaml": yaml_config(run),
        "apply_plan.py": python_snippet(run, settings.recipe),
        "megatron_lm_args.txt": megatron_lm_text(run) + "\n",
        "launch.sbatch": slurm_script(run, settings),
        "nemo_run_launch.py": nemo_run_script(run, settings),
        "prediction.json": json.dumps(prediction, indent=2, default=str) + "\n",
    }


def run_md(payload: dict[str, Any], gpu_hours: float, steps: int, *, hybrid: bool = False) -> str:
    best = payload["plans"][0]
    script = "pretrain_hybrid.py --hybrid-layer-pattern=..." if hybrid else "pretrain_gpt.py"
    time, memory, inputs = best["time"], best["memory"], payload["inputs"]
    return f"""# lcmoe plan — {inputs["model"]} on {inputs["num_gpus"]} × {inputs["gpu"]}

Run: `sbatch launch.sbatch` (or `python nemo_run_launch.py`). Before spending the allocation, check on one
node that the container has the dispatcher package this plan uses and the environment in `launch.sbatch`.
Megatron-LM users: `{script} $(cat megatron_lm_args.txt)` plus your model/data arguments.

What to expect in the log (Bridge `training_log` line, steady-state iterations):
- step time ≈ {time["step_seconds"]:.2f} s, model TFLOP/s/GPU ≈ {time["model_tflops_per_gpu"]:.0f},
  tokens/s/GPU ≈ {time["tokens_per_sec_per_gpu"]:.0f}
- peak allocated ≈ {memory["peak_allocated_bytes"] / 1024**3:.1f} GiB, peak reserved (nvidia-smi)
  ≈ {memory["peak_reserved_bytes"] / 1024**3:.1f} GiB of {memory["capacity_bytes"] / 1024**3:.0f} GiB

Cost: {steps} steps ≈ {gpu_hours:.1f} GPU-hours at the predicted step time.
Check a run against this prediction: compare the log's `MODEL_TFLOP/s/GPU` and `mem-max-allocated-gigabytes`
with the numbers above; `lcmoe check overrides.txt --model … --gpus …` re-derives them from the emitted config.
Rollback: `fallback/` holds a plan with ≥ 20% memory headroom.
"""


def write_plan_directory(
    target: Path,
    payload: dict[str, Any],
    result: Any,
    *,
    steps: int,
    confirmed: bool,
    settings: LaunchSettings | None = None,
) -> Path:
    best = result.plans[0]
    num_gpus = best.run.num_gpus
    gpu_hours = best.time.step_seconds * steps * num_gpus / 3600
    if num_gpus > COST_GATE_GPUS and not confirmed:
        raise LcmoeError(
            "--emit",
            str(target),
            f"would write a launcher for {num_gpus} GPUs (≈{gpu_hours:.0f} GPU-hours for {steps} steps)",
            "add --yes to confirm",
        )
    launch = settings or LaunchSettings(
        recipe=recipe_for(best.run.model, best.run.options), job_name=f"lcmoe-{best.run.model.name}"
    )
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.staging."))
    try:
        plan_doc = dict(
            payload,
            target={"megatron_core": payload["inputs"]["megatron_core_version"], "megatron_bridge": "0.6.2"},
            gpu_hours=gpu_hours,
            steps=steps,
        )
        (staging / "plan.json").write_text(json.dumps(plan_doc, indent=2, default=str) + "\n", encoding="utf-8")
        for name, text in _plan_files(best.run, payload["plans"][0], launch).items():
            (staging / name).write_text(text, encoding="utf-8")
        (staging / "RUN.md").write_text(
            run_md(payload, gpu_hours, steps, hybrid=best.run.model.is_hybrid), encoding="utf-8"
        )
        if result.fallback is not None:
            (staging / "fallback").mkdir()
            for name, text in _plan_files(result.fallback.run, payload["fallback"], launch).items():
                (staging / "fallback" / name).write_text(text, encoding="utf-8")
        install_directory(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def install_directory(staging: Path, target: Path) -> None:
    """Put a completed ``staging`` directory at ``target`` by renames: an existing ``target`` is
    moved aside first and deleted only after the new one is in place, so an interruption leaves
    either the old directory or the new one, never a mix."""
    os.chmod(staging, 0o755)
    if target.exists():
        backup = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old."))
        backup.rmdir()
        os.replace(target, backup)
        os.replace(staging, target)
        shutil.rmtree(backup, ignore_errors=True)
    else:
        os.replace(staging, target)
