"""Slurm and NeMo-Run launchers. Every user-provided string is shell-quoted (shlex.quote);
container image, mounts and a pip index/registry mirror are parameters for air-gapped sites."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from lcmoe.config_io.bridge import format_override_value, override_key, overrides_from_run
from lcmoe.emit.environment import environment
from lcmoe.run import RunConfig

DEFAULT_CONTAINER = "nvcr.io/nvidia/nemo:26.08"


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    job_name: str = "lcmoe"
    container_image: str = DEFAULT_CONTAINER
    mounts: tuple[str, ...] = ()
    recipe: str = "deepseek_v3_pretrain_config"
    account: str | None = None
    partition: str | None = None
    time_limit: str = "04:00:00"
    pip_index_url: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


# LoRA starts from a base model: Bridge refuses a PEFT run without one (config.py: "PEFT requires
# a pretrained checkpoint path"). The launchers read it from this variable at run time.
CHECKPOINT_VARIABLE = "PRETRAINED_CHECKPOINT"


def recipe_args(run: RunConfig, settings: LaunchSettings) -> list[str]:
    """``--recipe NAME`` (+ ``--mode lora`` for a LoRA run, which makes run_recipe.py build the
    recipe with ``peft_scheme="lora"``)."""
    return ["--recipe", settings.recipe, *(["--mode", "lora"] if run.options.is_lora else [])]


def override_args(run: RunConfig) -> list[str]:
    return [f"{override_key(key)}={format_override_value(value)}" for key, value in overrides_from_run(run).items()]


def slurm_script(run: RunConfig, settings: LaunchSettings) -> str:
    q = shlex.quote
    gpus_per_node = run.hardware.gpus_per_node
    nodes = -(-run.num_gpus // gpus_per_node)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={q(settings.job_name)}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={gpus_per_node}",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        f"#SBATCH --time={q(settings.time_limit)}",
        "#SBATCH --exclusive",
    ]
    if settings.account:
        lines.append(f"#SBATCH --account={q(settings.account)}")
    if settings.partition:
        lines.append(f"#SBATCH --partition={q(settings.partition)}")
    lines += ["set -euo pipefail", ""]
    for name, (value, reason) in environment(run).items():
        lines.append(f"# {reason}")
        lines.append(f"export {name}={q(value)}")
    for name, value in settings.extra_env.items():
        if not name.isidentifier():
            raise ValueError(f"environment variable name {name!r} is not a valid identifier")
        lines.append(f"export {name}={q(value)}")
    if settings.pip_index_url:
        lines.append(f"export PIP_INDEX_URL={q(settings.pip_index_url)}")
    mounts = ",".join(settings.mounts)
    srun = ["srun", f"--container-image={settings.container_image}"]
    if mounts:
        srun.append(f"--container-mounts={mounts}")
    command = [*srun, "python", "scripts/training/run_recipe.py", *recipe_args(run, settings), *override_args(run)]
    parts = [q(part) for part in command]
    if run.options.is_lora:
        need = f"export {CHECKPOINT_VARIABLE}=the Megatron checkpoint LoRA starts from"
        lines.append(f': "${{{CHECKPOINT_VARIABLE}:?{need}}}"')
        parts.append(f'"checkpoint.pretrained_checkpoint=${CHECKPOINT_VARIABLE}"')
    lines += ["", " \\\n  ".join(parts), ""]
    return "\n".join(lines)


def nemo_run_script(run: RunConfig, settings: LaunchSettings) -> str:
    """A NeMo-Run script; values are embedded as Python literals (repr), never as shell text."""
    overrides = override_args(run)
    imports, checkpoint = "import nemo_run as run", ""
    if run.options.is_lora:
        imports = "import os\n\n" + imports
        checkpoint = f'\nOVERRIDES.append("checkpoint.pretrained_checkpoint=" + os.environ["{CHECKPOINT_VARIABLE}"])'
    recipe = ", ".join(repr(arg) for arg in recipe_args(run, settings))
    env = {name: value for name, (value, _) in environment(run).items()} | dict(settings.extra_env)
    gpus_per_node = run.hardware.gpus_per_node
    nodes = -(-run.num_gpus // gpus_per_node)
    return f'''"""NeMo-Run launcher written by lcmoe (edit executor settings for your cluster)."""
{imports}

ENV = {env!r}
OVERRIDES = {overrides!r}{checkpoint}

executor = run.SlurmExecutor(
    account={settings.account!r},
    partition={settings.partition!r},
    nodes={nodes},
    ntasks_per_node={gpus_per_node},
    gpus_per_node={gpus_per_node},
    container_image={settings.container_image!r},
    container_mounts={list(settings.mounts)!r},
    time={settings.time_limit!r},
    env_vars=ENV,
    tunnel=run.LocalTunnel(job_dir="./nemo_run_jobs"),
)
script = run.Script(path="scripts/training/run_recipe.py", args=[{recipe}, *OVERRIDES])

if __name__ == "__main__":
    run.run(script, executor=executor, name={settings.job_name!r})
'''
