"""``lcmoe plan --emit DIR``: every file of the top plan and of the fallback.

Which files and what is in them lives here; how they reach the disk (refusing to overwrite what
lcmoe did not write, old-or-new after an interrupt) lives in ``lcmoe.emit.directory``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lcmoe.config_io.bridge import recipe_for
from lcmoe.emit.bridge import overrides_text, python_snippet, yaml_config
from lcmoe.emit.directory import Installed, current_umask, install_directory, install_files
from lcmoe.emit.launchers import LaunchSettings, nemo_run_script, slurm_script
from lcmoe.emit.megatron_lm import megatron_lm_text
from lcmoe.emit.syntax import markdown_text, slurm_job_name
from lcmoe.errors import LcmoeError
from lcmoe.run import RunConfig

__all__ = ["COST_GATE_GPUS", "atomic_write_text", "install_directory", "write_plan_directory"]

COST_GATE_GPUS = 64


def atomic_write_text(path: Path, text: str) -> None:
    """Temp file in the same folder, then rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; a report or config is for the team
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _plan_files(run: RunConfig, prediction: dict[str, Any], settings: LaunchSettings) -> dict[str, str]:
    return {
        "overrides.txt": overrides_text(run),
        "config.yaml": yaml_config(run),
        "apply_plan.py": python_snippet(run, settings.recipe if settings.has_recipe else None),
        "megatron_lm_args.txt": megatron_lm_text(run) + "\n",
        "launch.sbatch": slurm_script(run, settings),
        "nemo_run_launch.py": nemo_run_script(run, settings),
        "prediction.json": json.dumps(prediction, indent=2, default=str) + "\n",
    }


def run_md(
    payload: dict[str, Any], gpu_hours: float, steps: int, settings: LaunchSettings, *, hybrid: bool = False
) -> str:
    best = payload["plans"][0]
    script = "pretrain_hybrid.py --hybrid-layer-pattern=..." if hybrid else "pretrain_gpt.py"
    time, memory, inputs = best["time"], best["memory"], payload["inputs"]
    title = markdown_text(f"{inputs['model']} on {inputs['num_gpus']} × {inputs['gpu']}")
    if settings.data_paths:
        data = f"Data: `dataset.data_path` = {len(settings.data_paths)} path(s) given with `--data-path`."
    else:
        data = (
            "**Data: none given, so the run trains on Bridge's mock data** (random tokens: right for checking "
            "speed and memory, useless for a model). Pass `--data-path PREFIX` (repeatable) to `lcmoe plan --emit`, "
            "or add `dataset.data_path=[PREFIX,…]` to the launcher."
        )
    data += _packing_text(best, inputs)
    recipe = (
        f"Recipe: `{settings.recipe}` (Megatron Bridge), with the plan's overrides on top."
        if settings.has_recipe
        else "Recipe: **Megatron Bridge ships none for this model.** The launchers stop until you set one "
        "(`RECIPE=…` for `launch.sbatch`, `LCMOE_RECIPE=…` for NeMo-Run): a recipe of the same family, with the "
        "model built from its Hugging Face checkpoint by `AutoBridge.from_hf_pretrained(PATH).to_megatron_provider()`."
    )
    return f"""# lcmoe plan — {title}

Run: `sbatch launch.sbatch` (or `python nemo_run_launch.py`). Before spending the allocation, check on one
node that the container has the dispatcher package this plan uses and the environment in `launch.sbatch`
(`lcmoe preflight --plan plan.json`).

{recipe}

{data}

The recipe loads its tokenizer from the Hugging Face hub: `HF_HOME`, `HF_ENDPOINT` and `HF_HUB_OFFLINE` set
where lcmoe ran were written into the launchers; set them there for a mirror or an offline cache.

Megatron-LM users: one argument per line, so `mapfile -t ARGS < megatron_lm_args.txt` then
`torchrun … {script} "${{ARGS[@]}}"` plus your model/data arguments.

What to expect in the log (Bridge `training_log` line, steady-state iterations):
- step time ≈ {time["step_seconds"]:.2f} s, model TFLOP/s/GPU ≈ {time["model_tflops_per_gpu"]:.0f},
  tokens/s/GPU ≈ {time["tokens_per_sec_per_gpu"]:.0f}
- peak allocated ≈ {memory["peak_allocated_bytes"] / 1024**3:.1f} GiB, peak reserved (nvidia-smi)
  ≈ {memory["peak_reserved_bytes"] / 1024**3:.1f} GiB of {memory["capacity_bytes"] / 1024**3:.0f} GiB

Cost: {steps} steps ≈ {gpu_hours:.1f} GPU-hours at the predicted step time.
Check a run against this prediction: compare the log's `MODEL_TFLOP/s/GPU` and `mem-max-allocated-gigabytes`
with the numbers above; `lcmoe check plan.json` or `lcmoe check launch.sbatch` re-derives them from the emitted files.
Rollback: `fallback/` holds a plan with ≥ 20% memory headroom. `.lcmoe-manifest.json` lists the files lcmoe
wrote here (`--emit … --force` replaces only those).
"""


def _packing_text(best: dict[str, Any], inputs: dict[str, Any]) -> str:
    """RUN.md's paragraph on packed documents (nothing for fixed-length samples)."""
    docs, packing = inputs.get("doc_lengths"), best.get("packing")
    if not docs or not packing:
        return ""
    caveats = "".join(f"\n- {c}" for c in packing["caveats"])  # lcmoe's own sentences
    share = 100 * packing["attention_share_of_fixed"]
    return (
        f"\n\nDocuments: `{markdown_text(docs['name'])}`, about {packing['docs_per_pack']:.1f} per "
        f"{inputs['seq_len']}-token sample, packed with one attention mask each "
        "(`dataset.inter_document_masking=true`, `--dataloader-inter-document-masking`); core attention is "
        f"{share:.1f}% of one {inputs['seq_len']}-token document's.{caveats}"
    )


def plan_files(
    payload: dict[str, Any], result: Any, *, steps: int, settings: LaunchSettings, gpu_hours: float
) -> dict[str, str]:
    """Every file ``--emit`` writes (relative path → text): the top plan's and the fallback's."""
    best = result.plans[0]
    plan_doc = dict(
        payload,
        target={"megatron_core": payload["inputs"]["megatron_core_version"], "megatron_bridge": "0.6.2"},
        gpu_hours=gpu_hours,
        steps=steps,
    )
    files = {"plan.json": json.dumps(plan_doc, indent=2, default=str) + "\n"}
    files |= _plan_files(best.run, payload["plans"][0], settings)
    files["RUN.md"] = run_md(payload, gpu_hours, steps, settings, hybrid=best.run.model.is_hybrid)
    if result.fallback is not None:
        files |= {
            f"fallback/{name}": text
            for name, text in _plan_files(result.fallback.run, payload["fallback"], settings).items()
        }
    return files


def write_plan_directory(
    target: Path,
    payload: dict[str, Any],
    result: Any,
    *,
    steps: int,
    confirmed: bool,
    settings: LaunchSettings | None = None,
    force: bool = False,
) -> Installed:
    """Write the plan's files at ``target`` (``directory.install_files``: never over files lcmoe did
    not write, old or new directory after an interrupt)."""
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
    launch = settings or default_settings(best.run)
    files = plan_files(payload, result, steps=steps, settings=launch, gpu_hours=gpu_hours)
    return install_files(Path(target), files, force=force)


def default_settings(run: RunConfig) -> LaunchSettings:
    """Launch settings with the model's Bridge recipe and a job name from the model's name."""
    recipe = recipe_for(run.model, run.options, run.hardware)
    return LaunchSettings(
        recipe=recipe or "", has_recipe=recipe is not None, job_name=slurm_job_name(f"lcmoe-{run.model.name}")
    )
