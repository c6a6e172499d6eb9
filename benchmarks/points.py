"""memory_points.csv: documented fits and OOMs → does lcmoe's verdict agree?

A row is modelled when its model is in the catalog and its GPU and GPU count are stated.
Fields a row leaves empty take Megatron Bridge's perf-recipe defaults (seq 4096, MBS 1,
CP/EP/ETP 1, distributed optimizer, BF16), which the row notes say the runs used.
"""

from __future__ import annotations

import re
from typing import Any

from benchmarks.published import read_rows
from lcmoe.catalog import load_hardware, load_model
from lcmoe.errors import LcmoeError
from lcmoe.estimate.memory import estimate_memory
from lcmoe.layout import ParallelLayout
from lcmoe.run import resolve_pipeline_layout
from lcmoe.workload import TrainingOptions

LABEL_TO_CATALOG = {
    "llama370b": "llama3-70b",
    "llama3170b": "llama3-70b",
    "llama31405b": "llama3.1-405b",
    "qwen330ba3b": "qwen3-30b-a3b",
    "moonlight16b": "moonlight-16b-a3b",
    "dsv3": "deepseek-v3",
    "deepseekv3": "deepseek-v3",
    "gptoss120b": "gpt-oss-120b",
    "qwen3next80ba3b": "qwen3-next-80b-a3b",
    "qwen3235ba22b": "qwen3-235b-a22b",
    "nemotron3nano": "nemotron-3-nano-30b-a3b",
}
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


def measured_allocated_bytes(row: dict[str, str]) -> float | None:
    """The row's measured peak allocated memory in bytes (mem_unit GB = 1e9, GiB = 2^30), when it
    reports one."""
    metric = row.get("metric", "")
    value = row.get("peak_mem_gb", "")
    if ("alloc" not in metric and not metric.startswith("peak_mem")) or not value:
        return None
    try:
        return float(value) * (2**30 if row.get("mem_unit") == "GiB" else 1e9)
    except ValueError:
        return None


def point_config(row: dict[str, str]) -> tuple[Any, Any, ParallelLayout, TrainingOptions] | str:
    name = LABEL_TO_CATALOG.get(_key(row.get("model", "")))
    if name is None:
        return "model not in the catalog"
    if not row.get("gpu") or not row.get("num_gpus"):
        return "GPU type or count not stated"
    model, hardware = load_model(name), load_hardware(row["gpu"])
    tp, pp, cp = (_first_int(row.get(k), 1) for k in ("tp", "pp", "cp"))
    vpp = _first_int(row.get("vpp"), 1)
    world = _first_int(row["num_gpus"], 1)
    if world % (tp * pp * cp):
        return f"{world} GPUs do not divide by TP·PP·CP = {tp * pp * cp}"
    dp = world // (tp * pp * cp)
    mbs = _first_int(row.get("mbs"), 1)
    gbs = _first_int(row.get("gbs"), mbs * dp)
    detail = (row.get("config_detail", "") + " " + row.get("notes", "")).lower()
    recompute = row.get("recompute", "").lower()
    modules = frozenset(m.strip() for m in recompute.split(":", 1)[1].split(",")) if "selective" in recompute else None
    offload = re.search(r"optimizer_offload_(\d+)pct", detail)
    scopes: set[str] = set()
    if "full-iteration cuda graph" in detail:
        scopes.add("full_iteration")
    for scope in ("attn", "mlp", "mamba", "moe_router", "moe_preprocess"):
        if re.search(rf"cuda graphs? (?:scope )?[^;]*\b{scope}\b", detail):
            scopes.add(scope)
    dispatcher = (row.get("dispatcher") or next((d for d in ("hybridep", "deepep") if d in detail), "")).lower()
    inherited = recipe_settings(row, name)
    scopes |= inherited.pop("cuda_graph_scope", set())
    try:
        layout = ParallelLayout(
            tp=tp,
            pp=pp,
            vpp=vpp,
            cp=cp,
            ep=_first_int(row.get("ep"), 1),
            etp=_first_int(row.get("etp"), 1),
            dp=dp,
            mbs=mbs,
            gbs=gbs,
            sequence_parallel=tp > 1,
            # Layers that do not split evenly over PP·VPP get the balanced layout Bridge's
            # recipes spell out (embedding and loss as stages of their own, as Megatron's
            # account_for_*_in_pipeline_split does).
            pipeline_layout=resolve_pipeline_layout(model, pp, vpp, None),
        )
        options = TrainingOptions(
            seq_len=_first_int(row.get("seq_len"), 4096),
            precision=PRECISION.get(_key(row.get("precision", "")), "bf16"),
            recompute_granularity="selective" if modules else "none",
            recompute_modules=modules or frozenset(),
            optimizer_offload_fraction=int(offload.group(1)) / 100 if offload else 0.0,
            dispatcher=dispatcher if dispatcher in ("deepep", "hybridep") else "alltoall",
            cuda_graph_scope=frozenset(scopes),
            expandable_segments="without expandable" not in detail,
            **inherited,
        )
    except LcmoeError as exc:
        return str(exc)
    return model, hardware, layout, options


def evaluate_points(path: str, *, verbose: bool = True) -> dict[str, Any]:
    results, cannot = [], []
    for row in read_rows(path):
        if row.get("outcome") not in ("fits", "oom"):
            continue
        label = f"{row.get('model')} {row.get('gpu')}x{row.get('num_gpus')} {row.get('config_detail', '')[:60]}"
        config = point_config(row)
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
        measured = measured_allocated_bytes(row)
        results.append(
            {
                "measured_allocated_gib": measured / 2**30 if measured else None,
                "peak_allocated_gib": estimate.peak_allocated_bytes / 2**30,
                "measured_err_pct": 100 * (estimate.peak_allocated_bytes / measured - 1) if measured else None,
                "row": label,
                "documented": row["outcome"],
                "predicted": predicted,
                "peak_reserved_gib": estimate.peak_reserved_bytes / 2**30,
                "capacity_gib": estimate.capacity_bytes / 2**30,
                "agree": predicted == row["outcome"],
            }
        )
    if verbose:
        for r in results:
            mark = "ok  " if r["agree"] else "MISS"
            print(
                f"{mark} documented {r['documented']:4s} predicted {r['predicted']:4s} "
                f"{r['peak_reserved_gib']:7.1f}/{r['capacity_gib']:.0f} GiB  {r['row']}"
            )
    measured_rows = [r for r in results if r["measured_allocated_gib"]]
    if verbose and measured_rows:
        print("measured peak allocated (worst stage predicted; the logging rank is not stated):")
        for r in measured_rows:
            print(
                f"  {r['peak_allocated_gib']:6.1f} vs {r['measured_allocated_gib']:6.1f} GiB "
                f"{r['measured_err_pct']:+6.1f}%  {r['row']}"
                # An OOM run logs its memory before the allocation that fails: a lower bound.
                + ("  (OOM run: logged before its peak)" if r["documented"] == "oom" else "")
            )
    agree = sum(bool(r["agree"]) for r in results)
    return {
        "n_modelled": len(results),
        "n_agree": agree,
        "fit_agreement": agree / len(results) if results else 0.0,
        "n_cannot_model": len(cannot),
        "results": results,
        "cannot_model": cannot,
    }
