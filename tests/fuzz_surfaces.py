"""Generated inputs for every surface lcmoe reads, and the invariant each must keep: a result,
or one LcmoeError sentence (exit code 2 at the CLI) — never another exception, a hang or a
broken estimator invariant. Shared by tests/test_robustness.py (small budget, in CI) and
benchmarks/fuzz.py (≥ 10,000 cases per surface)."""

from __future__ import annotations

import json
import math
import signal
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
CASE_SECONDS = 10.0

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
)


@dataclass
class SurfaceReport:
    name: str
    cases: int = 0
    results: int = 0
    errors: int = 0
    failures: list[str] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)


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


def attempt_check_config(text: str) -> str:
    from lcmoe.cli.check_cmd import parse_run
    from lcmoe.estimate.report import estimate_run
    from lcmoe.rules.legality import violations

    hw = load_hardware("h100")
    model = "qwen3-30b-a3b" if "--num-layers" not in text else None
    _, run = parse_run(text, model=model, gpu="h100", gpus=16, seq_len="4096", hardware=hw)
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
}


def _one_sentence(exc: LcmoeError) -> None:
    text = str(exc)
    if "\n" in text or not text.strip() or len(text) > 2000:
        raise InvariantBroken(f"error is not one sentence: {text[:300]!r}")


def run_surface(name: str, max_examples: int, seed_value: int = 0) -> SurfaceReport:
    """Feed ``max_examples`` generated inputs to one surface and count outcomes; never stops early."""
    strategy, attempt = SURFACES[name]
    report = SurfaceReport(name)

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
        try:
            with time_limit(CASE_SECONDS):
                label = attempt(value)
            report.results += 1
            report.outcomes[label or "result"] += 1
        except LcmoeError as exc:
            report.errors += 1
            report.outcomes["one-sentence error (exit 2)"] += 1
            try:
                _one_sentence(exc)
            except InvariantBroken as broken:
                report.failures.append(f"{broken} ← {value!r:.300}")
        except Exception as exc:  # every other exception is a failure
            report.failures.append(f"{type(exc).__name__}: {str(exc)[:200]} ← {value!r:.300}")

    body()
    return report
