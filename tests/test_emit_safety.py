"""``--emit`` never runs what nobody wrote and never destroys what lcmoe did not write (issue #30).

* every injection input (job name, account, partition, time limit, container, mount, pip index,
  model name from a YAML or from a Hugging Face config's directory) is refused in one sentence or
  written inertly: the emitted shell files run under a stub ``srun`` and no marker file appears;
* the sbatch's srun receives every override intact (a stub srun prints its argv);
* the NeMo-Run launcher, built by the real nemo-run in dry-run (``LCMOE_NEMO_RUN_PYTHON``), produces
  an sbatch whose command reaches run_recipe.py with the same arguments;
* an existing directory is refused, or with --force only lcmoe's files are replaced; a file or a
  symlink target is refused; an interrupt at any step leaves the old or the new directory.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lcmoe.emit.launchers import LaunchSettings, nemo_run_script, override_args, slurm_script
from lcmoe.errors import LcmoeError
from tests.conftest import run_cli
from tests.helpers import make_run, write_hf_config

MARKER = "lcmoe_injected_marker"
PAYLOADS = [
    f"x\ntouch {MARKER}",
    f"x\rtouch {MARKER}",
    f"x'; touch {MARKER}; echo '",
    f"$(touch {MARKER})",
    f"`touch {MARKER}`",
    f"x\u2028touch {MARKER}",
]
# A fast request (dense Llama 3 8B, ~1 s) for what does not depend on the model; the MoE launchers'
# arguments (layouts with '|' and '*', {…} precision mappings, […] lists) are checked on make_run().
SMALL = ["--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq-len", "4k", "--top", "1", "-q"]


def _stub_bin(tmp: Path) -> Path:
    """A folder with ``srun`` printing one argument per line (NUL-free) and exiting 0."""
    folder = tmp / "stub-bin"
    folder.mkdir(exist_ok=True)
    srun = folder / "srun"
    srun.write_text('#!/bin/bash\nfor a in "$@"; do printf "%s\\0" "$a"; done\n', encoding="utf-8")
    srun.chmod(0o755)
    return folder


def _run_shell(path: Path, tmp: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    environ = {"PATH": f"{_stub_bin(tmp)}:/usr/bin:/bin", "HOME": str(tmp), **(env or {})}
    return subprocess.run(["bash", str(path)], cwd=tmp, env=environ, capture_output=True, timeout=60, check=False)


def _emit(tmp: Path, *extra: str, target: str = "out") -> tuple[int, str, str]:
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        return run_cli("plan", *SMALL, "--emit", target, *extra)
    finally:
        os.chdir(cwd)


# -- injection ------------------------------------------------------------------------------------


def _assert_inert(tmp: Path, out: Path) -> None:
    for shell in out.rglob("*.sbatch"):
        assert subprocess.run(["bash", "-n", str(shell)], check=False).returncode == 0, shell
        _run_shell(shell, tmp)
    assert not list(tmp.rglob(MARKER)), "an injected command ran"
    for py in out.rglob("*.py"):
        ast.parse(py.read_text(encoding="utf-8"))  # still one valid Python file


@pytest.mark.parametrize("option", ["--job-name", "--account", "--partition", "--time-limit", "--container", "--mount"])
@pytest.mark.parametrize("payload", PAYLOADS)
def test_cli_launcher_values_never_become_commands(tmp_path: Path, option: str, payload: str) -> None:
    code, _, err = _emit(tmp_path, option, payload)
    assert "Traceback" not in err
    if code == 2:  # refused: one sentence naming the option, nothing written
        assert option in err and not (tmp_path / "out").exists()
    else:
        assert code == 0, err
        _assert_inert(tmp_path, tmp_path / "out")


@pytest.mark.parametrize("payload", PAYLOADS[:3])
def test_model_yaml_name_never_becomes_a_command(tmp_path: Path, payload: str) -> None:
    from lcmoe.catalog import _catalog_files

    text = _catalog_files("models")["llama3-8b"]
    lines = [f"name: {json.dumps(payload)}" if line.startswith("name:") else line for line in text.splitlines()]
    (tmp_path / "m.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    args = ["--model", "m.yaml", *SMALL[2:]]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, _, err = run_cli("plan", *args, "--emit", "out")
    finally:
        os.chdir(cwd)
    assert "Traceback" not in err
    assert code in (0, 2), err
    if code == 0:
        _assert_inert(tmp_path, tmp_path / "out")
        assert "\n" not in (tmp_path / "out" / "RUN.md").read_text(encoding="utf-8").splitlines()[0]


def test_hf_config_directory_name_never_becomes_a_command(tmp_path: Path) -> None:
    folder = tmp_path / f"evil\ntouch {MARKER}"
    write_hf_config(folder)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code, _, err = run_cli("plan", "--model", str(folder / "config.json"), *SMALL[2:], "--emit", "out")
    finally:
        os.chdir(cwd)
    assert "Traceback" not in err and code in (0, 2), err
    if code == 0:
        _assert_inert(tmp_path, tmp_path / "out")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("job_name", "a\nb"),
        ("account", "a b"),
        ("partition", "p;q"),
        ("time_limit", "4h"),
        ("container_image", "img name"),
        ("pip_index_url", "https://x\n"),
        ("recipe", "os; import os"),
    ],
)
def test_launch_settings_are_refused_or_reduced(field: str, value: str) -> None:
    settings = LaunchSettings(**{field: value})
    if field == "job_name":  # free text: reduced to a safe word
        assert "#SBATCH --job-name=a-b\n" in slurm_script(make_run(), settings)
        return
    with pytest.raises(LcmoeError):
        slurm_script(make_run(), settings)
    with pytest.raises(LcmoeError):
        nemo_run_script(make_run(), settings)


def test_control_characters_in_the_environment_are_refused() -> None:
    with pytest.raises(LcmoeError, match="control character"):
        slurm_script(make_run(), LaunchSettings(extra_env={"HF_ENDPOINT": "https://m\ntouch x"}))
    with pytest.raises(LcmoeError, match="environment variable name"):
        slurm_script(make_run(), LaunchSettings(extra_env={"A;B": "1"}))


# -- the launchers carry the plan intact ------------------------------------------------------------


def _srun_argv(tmp: Path, sbatch: Path) -> list[str]:
    result = _run_shell(sbatch, tmp)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode().split("\0")[:-1]


def test_stub_srun_receives_every_argument_intact(tmp_path: Path) -> None:
    run = make_run()  # DeepSeek-V3 128K: pipeline layout with '|' and '*', a {…} precision mapping, […] lists
    settings = LaunchSettings(data_paths=("/data/a_text_document", "/data/b_text_document"))
    sbatch = tmp_path / "launch.sbatch"
    sbatch.write_text(slurm_script(run, settings), encoding="utf-8")
    argv = _srun_argv(tmp_path, sbatch)
    start = argv.index("python")
    assert argv[:start] == [
        "--mpi=pmix",
        "--container-image=nvcr.io/nvidia/nemo:26.08",
        "--container-workdir=/opt/Megatron-Bridge",
    ]
    expected = ["python", settings.run_script, "--recipe", settings.recipe, *override_args(run, settings)]
    assert argv[start:] == expected
    assert any(a.startswith("model.pipeline_model_parallel_layout=") and "|" in a for a in expected)
    assert "dataset.data_path=[/data/a_text_document,/data/b_text_document]" in expected


def test_every_emitted_shell_file_parses_and_python_file_compiles(tmp_path: Path) -> None:
    code, _, err = _emit(tmp_path)
    assert code == 0, err
    for path in (tmp_path / "out").rglob("*"):
        if path.suffix == ".sbatch":
            assert subprocess.run(["bash", "-n", str(path)], check=False).returncode == 0
        elif path.suffix == ".py":
            compile(path.read_text(encoding="utf-8"), str(path), "exec")


def test_apply_plan_sets_torch_dtypes(tmp_path: Path) -> None:
    from lcmoe.emit.bridge import python_snippet
    from tests.helpers import with_options

    run = with_options(make_run(), main_grads_dtype="bf16", exp_avg_dtype="bf16", precision_aware=True)
    text = python_snippet(run, "deepseek_v3_pretrain_config")
    assert "cfg.optimizer.main_grads_dtype = torch.bfloat16" in text
    assert "cfg.optimizer.exp_avg_dtype = torch.bfloat16" in text
    assert "= 'bf16'" not in text and "= 'fp32'" not in text


def test_recipe_per_gpu_comes_from_the_catalog() -> None:
    from lcmoe.catalog import load_hardware, load_model
    from lcmoe.config_io.bridge import recipe_for
    from lcmoe.workload import TrainingOptions

    glm, opts = load_model("glm-5.2"), TrainingOptions(seq_len=4096)
    assert recipe_for(glm, opts, load_hardware("gb200")) == "glm52_pretrain_192gpu_gb200_bf16_config"
    assert recipe_for(glm, opts, load_hardware("h100")) == "glm52_pretrain_416gpu_h100_bf16_config"


def test_mock_data_is_said_and_data_path_is_passed(tmp_path: Path) -> None:
    code, _, err = _emit(tmp_path)
    assert code == 0
    assert "mock data" in (tmp_path / "out" / "RUN.md").read_text(encoding="utf-8")
    code, _, err = _emit(tmp_path, "--data-path", "/lustre/data/text_document", target="out2")
    assert code == 0, err
    sbatch = (tmp_path / "out2" / "launch.sbatch").read_text(encoding="utf-8")
    assert "dataset.data_path=[/lustre/data/text_document]" in sbatch
    code, _, err = _emit(tmp_path, "--data-path", "/a b", target="out3")
    assert code == 2 and "--data-path" in err


def test_hf_settings_are_forwarded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "https://hf-mirror.example")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, _, err = _emit(tmp_path)
    assert code == 0, err
    sbatch = (tmp_path / "out" / "launch.sbatch").read_text(encoding="utf-8")
    assert "export HF_ENDPOINT=https://hf-mirror.example" in sbatch and "export HF_HUB_OFFLINE=1" in sbatch
    assert "'HF_ENDPOINT': 'https://hf-mirror.example'" in (tmp_path / "out" / "nemo_run_launch.py").read_text()


NEMO_RUN_PYTHON = os.environ.get("LCMOE_NEMO_RUN_PYTHON")


@pytest.mark.skipif(not NEMO_RUN_PYTHON and not os.environ.get("CI"), reason="LCMOE_NEMO_RUN_PYTHON (nemo-run) not set")
def test_real_nemo_run_dry_run_reaches_run_recipe_intact(tmp_path: Path) -> None:
    assert NEMO_RUN_PYTHON, "CI must build the nemo-run interpreter (.ci/run) and set LCMOE_NEMO_RUN_PYTHON"
    run = make_run()
    settings = LaunchSettings(account="acct", partition="batch", data_paths=("/data/x_text_document",))
    launcher = tmp_path / "nemo_run_launch.py"
    launcher.write_text(nemo_run_script(run, settings), encoding="utf-8")
    here = Path(__file__).resolve().parent
    result = subprocess.run(
        [NEMO_RUN_PYTHON, str(here / "nemo_run_dry.py"), str(launcher)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sbatch_text = result.stdout.split("=====SBATCH=====\n", 1)[1]
    srun_line = next(line for line in sbatch_text.splitlines() if "run_recipe.py" in line)
    stub = tmp_path / "command.sh"
    stub.write_text(srun_line.split(" & pids")[0] + "\n", encoding="utf-8")
    argv = _srun_argv(tmp_path, stub)
    start = argv.index("python")
    expected = ["python", settings.run_script, "--recipe", settings.recipe, *override_args(run, settings)]
    assert argv[start:] == expected
    assert "--mpi=pmix" in argv[:start]
    assert not list(tmp_path.rglob(MARKER))


def test_nemo_run_launcher_under_a_stub_executor_runs_nothing_injected(tmp_path: Path) -> None:
    """With a stub ``nemo_run`` module, the launcher only builds objects: the arguments it hands to
    run.Script are the overrides, each shell-quoted once, and no injected command runs."""
    stub = tmp_path / "stubs" / "nemo_run"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "import json, os\n"
        "class _Rec:\n"
        "    def __init__(self, *a, **k): self.kwargs = k\n"
        "SlurmExecutor = Script = LocalTunnel = Packager = _Rec\n"
        "def run(script, executor, name):\n"
        "    json.dump({'args': script.kwargs['args'], 'name': name}, open(os.environ['OUT'], 'w'))\n",
        encoding="utf-8",
    )
    settings = LaunchSettings(account="acct", job_name=f"j\ntouch {MARKER}")
    launcher = tmp_path / "nemo_run_launch.py"
    launcher.write_text(nemo_run_script(make_run(), settings), encoding="utf-8")
    out = tmp_path / "recorded.json"
    env = {"PYTHONPATH": str(stub.parent), "OUT": str(out), "PATH": os.environ.get("PATH", "")}
    result = subprocess.run([sys.executable, str(launcher)], cwd=tmp_path, env=env, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr.decode()
    recorded: dict[str, Any] = json.loads(out.read_text())
    import shlex

    assert [shlex.split(a)[0] for a in recorded["args"]][2:] == override_args(make_run())
    assert "\n" not in recorded["name"] and not list(tmp_path.rglob(MARKER))


# -- --emit never destroys --------------------------------------------------------------------------


def test_existing_directory_with_a_user_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_text("mine", encoding="utf-8")
    code, _, err = _emit(tmp_path)
    assert code == 2 and "not empty" in err and "--force" in err
    assert [p.name for p in target.iterdir()] == ["notes.txt"]


def test_force_replaces_only_lcmoe_files(tmp_path: Path) -> None:
    assert _emit(tmp_path)[0] == 0
    target = tmp_path / "out"
    (target / "notes.txt").write_text("mine", encoding="utf-8")
    (target / "fallback" / "mine.cfg").write_text("also mine", encoding="utf-8")
    before = (target / "plan.json").read_text(encoding="utf-8")
    code, _, err = _emit(tmp_path, "--force", "--steps", "7")
    assert code == 0, err
    assert (target / "notes.txt").read_text(encoding="utf-8") == "mine"
    assert (target / "fallback" / "mine.cfg").read_text(encoding="utf-8") == "also mine"
    after = json.loads((target / "plan.json").read_text(encoding="utf-8"))
    assert after["steps"] == 7 and before != (target / "plan.json").read_text(encoding="utf-8")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "stub-bin") == ["out"]


def test_force_refuses_an_edited_lcmoe_file_and_a_clashing_user_file(tmp_path: Path) -> None:
    assert _emit(tmp_path)[0] == 0
    target = tmp_path / "out"
    (target / "launch.sbatch").write_text("#!/bin/bash\n# my edits\n", encoding="utf-8")
    code, _, err = _emit(tmp_path, "--force")
    assert code == 2 and "edited" in err
    assert (target / "launch.sbatch").read_text(encoding="utf-8") == "#!/bin/bash\n# my edits\n"
    other = tmp_path / "other"
    other.mkdir()
    (other / "RUN.md").write_text("my runbook", encoding="utf-8")
    code, _, err = _emit(tmp_path, "--force", target="other")
    assert code == 2 and "RUN.md" in err and (other / "RUN.md").read_text(encoding="utf-8") == "my runbook"


@pytest.mark.parametrize("kind", ["file", "symlink", "dot", "empty", "under-file"])
def test_bad_targets_are_refused(tmp_path: Path, kind: str) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "afile").write_text("data", encoding="utf-8")
    target = {"file": "afile", "symlink": "link", "dot": ".", "empty": "", "under-file": "afile/sub"}[kind]
    if kind == "symlink":
        (tmp_path / "link").symlink_to(tmp_path / "real")
    code, _, err = _emit(tmp_path, target=target)
    assert code == 2 and "Traceback" not in err and "--emit" in err
    assert (tmp_path / "afile").read_text(encoding="utf-8") == "data"
    assert list((tmp_path / "real").iterdir()) == []


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class _Boom(KeyboardInterrupt):
    pass


@pytest.mark.parametrize("existing", [False, True])
def test_interrupt_at_every_step_leaves_old_or_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool
) -> None:
    """Raise KeyboardInterrupt at the k-th filesystem call of a write, for every k: the target is
    then exactly the old tree or exactly the new one, and nothing else is left beside it."""
    from lcmoe.emit import directory

    target = tmp_path / "out"
    old_files = {"plan.json": "old plan\n", "fallback/launch.sbatch": "old\n"}
    new_files = {"plan.json": "new plan\n", "launch.sbatch": "#!/bin/bash\n", "fallback/launch.sbatch": "new\n"}
    names = ["replace", "link", "mkdir", "write_bytes", "write_text", "rmtree", "chmod"]
    state = {"k": 0, "n": 0}

    def counting(original: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            state["n"] += 1
            if state["n"] == state["k"]:
                raise _Boom
            return original(*args, **kwargs)

        return wrapper

    while True:
        k = state["k"]
        shutil.rmtree(target, ignore_errors=True)
        if existing:
            directory.install_files(target, old_files)
            (target / "user.txt").write_text("keep me", encoding="utf-8")
        old_tree = _tree(target) if existing else None
        state["n"] = 0
        with monkeypatch.context() as patch:
            for name in names:
                for owner in (directory.os, directory.shutil, Path):
                    if hasattr(owner, name) and not (owner is directory.shutil and name != "rmtree"):
                        patch.setattr(owner, name, counting(getattr(owner, name)))
            try:
                directory.install_files(target, new_files, force=True)
                finished = True
            except _Boom:
                finished = False
        directory.recover(target)  # what the next write does first
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != "out"]
        assert leftovers == [], (k, leftovers)
        tree = _tree(target) if target.exists() else None
        new_tree = {**{k2: v.encode() for k2, v in new_files.items()}}
        if existing:
            new_tree["user.txt"] = b"keep me"
        if tree is not None:
            tree.pop(directory.MANIFEST, None)
        if old_tree is not None:
            old_tree.pop(directory.MANIFEST, None)
        assert tree in (old_tree, new_tree), (k, tree)
        if finished and k > 0:
            break
        state["k"] = k + 1
        assert k < 200


def test_written_files_are_listed(tmp_path: Path) -> None:
    code, _, err = run_cli("plan", *SMALL[:-1], "--emit", str(tmp_path / "out"))
    assert code == 0, err
    assert f"wrote {tmp_path / 'out'}: " in err and "launch.sbatch" in err and "mock data" in err
    manifest = json.loads((tmp_path / "out" / ".lcmoe-manifest.json").read_text(encoding="utf-8"))
    assert "fallback/launch.sbatch" in manifest["files"]
    mode = (tmp_path / "out").stat().st_mode
    assert stat.S_ISDIR(mode)
