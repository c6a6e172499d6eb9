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
from lcmoe.workload import TrainingOptions

LABEL_TO_CATALOG = {
    "llama370b": "llama3-70b",
    "llama3170b": "llama3-70b",
    "llama31405b": "llama3.1-405b",
    "qwen330ba3b": "qwen3-30b-a3b",
    "dsv3": "deepseek-v3",
    "deepseekv3": "deepseek-v3",
    "gptoss120b": "gpt-oss-120b",
    "qwen3next80ba3b": "qwen3-next-80b-a3b",
    "qwen3235ba22b": "qwen3-235b-a22b",
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
    for scope in ("attn", "mlp", "moe_router", "moe_preprocess"):
        if re.search(rf"cuda graphs? (?:scope )?[^;]*\b{scope}\b", detail):
            scopes.add(scope)
    dispatcher = row.get("dispatcher", "").lower()
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
        results.append(
            {
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
    agree = sum(bool(r["agree"]) for r in results)
    return {
        "n_modelled": len(results),
        "n_agree": agree,
        "fit_agreement": agree / len(results) if results else 0.0,
        "n_cannot_model": len(cannot),
        "results": results,
        "cannot_model": cannot,
    }
