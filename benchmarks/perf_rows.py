"""Published Bridge throughput rows (perf_summary.csv ⋈ perf_recipes.csv, long_context.csv) →
RunConfigs with the recipe settings behind each row, for the time-model fit and benchmark."""

from __future__ import annotations

import re
from dataclasses import dataclass

from benchmarks.published import as_float, as_int, catalog_model_for_row, read_rows
from lcmoe.catalog import load_hardware, load_model
from lcmoe.errors import LcmoeError
from lcmoe.layout import ParallelLayout, check_pipeline_layout
from lcmoe.run import RunConfig, build_layout, resolve_pipeline_layout
from lcmoe.workload import CUDA_GRAPH_SCOPES, TrainingOptions

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
            reason = "model not in catalog"
        elif row.get("status") != "current" or row.get("task") not in tasks:
            reason = f"not a current {'/'.join(tasks)} row"
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


def long_context_cases(path: str) -> tuple[list[PerfCase], list[dict[str, str]]]:
    """long_context.csv rows. The DSV3 H100 CP series publishes the full layout only at 128K and
    256K; the shorter points share it (TP1 EP32 PP8 VPP4, CP as published, DP = GPUs/(PP·CP)),
    as the card states the family changes only CP; the rows add optimizer offload from 16K. GBS
    is not published: 32 microbatches per pipeline are assumed (bubble (PP−1)/(VPP·M) ≈ 5%),
    except where a row's note gives it (Qwen3-235B's 4K baseline). Recompute is published at 128K/256K
    (up_proj, norm, moe, mlp); the 4K–64K points, for which the card says only "selective", take
    the same set: CP grows with the sequence so every point holds 4K tokens per GPU and the same
    per-GPU activations, and no narrower set of lcmoe's ladder fits an H100 (the set without
    ``moe`` is predicted within 2% of the 80 GB, so picking "the narrowest that fits" would make
    the time fit hinge on the memory estimator's last percent)."""
    cases, skipped = [], []
    for row in read_rows(path):
        label = f"{row['model']} {row['gpu']}x{row['num_gpus']} {row['seq_len']}"
        tflops = as_float(row.get("tflops_unrounded_draft")) or as_float(row.get("tflops_per_gpu"))
        name = (
            "deepseek-v3"
            if row["model"].startswith("DSV3")
            else ("qwen3-235b-a22b" if row["model"].startswith("Qwen3 235B") else None)
        )
        if name is None or not tflops:
            skipped.append({"row": label, "reason": "model not in catalog or no TFLOP/s"})
            continue
        spec = load_model(name)
        hardware = load_hardware(row["gpu"])
        seq = as_int(row["seq_len"])
        gbs: int | None = None  # not published: 32 microbatches per pipeline
        if name == "deepseek-v3":
            tp, ep, pp, vpp = 1, 32, 8, 4
            precision, dispatcher = "fp8-blockwise", "deepep"
            granularity, modules = "selective", frozenset({"mla_up_proj", "layernorm", "moe", "mlp"})
            graphs: frozenset[str] = frozenset()
            offload = LONG_CONTEXT_OFFLOAD_FRACTION if row.get("optimizer_cpu_offload") == "True" else 0.0
        else:
            # 128K: SKILL.md "Qwen3 235B at 128K on GB200"; the 4K baseline: the row's note (the
            # moe-hardware-configs card's TP1 EP32 PP4 VPP12, MBS1 GBS1024, same graph scope).
            tp, ep, pp, vpp = (4, 32, 4, 12) if seq > 4096 else (1, 32, 4, 12)
            gbs = None if seq > 4096 else 1024
            precision, dispatcher = "bf16", "hybridep"
            granularity, modules = (
                ("selective", frozenset({"moe_act", "layernorm"})) if seq > 4096 else ("none", frozenset())
            )
            graphs = frozenset({"attn", "moe_router", "moe_preprocess"})
            offload = 0.0
        cp = as_int(row.get("cp"), 1)
        world = as_int(row["num_gpus"])
        if world % (tp * pp * cp):
            skipped.append({"row": label, "reason": "layout does not divide the GPU count"})
            continue
        dp = world // (tp * pp * cp)
        layout = build_layout(spec, world, tp=tp, cp=cp, ep=ep, pp=pp, vpp=vpp, gbs=gbs or 32 * dp)
        options = TrainingOptions(
            seq_len=seq,
            precision=precision,
            recompute_granularity=granularity,  # type: ignore[arg-type]
            recompute_modules=modules,
            dispatcher=dispatcher,
            cuda_graph_scope=graphs,
            optimizer_offload_fraction=offload,
            main_grads_dtype="bf16",
            exp_avg_dtype="bf16",
        )
        run = RunConfig(spec, hardware, layout, options)
        cases.append(
            PerfCase(
                label,
                f"{name}/{row['gpu']}/{LONG_CONTEXT}",
                name,
                run,
                tflops,
                LONG_CONTEXT,
            )
        )
    return cases, skipped
