"""A plan written by ``lcmoe plan --json`` / ``--emit`` (plan.json) → the RunConfig it describes.

The plan records the layout and every option the planner varies (``Plan.as_dict``); the rest are
the planner's base options (``plan/search.py`` ``base_options``: BF16 main grads, expandable
segments), so ``estimate`` of the rebuilt run reproduces the plan's numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lcmoe.errors import LcmoeError
from lcmoe.layout import ParallelLayout, read_hierarchical_sizes
from lcmoe.run import RunConfig
from lcmoe.safe_io import load_json, read_text_capped
from lcmoe.specs.doc_lengths import DocLengths, doc_lengths_from_shares
from lcmoe.specs.hardware import HardwareSpec, hardware_from_dict
from lcmoe.specs.model import ModelSpec, model_from_dict
from lcmoe.units import real_number, whole_number
from lcmoe.workload import TrainingOptions, lora_fields

MAX_PLAN_BYTES = 16 * 1024 * 1024


def read_plan(path: str | Path) -> dict[str, Any]:
    """plan.json (or the one in an ``--emit`` directory): a regular file of at most 16 MiB,
    parsed with bounded nesting and integer length (safe_io)."""
    source = Path(path)
    if source.is_dir():
        source = source / "plan.json"
    text = read_text_capped(source, field="--plan", max_bytes=MAX_PLAN_BYTES)
    try:
        doc = load_json(text, origin=f"--plan {path}")
    except LcmoeError as exc:  # not JSON, too deep, or a number too long: say which
        raise LcmoeError(
            "--plan", str(path), f"is not a plan lcmoe can read ({exc.rule})", "pass plan.json from lcmoe plan --emit"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("plans"), list) or not isinstance(doc.get("inputs"), dict):
        raise LcmoeError("--plan", str(path), "has no 'inputs' and 'plans'", "pass plan.json from lcmoe plan --emit")
    return doc


def _whole(section: dict[str, Any], key: str, default: int | None = None) -> int:
    value = section[key] if default is None else section.get(key, default)
    return whole_number(value, field=f"plan {key}", fix="re-run lcmoe plan")


def _flag(section: dict[str, Any], key: str, default: bool | None = None) -> bool:
    """A JSON boolean (plan.json writes true/false); no truthy text or numbers."""
    value = section[key] if default is None else section.get(key, default)
    if not isinstance(value, bool):
        raise LcmoeError(f"plan {key}", value, "must be true or false", "re-run lcmoe plan")
    return value


def _text(section: dict[str, Any], key: str) -> str:
    value = section[key]
    if not isinstance(value, str):
        raise LcmoeError(f"plan {key}", value, "must be a string", "re-run lcmoe plan")
    return value


def _texts(section: dict[str, Any], key: str) -> frozenset[str]:
    value = section[key]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise LcmoeError(f"plan {key}", value, "must be a list of strings", "re-run lcmoe plan")
    return frozenset(value)


def plan_specs(inputs: dict[str, Any]) -> tuple[ModelSpec, HardwareSpec | None]:
    """The plan's model (the embedded ``model_spec``, else the catalog model of that name: plans
    before the spec was embedded) and its embedded hardware, if any."""
    from lcmoe.catalog import load_model

    spec = inputs.get("model_spec")
    if isinstance(spec, dict):
        model = model_from_dict(spec, origin="plan.json inputs.model_spec")
    else:
        model = load_model(_text(inputs, "model"))
    hardware = inputs.get("hardware_spec")
    return model, hardware_from_dict(hardware, origin="plan.json inputs.hardware_spec") if isinstance(
        hardware, dict
    ) else None


def run_from_plan(doc: dict[str, Any], *, index: int = 0, hardware: HardwareSpec | None = None) -> RunConfig:
    """Plan ``index`` (0 = best) of a plan document; ``hardware`` overrides the catalog GPU."""
    from lcmoe.catalog import load_hardware

    plans = doc["plans"]
    if not plans:
        raise LcmoeError("--plan", "plans", "is empty (no plan fitted)", "plan with more GPUs first")
    if not 0 <= index < len(plans):
        raise LcmoeError("--plan-index", index, f"must be between 0 and {len(plans) - 1}", "use 0 for the best plan")
    inputs, entry = doc["inputs"], plans[index]
    try:
        if not isinstance(entry, dict):
            raise TypeError("a plan entry must be a mapping")
        lay, rec = entry["layout"], entry["recompute"]
        if not isinstance(lay, dict) or not isinstance(rec, dict):
            raise TypeError("layout and recompute must be mappings")
        model, plan_hardware = plan_specs(inputs)
        hw = hardware or plan_hardware or load_hardware(_text(inputs, "gpu"))
        layout = _plan_layout(lay)
        method = rec.get("method") or "uniform"
        options = TrainingOptions(
            seq_len=_whole(inputs, "seq_len"),
            precision=_text(entry, "precision"),
            # Plans written before main_grads_dtype was recorded all planned a BF16 buffer.
            main_grads_dtype="fp32" if entry.get("main_grads_dtype") == "fp32" else "bf16",
            exp_avg_dtype="bf16" if _flag(entry, "precision_aware_optimizer", False) else "fp32",
            optimizer_offload_fraction=real_number(
                entry["optimizer_offload_fraction"], field="plan optimizer_offload_fraction", fix="re-run lcmoe plan"
            ),
            recompute_granularity=_text(rec, "granularity"),  # type: ignore[arg-type]  # checked by TrainingOptions
            recompute_modules=_texts(rec, "modules"),
            recompute_method=method,  # type: ignore[arg-type]  # checked by TrainingOptions
            recompute_num_layers=_whole(rec, "num_layers", 1) if rec.get("num_layers") is not None else 1,
            dispatcher=_text(entry, "dispatcher"),
            cuda_graph_scope=_texts(entry, "cuda_graph_scope"),
            overlap_moe_expert_parallel_comm=_flag(entry, "overlap_moe_expert_parallel_comm"),
            doc_lengths=plan_doc_lengths(inputs.get("doc_lengths")),
            **_peft(entry.get("peft")),
            **_activation_offload(entry.get("activation_offload")),
            **_dynamic_cp(entry.get("dynamic_cp")),
            **_paged_stash(entry.get("paged_stash")),
            **_muon(entry),
        )
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise LcmoeError(
            "--plan", f"plans[{index}]", f"is missing or has a bad field ({exc})", "re-run lcmoe plan"
        ) from None
    return RunConfig(model, hw, layout, options)


def _muon(entry: dict[str, Any]) -> dict[str, Any]:
    """A Muon plan's optimizer fields (``TrainingOptions.muon_summary``); {} for an Adam plan."""
    if entry.get("optimizer", "adam") != "muon":
        return {}
    return {
        "optimizer": "muon",
        "muon_num_ns_steps": _whole(entry, "muon_num_ns_steps", 5),
        "muon_tp_mode": _text(entry, "muon_tp_mode"),
    }


def _plan_layout(lay: dict[str, Any]) -> ParallelLayout:
    """A plan entry's ``layout`` mapping as a ParallelLayout (a missing or bad field raises, for
    run_from_plan to report)."""
    layout_text = lay.get("pipeline_layout")
    if layout_text is not None and not isinstance(layout_text, str):
        raise LcmoeError("plan pipeline_layout", layout_text, "must be a string or null", "re-run lcmoe plan")
    return ParallelLayout(
        tp=_whole(lay, "tp"),
        cp=_whole(lay, "cp"),
        ep=_whole(lay, "ep"),
        etp=_whole(lay, "etp"),
        pp=_whole(lay, "pp"),
        vpp=_whole(lay, "vpp"),
        dp=_whole(lay, "dp"),
        mbs=_whole(lay, "mbs"),
        gbs=_whole(lay, "gbs"),
        sequence_parallel=_flag(lay, "sequence_parallel"),
        cp_comm_type=_text(lay, "cp_comm_type"),
        hierarchical_context_parallel_sizes=read_hierarchical_sizes(
            lay.get("hierarchical_context_parallel_sizes"),
            field="plan hierarchical_context_parallel_sizes",
            cp_comm_type=_text(lay, "cp_comm_type"),
        ),
        pipeline_layout=layout_text,
    )


def plan_doc_lengths(doc: Any) -> DocLengths | None:
    """The packed documents a plan was made for (``inputs.doc_lengths``; absent or null: fixed
    length), rebuilt from its lengths and token shares with every value checked."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("lengths"), list):
        raise LcmoeError("plan inputs.doc_lengths", doc, "must hold lengths and token_shares", "re-run lcmoe plan")
    lengths, shares = doc["lengths"], doc.get("token_shares")
    if not isinstance(shares, list) or len(shares) != len(lengths):
        raise LcmoeError(
            "plan inputs.doc_lengths", doc.get("name"), "needs one token share per length", "re-run lcmoe plan"
        )
    pairs: dict[Any, Any] = {}
    for length, share in zip(lengths, shares, strict=True):
        if not isinstance(length, int) or isinstance(length, bool) or length in pairs:
            raise LcmoeError(
                "plan inputs.doc_lengths length", length, "must be distinct whole numbers", "re-run lcmoe plan"
            )
        pairs[length] = share
    name, source = doc.get("name"), doc.get("source", "")
    return doc_lengths_from_shares(
        name if isinstance(name, str) else "plan.json",
        pairs,
        source=source if isinstance(source, str) else "",
    )


def _activation_offload(doc: dict[str, Any] | None) -> dict[str, Any]:
    """TrainingOptions' offload fields from a plan entry's ``activation_offload`` (absent: off)."""
    if not doc:
        return {}
    if not isinstance(doc, dict):
        raise TypeError("activation_offload must be a mapping")
    fraction = real_number(doc.get("fraction", 1.0), field="plan activation_offload.fraction", fix="re-run lcmoe plan")
    return {"activation_offload_modules": _texts(doc, "modules"), "activation_offload_fraction": fraction}


def _dynamic_cp(doc: dict[str, Any] | None) -> dict[str, Any]:
    """TrainingOptions' dynamic-CP fields from a plan entry's ``dynamic_cp`` (absent: off)."""
    if not doc:
        return {}
    if not isinstance(doc, dict):
        raise TypeError("dynamic_cp must be a mapping")
    most = doc.get("max_seqlen_per_dp_cp_rank")
    return {
        "dynamic_context_parallel": True,
        "max_seqlen_per_dp_cp_rank": None if most is None else _whole(doc, "max_seqlen_per_dp_cp_rank"),
        "min_dynamic_context_parallel_size": _whole(doc, "min_dynamic_context_parallel_size", 1),
    }


def _paged_stash(doc: dict[str, Any] | None) -> dict[str, Any]:
    """TrainingOptions' rank-capacity and paged-stash fields from a plan entry's ``paged_stash``
    (``TrainingOptions.paged_stash_summary``; absent: neither)."""
    if not doc:
        return {}
    if not isinstance(doc, dict):
        raise TypeError("paged_stash must be a mapping")

    def number(key: str) -> float:
        return real_number(doc[key], field=f"plan paged_stash.{key}", fix="re-run lcmoe plan")

    return {
        "moe_expert_rank_capacity_factor": number("rank_capacity_factor"),
        "moe_paged_stash": _flag(doc, "stash"),
        "moe_paged_stash_buffer_size_factor_cuda": number("cuda_factor"),
        "moe_paged_stash_buffer_size_factor_cpu": number("cpu_factor"),
    }


def _peft(doc: dict[str, Any] | None) -> dict[str, Any]:
    """TrainingOptions' LoRA fields from a plan entry's ``peft`` (None: full training)."""
    if not doc:
        return {}
    if not isinstance(doc, dict):
        raise TypeError("peft must be a mapping")
    return lora_fields(
        _whole(doc, "rank"), _texts(doc, "targets"), _flag(doc, "input_regather", False), scheme=_text(doc, "scheme")
    )
