"""Published Bridge throughput rows (perf_summary.csv ⋈ perf_recipes.csv, long_context.csv) →
RunConfigs with the recipe settings behind each row, for the time-model fit and benchmark."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from benchmarks.published import (
    as_float,
    as_int,
    catalog_model_for_label,
    catalog_model_for_row,
    not_in_catalog,
    read_rows,
)
from lcmoe.catalog import load_hardware
from lcmoe.errors import LcmoeError
from lcmoe.layout import ParallelLayout, check_pipeline_layout
from lcmoe.run import RunConfig, build_layout, resolve_pipeline_layout
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import CUDA_GRAPH_SCOPES, RECOMPUTE_MODULES, TrainingOptions

JOIN_KEY = ("container", "task", "model", "gpu", "precision", "variant")


@dataclass(frozen=True, slots=True)
class PerfCase:
    name: str
    group: str  # (model, gpu, container) for rank correlation
    model_name: str
    run: RunConfig
    published_tflops: float
    container: str = "long-context"  # the NeMo container of the published run
    # perf_recipes.csv ``match``: "exact" when the traced recipe has the published layout,
    # "partial" when they disagree (the published layout is then used); "card" for long_context.csv.
    recipe_match: str = "card"


LONG_CONTEXT = "long-context"
# Models whose published rows check the FLOPs count and the memory estimator but stay out of the
# time-model fit and its MAPE; throughput_accuracy.py reports them apart, as an out-of-sample check.
TIME_HOLDOUT = {
    "nemotron-3-super-120b-a12b": (
        "its NVFP4 recipe keeps the last 14 of 88 layers in BF16 "
        "(mixed_precision.py:421-429 nemotron_3_super_bf16_with_nvfp4_mixed) and its GB200 rows run TP2 "
        "with LatentMoE dispatch, none of which the fitted rows exercise"
    ),
}


def split_time_holdout(cases: list[PerfCase]) -> tuple[list[PerfCase], list[PerfCase]]:
    """(rows the time model is fitted and scored on, rows of ``TIME_HOLDOUT`` models)."""
    fitted = [c for c in cases if c.model_name not in TIME_HOLDOUT]
    return fitted, [c for c in cases if c.model_name in TIME_HOLDOUT]


# The DSV3 card marks optimizer CPU offload ("All DSV3 long-context configs require
# --optimizer-cpu-offload") but no fraction, and in Bridge the flag alone offloads nothing:
# megatron-core's OptimizerConfig.optimizer_offload_fraction defaults to 0.0
# (optimizer_config.py:350; only Megatron-LM's CLI defaults it to 1.0, arguments.py:2922), and
# HybridDeviceOptimizer keeps offload_fraction × numel on the host (hybrid_optimizer.py:258).
# The published steps agree: a full offload would put 2.9 G parameters of CPU Adam per rank,
# 23 G per 8-GPU host, into every step (≥ 10 s at the best measured host rate, 1.4 G/s per host,
# kernels-and-links.md §6) against a published 16K step of ~18 s that the GPU work alone fills.
LONG_CONTEXT_OFFLOAD_FRACTION = 0.0


def version_key(container: str) -> tuple[int, ...]:
    """26.04.01 → (26, 4, 1); the long-context card (no container) sorts first."""
    parts = container.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (0,)


def reference_container(cases: list[PerfCase]) -> str:
    """The newest container among ``cases``: what the shipped coefficients predict."""
    return max((c.container for c in cases if c.container != LONG_CONTEXT), key=version_key)


def container_factor(coefficients: object, container: str) -> float:
    """Throughput of ``container`` relative to the reference container, as fitted (1 if unknown)."""
    fit = getattr(coefficients, "fit", {}) or {}
    factors = fit.get("containers") or {}
    return float(factors.get(container, 1.0))


def _precision(norm: str, recipe: dict[str, str]) -> str:
    """lcmoe's precision for a published row. The 25.09 tables publish no precision column; the
    traced recipe's variant (fp8_cs, fp8_mx, fp8_ss) and fp8_recipe say what ran."""
    norm = norm or recipe.get("recipe_variant", "")
    fp8_recipe = recipe.get("fp8_recipe", "")
    if norm == "fp8_mx" or fp8_recipe == "mxfp8":
        return "mxfp8"
    if norm == "nvfp4":
        return "nvfp4"
    if norm in ("fp8_cs", "fp8_ss"):
        return "fp8-blockwise" if "blockwise" in fp8_recipe else "fp8-tensorwise"
    return "bf16"


def _recompute(text: str) -> tuple[str, frozenset[str]]:
    if text.startswith("selective"):
        mods = frozenset(m for m in re.findall(r"[a-z_]+", text.split("selective", 1)[1]) if m)
        return ("selective", mods) if mods else ("none", frozenset())
    if text.startswith("full"):
        return "full", frozenset()
    return "none", frozenset()


def graph_scopes(text: str) -> frozenset[str]:
    """CUDA-graph scopes of a traced recipe's ``cuda_graph_effective`` ("transformer_engine
    [attn,moe_router]", "full_iteration", "none (default)")."""
    if "full_iteration" in text:
        return frozenset({"full_iteration"})
    match = re.search(r"\[(.*)\]", text)
    if not match:
        return frozenset()
    return frozenset({s.strip() for s in match.group(1).split(",")} & (CUDA_GRAPH_SCOPES - {"full_iteration"}))


def _recipe_for(row: dict[str, str], recipes: dict[tuple[str, ...], dict[str, str]]) -> dict[str, str] | None:
    """The traced recipe of a published row. The 25.09 tables label MoE rows "(dropless)" or
    "(tokendrop)" where the recipe trace names the base model: a dropless row joins on the base
    model when the recipe agrees (token_drop False). Token-dropping runs (capacity factor, padded
    expert inputs) are outside what lcmoe models, so they get no recipe."""
    recipe = recipes.get(tuple(row[k] for k in JOIN_KEY))
    if recipe is not None or row.get("model_qualifier") != "dropless":
        return recipe
    base = recipes.get(tuple(row["model_base"] if k == "model" else row[k] for k in JOIN_KEY))
    return base if base is not None and base.get("token_drop") == "False" else None


# Bridge's LoRA perf recipes put adapters on linear_qkv only (scripts/performance/configs/llama/
# llama3_llm_finetune.py ``cfg.peft.target_modules = ["linear_qkv"]``; perf_recipes/llama/*/llama3.py).
LORA_PERF_TARGETS = frozenset({"linear_qkv"})


def perf_cases(
    summary_path: str, recipes_path: str, *, tasks: tuple[str, ...] = ("pretrain",)
) -> tuple[list[PerfCase], list[dict[str, str]]]:
    """The published runs of ``tasks`` (pretrain; sft, a full finetune on packed sequences; lora)
    that lcmoe can rebuild from their traced recipes."""
    recipes = {tuple(r[k] for k in JOIN_KEY): r for r in read_rows(recipes_path)}
    cases, skipped = [], []
    for row in read_rows(summary_path):
        label = f"{row['container']} {row['model']} {row['gpu']}x{row['num_gpus']} {row['precision']} {row['variant']}"
        spec = catalog_model_for_row(row)
        tflops = as_float(row.get("model_tflops_per_gpu"))
        recipe = _recipe_for(row, recipes)
        reason = None
        if spec is None:
            reason = not_in_catalog(row.get("model_base") or row.get("model", ""))
        elif row.get("status") != "current":
            reason = f"superseded (status {row.get('status')}; no recipe trace)"
        elif row.get("task") not in tasks:
            reason = f"task {row.get('task')} (not {'/'.join(tasks)}: another reader)"
        elif "tokendrop" in (row.get("model_qualifier") or "").replace("-", ""):
            reason = "token-dropping run (capacity factor: not modelled)"
        elif not tflops:
            reason = "no TFLOP/s published"
        elif recipe is None:
            reason = "no recipe settings (perf_recipes.csv)"
        elif recipe.get("use_megatron_fsdp") == "True":
            reason = "Megatron-FSDP run (not modelled by the time model)"
        if reason:
            skipped.append({"row": label, "reason": reason})
            continue
        assert spec is not None and recipe is not None and tflops is not None
        try:
            run = _run_for(row, recipe, spec)
        except LcmoeError as exc:
            skipped.append({"row": label, "reason": str(exc)})
            continue
        group = f"{spec.name}/{row['gpu']}/{row['container']}"
        cases.append(PerfCase(label, group, spec.name, run, tflops, row["container"], recipe.get("match", "exact")))
    return cases, skipped


def _run_for(row: dict[str, str], recipe: dict[str, str], spec: object) -> RunConfig:
    from lcmoe.specs.model import ModelSpec

    assert isinstance(spec, ModelSpec)
    hardware = load_hardware(row["gpu"])
    tp, pp, cp = as_int(row.get("tp")), as_int(row.get("pp")), as_int(row.get("cp"))
    vpp = as_int(row.get("vp"))
    world = as_int(row["num_gpus"])
    dp = world // (tp * pp * cp)
    granularity, modules = _recompute(recipe.get("recompute_effective", ""))
    dispatcher = recipe.get("dispatcher_effective", "")
    dispatcher = "hybridep" if "hybridep" in dispatcher else "deepep" if "deepep" in dispatcher else "alltoall"
    layout_text = recipe.get("pipeline_model_parallel_layout") or None
    if layout_text in ("None", ""):
        layout_text = None
    layout = ParallelLayout(
        tp=tp,
        pp=pp,
        cp=cp,
        vpp=vpp,
        dp=dp,
        ep=as_int(row.get("ep")),
        etp=as_int(recipe.get("etp")),
        mbs=as_int(row.get("mbs")),
        gbs=as_int(row.get("gbs")),
        sequence_parallel=tp > 1,
        pipeline_layout=resolve_pipeline_layout(spec, pp, vpp, layout_text),
    )
    options = TrainingOptions(
        seq_len=as_int(row.get("seq_len"), 4096),
        precision=_precision(row.get("precision_norm", ""), recipe),
        recompute_granularity=granularity,  # type: ignore[arg-type]
        recompute_modules=modules,
        dispatcher=dispatcher,
        cuda_graph_scope=graph_scopes(recipe.get("cuda_graph_effective", "")),
        overlap_moe_expert_parallel_comm=recipe.get("a2a_overlap_effective") == "True",
        # Every perf recipe sets ddp.grad_reduce_in_fp32=False (set_llama3_common_configs,
        # set_deepseek_v3_common_configs, perf_recipes/_common.py _perf_precision; facts §2): the
        # DDP gradient buffer is BF16.
        main_grads_dtype="bf16",
        exp_avg_dtype="bf16" if recipe.get("use_precision_aware_optimizer") == "True" else "fp32",
        **({"peft": "lora", "lora_targets": LORA_PERF_TARGETS} if row.get("task") == "lora" else {}),
    )
    check_pipeline_layout(spec, layout)
    return RunConfig(spec, hardware, layout, options)


# Layout fields a long-context row states in its columns (or, where a column is empty, in its
# notes as "TP1 EP32 PP4 VPP12, MBS1 GBS1024").
LAYOUT_FIELDS = ("tp", "cp", "ep", "etp", "pp", "vpp", "mbs", "gbs")
_NOTE_FIELD = {"tp": "TP", "cp": "CP", "ep": "EP", "etp": "ETP", "pp": "PP", "vpp": "VPP", "mbs": "MBS", "gbs": "GBS"}
# The card's recompute labels → Megatron's recompute_modules.
_RECOMPUTE_LABELS = {"up_proj": "mla_up_proj", "norm": "layernorm", "layer_norm": "layernorm"}


def stated_layout(row: dict[str, str]) -> dict[str, str]:
    """The layout a row states: its columns, then "TP4"-style tokens in its notes."""
    notes = row.get("notes", "")
    stated: dict[str, str] = {}
    for key in (*LAYOUT_FIELDS, "recompute", "cuda_graph", "cp_comm_type"):
        value = (row.get(key) or "").strip()
        if not value and key in _NOTE_FIELD:
            match = re.search(rf"\b{_NOTE_FIELD[key]}\s*=?\s*(\d+)\b", notes)
            value = match.group(1) if match else ""
        if not value and key == "cuda_graph":
            match = re.search(r"CUDA graphs? ([a-z_/+, ]+)", notes)
            value = match.group(1) if match else ""
        if value:
            stated[key] = value
    return stated


def series_key(row: dict[str, str]) -> tuple[str, ...]:
    """Rows of one CP-scaling series: same model label, GPU, precision and dispatcher."""
    return tuple(row.get(k, "") for k in ("model", "gpu", "precision", "dispatcher"))


def series_fill(row: dict[str, str], rows: list[dict[str, str]]) -> dict[str, str]:
    """The row's stated layout, completed from the nearest-length row of its series that states
    TP, EP and PP: the long-context card publishes a family's layout once and varies only CP
    along the series (skills/nemo-mbridge-perf-moe-long-context card.yaml ``cp_scaling_data``;
    data-README "long_context.csv"). CP and the GPU count stay the row's own."""
    own = stated_layout(row)
    if all(k in own for k in ("tp", "ep", "pp")):
        return own
    seq = as_int(row.get("seq_len"), 4096)
    donors = [
        stated_layout(r)
        for r in sorted(rows, key=lambda r: abs(math.log(as_int(r.get("seq_len"), 4096) / seq)))
        if series_key(r) == series_key(row) and r is not row
    ]
    donor = next((d for d in donors if all(k in d for k in ("tp", "ep", "pp"))), None)
    if donor is None:
        return own
    inherited = {k: v for k, v in donor.items() if k not in ("cp", "gbs", "mbs")}
    return inherited | own


def recompute_setting(text: str) -> tuple[str, frozenset[str]]:
    """("selective", modules) / ("full", ∅) / ("none", ∅) from a card's recompute cell
    ("selective: up_proj, norm, moe, mlp")."""
    text = text.lower()
    if text.startswith("full"):
        return "full", frozenset()
    if "selective" not in text:
        return "none", frozenset()
    labels = re.findall(r"[a-z_]+", text.split("selective", 1)[1])
    modules = frozenset(_RECOMPUTE_LABELS.get(m, m) for m in labels) & RECOMPUTE_MODULES
    return ("selective", modules) if modules else ("none", frozenset())


def precision_of(label: str) -> str:
    """lcmoe's precision for a published precision label (BF16, FP8-Block, FP8-CS, MXFP8, NVFP4)."""
    key = re.sub(r"[^a-z0-9]", "", label.lower())
    if "fp4" in key:
        return "nvfp4"
    if "mx" in key:
        return "mxfp8"
    if "block" in key:
        return "fp8-blockwise"
    return "fp8-tensorwise" if "fp8" in key else "bf16"


def dispatcher_of(label: str) -> str:
    key = label.lower().replace("-", "").replace("_", "")
    return next((d for d in ("hybridep", "deepep", "allgather") if d in key), "alltoall")


def long_context_cases(path: str) -> tuple[list[PerfCase], list[dict[str, str]]]:
    """Every row of a long-context table (long_context.csv's columns) that lcmoe can express.

    The model comes from the catalog (``published_names``); the layout from the row's columns,
    its notes ("TP1 EP32 PP4 VPP12, MBS1 GBS1024"), then the nearest row of its series
    (``series_fill``); a row whose TP, EP or PP none of these state is skipped ("layout not
    stated"). The measured rate is the row's model TFLOP/s, or its tokens/s (or step time and
    GBS) turned into Bridge's model TFLOP/s with lcmoe's FLOP count (``estimate.flops``, which
    matches Bridge's). GBS, where not stated, is 32 microbatches per pipeline (bubble
    (PP−1)/(VPP·32)). DSA runs CP only by all-gather (dsa.py); other mixers use the row's
    ``cp_comm_type`` or Megatron's default p2p. Optimizer offload is not costed
    (LONG_CONTEXT_OFFLOAD_FRACTION)."""
    rows = read_rows(path)
    cases, skipped = [], []
    for row in rows:
        label = f"{row.get('model', '')} {row.get('gpu', '')}x{row.get('num_gpus', '')} {row.get('seq_len', '')}"
        spec = catalog_model_for_label(row.get("model", ""))
        if spec is None:
            skipped.append({"row": label, "reason": not_in_catalog(row.get("model", ""))})
            continue
        if not row.get("gpu") or not row.get("num_gpus"):
            skipped.append({"row": label, "reason": "GPU type or count not stated"})
            continue
        if "pretrain" not in (row.get("task") or "pretrain").lower():
            skipped.append({"row": label, "reason": f"not a pretraining run ({row.get('task')})"})
            continue
        stated = series_fill(row, rows)
        if not all(k in stated for k in ("tp", "ep", "pp")):
            skipped.append({"row": label, "reason": "layout not stated"})
            continue
        try:
            case = _long_context_case(row, spec, stated, label)
        except (LcmoeError, ValueError) as exc:
            skipped.append({"row": label, "reason": f"not expressible: {exc}"})
            continue
        if case is None:
            skipped.append({"row": label, "reason": "no throughput published"})
            continue
        cases.append(case)
    return cases, skipped


def _long_context_case(row: dict[str, str], spec: ModelSpec, stated: dict[str, str], label: str) -> PerfCase | None:
    hardware = load_hardware(row["gpu"])
    seq = as_int(row.get("seq_len"), 4096)
    world = as_int(row["num_gpus"])
    tp, cp, pp = (as_int(stated.get(k)) for k in ("tp", "cp", "pp"))
    if world % (tp * pp * cp):
        raise ValueError(f"{world} GPUs do not divide by TP·PP·CP = {tp * pp * cp}")
    dp = world // (tp * pp * cp)
    mbs = as_int(stated.get("mbs"))
    gbs = as_int(stated.get("gbs"), 32 * dp * mbs)
    granularity, modules = recompute_setting(stated.get("recompute", ""))
    comm = (
        "all_gather" if spec.is_dsa and cp > 1 else stated.get("cp_comm_type", "p2p").replace("allgather", "all_gather")
    )
    layout = build_layout(
        spec,
        world,
        tp=tp,
        cp=cp,
        ep=as_int(stated.get("ep")),
        etp=as_int(stated.get("etp")),
        pp=pp,
        vpp=as_int(stated.get("vpp")),
        mbs=mbs,
        gbs=gbs,
        cp_comm_type=comm,
    )
    options = TrainingOptions(
        seq_len=seq,
        precision=precision_of(row.get("precision", "")),
        recompute_granularity=granularity,  # type: ignore[arg-type]
        recompute_modules=modules,
        dispatcher=dispatcher_of(row.get("dispatcher", "")),
        cuda_graph_scope=card_graph_scopes(stated.get("cuda_graph", "")),
        optimizer_offload_fraction=LONG_CONTEXT_OFFLOAD_FRACTION,
        main_grads_dtype="bf16",
        exp_avg_dtype="bf16",
    )
    run = RunConfig(spec, hardware, layout, options)
    tflops = measured_tflops(row, run)
    if tflops is None:
        return None
    return PerfCase(label, f"{spec.name}/{row['gpu']}/{LONG_CONTEXT}", spec.name, run, tflops, LONG_CONTEXT)


def card_graph_scopes(text: str) -> frozenset[str]:
    """CUDA-graph scopes of a card's cell ("attn + moe_router + moe_preprocess", "full iteration")."""
    key = text.lower()
    if "full" in key and "iter" in key:
        return frozenset({"full_iteration"})
    return frozenset(re.findall(r"[a-z_]+", key)) & (CUDA_GRAPH_SCOPES - {"full_iteration"})


def measured_tflops(row: dict[str, str], run: RunConfig) -> float | None:
    """A row's model TFLOP/s/GPU: published (the unrounded draft value where there is one), else
    from its tokens/s/GPU (or step time: GBS·seq/(step·GPUs)) × lcmoe's model FLOPs per token."""
    from lcmoe.estimate.time import model_flops_per_token

    tflops = as_float(row.get("tflops_unrounded_draft")) or as_float(row.get("tflops_per_gpu"))
    if tflops:
        return tflops
    tokens = as_float(row.get("tokens_per_sec_per_gpu"))
    step_ms = as_float(row.get("step_time_ms"))
    if not tokens and step_ms:
        tokens = run.layout.gbs * run.options.seq_len / (step_ms / 1e3) / run.layout.world_size
    if not tokens:
        return None
    return tokens * model_flops_per_token(run.model, run.options, run.layout.tp) / 1e12
