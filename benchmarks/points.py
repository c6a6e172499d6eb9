"""memory_points.csv: documented fits and OOMs → does lcmoe's verdict agree?

A row is modelled when it is a full-parameter training run (not LoRA, inference or a checkpoint
conversion), its model is in the catalog and its GPU and GPU count are stated. A row takes what
it leaves empty (layout, sequence length, dispatcher, recompute, CUDA graphs, optimizer dtypes)
from the Bridge recipe it ran: the perf recipe's trace in perf_recipes.csv
(``perf_recipe_for``), or for a row naming its recipe ("recipe=NAME") that recipe's settings
read from the Bridge source into benchmarks/data/bridge_recipes.csv (``named_recipe_for``);
what neither says takes Megatron Bridge's defaults (seq 4096, MBS 1, CP/EP/ETP 1, distributed
optimizer, BF16). Whether the allocator ran with expandable segments comes from the row's own
sources (``ran_with_expandable_segments``).
"""

from __future__ import annotations

import functools
import re
import statistics
from pathlib import Path
from typing import Any

from benchmarks.perf_rows import LORA_PERF_TARGETS, version_key
from benchmarks.perf_rows import graph_scopes as recipe_graph_scopes
from benchmarks.published import REFERENCE, not_in_catalog, read_rows
from lcmoe.catalog import catalog_name_for_label, load_hardware, load_model
from lcmoe.errors import LcmoeError
from lcmoe.estimate.memory import estimate_memory
from lcmoe.layout import ParallelLayout
from lcmoe.run import resolve_pipeline_layout
from lcmoe.workload import TrainingOptions

# Settings of the Bridge recipes that memory_points rows name ("recipe=NAME") but perf_recipes.csv
# does not trace, read from the Bridge source (each row cites its file and lines).
NAMED_RECIPES = Path(__file__).resolve().parent / "data" / "bridge_recipes.csv"
PRECISION = {
    "bf16": "bf16",
    "fp8cs": "fp8-tensorwise",
    "fp8": "fp8-tensorwise",
    "fp8mx": "mxfp8",
    "mxfp8": "mxfp8",
    "nvfp4": "nvfp4",
    "fp8blockwise": "fp8-blockwise",
}


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _first_int(text: str | None, default: int) -> int:
    match = re.search(r"\d+", text or "")
    return int(match.group()) if match else default


def recipe_settings(row: dict[str, str], name: str) -> dict[str, Any]:
    """Settings a row inherits from the Bridge recipe it ran, where the row names that recipe's
    own layout but not these fields.

    - Perf recipes (task "perf recipe"; the PR #3107 Llama3-70B SFT runs, whose card scores them
      against LLAMA3_70B_SFT_CONFIG_H100_FP8_CS_V1's golden 709.93 TFLOP/s; the Qwen3-30B-A3B
      16×H100 HybridEP "canonical recipe" runs): ddp.grad_reduce_in_fp32=False, so the DDP
      gradient buffer is BF16 (facts §2); the Llama3-70B SFT FP8 recipes graph the MLP
      (cuda_graph_impl=transformer_engine, scope mlp; perf_recipes.csv).
    - Moonlight-16B-A3B (moonlight_16b_pretrain_8gpu_h100_bf16_config at Bridge 600d069b8):
      BF16 gradients and the precision-aware optimizer's BF16 Adam moments.
    - Nemotron-3 Nano (nemotron_3_nano_pretrain_8gpu_h100_bf16_config at the same commit,
      recipes/nemotronh/h100/nemotron_3_nano.py:198, 230): ddp.grad_reduce_in_fp32=False, so BF16
      gradients, with FP32 Adam.
    """
    task = row.get("task", "").lower()
    settings: dict[str, Any] = {}
    sft_70b = name == "llama3-70b" and task.startswith("sft")
    canonical_30b = name == "qwen3-30b-a3b" and (row.get("dispatcher") or "").lower() == "hybridep"
    if "perf recipe" in task or sft_70b or canonical_30b:
        settings["main_grads_dtype"] = "bf16"
    if sft_70b and "fp8" in _key(row.get("precision", "")):
        settings["cuda_graph_scope"] = {"mlp"}
    if name == "moonlight-16b-a3b":
        settings.update(main_grads_dtype="bf16", exp_avg_dtype="bf16")
    if name == "nemotron-3-nano-30b-a3b":
        settings["main_grads_dtype"] = "bf16"
    return settings


# Verdicts whose predicted peak is within this many percent of the GPU's memory are reported apart:
# the golden rows' median error is about 2% and their 90th percentile about 8%.
CLOSE_CALL_PCT = 5.0

# Tasks whose memory is not a training step's (inference, checkpoint conversion, a forward-only
# comparison, a loss-function study): lcmoe's verdict is about training, so they are not scored.
NOT_TRAINING = ("inference", "conversion", "forward comparison", "loss computation")


def ran_with_expandable_segments(row: dict[str, str]) -> bool:
    """Whether the run had ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, from its sources:

    - the row says so ("without expandable segments" / "with expandable segments");
    - an OOM whose documented fix is enabling expandable segments ran without them (the
      perf_plugins.py commits behind these rows add the variable as the fix, e.g. 55bc72009
      for Qwen3-Next on H100, d316d69dd for Nemotron-3 Nano);
    - the Llama3-70B SFT runs of PR #3107 ran without them: the memory-tuning skill's
      ``baseline_without_expandable_segments`` (704 TFLOP/s, OOM at 58.8 GB, "fixed by
      expandable_segments") is the activation-recompute skill's ``core_attn_baseline`` (704
      TFLOP/s, 58.8 GB), and the recompute experiments changed only recompute_modules.
    Otherwise the row is taken to have them, as lcmoe's emitted launchers and Bridge's perf
    executors since 6f24c71f3 set them.
    """
    text = (row.get("config_detail", "") + " " + row.get("notes", "")).lower().replace("_", " ")
    if "without expandable" in text:
        return False
    if "with expandable" in text:
        return True
    if row.get("outcome") == "oom" and re.search(r"fix(ed)?\b[^;]*expandable segments", text):
        return False
    return "pr #3107" not in text


def perf_recipe_for(row: dict[str, str], name: str, recipes: list[dict[str, str]]) -> dict[str, str] | None:
    """The traced Bridge perf recipe a "perf recipe" row ran (perf_recipes.csv): same catalog
    model, GPU, precision and task, and the layout fields the row states; the newest container's
    trace when several match. None for other rows, or when no trace matches."""
    task = row.get("task", "").lower()
    if "perf recipe" not in task:
        return None
    precision = PRECISION.get(_key(row.get("precision", "")), "bf16")
    stated = {k: _first_int(row.get(k), 0) for k in ("tp", "pp", "cp", "ep", "mbs", "gbs") if row.get(k)}
    candidates = [
        recipe
        for recipe in recipes
        if catalog_name_for_label(recipe.get("model", "")) == name
        and recipe.get("gpu") == row.get("gpu")
        and PRECISION.get(_key(recipe.get("precision_norm", "")), "bf16") == precision
        and task.startswith(recipe.get("task", "?"))
        and all(_first_int(recipe.get(f"recipe_{k}"), 1) == v for k, v in stated.items())
    ]
    return max(candidates, key=lambda r: version_key(r.get("container", "")), default=None)


@functools.cache
def named_recipes() -> tuple[dict[str, str], ...]:
    """benchmarks/data/bridge_recipes.csv, read once."""
    return tuple(read_rows(NAMED_RECIPES)) if NAMED_RECIPES.exists() else ()


def named_recipe_for(row: dict[str, str], name: str) -> dict[str, str] | None:
    """The settings of the recipe a row names ("recipe=NAME") from benchmarks/data/bridge_recipes.csv."""
    match = re.search(r"recipe=([A-Za-z0-9_]+)", row.get("config_detail", ""))
    if match is None:
        return None
    return next((r for r in named_recipes() if r["recipe_function"] == match.group(1) and r["model"] == name), None)


def perf_recipes_beside(points_path: str) -> list[dict[str, str]]:
    """perf_recipes.csv next to the points file, else in the shared reference folder; [] if neither."""
    for folder in (Path(points_path).parent, REFERENCE):
        candidate = folder / "perf_recipes.csv"
        if candidate.exists():
            return read_rows(candidate)
    return []


def measured_allocated_bytes(row: dict[str, str]) -> float | None:
    """The row's measured peak allocated memory in bytes (mem_unit GB = 1e9, GiB = 2^30), when it
    reports one."""
    metric = row.get("metric", "")
    if ("alloc" not in metric and not metric.startswith("peak_mem")) or "reserved" in metric:
        return None
    return _measured_bytes(row)


def measured_reserved_bytes(row: dict[str, str]) -> float | None:
    """The row's measured peak reserved memory (torch ``max_memory_reserved``: the caching
    allocator's segments, without the CUDA context or buffers allocated outside PyTorch)."""
    return _measured_bytes(row) if "reserved" in row.get("metric", "") else None


def _measured_bytes(row: dict[str, str]) -> float | None:
    value = row.get("peak_mem_gb", "")
    if not value:
        return None
    try:
        return float(value) * (2**30 if row.get("mem_unit", "").startswith("GiB") else 1e9)
    except ValueError:
        return None


def point_config(
    row: dict[str, str], recipes: list[dict[str, str]] | None = None
) -> tuple[Any, Any, ParallelLayout, TrainingOptions] | str:
    """The configuration a row ran: its own fields first, then its recipe's trace (perf_recipes.csv
    for perf-recipe rows, benchmarks/data/bridge_recipes.csv for rows naming a recipe), then
    Bridge's defaults. A string says why the row cannot be modelled."""
    task = row.get("task", "").lower()
    if any(word in task for word in NOT_TRAINING):
        return "not a training run"
    lora: dict[str, Any] = {}
    if "lora" in task or "peft" in task:
        # Bridge's LoRA perf recipes adapt linear_qkv only; other LoRA runs use LoRA's defaults.
        lora = {"peft": "lora"} | ({"lora_targets": LORA_PERF_TARGETS} if "perf recipe" in task else {})
    name = catalog_name_for_label(row.get("model", ""))
    if name is None:
        return not_in_catalog(row.get("model", ""))
    if not row.get("gpu") or not row.get("num_gpus"):
        return "GPU type or count not stated"
    model, hardware = load_model(name), load_hardware(row["gpu"])
    recipe = perf_recipe_for(row, name, recipes or []) or named_recipe_for(row, name) or {}

    def stated(key: str, recipe_key: str, default: int) -> int:
        return _first_int(row.get(key) or recipe.get(recipe_key), default)

    tp, pp, cp = stated("tp", "recipe_tp", 1), stated("pp", "recipe_pp", 1), stated("cp", "recipe_cp", 1)
    vpp = _first_int(row.get("vpp"), 1)
    world = _first_int(row["num_gpus"], 1)
    if world % (tp * pp * cp):
        return f"{world} GPUs do not divide by TP·PP·CP = {tp * pp * cp}"
    dp = world // (tp * pp * cp)
    mbs = stated("mbs", "recipe_mbs", 1)
    gbs = stated("gbs", "recipe_gbs", mbs * dp)
    detail = (row.get("config_detail", "") + " " + row.get("notes", "")).lower()
    recompute = row.get("recompute", "").lower() or recipe.get("recompute_effective", "").lower()
    modules = (
        frozenset(m for m in re.findall(r"[a-z_]+", recompute.split("selective", 1)[1]) if m)
        if "selective" in recompute
        else None
    )
    full = "full" in recompute and modules is None
    offload = re.search(r"optimizer_offload_(\d+)pct", detail)
    # The graphs a row ran are the ones its configuration names (notes may name the fix instead);
    # a full-iteration graph captures everything, so no TE scope runs beside it.
    configured = row.get("config_detail", "").lower()
    scopes: set[str] = set()
    if "full-iteration cuda graph" in configured:
        scopes.add("full_iteration")
    for scope in ("attn", "mlp", "mamba", "moe_router", "moe_preprocess"):
        if re.search(rf"cuda graphs? (?:scope )?[^;]*\b{scope}\b", configured):
            scopes.add(scope)
    if not scopes and recipe:
        scopes = set(recipe_graph_scopes(recipe.get("cuda_graph_effective", "")))
    dispatcher = (
        row.get("dispatcher")
        or next((d for d in ("hybridep", "deepep") if d in detail), "")
        or next((d for d in ("hybridep", "deepep") if d in recipe.get("dispatcher_effective", "")), "")
    ).lower()
    inherited = recipe_settings(row, name)
    scopes |= inherited.pop("cuda_graph_scope", set())
    if "full_iteration" in scopes:
        scopes = {"full_iteration"}
    if recipe.get("main_grads_dtype") in ("fp32", "bf16"):
        inherited["main_grads_dtype"] = recipe["main_grads_dtype"]
    if recipe.get("use_precision_aware_optimizer") == "True":
        # Moments as the recipe sets them (bridge_recipes.csv); perf_recipes.csv does not say, and
        # its precision-aware recipes keep BF16 ones (perf_recipes/_common.py).
        inherited["precision_aware"] = True
        inherited["exp_avg_dtype"] = recipe.get("exp_avg_dtype") or "bf16"
    if recipe.get("main_params_dtype") in ("fp16", "bf16"):
        inherited["main_params_dtype"] = recipe["main_params_dtype"]
    if recipe.get("moe_expert_capacity_factor"):
        # Expert inputs padded to capacity: every expert sees capacity × the mean token count.
        inherited["moe_token_imbalance"] = float(recipe["moe_expert_capacity_factor"])
    try:
        layout = ParallelLayout(
            tp=tp,
            pp=pp,
            vpp=vpp,
            cp=cp,
            ep=stated("ep", "recipe_ep", 1),
            etp=stated("etp", "etp", 1),
            dp=dp,
            mbs=mbs,
            gbs=gbs,
            sequence_parallel=tp > 1,
            cp_comm_type="all_gather" if model.is_dsa and cp > 1 else "p2p",  # DSA runs no other CP
            # Layers that do not split evenly over PP·VPP get the balanced layout Bridge's
            # recipes spell out (embedding and loss as stages of their own, as Megatron's
            # account_for_*_in_pipeline_split does).
            pipeline_layout=resolve_pipeline_layout(model, pp, vpp, None),
        )
        options = TrainingOptions(
            seq_len=stated("seq_len", "recipe_seq_len", 4096),
            precision=PRECISION.get(_key(row.get("precision") or recipe.get("precision_norm", "")), "bf16"),
            recompute_granularity="selective" if modules else "full" if full else "none",
            recompute_modules=modules or frozenset(),
            optimizer_offload_fraction=int(offload.group(1)) / 100 if offload else 0.0,
            # A recipe's full recompute is Bridge's uniform method over one layer at a time, which
            # are TrainingOptions' defaults (recompute_method, recompute_num_layers).
            dispatcher=dispatcher if dispatcher in ("deepep", "hybridep") else "alltoall",
            cuda_graph_scope=frozenset(scopes),
            megatron_fsdp=recipe.get("use_megatron_fsdp") == "True",
            activation_offload_modules=frozenset(
                m for m in re.findall(r"[a-z_0-9]+", recipe.get("offload_modules", "").lower()) if m != "none"
            ),
            expandable_segments=ran_with_expandable_segments(row),
            overlap_moe_expert_parallel_comm="ep overlap on" in detail,
            **inherited,
            **lora,
        )
    except LcmoeError as exc:
        return str(exc)
    return model, hardware, layout, options


def evaluate_points(path: str, *, verbose: bool = True) -> dict[str, Any]:
    recipes = perf_recipes_beside(path)
    results, cannot = [], []
    for row in read_rows(path):
        if row.get("outcome") not in ("fits", "oom"):
            continue
        label = f"{row.get('model')} {row.get('gpu')}x{row.get('num_gpus')} {row.get('config_detail', '')[:60]}"
        config = point_config(row, recipes)
        if isinstance(config, str):
            cannot.append({"row": label, "reason": config})
            continue
        model, hardware, layout, options = config
        try:
            estimate = estimate_memory(model, hardware, layout, options)
        except LcmoeError as exc:
            cannot.append({"row": label, "reason": str(exc)})
            continue
        predicted = "fits" if estimate.fits() else "oom"
        allocated, reserved = measured_allocated_bytes(row), measured_reserved_bytes(row)
        results.append(
            {
                "measured_allocated_gib": allocated / 2**30 if allocated else None,
                "peak_allocated_gib": estimate.peak_allocated_bytes / 2**30,
                "measured_err_pct": 100 * (estimate.peak_allocated_bytes / allocated - 1) if allocated else None,
                "measured_reserved_gib": reserved / 2**30 if reserved else None,
                "peak_torch_reserved_gib": estimate.peak_torch_reserved_bytes / 2**30,
                "measured_reserved_err_pct": (
                    100 * (estimate.peak_torch_reserved_bytes / reserved - 1) if reserved else None
                ),
                # Only a lower bound on the peak: an OOM run logs its memory before the allocation
                # that fails; "mem_allocated" is what is allocated after a step, not the peak.
                "measured_lower_bound": row["outcome"] == "oom" or row.get("metric") == "mem_allocated",
                "row": label,
                "documented": row["outcome"],
                "predicted": predicted,
                "expandable_segments": options.expandable_segments,
                "peak_reserved_gib": estimate.peak_reserved_bytes / 2**30,
                "capacity_gib": estimate.capacity_bytes / 2**30,
                "agree": predicted == row["outcome"],
                "oom_risk": estimate.oom_risk,
            }
        )
    if verbose:
        for r in results:
            mark = "ok  " if r["agree"] else "MISS"
            allocator = "" if r["expandable_segments"] else " (no expandable segments)"
            risk = " at risk" if r["oom_risk"] else ""
            print(
                f"{mark} documented {r['documented']:4s} predicted {r['predicted'] + risk:12s} "
                f"{r['peak_reserved_gib']:7.1f}/{r['capacity_gib']:.0f} GiB  {r['row']}{allocator}"
            )
    measured_rows = [r for r in results if r["measured_allocated_gib"] or r["measured_reserved_gib"]]
    if verbose and measured_rows:
        print("measured peaks (worst stage predicted; the logging rank is not stated):")
        for r in measured_rows:
            kind, ours, theirs, err = (
                ("allocated", r["peak_allocated_gib"], r["measured_allocated_gib"], r["measured_err_pct"])
                if r["measured_allocated_gib"]
                else (
                    "reserved",
                    r["peak_torch_reserved_gib"],
                    r["measured_reserved_gib"],
                    r["measured_reserved_err_pct"],
                )
            )
            print(
                f"  {kind:9s} {ours:6.1f} vs {theirs:6.1f} GiB {err:+6.1f}%  {r['row']}"
                + ("  (a lower bound on the peak)" if r["measured_lower_bound"] else "")
            )
    agree = sum(bool(r["agree"]) for r in results)
    # A verdict within CLOSE_CALL_PCT of capacity is inside the estimator's own error band.
    decisive = [r for r in results if abs(r["peak_reserved_gib"] / r["capacity_gib"] - 1) * 100 > CLOSE_CALL_PCT]
    errors = [
        abs(err)
        for r in results
        if not r["measured_lower_bound"]
        for err in (r["measured_err_pct"], r["measured_reserved_err_pct"])
        if err is not None
    ]
    # The three-way verdict the CLI prints: a "fits" inside the estimator's error band is at risk.
    ooms = [r for r in results if r["documented"] == "oom"]
    fitting = [r for r in results if r["documented"] == "fits"]
    return {
        "n_oom_documented": len(ooms),
        "n_oom_predicted_oom_or_at_risk": sum(r["predicted"] == "oom" or bool(r["oom_risk"]) for r in ooms),
        "n_fits_documented": len(fitting),
        "n_fits_predicted_at_risk": sum(bool(r["oom_risk"]) for r in fitting),
        "n_modelled": len(results),
        "n_agree": agree,
        "fit_agreement": agree / len(results) if results else 0.0,
        "n_decisive": len(decisive),
        "fit_agreement_decisive": sum(bool(r["agree"]) for r in decisive) / len(decisive) if decisive else 0.0,
        "measured_peaks_n": len(errors),
        "measured_peaks_median_abs_pct_err": statistics.median(errors) if errors else None,
        "measured_peaks_max_abs_pct_err": max(errors) if errors else None,
        "n_cannot_model": len(cannot),
        "results": results,
        "cannot_model": cannot,
    }
