"""preflight with injected node facts (and for real on this GPU-less machine); calibrate from
measured logs and use the calibration in estimate / plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lcmoe.diagnose.preflight import GpuInfo, NodeFacts, checks, probe_node, worst_exit_code
from lcmoe.emit.megatron_lm import megatron_lm_args
from lcmoe.estimate.calibration import MeasuredRun, calibrate, load_calibration
from lcmoe.estimate.time import estimate_time
from tests import log_fixtures as lf
from tests.conftest import run_cli
from tests.helpers import make_run

GIB = 1024.0**3
GOOD_PACKAGES: dict[str, str | None] = {
    "torch": "2.9.0",
    "transformer-engine": "2.8.0",
    "megatron-core": "0.19.2",
    "megatron-bridge": "0.6.2",
    "deep-ep": "1.2.1",
}


def _node(**changes: object) -> NodeFacts:
    facts: dict[str, object] = {
        "python": (3, 12, 3),
        "packages": dict(GOOD_PACKAGES),
        "gpus": tuple(GpuInfo("NVIDIA H100 80GB HBM3", 81559 * 1024**2) for _ in range(8)),
        "gpu_probe": "nvidia-smi",
        "driver_version": "580.65",
        "cuda_version": "13.0",
        "nccl_version": "2.27.7",
        "deep_ep_buffer": True,
        "hybrid_ep_buffer": False,
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
    }
    facts.update(changes)
    return NodeFacts(**facts)  # type: ignore[arg-type]


def _by_name(results: list) -> dict[str, str]:  # type: ignore[type-arg]
    return {c.name: c.status for c in results}


def test_ready_node_passes_a_deepep_plan() -> None:
    run = make_run(dispatcher="deepep")
    results = checks(_node(), run, target_megatron_core="0.19.2")
    assert worst_exit_code(results) == 0, [c for c in results if c.status != "pass"]


def test_missing_gpu_fails_with_a_fix() -> None:
    results = checks(_node(gpus=(), gpu_probe="nvidia-smi not found", cuda_version=None, nccl_version=None))
    status = _by_name(results)
    assert status["gpus"] == "fail" and status["torch"] == "fail"
    assert worst_exit_code(results) == 2
    gpu = next(c for c in results if c.name == "gpus")
    assert "no GPU visible" in gpu.detail and gpu.fix


def test_plan_specific_failures() -> None:
    hybrid = make_run("qwen3-235b-a22b", "gb200", tp=4, cp=4, ep=32, pp=4, vpp=12, gpus=128, dispatcher="hybridep")
    status = _by_name(checks(_node(), hybrid))
    assert status["dispatcher"] == "fail"  # deep_ep without HybridEPBuffer
    assert status["gpus"] == "warn"  # H100s, plan for GB200
    assert status["env NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN"] == "warn"
    small = _node(gpus=tuple(GpuInfo("NVIDIA H100 PCIe", 40 * GIB) for _ in range(8)))
    assert _by_name(checks(small, make_run()))["gpus"] == "fail"
    old = _node(packages={**GOOD_PACKAGES, "megatron-core": "0.15.0"})
    assert _by_name(checks(old, make_run(), target_megatron_core="0.19.2"))["megatron-core"] == "warn"
    fp8 = make_run(precision="fp8-blockwise")
    no_te = _node(packages={**GOOD_PACKAGES, "transformer-engine": None})
    assert _by_name(checks(no_te, fp8))["transformer-engine"] == "fail"


def test_probe_survives_missing_and_hanging_tools() -> None:
    calls: list[list[str]] = []

    def runner(argv: list[str]) -> tuple[int, str]:
        calls.append(argv)
        return (127, "") if argv[0] == "nvidia-smi" else (124, "")

    facts = probe_node(runner, env={})
    assert facts.gpus == () and "nvidia-smi not found" in facts.gpu_probe
    assert calls[0][0] == "nvidia-smi"


def test_probe_reads_nvidia_smi() -> None:
    def runner(argv: list[str]) -> tuple[int, str]:
        if argv[0] == "nvidia-smi":
            return 0, "NVIDIA H200, 143771, 580.65\nNVIDIA H200, 143771, 580.65\n"
        return 0, json.dumps({"cuda": "13.0", "nccl": "2.27.7"}) + "\n"

    facts = probe_node(runner, env={})
    assert len(facts.gpus) == 2 and facts.gpus[0].memory_bytes == pytest.approx(143771 * 1024**2)
    assert facts.driver_version == "580.65"


def test_preflight_cli_on_this_machine_reports_the_missing_gpu() -> None:
    """Acceptance: on a CI machine without GPUs, a failure with a clear message and exit code 2."""
    code, out, err = run_cli("preflight", "--json")
    assert "Traceback" not in out + err
    doc = json.loads(out)
    gpu = next(c for c in doc["checks"] if c["check"] == "gpus")
    if gpu["status"] == "pass":
        pytest.skip("this machine has a GPU")
    assert gpu["status"] == "fail" and "no GPU visible" in gpu["detail"]
    assert code == doc["exit_code"] == 2


# ----- calibrate -------------------------------------------------------------------------------
def test_calibration_moves_toward_the_measurements() -> None:
    runs = [
        make_run("qwen3-30b-a3b", seq_len=16384, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16, gbs=64),
        make_run("qwen3-30b-a3b", seq_len=65536, tp=2, cp=4, ep=8, pp=1, vpp=1, gpus=32, gbs=32),
    ]
    measured = [MeasuredRun(r, 1.25 * estimate_time(r).step_seconds) for r in runs]
    one = calibrate(measured[:1])
    assert set(one.scales) == {"compute", "communication"} and one.scales["compute"] == one.scales["communication"]
    assert one.scales["compute"] < 1 and one.mape_after < one.mape_before
    many = calibrate(measured * 10)
    assert many.mape_after < one.mape_after  # more evidence, less shrinkage toward the shipped fit


def test_calibration_never_exceeds_the_ceilings() -> None:
    run = make_run("qwen3-30b-a3b", seq_len=16384, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16, gbs=64)
    fast = calibrate([MeasuredRun(run, 0.2 * estimate_time(run).step_seconds)] * 50)
    assert fast.coefficients.attention_efficiency <= 0.75
    assert fast.coefficients.gemm_efficiency_bf16 <= 0.82


def test_calibrate_cli_writes_a_file_estimate_uses(tmp_path: Path) -> None:
    run = make_run("qwen3-30b-a3b", seq_len=16384, tp=1, cp=2, ep=8, pp=1, vpp=1, gpus=16, gbs=64)
    config = tmp_path / "args.txt"
    config.write_text("\n".join(megatron_lm_args(run)), encoding="utf-8")
    slow = 1.3 * estimate_time(run).step_seconds
    log = tmp_path / "run.log"
    log.write_text("\n".join(lf.steady_iterations(30, slow * 1000)), encoding="utf-8")
    out = tmp_path / "cluster.yaml"
    code, _, err = run_cli(
        "calibrate", str(log), "--config", str(config), "--model", "qwen3-30b-a3b", "--gpus", "16", "--out", str(out)
    )
    assert code == 0, err
    calibration = load_calibration(out)
    assert calibration.architecture == "hopper" and calibration.mape_after < calibration.mape_before
    base = [
        "estimate",
        "-m",
        "qwen3-30b-a3b",
        "-n",
        "16",
        "-s",
        "16k",
        "--cp",
        "2",
        "--ep",
        "8",
        "--gbs",
        "64",
        "--precision-aware-optimizer",
        "--json",
    ]
    _, plain, _ = run_cli(*base)
    _, calibrated, _ = run_cli(*base, "--calibration", str(out))
    assert json.loads(calibrated)["time"]["step_seconds"] > json.loads(plain)["time"]["step_seconds"]
    code, _, err = run_cli(
        "estimate", "-m", "qwen3-30b-a3b", "-g", "b200", "-n", "16", "-s", "16k", "--calibration", str(out)
    )
    assert code == 2 and "--calibration" in err and "hopper" in err
    code, _, err = run_cli("plan", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "16k", "--calibration", str(out), "-q")
    assert code == 0, err


def test_calibrate_without_iterations_is_one_sentence(tmp_path: Path) -> None:
    log = tmp_path / "empty.log"
    log.write_text("nothing here\n", encoding="utf-8")
    code, _, err = run_cli("calibrate", str(log), "--out", str(tmp_path / "c.yaml"))
    assert code == 2 and "LOG" in err and not (tmp_path / "c.yaml").exists()
