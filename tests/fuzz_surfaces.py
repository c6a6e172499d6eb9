"""Generated inputs for every surface lcmoe reads, and the invariant each must keep: a result,
or one LcmoeError sentence (exit code 2 at the CLI) — never another exception, a hang or a
broken estimator invariant. Shared by tests/test_robustness.py (small budget, in CI) and
benchmarks/fuzz.py (≥ 10,000 cases per surface)."""

from __future__ import annotations

import io
import json
import math
import os
import resource
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from lcmoe.catalog import load_hardware, load_model, read_yaml_text
from lcmoe.errors import LcmoeError
from lcmoe.specs.hf import SUPPORTED_MODEL_TYPES
from tests.helpers import HF_FAMILY_BASE

CATALOG = Path(__file__).resolve().parent.parent / "src" / "lcmoe" / "catalog"
CASE_SECONDS = 10.0  # the budget: any command on any input <= 10 MB within 10 s ...
CASE_RSS_BYTES = 1024**3  # ... and 1 GB of resident memory (checked as the process's peak)

HOSTILE: st.SearchStrategy[Any] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 2, 3, 7, 64, 10**6, 10**12, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "nan", "inf", "-1", "1e400", "٣", "１２８", "128k", "$(reboot)", "'; rm -rf /", "\x00"]),
    st.lists(st.integers(-3, 3), max_size=4),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    # Issue #31 classes: integers past int()'s 4300-digit limit, digit strings, non-finite floats
    # as text, deep nesting, a long value.
    st.sampled_from([10**400, -(10**400), "9" * 5000, ".inf", "-.inf", ".nan", "true", "false", "x" * 100_000]),
    st.integers(1, 150).map(lambda depth: json.loads("[" * depth + "]" * depth)),
)


@dataclass
class SurfaceReport:
    name: str
    cases: int = 0
    results: int = 0
    errors: int = 0
    failures: list[str] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    slowest_seconds: float = 0.0  # the longest single case (budget: CASE_SECONDS)
    peak_rss_bytes: int = 0  # the process's peak resident memory after the surface (budget: CASE_RSS_BYTES)


class InvariantBroken(AssertionError):
    """An estimator invariant that must hold for every legal input."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"case ran longer than {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def peak_rss_bytes() -> int:
    """This process's peak resident memory (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _mutate(draw: st.DrawFn, base: dict[str, Any], extra_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    data = dict(base)
    keys = sorted(data) + list(extra_keys) + ["unknown_field"]
    for _ in range(draw(st.integers(0, 4))):
        key = draw(st.sampled_from(keys))
        action = draw(st.sampled_from(["drop", "set", "scale"]))
        if action == "drop":
            data.pop(key, None)
        elif action == "set":
            data[key] = draw(HOSTILE)
        elif isinstance(data.get(key), int) and not isinstance(data.get(key), bool):
            data[key] = data[key] * draw(st.sampled_from([0, -1, 2, 3, 1000, 10**9]))
    return data


# ----- surfaces ---------------------------------------------------------------------------------
def _yaml_dicts(kind: str) -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted((CATALOG / kind).glob("*.yaml"))]


HF_BASE: dict[str, Any] = {
    **HF_FAMILY_BASE,
    "model_type": "deepseek_v3",
    "q_lora_rank": 64,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 16,
    "v_head_dim": 32,
    "num_nextn_predict_layers": 1,
}
MODEL_TYPES = (*SUPPORTED_MODEL_TYPES, "bert", "")


@st.composite
def hf_configs(draw: st.DrawFn) -> dict[str, Any]:
    base = dict(HF_BASE, model_type=draw(st.sampled_from(MODEL_TYPES)))
    return _mutate(draw, base)


def use_model(spec: Any) -> None:
    from lcmoe.estimate.flops import flops_per_token
    from lcmoe.estimate.params import count_params

    total = flops_per_token(spec, 4096).total
    if not (math.isfinite(total) and total > 0):
        raise InvariantBroken(f"FLOPs/token {total}")
    count_params(spec)


def attempt_hf_config(data: dict[str, Any]) -> None:
    from lcmoe.specs.hf import model_from_hf_dict

    use_model(model_from_hf_dict(data, name="fuzz"))


@st.composite
def model_yamls(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    data = _mutate(draw, draw(st.sampled_from(_MODEL_DICTS)))
    return yaml.safe_dump(data, allow_unicode=True)


def attempt_model_yaml(text: str) -> None:
    from lcmoe.specs.model import model_from_dict

    use_model(model_from_dict(read_yaml_text(text, origin="fuzz.yaml"), origin="fuzz.yaml"))


@st.composite
def hardware_yamls(draw: st.DrawFn) -> str:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.text(max_size=200))
    return yaml.safe_dump(_mutate(draw, draw(st.sampled_from(_HARDWARE_DICTS))), allow_unicode=True)


def attempt_hardware_yaml(text: str) -> str:
    from lcmoe.run import RunConfig, build_layout
    from lcmoe.specs.hardware import hardware_from_dict
    from lcmoe.workload import TrainingOptions

    hw = hardware_from_dict(read_yaml_text(text, origin="fuzz.yaml"), origin="fuzz.yaml")
    model = load_model("qwen3-30b-a3b")
    run = RunConfig(model, hw, build_layout(model, 8, ep=8), TrainingOptions(seq_len=4096))
    check_estimates(run)
    return "estimated, invariants hold"


TOKEN_WORDS = st.one_of(
    st.text(max_size=12),
    st.from_regex(r"-?[0-9]{0,12}(\.[0-9]{0,3})?([eE][-+]?[0-9]{1,4})?[kKmMgG]?", fullmatch=True),
    HOSTILE.map(str),
)


@st.composite
def cli_numbers(draw: st.DrawFn) -> list[str]:
    seq = draw(TOKEN_WORDS)
    gpus, tp = draw(TOKEN_WORDS), draw(st.sampled_from(["1", "2", "0", "-1", "3", "1e3", "x"]))
    return ["estimate", "-m", "llama3-8b", "-n", gpus, "-s", seq, "--tp", tp, "--quiet"]


def attempt_cli_numbers(argv: list[str]) -> str:
    from lcmoe.units import parse_token_count
    from tests.conftest import run_cli

    try:
        parse_token_count(argv[6])
    except LcmoeError as exc:
        _one_sentence(exc)
    code, out, err = run_cli(*argv)
    if code not in (0, 1, 2) or "Traceback" in out + err:
        raise InvariantBroken(f"exit {code}: {(out + err)[-300:]}")
    if code == 2 and not err.strip():
        raise InvariantBroken("exit 2 without a message")
    return f"exit {code}"


LAYOUT_MODELS = ("qwen3-30b-a3b", "llama3-8b", "gpt-oss-20b", "deepseek-v2-lite", "qwen3-next-80b-a3b", "deepseek-v3")
SIZES = st.one_of(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.integers(-2, 300))


@st.composite
def layouts(draw: st.DrawFn) -> dict[str, Any]:
    """Half hostile sizes, half powers of two that divide the GPU count (mostly legal layouts,
    so the estimator invariants are exercised, not just the refusals)."""
    if draw(st.booleans()):
        gpus = draw(st.sampled_from([8, 16, 64, 256, 1024]))
        pow2 = st.sampled_from([1, 1, 2, 4, 8])
        tp, cp, pp = draw(pow2), draw(pow2), draw(st.sampled_from([1, 1, 2, 4, 8]))
        if gpus % (tp * cp * pp):
            tp = cp = 1
            pp = 1 if gpus % pp else pp
        return {
            "model": draw(st.sampled_from(LAYOUT_MODELS)),
            "gpu": draw(st.sampled_from(["h100", "b200", "gb200", "h200"])),
            "gpus": gpus,
            "seq_len": draw(st.sampled_from([4096, 16384, 65536, 131072])),
            "tp": tp,
            "cp": cp,
            "ep": draw(st.sampled_from([1, 2, 4, 8, 16, 32])),
            "etp": 1,
            "pp": pp,
            "vpp": draw(st.sampled_from([1, 1, 2])) if pp > 1 else 1,
            "mbs": 1,
            "gbs": None,
            "recompute": draw(st.sampled_from(["none", "full", "moe_act", "layernorm,mlp", "moe_act,layernorm"])),
            "precision": draw(st.sampled_from(["bf16", "bf16", "fp8-blockwise", "mxfp8"])),
            "offload": draw(st.sampled_from([0.0, 0.5, 1.0])),
            "dispatcher": draw(st.sampled_from(["alltoall", "allgather", "deepep", "hybridep"])),
            "cp_comm_type": draw(st.sampled_from(["p2p", "a2a"])),
        }
    return {
        "model": draw(st.sampled_from(LAYOUT_MODELS)),
        "gpu": draw(st.sampled_from(["h100", "b200", "gb200", "a100"])),
        "gpus": draw(st.sampled_from([1, 8, 16, 64, 256, 1024, 0, -8, 7, 96])),
        "seq_len": draw(st.sampled_from([1, 4096, 16384, 131072, 262144, 1000, 2**20])),
        **{axis: draw(SIZES) for axis in ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs")},
        "gbs": draw(st.one_of(st.none(), st.integers(-4, 4096))),
        "recompute": draw(st.sampled_from(["none", "full", "moe_act", "layernorm,mlp", "core_attn,moe"])),
        "precision": draw(st.sampled_from(["bf16", "fp8-blockwise", "mxfp8", "nvfp4"])),
        "offload": draw(st.sampled_from([0.0, 0.5, 1.0, -0.1, 1.5, float("nan")])),
        "dispatcher": draw(st.sampled_from(["alltoall", "allgather", "deepep", "hybridep"])),
        "cp_comm_type": draw(st.sampled_from(["p2p", "a2a", "allgather", "bogus"])),
    }


def attempt_layout(d: dict[str, Any]) -> str:
    from lcmoe.rules.legality import violations
    from lcmoe.run import RunConfig, build_layout, check_precision_supported, parse_recompute
    from lcmoe.workload import TrainingOptions

    model, hw = load_model(d["model"]), load_hardware(d["gpu"])
    check_precision_supported(hw, d["precision"])
    layout = build_layout(
        model,
        d["gpus"],
        tp=d["tp"],
        cp=d["cp"],
        ep=d["ep"],
        etp=d["etp"],
        pp=d["pp"],
        vpp=d["vpp"],
        mbs=d["mbs"],
        gbs=d["gbs"],
        cp_comm_type=d["cp_comm_type"],
        round_gbs=d["gbs"] is None,
    )
    granularity, modules, method, layers = parse_recompute(d["recompute"])
    options = TrainingOptions(
        seq_len=d["seq_len"],
        precision=d["precision"],
        optimizer_offload_fraction=d["offload"],
        recompute_granularity=granularity,
        recompute_modules=modules,
        recompute_method=method,
        recompute_num_layers=layers,
        dispatcher=d["dispatcher"],
        main_grads_dtype="bf16",
        exp_avg_dtype="bf16",
    )
    run = RunConfig(model, hw, layout, options)
    if violations(run):
        return "refused by a legality rule"
    check_estimates(run)
    check_monotonicity(run)
    return "estimated, invariants hold"


def check_estimates(run: Any) -> None:
    """Finite positive totals; components sum to totals; the time breakdown sums to the step."""
    from lcmoe.estimate.memory import estimate_memory
    from lcmoe.estimate.time import estimate_time

    memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
    time = estimate_time(run)
    for name, value in (
        ("peak reserved", memory.peak_reserved_bytes),
        ("step", time.step_seconds),
        ("tokens/s", time.tokens_per_sec_per_gpu),
        ("TFLOP/s", time.model_tflops_per_gpu),
    ):
        if not (math.isfinite(value) and value > 0):
            raise InvariantBroken(f"{name} = {value}")
    for stage in memory.stages:
        parts = stage.components()
        if not math.isclose(sum(parts.values()), stage.peak_reserved, rel_tol=1e-9):
            raise InvariantBroken(f"stage {stage.stage}: components {sum(parts.values())} != {stage.peak_reserved}")
        if any(v < -1e-6 * stage.peak_reserved for v in parts.values()):
            raise InvariantBroken(f"negative component in {parts}")
    if not math.isclose(sum(time.breakdown.values()), time.step_seconds, rel_tol=1e-9):
        raise InvariantBroken(f"breakdown {sum(time.breakdown.values())} != step {time.step_seconds}")


def check_monotonicity(run: Any) -> None:
    """More CP → less activation memory per rank; full recompute → less memory, more time than
    none; more optimizer offload → less GPU memory, more host memory, no less time."""
    from lcmoe.diagnose import remedies
    from lcmoe.estimate.memory import estimate_memory
    from lcmoe.estimate.time import estimate_time
    from lcmoe.rules.legality import violations

    def mem(r: Any) -> Any:
        return estimate_memory(r.model, r.hardware, r.layout, r.options)

    base = mem(run)
    lay = run.layout
    more_cp = remedies.relayout(run, "cp").run  # CP doubled at the same GPU count and GBS
    if more_cp is not None and not violations(more_cp):
        wider = mem(more_cp)
        for a, b in zip(base.stages, wider.stages, strict=True):
            if b.activations > a.activations * (1 + 1e-9):
                raise InvariantBroken(f"CP {lay.cp}→{lay.cp * 2} raised stage {a.stage} activations")
    none = replace(run, options=replace(run.options, recompute_granularity="none", recompute_modules=frozenset()))
    full = replace(run, options=replace(run.options, recompute_granularity="full", recompute_modules=frozenset()))
    if not violations(none) and not violations(full):
        if max(s.activations for s in mem(full).stages) > max(s.activations for s in mem(none).stages) * (1 + 1e-9):
            raise InvariantBroken("full recompute stores more activations than none")
        if estimate_time(full).step_seconds < estimate_time(none).step_seconds * (1 - 1e-9):
            raise InvariantBroken("full recompute is faster than none")
    kept = replace(run, options=replace(run.options, optimizer_offload_fraction=0.0))
    moved = replace(run, options=replace(run.options, optimizer_offload_fraction=1.0))
    a, b = mem(kept), mem(moved)
    if b.peak_allocated_bytes > a.peak_allocated_bytes * (1 + 1e-9) or b.host_bytes_per_gpu < a.host_bytes_per_gpu:
        raise InvariantBroken("optimizer offload did not move memory from GPU to host")
    if estimate_time(moved).step_seconds < estimate_time(kept).step_seconds * (1 - 1e-9):
        raise InvariantBroken("optimizer offload made the step faster")


MEGATRON_FLAGS = (
    "tensor-model-parallel-size",
    "pipeline-model-parallel-size",
    "context-parallel-size",
    "expert-model-parallel-size",
    "expert-tensor-parallel-size",
    "micro-batch-size",
    "global-batch-size",
    "seq-length",
    "num-layers",
    "hidden-size",
    "num-attention-heads",
    "num-experts",
    "moe-router-topk",
    "recompute-granularity",
    "recompute-modules",
    "fp8-format",
    "moe-token-dispatcher-type",
    "pipeline-model-parallel-layout",
    "moe-layer-freq",
    "num-layers-per-virtual-pipeline-stage",
    "optimizer-offload-fraction",
    "cuda-graph-scope",
)
BRIDGE_KEYS = (
    "model.tensor_model_parallel_size",
    "model.pipeline_model_parallel_size",
    "model.context_parallel_size",
    "model.expert_model_parallel_size",
    "model.seq_length",
    "train.global_batch_size",
    "train.micro_batch_size",
    "model.recompute_granularity",
    "model.recompute_modules",
    "mixed_precision",
    "model.moe_token_dispatcher_type",
    "model.virtual_pipeline_model_parallel_size",
    "optimizer.optimizer_offload_fraction",
    "model.cuda_graph_scope",
    "dataset.sequence_length",
)


@st.composite
def check_configs(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["args", "overrides", "yaml", "text"]))
    if kind == "args":
        pairs = draw(st.lists(st.tuples(st.sampled_from(MEGATRON_FLAGS), HOSTILE), max_size=10))
        return " ".join(f"--{k} {json.dumps(v) if not isinstance(v, str) else v!r}" for k, v in pairs)
    if kind == "overrides":
        pairs = draw(st.lists(st.tuples(st.sampled_from(BRIDGE_KEYS), HOSTILE), max_size=8))
        return "\n".join(f"{k}={v}" for k, v in pairs)
    if kind == "yaml":
        tree: dict[str, Any] = {}
        for key, value in draw(st.lists(st.tuples(st.sampled_from(BRIDGE_KEYS), HOSTILE), max_size=8)):
            section, _, name = key.rpartition(".")
            (tree.setdefault(section, {}) if section else tree)[name] = value
        return yaml.safe_dump(tree, allow_unicode=True)
    return draw(st.text(max_size=300))


def parse_config(text: str, *, model: str | None, seq_len: str | None = None) -> Any:
    """check's parse_run on ``text`` for 16 H100s: the RunConfig, or None where check reports
    the config without building a run (unknown flags)."""
    from lcmoe.cli.check_cmd import parse_run

    parsed = parse_run(text, model=model, gpu="h100", gpus=16, seq_len=seq_len, hardware=load_hardware("h100"))
    return parsed[1]


def attempt_check_config(text: str) -> str:
    from lcmoe.estimate.report import estimate_run
    from lcmoe.rules.legality import violations

    model = "qwen3-30b-a3b" if "--num-layers" not in text else None
    run = parse_config(text, model=model, seq_len="4096")
    if run is None:
        return "refused: unknown flags"
    if violations(run):
        return "refused by a legality rule"
    estimate_run(run)
    return "estimated"


@st.composite
def plan_documents(draw: st.DrawFn) -> dict[str, Any]:
    doc = json.loads(json.dumps(_plan_doc()))
    entry = doc["plans"][0]
    for section in (doc["inputs"], entry, entry["layout"], entry["recompute"]):
        mutated = _mutate(draw, section)
        section.clear()
        section.update(mutated)
    if draw(st.booleans()):
        doc["plans"] = draw(st.sampled_from([[], None, "x", [1]])) if draw(st.integers(0, 5)) == 0 else doc["plans"]
    return doc


def attempt_plan_document(doc: dict[str, Any]) -> str:
    from lcmoe.config_io.plan_json import run_from_plan
    from lcmoe.estimate.report import estimate_run
    from lcmoe.rules.legality import violations

    if not isinstance(doc.get("plans"), list) or not isinstance(doc.get("inputs"), dict):
        return "refused by read_plan"  # read_plan refuses these before run_from_plan sees them (tested separately)
    run = run_from_plan(doc)
    if violations(run):
        return "refused by a legality rule"
    estimate_run(run)
    return "estimated"


@st.composite
def log_texts(draw: st.DrawFn) -> list[str]:
    from tests import log_fixtures as lf

    lines = [
        *lf.argument_dump({"world_size": 16, "tensor_model_parallel_size": draw(HOSTILE)}),
        *lf.steady_iterations(draw(st.integers(0, 30)), draw(st.floats(0.001, 1e6)), seed=draw(st.integers(0, 99))),
        lf.bridge_memory_line(0, 1, 60.0, 70.0),
        lf.megatron_memory_line(1, 1, 5e4, 6e4),
        lf.oom_line(1.0, 0, 80.0, 10.0, 10.0),
        lf.step_time_line(1.0, 300.0),
        *lf.timers_block((1.0, 2.0)),
    ]
    out: list[str] = []
    for line in draw(st.permutations(lines)):
        op = draw(st.integers(0, 5))
        if op == 0:
            line = line[: draw(st.integers(0, len(line)))]
        elif op == 1:
            other = draw(st.sampled_from(lines))
            line = line[: draw(st.integers(0, len(line)))] + other[draw(st.integers(0, len(other))) :]
        elif op == 2:
            line = draw(st.text(max_size=200))
        out.append(line)
    return out


def attempt_log(lines: list[str]) -> None:
    from lcmoe.diagnose.logs import parse_log_lines
    from lcmoe.diagnose.regression import compare
    from lcmoe.diagnose.steps import step_stats

    summary = parse_log_lines(lines)
    stats = step_stats(summary)
    if stats is not None and not (math.isfinite(stats.median_seconds) and stats.median_seconds > 0):
        raise InvariantBroken(f"median step {stats.median_seconds}")
    compare(summary, summary).as_dict()
    json.dumps(summary.as_dict())


# ----- issue #31 surfaces: hostile text, special files, layouts, calibrations, output streams ------
def _deep(depth: int, flow: str) -> str:
    return flow[0] * depth + flow[1] * depth


def _anchor_bomb(levels: int, width: int) -> str:
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join([*lines, f"model: {{tensor_model_parallel_size: 1, bomb: *a{levels - 1}}}"]) + "\n"


HOSTILE_TEXTS: st.SearchStrategy[str] = st.one_of(
    st.integers(1, 100_000).map(lambda d: "a: " + _deep(d, "[]") + "\n"),
    st.integers(1, 100_000).map(lambda d: "a: " + "{b: " * d + "1" + "}" * d + "\n"),
    st.integers(1, 5000).map(lambda d: "- " * d + "x\n"),
    st.tuples(st.integers(2, 12), st.integers(2, 12)).map(lambda t: _anchor_bomb(*t)),
    st.integers(4000, 6000).map(lambda n: f"num_layers: {'9' * n}\n"),
    st.sampled_from(["a: .inf\n", "a: .nan\n", "a: !!python/object:os.system x\n", "\x00\xff\ufffe", "a:\tb\n"]),
    st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    st.integers(1, 3_000_000).map(lambda n: "name: " + "x" * n + "\n"),
)


@st.composite
def yaml_texts(draw: st.DrawFn) -> tuple[str, str]:
    """(reader, hostile text): every YAML/JSON reader lcmoe has gets the same texts."""
    reader = draw(st.sampled_from(["model", "hardware", "calibration", "check-yaml", "check-overrides", "plan"]))
    text = draw(HOSTILE_TEXTS)
    if reader == "plan" and draw(st.booleans()):
        text = draw(st.integers(1, 200_000).map(lambda d: '{"inputs": ' + _deep(d, "[]") + ', "plans": []}'))
    return reader, text


def _read_as(reader: str, path: Path) -> object:
    """Hand ``path`` to one of lcmoe's file readers, as the CLI does."""
    from lcmoe.catalog import load_hardware_file, load_model_file
    from lcmoe.cli.check_cmd import read_input
    from lcmoe.config_io.plan_json import read_plan, run_from_plan
    from lcmoe.diagnose.logs import read_log
    from lcmoe.estimate.calibration import load_calibration

    if reader == "model":
        return load_model_file(path)
    if reader == "hf-json":
        return load_model_file(path.with_suffix(".json")) if path.suffix != ".json" else load_model_file(path)
    if reader == "hardware":
        return load_hardware_file(path)
    if reader == "calibration":
        return load_calibration(path)
    if reader == "plan":
        return run_from_plan(read_plan(path))
    if reader == "log":
        return read_log(path)
    model = None if reader == "check-args" else "qwen3-30b-a3b"
    return parse_config(read_input(str(path)), model=model)


def attempt_yaml_text(case: tuple[str, str]) -> str:
    reader, text = case
    with tempfile.TemporaryDirectory() as folder:
        name = {"plan": "plan.json", "check-overrides": "overrides.txt"}.get(reader, "input.yaml")
        path = Path(folder) / name
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        _read_as(reader, path)
    return "read"


SPECIAL_FILES = ("/dev/zero", "/dev/null", "fifo", "directory", "missing", "empty", "binary", "big", "symlink-loop")
FILE_READERS = ("model", "hf-json", "hardware", "calibration", "plan", "log", "check-args", "check-yaml")


@st.composite
def special_files(draw: st.DrawFn) -> tuple[str, str]:
    return draw(st.sampled_from(FILE_READERS)), draw(st.sampled_from(SPECIAL_FILES))


def attempt_special_file(case: tuple[str, str]) -> str:
    """Every reader on every kind of file that is not a small regular file: one sentence or a
    result, never a hang (a FIFO), an endless read (/dev/zero) or a traceback."""
    reader, kind = case
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder)
        suffix = ".json" if reader in ("hf-json", "plan") else ".yaml"
        path = base / f"input{suffix}"
        if kind.startswith("/dev/"):
            path = Path(kind)
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "directory":
            path.mkdir()
        elif kind == "empty":
            path.write_bytes(b"")
        elif kind == "binary":
            path.write_bytes(bytes(range(256)) * 64)
        elif kind == "big":
            with path.open("wb") as handle:
                handle.truncate(17 * 1024 * 1024)  # sparse: larger than every cap
        elif kind == "symlink-loop":
            os.symlink(path, path)
        _read_as(reader, path)
    return "read"


LAYOUT_TOKENS = st.sampled_from(["E", "t", "m", "L", "|", "t*99999999", "(t|)*9999999", "(", ")", "*", "x", " "])


@st.composite
def pipeline_layouts(draw: st.DrawFn) -> tuple[str, str]:
    """(where, layout text): the CLI option, a Bridge override, Megatron arguments or plan.json."""
    where = draw(st.sampled_from(["cli", "override", "args", "plan"]))
    if where == "plan":
        _plan_doc()  # the one real search, done here and not inside a case's time budget
    if draw(st.booleans()):
        text = "".join(draw(st.lists(LAYOUT_TOKENS, max_size=12)))
    else:
        inner = "t*" + str(draw(st.integers(0, 10**12)))
        text = f"({inner}|)*{draw(st.integers(0, 10**12))}"
    return where, text


def attempt_pipeline_layout(case: tuple[str, str]) -> str:
    from lcmoe.config_io.plan_json import run_from_plan
    from lcmoe.rules.legality import violations
    from lcmoe.run import RunConfig, build_layout
    from lcmoe.workload import TrainingOptions

    where, text = case
    model, hw = load_model("qwen3-30b-a3b"), load_hardware("h100")
    if where == "cli":
        run = RunConfig(model, hw, build_layout(model, 16, pp=2, pipeline_layout=text), TrainingOptions(seq_len=4096))
    elif where == "override":
        body = f"model.pipeline_model_parallel_size=2\nmodel.pipeline_model_parallel_layout={text}\n"
        run = parse_config(body, model="qwen3-30b-a3b")
    elif where == "args":
        body = f"--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout {json.dumps(text)}"
        run = parse_config(body, model="qwen3-30b-a3b")
    else:
        doc = json.loads(json.dumps(_plan_doc()))
        doc["plans"][0]["layout"].update(pp=2, dp=doc["plans"][0]["layout"]["dp"], pipeline_layout=text)
        run = run_from_plan(doc)
    return "refused by a legality rule" if violations(run) else "legal"


CALIBRATION_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 0.0, -0.5, 5.0, 1e308, -1, True, "x", None, [], {}, "__HUGE__"]),
)


@st.composite
def calibrations(draw: st.DrawFn) -> str:
    from dataclasses import fields as dc_fields

    from lcmoe.estimate.time import TimeCoefficients

    names = sorted(f.name for f in dc_fields(TimeCoefficients) if f.name not in ("fit",))
    coefficients = {name: draw(CALIBRATION_VALUES) for name in draw(st.lists(st.sampled_from(names), max_size=4))}
    doc = {
        "format": "lcmoe-calibration/1",
        "architecture": draw(st.sampled_from(["hopper", "hopper", "blackwell", "volta", 3])),
        "hardware": "h100",
        "scales": {"all": draw(st.one_of(st.just(1.0), CALIBRATION_VALUES))},
        "coefficients": coefficients,
        "fit": {"n": 1, "mape_before": draw(CALIBRATION_VALUES), "mape_after": 1.0},
    }
    # A 5000-digit integer literal (past int()'s limit) is spliced into the text after dumping.
    return yaml.safe_dump(doc, allow_unicode=True).replace("__HUGE__", "9" * 5000)


def attempt_calibration(text: str) -> str:
    """A calibration is refused, or every plan it times is finite and positive."""
    from lcmoe.estimate.calibration import coefficients_for, load_calibration
    from lcmoe.estimate.time import estimate_time
    from lcmoe.run import RunConfig, build_layout
    from lcmoe.workload import TrainingOptions

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cluster.yaml"
        path.write_text(text, encoding="utf-8")
        calibration = load_calibration(path)
    hw, model = load_hardware("h100"), load_model("qwen3-30b-a3b")
    coefficients = coefficients_for(hw, calibration)
    run = RunConfig(model, hw, build_layout(model, 8, ep=8), TrainingOptions(seq_len=4096))
    time = estimate_time(run, coefficients) if coefficients is not None else estimate_time(run)
    for name, value in (("step", time.step_seconds), ("tokens/s", time.tokens_per_sec_per_gpu)):
        if not (math.isfinite(value) and value > 0):
            raise InvariantBroken(f"calibrated {name} = {value}")
    return "timed, finite"


class _FailingStream:
    """A text stream whose writes fail as a closed, full or vanished stdout does."""

    def __init__(self, error: OSError | None, encoding: str = "utf-8") -> None:
        self.error, self.encoding, self.errors, self.written = error, encoding, "strict", 0
        self._fd: int | None = None

    def reconfigure(self, *, errors: str) -> None:
        self.errors = errors

    def write(self, text: str) -> int:
        if self.error is not None:
            raise self.error
        text.encode(self.encoding, self.errors)  # UnicodeEncodeError where an ASCII terminal would raise
        self.written += len(text)
        return len(text)

    def flush(self) -> None:
        if self.error is not None:
            raise self.error

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        # rich answers a broken pipe by dup2-ing /dev/null onto stdout's descriptor: give it one
        # that is harmless to overwrite.
        if self._fd is None:
            self._fd = os.open(os.devnull, os.O_WRONLY)
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


OUTPUT_COMMANDS = (
    ("models",),
    ("hardware",),
    ("flops", "-m", "deepseek-v3", "-s", "128k"),
    ("estimate", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "4k", "--ep", "8"),
    ("estimate", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "4k", "--ep", "8", "--json"),
)
STREAM_ERRORS = (
    None,
    BrokenPipeError(32, "Broken pipe"),
    OSError(28, "No space left on device"),
    OSError(9, "Bad file descriptor"),
    OSError(5, "Input/output error"),
)


@st.composite
def output_streams(draw: st.DrawFn) -> tuple[tuple[str, ...], int, str]:
    return (
        draw(st.sampled_from(OUTPUT_COMMANDS)),
        draw(st.integers(0, len(STREAM_ERRORS) - 1)),
        draw(st.sampled_from(["utf-8", "ascii", "latin-1"])),
    )


def attempt_output_stream(case: tuple[tuple[str, ...], int, str]) -> str:
    """The CLI writing to a stdout that fails (closed, full, broken pipe) or cannot encode: exit
    1 or 2 with at most one line on stderr, never a traceback."""
    import contextlib
    import sys

    from lcmoe.cli import main

    argv, which, encoding = case
    error = STREAM_ERRORS[which]
    out, err = _FailingStream(error, encoding), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):  # type: ignore[type-var]
        try:
            main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0) if not isinstance(exc.code, str) else 1
        finally:
            out.close()
    if not isinstance(sys.stdout, io.TextIOBase) and sys.stdout is not sys.__stdout__:
        raise InvariantBroken("stdout left replaced")
    text = err.getvalue()
    if "Traceback" in text or text.count("\n") > 1:
        raise InvariantBroken(f"exit {code}: {text[-300:]}")
    if error is None and code not in (0, 1):  # 1: estimate's findings (an OOM or at-risk verdict)
        raise InvariantBroken(f"exit {code} on a working stdout: {text[-300:]}")
    if error is not None and code not in (1, 2):
        raise InvariantBroken(f"exit {code} on a failing stdout")
    return f"exit {code}"


_MODEL_DICTS = _yaml_dicts("models")
_HARDWARE_DICTS = _yaml_dicts("hardware")
_PLAN: dict[str, Any] = {}


def _plan_doc() -> dict[str, Any]:
    if not _PLAN:
        from tests.conftest import run_cli

        code, out, _ = run_cli("plan", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "16k", "--top", "1", "--json")
        assert code == 0
        _PLAN.update(json.loads(out))
    return _PLAN


SURFACES: dict[str, tuple[st.SearchStrategy[Any], Callable[[Any], str | None]]] = {
    "hf-config": (hf_configs(), attempt_hf_config),
    "model-yaml": (model_yamls(), attempt_model_yaml),
    "hardware-yaml": (hardware_yamls(), attempt_hardware_yaml),
    "cli-numbers": (cli_numbers(), attempt_cli_numbers),
    "layouts": (layouts(), attempt_layout),
    "check-configs": (check_configs(), attempt_check_config),
    "plan-json": (plan_documents(), attempt_plan_document),
    "logs": (log_texts(), attempt_log),
    "hostile-text": (yaml_texts(), attempt_yaml_text),
    "special-files": (special_files(), attempt_special_file),
    "pipeline-layouts": (pipeline_layouts(), attempt_pipeline_layout),
    "calibrations": (calibrations(), attempt_calibration),
    "output-streams": (output_streams(), attempt_output_stream),
}


def _one_sentence(exc: LcmoeError) -> None:
    text = str(exc)
    if "\n" in text or not text.strip() or len(text) > 2000:
        raise InvariantBroken(f"error is not one sentence: {text[:300]!r}")


def _short(value: object) -> str:
    """A failing input for the report: its repr cut to 300 characters (inputs can be megabytes)."""
    try:
        text = repr(value) if not isinstance(value, str) or len(value) < 10_000 else repr(value[:300])
    except ValueError:  # an int past the 4300-digit repr limit
        text = f"<{type(value).__name__}>"
    return text[:300]


def run_surface(name: str, max_examples: int, seed_value: int = 0) -> SurfaceReport:
    """Feed ``max_examples`` generated inputs to one surface and count outcomes; never stops early."""
    strategy, attempt = SURFACES[name]
    report = SurfaceReport(name)
    # ru_maxrss is the process's lifetime peak: a pytest worker has already run other tests (a
    # Megatron-Core import, the bounded-memory log test) and kept their modules, so there a case may
    # add at most half the budget to the peak it found; in a fresh process (benchmarks/fuzz.py) the
    # budget is the full 1 GB.
    rss_budget = max(CASE_RSS_BYTES, peak_rss_bytes() + CASE_RSS_BYTES // 2)

    @seed(seed_value)
    @settings(
        max_examples=max_examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        derandomize=False,
    )
    @given(strategy)
    def body(value: Any) -> None:
        report.cases += 1
        start = time.perf_counter()
        try:
            with time_limit(CASE_SECONDS):
                label = attempt(value)
            peak = peak_rss_bytes()
            if peak > rss_budget:
                raise InvariantBroken(f"peak RSS {peak / 1024**2:.0f} MiB > {rss_budget / 1024**2:.0f} MiB")
            report.results += 1
            report.outcomes[label or "result"] += 1
        except LcmoeError as exc:
            report.errors += 1
            report.outcomes["one-sentence error (exit 2)"] += 1
            try:
                _one_sentence(exc)
            except InvariantBroken as broken:
                report.failures.append(f"{broken} ← {_short(value)}")
        except Exception as exc:  # every other exception is a failure
            report.failures.append(f"{type(exc).__name__}: {str(exc)[:200]} ← {_short(value)}")
        finally:
            report.slowest_seconds = max(report.slowest_seconds, time.perf_counter() - start)
            report.peak_rss_bytes = peak_rss_bytes()

    body()
    return report
