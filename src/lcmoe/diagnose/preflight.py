"""Is this node ready for the plan? Versions, GPUs, dispatcher packages and environment.

Probes (``probe_node``) are the only I/O: package metadata, ``nvidia-smi`` and a short ``python
-c`` that imports torch / deep_ep in a subprocess (so a broken CUDA install or a crashing
extension cannot take lcmoe down, and a hang is cut by a timeout). ``checks`` is a pure function
of the probed ``NodeFacts`` and the plan, so it is tested with injected facts on machines without
GPUs. Each check is pass / warn / fail with a fix; the exit code is the worst (0 / 1 / 2)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from lcmoe.emit.environment import environment
from lcmoe.rules.context_parallel import MIN_TE_CP_COMM_TYPE, MIN_TE_HIERARCHICAL_CP
from lcmoe.rules.legality import version_tuple, violations
from lcmoe.run import RunConfig

PROBE_TIMEOUT_S = 60
STATUS_CODE = {"pass": 0, "warn": 1, "fail": 2}
# Distribution names as pip spells them, first found wins.
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "transformer-engine": ("transformer_engine", "transformer-engine", "transformer_engine_torch"),
    "megatron-core": ("megatron-core", "megatron_core"),
    "megatron-bridge": ("megatron-bridge", "megatron_bridge"),
    "deep-ep": ("deep_ep", "deep-ep"),
}
MIN_PYTHON = (3, 10)  # megatron-core 0.16; 0.17+ and megatron-bridge 0.4+ need 3.12 (dependencies.md §1)


@dataclass(frozen=True, slots=True)
class GpuInfo:
    name: str
    memory_bytes: float


@dataclass(frozen=True, slots=True)
class NodeFacts:
    python: tuple[int, int, int]
    packages: dict[str, str | None]
    gpus: tuple[GpuInfo, ...] = ()
    gpu_probe: str = "not probed"  # how the GPUs were found, or why not
    driver_version: str | None = None
    cuda_version: str | None = None  # torch.version.cuda
    nccl_version: str | None = None
    deep_ep_buffer: bool = False  # deep_ep.Buffer (fused_a2a.py:9)
    hybrid_ep_buffer: bool = False  # deep_ep.HybridEPBuffer (fused_a2a.py:269)
    deep_ep_error: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: str  # pass | warn | fail
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"check": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


def worst_exit_code(results: list[Check]) -> int:
    return max((STATUS_CODE[c.status] for c in results), default=0)


def _gpu_matches(hardware_name: str, gpu_name: str) -> bool:
    return re.search(rf"(?<![a-z0-9]){re.escape(hardware_name.lower())}(?![a-z0-9])", gpu_name.lower()) is not None


def checks(facts: NodeFacts, run: RunConfig | None = None, *, target_megatron_core: str | None = None) -> list[Check]:
    """Every check for ``facts`` (and the plan's ``run`` when given)."""
    mcore = facts.packages.get("megatron-core")
    out = [
        _python_check(facts),
        _torch_check(facts),
        _nccl_check(facts),
        _gpu_check(facts, run),
        _transformer_engine_check(facts, run),
        _megatron_core_check(mcore, target_megatron_core),
        _megatron_bridge_check(facts),
    ]
    if run is not None:
        out += _plan_checks(facts, run, mcore)
    return out


def _python_check(facts: NodeFacts) -> Check:
    py = ".".join(map(str, facts.python))
    if facts.python[:2] < MIN_PYTHON:
        return Check("python", "fail", f"Python {py}", "use Python ≥ 3.10 (3.12 for megatron-core ≥ 0.17)")
    if facts.python[:2] < (3, 12):
        return Check(
            "python",
            "warn",
            f"Python {py}: megatron-core ≤ 0.16.1 and megatron-bridge ≤ 0.3.1 only",
            "use the NeMo / PyTorch container's Python 3.12",
        )
    return Check("python", "pass", f"Python {py}")


def _torch_check(facts: NodeFacts) -> Check:
    torch = facts.packages.get("torch")
    if torch is None:
        return Check("torch", "fail", "torch is not installed", "run inside the training container")
    if facts.cuda_version is None:
        return Check(
            "torch",
            "fail",
            f"torch {torch} is a CPU build (torch.version.cuda is None)",
            "install the CUDA build of torch (the training container has it)",
        )
    return Check("torch", "pass", f"torch {torch}, CUDA {facts.cuda_version}")


def _nccl_check(facts: NodeFacts) -> Check:
    if facts.nccl_version:
        return Check("nccl", "pass", f"NCCL {facts.nccl_version}")
    return Check(
        "nccl", "warn", "NCCL version unknown (torch.cuda.nccl not available)", "use a CUDA build of torch with NCCL"
    )


def _te_cp_check(te: str, run: RunConfig | None) -> Check:
    """Transformer Engine is there; a plan's CP exchange needs TE ≥ 1.10 to reach TE at all (older
    TE runs every CP layer as the p2p ring) and a2a+p2p TE ≥ 1.12 (mcore
    extensions/transformer_engine.py:1869-1876)."""
    lay = run.layout if run is not None else None
    if lay is not None and lay.cp > 1 and lay.cp_comm_type != "p2p":
        need = MIN_TE_HIERARCHICAL_CP if lay.cp_comm_type == "a2a+p2p" else MIN_TE_CP_COMM_TYPE
        if version_tuple(te) < version_tuple(need):
            return Check(
                "transformer-engine",
                "fail",
                f"Transformer Engine {te} is older than {need}, which cp_comm_type {lay.cp_comm_type} needs",
                f"pip install 'transformer_engine[pytorch]>={need}' (or use the NeMo container)",
            )
    return Check("transformer-engine", "pass", f"Transformer Engine {te}")


def _transformer_engine_check(facts: NodeFacts, run: RunConfig | None) -> Check:
    """Transformer Engine: needed for FP8 plans, expected everywhere else."""
    te = facts.packages.get("transformer-engine")
    if te:
        return _te_cp_check(te, run)
    needs_te = run is not None and run.options.is_fp8
    return Check(
        "transformer-engine",
        "fail" if needs_te else "warn",
        "Transformer Engine is not installed",
        "pip install transformer_engine[pytorch] (or use the NeMo container)",
    )


def _megatron_core_check(mcore: str | None, target: str | None) -> Check:
    """megatron-core installed, and not older than the release the plan targets."""
    if mcore is None:
        return Check("megatron-core", "fail", "megatron-core is not installed", "pip install megatron-core")
    if target and version_tuple(mcore) < version_tuple(target):
        return Check(
            "megatron-core",
            "warn",
            f"megatron-core {mcore} is older than the plan's {target}",
            f"pip install 'megatron-core>={target}' or re-plan with --megatron-core-version {mcore}",
        )
    return Check("megatron-core", "pass", f"megatron-core {mcore}")


def _megatron_bridge_check(facts: NodeFacts) -> Check:
    bridge = facts.packages.get("megatron-bridge")
    if bridge:
        return Check("megatron-bridge", "pass", f"megatron-bridge {bridge}")
    return Check(
        "megatron-bridge",
        "warn",
        "megatron-bridge is not installed (needed for the emitted Bridge config)",
        "pip install megatron-bridge, or launch with megatron_lm_args.txt",
    )


def _gpu_check(facts: NodeFacts, run: RunConfig | None) -> Check:
    if not facts.gpus:
        return Check(
            "gpus",
            "fail",
            f"no GPU visible ({facts.gpu_probe})",
            "run preflight on a GPU node (srun --gres=gpu:8 …) with the driver loaded",
        )
    names = sorted({g.name for g in facts.gpus})
    detail = f"{len(facts.gpus)} × {', '.join(names)}" + (
        f", driver {facts.driver_version}" if facts.driver_version else ""
    )
    if run is None:
        return Check("gpus", "pass", detail)
    hw = run.hardware
    if not all(_gpu_matches(hw.name, g.name) for g in facts.gpus):
        return Check("gpus", "warn", f"{detail}; the plan is for {hw.name}", f"re-plan with --gpu for {names[0]}")
    if len(facts.gpus) < min(hw.gpus_per_node, run.num_gpus):
        return Check(
            "gpus",
            "fail",
            f"{detail}; the plan needs {hw.gpus_per_node} per node",
            "request a full node or re-plan with --gpus-per-node",
        )
    smallest = min(g.memory_bytes for g in facts.gpus)
    if smallest < 0.97 * hw.hbm_bytes:
        return Check(
            "gpus",
            "fail",
            f"{detail}; {smallest / 1024**3:.1f} GiB per GPU, the plan assumes {hw.hbm_bytes / 1024**3:.1f} GiB",
            "re-plan with --hardware-file for this GPU, or free the GPUs (MIG? other processes?)",
        )
    return Check("gpus", "pass", detail)


# dispatcher → (its NodeFacts flag, name, the class Megatron imports (fused_a2a.py:9 / :269),
# why when absent, fix)
_DISPATCHER_PACKAGES = {
    "deepep": (
        "deep_ep_buffer",
        "DeepEP",
        "deep_ep.Buffer",
        "deep_ep not installed",
        "install DeepEP in the container, or re-plan with --dispatchers alltoall",
    ),
    "hybridep": (
        "hybrid_ep_buffer",
        "HybridEP",
        "deep_ep.HybridEPBuffer",
        "deep_ep without HybridEP",
        "install DeepEP's hybrid-ep build, or re-plan with --dispatchers alltoall",
    ),
}


def _plan_checks(facts: NodeFacts, run: RunConfig, mcore: str | None) -> list[Check]:
    out: list[Check] = []
    dispatcher = run.options.dispatcher if run.model.is_moe else "none"
    package = _DISPATCHER_PACKAGES.get(dispatcher)
    if package is None:
        out.append(Check("dispatcher", "pass", f"{dispatcher}: built into megatron-core"))
    else:
        flag, label, symbol, missing, fix = package
        if getattr(facts, flag):
            out.append(Check("dispatcher", "pass", f"{symbol} imports"))
        else:
            why = facts.deep_ep_error or missing
            out.append(Check("dispatcher", "fail", f"the plan uses {label} but {symbol} does not import ({why})", fix))
    for name, (value, reason) in environment(run).items():
        have = facts.env.get(name)
        if have == value:
            out.append(Check(f"env {name}", "pass", f"{name}={value}"))
        else:
            now = "unset" if have is None else f"is {have!r}"
            out.append(
                Check(
                    f"env {name}",
                    "warn",
                    f"{name} {now}; the plan wants {value} ({reason})",
                    f"export {name}={value} (launch.sbatch sets it)",
                )
            )
    if mcore:
        broken = violations(run, megatron_core_version=mcore)
        out.append(
            Check("megatron-core rules", "fail", f"with megatron-core {mcore}: {broken[0].message}", broken[0].fix)
            if broken
            else Check("megatron-core rules", "pass", f"the plan is legal for megatron-core {mcore}")
        )
    return out


# ----- probes (I/O) ---------------------------------------------------------------------------
_TORCH_PROBE = """
import json
out = {}
try:
    import torch
    out["cuda"] = torch.version.cuda
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else None
    except Exception as exc:
        out["nccl_error"] = type(exc).__name__
    if torch.cuda.is_available():
        out["gpus"] = [[torch.cuda.get_device_name(i), torch.cuda.get_device_properties(i).total_memory]
                       for i in range(torch.cuda.device_count())]
except Exception as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)[:200]
print(json.dumps(out))
"""
_DEEP_EP_PROBE = """
import json
try:
    import deep_ep
    print(json.dumps({"buffer": hasattr(deep_ep, "Buffer"), "hybrid": hasattr(deep_ep, "HybridEPBuffer")}))
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__ + ": " + str(exc)[:200]}))
"""

Runner = Callable[[list[str]], tuple[int, str]]


def probe_environment() -> dict[str, str]:
    """The environment a probe runs in: this one without the variables that make Python import
    from elsewhere (PYTHONPATH, PYTHONSTARTUP, PYTHONHOME, …); CUDA_*, NCCL_*, LD_LIBRARY_PATH
    and PATH stay, since they decide what torch and nvidia-smi see."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def run_command(argv: list[str]) -> tuple[int, str]:
    """(exit code, stdout) of a probe; 127 when the program is missing, 124 on timeout. Probes
    run isolated: from the filesystem root (nothing of the current directory on any path), in
    ``probe_environment()``, with a Python probe in isolated mode (``python -I``)."""
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_S,
            check=False,
            cwd=os.path.abspath(os.sep),
            env=probe_environment(),
            stdin=subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return 127, ""
    except subprocess.TimeoutExpired:
        return 124, ""
    except OSError:
        return 126, ""
    return done.returncode, done.stdout


def _json_probe(runner: Runner, code: str) -> dict[str, object]:
    # -I: isolated mode, neither the current directory nor PYTHON* variables nor user site on
    # sys.path, so a torch.py lying in the working directory is never what gets imported.
    rc, out = runner([sys.executable, "-I", "-c", code])
    if rc != 0:
        return {"error": f"probe exited {rc}"}
    try:
        data = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    except (json.JSONDecodeError, IndexError):
        return {"error": "probe printed no JSON"}
    return data if isinstance(data, dict) else {}


def _package_version(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def probe_node(runner: Runner = run_command, env: Mapping[str, str] | None = None) -> NodeFacts:
    """Probe this machine. Every failure becomes a fact, never an exception."""
    packages = {key: _package_version(names) for key, names in DISTRIBUTIONS.items()}
    gpus: list[GpuInfo] = []
    driver = None
    rc, out = runner(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"])
    if rc == 0 and out.strip():
        for row in out.strip().splitlines():
            parts = [p.strip() for p in row.split(",")]
            if len(parts) >= 3:
                try:
                    gpus.append(GpuInfo(parts[0], float(parts[1]) * 1024**2))
                    driver = parts[2]
                except ValueError:
                    continue
        gpu_probe = "nvidia-smi"
    else:
        gpu_probe = "nvidia-smi not found" if rc == 127 else f"nvidia-smi exited {rc}"
    torch_facts = _json_probe(runner, _TORCH_PROBE) if packages["torch"] else {}
    torch_gpus = torch_facts.get("gpus")
    if not gpus and isinstance(torch_gpus, list):
        gpus = [GpuInfo(str(n), float(m)) for n, m in torch_gpus]
        gpu_probe = "torch.cuda"
    elif not gpus and packages["torch"]:
        gpu_probe += "; torch.cuda sees none"
    deep: dict[str, object] = {}
    if importlib.util.find_spec("deep_ep") is not None:
        deep = _json_probe(runner, _DEEP_EP_PROBE)
    cuda = torch_facts.get("cuda")
    nccl = torch_facts.get("nccl")
    return NodeFacts(
        python=(sys.version_info.major, sys.version_info.minor, sys.version_info.micro),
        packages=packages,
        gpus=tuple(gpus),
        gpu_probe=gpu_probe,
        driver_version=driver,
        cuda_version=str(cuda) if cuda else None,
        nccl_version=str(nccl) if nccl else None,
        deep_ep_buffer=bool(deep.get("buffer")),
        hybrid_ep_buffer=bool(deep.get("hybrid")),
        deep_ep_error=str(deep["error"]) if "error" in deep else (None if deep else "deep_ep not installed"),
        env=dict(os.environ if env is None else env),
    )
