"""``plan --emit``'s options and the one call that writes the directory (CLI edge: reads the
environment for the Hugging Face settings a job must inherit, prints what was written)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer

from lcmoe.cli.common import stderr

EMIT = typer.Option(
    None, "--emit", help="write configs and launchers for the top plan to DIR (a new or empty directory)"
)
FORCE = typer.Option(
    False, "--force", help="--emit into a directory lcmoe wrote before: replace only its files (others are kept)"
)
DATA_PATHS = typer.Option(
    [], "--data-path", help="dataset prefix for the launchers (repeatable); without it the run uses mock data"
)
RUN_SCRIPT = typer.Option(None, "--run-script", help="run_recipe.py's path inside the container")


def check_emit_options(target: Path, launch: dict[str, Any], *, force: bool) -> None:
    """Refuse a bad ``--emit`` target or launcher value before the search, not after it."""
    from lcmoe.emit import syntax
    from lcmoe.emit.directory import check_target, not_empty_error
    from lcmoe.emit.launchers import LaunchSettings, data_paths

    path = check_target(target)
    if not force and path.is_dir() and any(path.iterdir()):
        raise not_empty_error(path, sorted(p.name for p in path.iterdir()))
    syntax.check_plain("--job-name", launch.get("job_name") or "")
    for option, check in (("account", syntax.sbatch_word), ("partition", syntax.sbatch_word)):
        if launch.get(option):
            check(f"--{option}", launch[option])
    if launch.get("time_limit"):
        syntax.slurm_time("--time-limit", launch["time_limit"])
    if launch.get("container"):
        syntax.container_image("--container", launch["container"])
    for mount in launch.get("mounts") or ():
        syntax.container_mount("--mount", mount)
    if launch.get("pip_index_url"):
        syntax.url("--pip-index-url", launch["pip_index_url"])
    if launch.get("run_script"):
        syntax.check_plain("--run-script", launch["run_script"])
    data_paths(LaunchSettings(data_paths=tuple(launch.get("data_paths") or ())))


def emit_plan(
    target: Path,
    payload: dict[str, Any],
    result: Any,
    *,
    steps: int,
    confirmed: bool,
    force: bool,
    launch: dict[str, Any],
    quiet: bool,
) -> None:
    """Build the launch settings for the top plan (``launch``: the CLI's values, None = default)
    and write the directory; say on stderr what was written and kept."""
    from lcmoe.config_io.bridge import recipe_for
    from lcmoe.emit.launchers import DEFAULT_CONTAINER, DEFAULT_RUN_SCRIPT, LaunchSettings, forwarded_environment
    from lcmoe.emit.writer import write_plan_directory

    best = result.plans[0].run
    recipe = recipe_for(best.model, best.options, best.hardware)
    settings = LaunchSettings(
        job_name=launch.get("job_name") or f"lcmoe-{best.model.name}",
        recipe=recipe or "",
        has_recipe=recipe is not None,
        mounts=tuple(launch.get("mounts") or ()),
        account=launch.get("account"),
        partition=launch.get("partition"),
        time_limit=launch.get("time_limit") or "04:00:00",
        pip_index_url=launch.get("pip_index_url"),
        container_image=launch.get("container") or DEFAULT_CONTAINER,
        run_script=launch.get("run_script") or DEFAULT_RUN_SCRIPT,
        data_paths=tuple(launch.get("data_paths") or ()),
        extra_env=forwarded_environment(dict(os.environ)),
    )
    done = write_plan_directory(
        target, payload, result, steps=steps, confirmed=confirmed, settings=settings, force=force
    )
    if quiet:
        return
    stderr.print(f"wrote {done.target}: {', '.join(done.written)}", highlight=False, markup=False)
    if done.kept:
        stderr.print(f"kept (not written by lcmoe): {', '.join(done.kept)}", highlight=False, markup=False)
    if not settings.data_paths:
        stderr.print(
            "note: no --data-path given, so the emitted run trains on mock data", highlight=False, markup=False
        )
    if not settings.has_recipe:
        stderr.print(
            f"note: Megatron Bridge ships no recipe for {best.model.name}; RUN.md says how to launch it",
            highlight=False,
            markup=False,
        )
