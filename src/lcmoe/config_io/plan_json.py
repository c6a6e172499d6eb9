"""A plan written by ``lcmoe plan --json`` / ``--emit`` (plan.json) → the RunConfig it describes.

The plan records the layout and every option the planner varies (``Plan.as_dict``); the rest are
the planner's base options (``plan/search.py`` ``base_options``: BF16 main grads, expandable
segments), so ``estimate`` of the rebuilt run reproduces the plan's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lcmoe.errors import LcmoeError
from lcmoe.layout import ParallelLayout
from lcmoe.run import RunConfig
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.workload import TrainingOptions, lora_fields

MAX_PLAN_BYTES = 16 * 1024 * 1024


def read_plan(path: str | Path) -> dict[str, Any]:
    source = Path(path)
    if source.is_dir():
        source = source / "plan.json"
    try:
        if source.stat().st_size > MAX_PLAN_BYTES:
            raise LcmoeError("--plan", str(path), "is larger than 16 MiB", "pass plan.json from lcmoe plan --emit")
        doc = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LcmoeError("--plan", str(path), f"cannot be read ({exc.__class__.__name__})", "check the path") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise LcmoeError(
            "--plan", str(path), "is not JSON", "pass plan.json from lcmoe plan --emit or --json"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("plans"), list) or not isinstance(doc.get("inputs"), dict):
        raise LcmoeError("--plan", str(path), "has no 'inputs' and 'plans'", "pass plan.json from lcmoe plan --emit")
    return doc


def run_from_plan(doc: dict[str, Any], *, index: int = 0, hardware: HardwareSpec | None = None) -> RunConfig:
    """Plan ``index`` (0 = best) of a plan document; ``hardware`` overrides the catalog GPU."""
    from lcmoe.catalog import load_hardware, load_model

    plans = doc["plans"]
    if not plans:
        raise LcmoeError("--plan", "plans", "is empty (no plan fitted)", "plan with more GPUs first")
    if not 0 <= index < len(plans):
        raise LcmoeError("--plan-index", index, f"must be between 0 and {len(plans) - 1}", "use 0 for the best plan")
    inputs, entry = doc["inputs"], plans[index]
    try:
        lay, rec = entry["layout"], entry["recompute"]
        model = load_model(str(inputs["model"]))
        hw = hardware or load_hardware(str(inputs["gpu"]))
        layout = ParallelLayout(
            tp=int(lay["tp"]),
            cp=int(lay["cp"]),
            ep=int(lay["ep"]),
            etp=int(lay["etp"]),
            pp=int(lay["pp"]),
            vpp=int(lay["vpp"]),
            dp=int(lay["dp"]),
            mbs=int(lay["mbs"]),
            gbs=int(lay["gbs"]),
            sequence_parallel=bool(lay["sequence_parallel"]),
            cp_comm_type=str(lay["cp_comm_type"]),
            pipeline_layout=lay.get("pipeline_layout"),
        )
        options = TrainingOptions(
            seq_len=int(inputs["seq_len"]),
            precision=str(entry["precision"]),
            # Plans written before main_grads_dtype was recorded all planned a BF16 buffer.
            main_grads_dtype="fp32" if entry.get("main_grads_dtype") == "fp32" else "bf16",
            exp_avg_dtype="bf16" if entry.get("precision_aware_optimizer") else "fp32",
            optimizer_offload_fraction=float(entry["optimizer_offload_fraction"]),
            recompute_granularity=rec["granularity"],
            recompute_modules=frozenset(rec["modules"]),
            recompute_method=rec.get("method") or "uniform",
            recompute_num_layers=int(rec.get("num_layers") or 1),
            dispatcher=str(entry["dispatcher"]),
            cuda_graph_scope=frozenset(entry["cuda_graph_scope"]),
            overlap_moe_expert_parallel_comm=bool(entry["overlap_moe_expert_parallel_comm"]),
            **_peft(entry.get("peft")),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise LcmoeError(
            "--plan", f"plans[{index}]", f"is missing or has a bad field ({exc})", "re-run lcmoe plan"
        ) from None
    return RunConfig(model, hw, layout, options)


def _peft(doc: dict[str, Any] | None) -> dict[str, Any]:
    """TrainingOptions' LoRA fields from a plan entry's ``peft`` (None: full training)."""
    if not doc:
        return {}
    targets = (str(t) for t in doc["targets"])
    return lora_fields(int(doc["rank"]), targets, bool(doc.get("input_regather", False)), scheme=str(doc["scheme"]))
