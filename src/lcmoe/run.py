"""RunConfig: one fully specified training run (model, hardware, layout, options), and its
construction from user-level knobs with Megatron's derived values and one-sentence errors."""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.errors import LcmoeError
from lcmoe.layout import ParallelLayout, auto_pipeline_layout, needs_explicit_layout
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import RECOMPUTE_MODULES, RecomputeGranularity, RecomputeMethod, TrainingOptions


@dataclass(frozen=True, slots=True)
class RunConfig:
    model: ModelSpec
    hardware: HardwareSpec
    layout: ParallelLayout
    options: TrainingOptions

    @property
    def num_gpus(self) -> int:
        return self.layout.world_size


def derive_dp(num_gpus: int, *, tp: int, cp: int, pp: int) -> int:
    """DP = GPUs / (TP·CP·PP); the GPU count must be a multiple (megatron-bridge-facts.md §2.1)."""
    for name, size in (("--tp", tp), ("--cp", cp), ("--pp", pp)):
        if size < 1:
            raise LcmoeError(name, size, "must be at least 1", f"e.g. {name} 1")
    model_parallel = tp * cp * pp
    if num_gpus < 1:
        raise LcmoeError("--gpus", num_gpus, "must be at least 1", "e.g. --gpus 256")
    if num_gpus % model_parallel:
        raise LcmoeError(
            "--gpus",
            num_gpus,
            f"is not a multiple of TP·CP·PP = {tp}·{cp}·{pp} = {model_parallel}",
            f"use a multiple of {model_parallel} GPUs or change TP/CP/PP",
        )
    return num_gpus // model_parallel


def resolve_pipeline_layout(model: ModelSpec, pp: int, vpp: int, given: str | None) -> str | None:
    """The explicit layout to use: the user's; else the one Bridge's recipe sets for this model
    at this PP×VPP (``ModelSpec.recipe_pipeline_layouts``: what a Bridge run of the model without
    an explicit layout uses); else a balanced one when layers do not split evenly."""
    if given or (pp == 1 and vpp == 1):
        return given
    recipe = model.recipe_pipeline_layouts.get(f"{pp}x{vpp}")
    if recipe:
        return recipe
    if not needs_explicit_layout(model, pp, vpp):
        return None
    layout = auto_pipeline_layout(model, pp, vpp)
    if layout is None:
        raise LcmoeError(
            "pp·vpp", pp * vpp, f"is too many stages for {model.num_layers} layers", "use fewer pipeline stages"
        )
    return layout


def default_global_batch(dp: int, mbs: int, pp: int, vpp: int, requested: int | None) -> int:
    """The user's GBS rounded to the nearest legal multiple of MBS·DP (·PP with VPP) — the
    LC-GBS-SHRINK rule — or, when none is given, GA = 4·PP (8 without PP) to keep the bubble
    (PP − 1)/(VPP·GA) small."""
    unit = mbs * dp * (pp if vpp > 1 else 1)
    if requested:
        return max(unit, round(requested / unit) * unit)
    return mbs * dp * (4 * pp if pp > 1 else 8)


def build_layout(
    model: ModelSpec,
    num_gpus: int,
    *,
    tp: int = 1,
    cp: int = 1,
    ep: int = 1,
    etp: int = 1,
    pp: int = 1,
    vpp: int = 1,
    mbs: int = 1,
    gbs: int | None = None,
    cp_comm_type: str = "p2p",
    pipeline_layout: str | None = None,
    sequence_parallel: bool | None = None,
    round_gbs: bool = False,
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None,
) -> ParallelLayout:
    """A ParallelLayout from user-level knobs: DP derived from the GPU count, an explicit pipeline
    layout when layers do not split, SP on with TP > 1, and a default GBS (see
    ``default_global_batch``; ``round_gbs`` rounds a given GBS to a legal one instead of keeping it)."""
    sizes = {"--tp": tp, "--cp": cp, "--ep": ep, "--etp": etp, "--pp": pp, "--vpp": vpp, "--mbs": mbs}
    for name, size in (*sizes.items(), ("--gbs", gbs if gbs is not None else 1)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise LcmoeError(name, size, "must be a positive whole number", f"e.g. {name} 1")
    dp = derive_dp(num_gpus, tp=tp, cp=cp, pp=pp)
    if gbs is None or round_gbs:
        gbs = default_global_batch(dp, mbs, pp, vpp, gbs)
    return ParallelLayout(
        tp=tp,
        cp=cp,
        ep=ep,
        etp=etp,
        pp=pp,
        vpp=vpp,
        dp=dp,
        mbs=mbs,
        gbs=gbs,
        sequence_parallel=tp > 1 if sequence_parallel is None else sequence_parallel and tp > 1,
        cp_comm_type=cp_comm_type,
        hierarchical_context_parallel_sizes=hierarchical_context_parallel_sizes,
        pipeline_layout=resolve_pipeline_layout(model, pp, vpp, pipeline_layout),
    )


def parse_recompute(text: str) -> tuple[RecomputeGranularity, frozenset[str], RecomputeMethod, int]:
    """``none`` | ``full`` | ``full:block:4`` | ``full:uniform:1`` | comma-separated modules.

    Returns (granularity, modules, method, num_layers). Aliases: up_proj → mla_up_proj,
    norm → layernorm (the guidance's spelling)."""
    value = text.strip().lower()
    if value in ("", "none", "no", "off"):
        return "none", frozenset(), "uniform", 1
    if value.startswith("full"):
        parts = value.split(":")
        method_text = parts[1] if len(parts) > 1 and parts[1] else "uniform"
        if method_text not in ("uniform", "block"):
            raise LcmoeError(
                "--recompute", text, "full recompute method must be uniform or block", "e.g. full:uniform:1"
            )
        try:
            layers = int(parts[2]) if len(parts) > 2 else 1
        except ValueError:
            raise LcmoeError(
                "--recompute", text, "the layer count must be a whole number", "e.g. full:block:4"
            ) from None
        method: RecomputeMethod = "block" if method_text == "block" else "uniform"
        return "full", frozenset(), method, max(layers, 1)
    aliases = {"up_proj": "mla_up_proj", "norm": "layernorm", "attn": "core_attn"}
    modules = frozenset(aliases.get(m.strip(), m.strip()) for m in value.split(",") if m.strip())
    unknown = modules - RECOMPUTE_MODULES
    if unknown:
        raise LcmoeError(
            "--recompute",
            text,
            f"{', '.join(sorted(unknown))} is not a recompute module",
            f"use none, full, or some of {', '.join(sorted(RECOMPUTE_MODULES))}",
        )
    return "selective", modules, "uniform", 1


def check_precision_supported(hardware: HardwareSpec, precision: str) -> None:
    """MXFP8/NVFP4 need Blackwell; FP8 needs Hopper or later."""
    from lcmoe.workload import tensor_core_precision

    core = tensor_core_precision(precision)
    if not hardware.supports(core):
        raise LcmoeError(
            "--precision",
            precision,
            f"{hardware.name} has no {core} tensor cores",
            f"use one of {', '.join(sorted(hardware.peak_flops))}",
        )
