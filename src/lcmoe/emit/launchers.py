"""Slurm and NeMo-Run launchers.

Every value reaches a launcher through one writer of ``lcmoe.emit.syntax`` for its syntax
(``#SBATCH`` word, shell word, Python literal, comment): a value those writers refuse never reaches
a file. Container image, mounts, a pip index and the Hugging Face settings are parameters for
air-gapped and mirrored sites.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from lcmoe.config_io.bridge import format_override_value, override_key, overrides_from_run
from lcmoe.emit import syntax
from lcmoe.emit.environment import environment
from lcmoe.errors import LcmoeError
from lcmoe.run import RunConfig

DEFAULT_CONTAINER = "nvcr.io/nvidia/nemo:26.08"
# Where the NeMo container keeps Megatron Bridge's entry script (the image's /opt/Megatron-Bridge
# checkout); the job starts in another directory (NeMo-Run: /nemo_run/code), so the path is absolute.
DEFAULT_RUN_SCRIPT = "/opt/Megatron-Bridge/scripts/training/run_recipe.py"
# Environment a Bridge recipe reads when it loads its tokenizer from the Hugging Face hub; forwarded
# to the job when set where lcmoe runs (the CLI reads them, see ``forwarded_environment``).
HF_VARIABLES = ("HF_HOME", "HF_ENDPOINT", "HF_HUB_OFFLINE", "HF_TOKEN_PATH", "TRANSFORMERS_OFFLINE")


@dataclass(frozen=True, slots=True)
class LaunchSettings:
    """What a launcher needs beyond the plan; every field is validated when a launcher is written."""

    job_name: str = "lcmoe"
    """Free text; reduced to letters, digits, '.', '_' and '-' (``syntax.slurm_job_name``)."""
    container_image: str = DEFAULT_CONTAINER
    mounts: tuple[str, ...] = ()
    """pyxis ``SRC:DST[:FLAGS]`` mounts."""
    recipe: str = "deepseek_v3_pretrain_config"
    """A function of ``megatron.bridge.recipes``; None-recipe models get a launcher that says so."""
    has_recipe: bool = True
    """False for a model Bridge ships no recipe for: the launchers refuse to start and say how."""
    account: str | None = None
    partition: str | None = None
    time_limit: str = "04:00:00"
    pip_index_url: str | None = None
    """A pip mirror, exported as PIP_INDEX_URL to the job (for recipes that install at start-up)."""
    run_script: str = DEFAULT_RUN_SCRIPT
    data_paths: tuple[str, ...] = ()
    """Megatron indexed-dataset prefixes (``dataset.data_path``); none means Bridge's mock data."""
    extra_env: dict[str, str] = field(default_factory=dict)


# LoRA starts from a base model: Bridge refuses a PEFT run without one (config.py: "PEFT requires
# a pretrained checkpoint path"). The launchers read it from this variable at run time.
CHECKPOINT_VARIABLE = "PRETRAINED_CHECKPOINT"


def forwarded_environment(environ: dict[str, str]) -> dict[str, str]:
    """The Hugging Face settings of ``environ`` a job must see too (``HF_VARIABLES``)."""
    return {name: environ[name] for name in HF_VARIABLES if environ.get(name)}


def recipe_args(run: RunConfig, settings: LaunchSettings) -> list[str]:
    """``--recipe NAME`` (+ ``--mode lora`` for a LoRA run, which makes run_recipe.py build the
    recipe with ``peft_scheme="lora"``)."""
    recipe = syntax.python_identifier("recipe", settings.recipe)
    return ["--recipe", recipe, *(["--mode", "lora"] if run.options.is_lora else [])]


def override_args(run: RunConfig, settings: LaunchSettings | None = None) -> list[str]:
    """The plan's Hydra overrides (``KEY=VALUE``), plus the data paths when given."""
    args = [f"{override_key(key)}={format_override_value(value)}" for key, value in overrides_from_run(run).items()]
    if settings is not None and settings.data_paths:
        args.append(f"dataset.data_path={format_override_value(list(data_paths(settings)))}")
    return [syntax.check_plain("override", arg) for arg in args]


def data_paths(settings: LaunchSettings) -> tuple[str, ...]:
    """Dataset prefixes as Hydra list items: no whitespace (Bridge splits a string on it) and none
    of Hydra's grammar characters."""
    for path in settings.data_paths:
        syntax.check_plain("--data-path", path)
        if any(ch.isspace() or ch in ",[]{}()='\"\\$`" for ch in path):
            raise LcmoeError(
                "--data-path",
                path,
                "must be a path without spaces, quotes or any of , [ ] { } ( ) = $",
                "rename or link the dataset to a plain path",
            )
    return settings.data_paths


def launch_environment(run: RunConfig, settings: LaunchSettings) -> dict[str, tuple[str, str]]:
    """name → (value, reason) for every variable a launcher exports, each name and value checked."""
    env = dict(environment(run))
    for name, value in settings.extra_env.items():
        env[name] = (value, "forwarded from where lcmoe ran" if name in HF_VARIABLES else "set with lcmoe")
    if settings.pip_index_url:
        env["PIP_INDEX_URL"] = (syntax.url("--pip-index-url", settings.pip_index_url), "pip mirror")
    for name, (value, reason) in env.items():
        syntax.environment_name("environment variable", name)
        syntax.check_plain(f"environment variable {name}", value)
        syntax.comment_text("reason", reason)
    return env


def _nodes(run: RunConfig) -> int:
    return -(-run.num_gpus // run.hardware.gpus_per_node)


def _no_recipe_lines(run: RunConfig) -> list[str]:
    name = syntax.slurm_job_name(run.model.name)
    return [
        f"# Megatron Bridge ships no recipe for this model ({name}): write one, or build the model from its",
        "# Hugging Face checkpoint with AutoBridge (megatron.bridge.AutoBridge.from_hf_pretrained(PATH)",
        "# .to_megatron_provider()) and pass it to a recipe of the same family, then set RECIPE below.",
        ': "${RECIPE:?set RECIPE to a recipe function of megatron.bridge.recipes (see the comment above)}"',
    ]


def slurm_script(run: RunConfig, settings: LaunchSettings) -> str:
    """``launch.sbatch``: the header takes only validated words; the srun line quotes every word."""
    gpus_per_node = run.hardware.gpus_per_node
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={syntax.slurm_job_name(settings.job_name)}",
        f"#SBATCH --nodes={_nodes(run)}",
        f"#SBATCH --ntasks-per-node={gpus_per_node}",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        f"#SBATCH --time={syntax.slurm_time('--time-limit', settings.time_limit)}",
        "#SBATCH --exclusive",
        "#SBATCH --output=lcmoe-%x-%j.out",
        "#SBATCH --error=lcmoe-%x-%j.err",
    ]
    if settings.account:
        lines.append(f"#SBATCH --account={syntax.sbatch_word('--account', settings.account)}")
    if settings.partition:
        lines.append(f"#SBATCH --partition={syntax.sbatch_word('--partition', settings.partition)}")
    lines += ["set -euo pipefail", ""]
    for name, (value, reason) in launch_environment(run, settings).items():
        lines.append(f"# {reason}")
        lines.append(f"export {name}={shlex.quote(value)}")
    srun = [
        "srun",
        "--mpi=pmix",
        f"--container-image={syntax.container_image('--container', settings.container_image)}",
        "--container-workdir=/opt/Megatron-Bridge",
    ]
    mounts = [syntax.container_mount("--mount", mount) for mount in settings.mounts]
    if mounts:
        srun.append(f"--container-mounts={','.join(mounts)}")
    script = syntax.check_plain("--run-script", settings.run_script)
    words = [syntax.shell_word("command", part) for part in [*srun, "python", script]]
    if settings.has_recipe:
        words += [syntax.shell_word("recipe", part) for part in recipe_args(run, settings)]
    else:
        lines += _no_recipe_lines(run)
        words += ["--recipe", '"$RECIPE"', *(["--mode", "lora"] if run.options.is_lora else [])]
    words += [syntax.shell_word("override", arg) for arg in override_args(run, settings)]
    if run.options.is_lora:
        need = f"export {CHECKPOINT_VARIABLE}=the Megatron checkpoint LoRA starts from"
        lines.append(f': "${{{CHECKPOINT_VARIABLE}:?{need}}}"')
        words.append(f'"checkpoint.pretrained_checkpoint=${CHECKPOINT_VARIABLE}"')
    lines += ["", " \\\n  ".join(words), ""]
    return "\n".join(lines)


def nemo_run_script(run: RunConfig, settings: LaunchSettings) -> str:
    """A NeMo-Run launcher. Values are Python literals (``syntax.python_literal``); NeMo-Run joins
    a Script's arguments into the sbatch file with spaces and no quoting (nemo_run 0.11.1
    run/torchx_backend/schedulers/slurm.py ``" ".join(srun_cmd)``), so each argument is passed
    through ``shlex.quote`` by the script itself."""
    lit = syntax.python_literal
    env = {name: value for name, (value, _) in launch_environment(run, settings).items()}
    head = ["import os", "import shlex", "", "import nemo_run as run"]
    recipe: list[str] = recipe_args(run, settings) if settings.has_recipe else []
    # Built in this order: each value is checked as it is spelled, and the first bad one is reported.
    executor_fields = _nemo_executor_fields(run, settings)
    body = _nemo_settings_lines(run, settings, env, recipe)
    name = lit("--job-name", syntax.slurm_job_name(settings.job_name))
    return "\n".join(
        [
            '"""NeMo-Run launcher written by lcmoe (edit the executor for your cluster)."""',
            *head,
            "",
            *body,
            "",
            "executor = run.SlurmExecutor(",
            *executor_fields,
            ")",
            "# NeMo-Run writes these words into its sbatch file unquoted: quote them here.",
            "script = run.Script(path=SCRIPT, entrypoint='python', args=[shlex.quote(a) for a in RECIPE + OVERRIDES])",
            "",
            'if __name__ == "__main__":',
            f"    run.run(script, executor=executor, name={name})",
            "",
        ]
    )


def _nemo_executor_fields(run: RunConfig, settings: LaunchSettings) -> list[str]:
    """The keyword arguments of the NeMo-Run ``SlurmExecutor``, one line each."""
    lit = syntax.python_literal
    executor_fields = [
        f"    nodes={_nodes(run)},",
        f"    ntasks_per_node={run.hardware.gpus_per_node},",
        f"    gpus_per_node={run.hardware.gpus_per_node},",
        f"    container_image={lit('--container', syntax.container_image('--container', settings.container_image))},",
        f"    container_mounts={lit('--mount', [syntax.container_mount('--mount', m) for m in settings.mounts])},",
        f"    time={lit('--time-limit', syntax.slurm_time('--time-limit', settings.time_limit))},",
        "    env_vars=ENV,",
        '    srun_args=["--mpi=pmix"],',
        "    packager=run.Packager(),  # nothing to ship: the container has Megatron Bridge",
        '    tunnel=run.LocalTunnel(job_dir=os.path.abspath("nemo_run_jobs")),',
    ]
    executor_fields.insert(0, "    account=ACCOUNT,")
    if settings.partition:
        executor_fields.insert(
            1, f"    partition={lit('--partition', syntax.sbatch_word('--partition', settings.partition))},"
        )
    return executor_fields


def _nemo_settings_lines(run: RunConfig, settings: LaunchSettings, env: dict[str, str], recipe: list[str]) -> list[str]:
    """The NeMo-Run launcher's settings (account, environment, script, recipe, overrides) as Python
    assignments, with the launch-time checks a run without a recipe or under LoRA needs."""
    lit = syntax.python_literal
    account = syntax.sbatch_word("--account", settings.account) if settings.account else None
    body = [
        "# SlurmExecutor needs an account: the one given to lcmoe, or LCMOE_SLURM_ACCOUNT at launch.",
        f"ACCOUNT = os.environ.get('LCMOE_SLURM_ACCOUNT') or {lit('--account', account)}",
        "if not ACCOUNT:",
        "    raise SystemExit('set LCMOE_SLURM_ACCOUNT (or pass --account to lcmoe plan --emit)')",
        f"ENV = {lit('environment', env)}",
        f"SCRIPT = os.environ.get('LCMOE_RUN_SCRIPT', {lit('--run-script', settings.run_script)})",
        f"RECIPE = {lit('recipe', recipe)}",
        f"OVERRIDES = {lit('override', override_args(run, settings))}",
    ]
    if not settings.has_recipe:
        body += [
            "# Megatron Bridge ships no recipe for this model: write one, or build the model from its Hugging Face",
            "# checkpoint with AutoBridge and a recipe of the same family, then set LCMOE_RECIPE.",
            "if 'LCMOE_RECIPE' not in os.environ:",
            "    raise SystemExit('set LCMOE_RECIPE to a recipe of megatron.bridge.recipes (see the comment above)')",
            "RECIPE = ['--recipe', os.environ['LCMOE_RECIPE']]"
            + (" + ['--mode', 'lora']" if run.options.is_lora else ""),
        ]
    if run.options.is_lora:
        body.append(
            "OVERRIDES.append('checkpoint.pretrained_checkpoint=' + "
            f"os.environ[{lit('variable', CHECKPOINT_VARIABLE)}])"
        )
    return body
