"""ParallelLayout: how a model is split over GPUs, and what each pipeline stage holds.

Axes (Megatron-Core names; ``Axis`` glossary):
    tp  tensor parallel (attention/dense MLP; with sequence parallel the residual stream is
        also split over tp)           cp  context parallel (sequence split for attention)
    ep  expert parallel               etp expert tensor parallel (expert FFN split)
    pp  pipeline stages               vpp virtual stages (model chunks) per pipeline rank
    dp  data parallel = world / (tp·cp·pp)
    edp expert data parallel = world / (ep·etp·pp)  (MoE "parallel folding": the expert grid
        re-folds the same tp·cp·dp ranks, megatron-bridge-facts.md §2.1)
"""

from __future__ import annotations

# The layout lives in two modules: the parallel sizes (parallel.py) and the pipeline stages
# (pipeline.py); the package keeps the names lcmoe imports from ``lcmoe.layout``.
from lcmoe.layout.parallel import (
    MAX_GPUS,
    MAX_LAYOUT_CHARS,
    MAX_SEQUENCES,
    MAX_VIRTUAL_STAGES,
    Axis,
    ParallelLayout,
    read_hierarchical_sizes,
)
from lcmoe.layout.pipeline import (
    ModelChunk,
    PipelineStage,
    auto_pipeline_layout,
    check_pipeline_layout,
    inflight_microbatch_chunks,
    layers_split_evenly,
    needs_explicit_layout,
    parse_pipeline_layout,
    pipeline_stages,
)

__all__ = [
    "MAX_GPUS",
    "MAX_LAYOUT_CHARS",
    "MAX_SEQUENCES",
    "MAX_VIRTUAL_STAGES",
    "Axis",
    "ModelChunk",
    "ParallelLayout",
    "PipelineStage",
    "auto_pipeline_layout",
    "check_pipeline_layout",
    "inflight_microbatch_chunks",
    "layers_split_evenly",
    "needs_explicit_layout",
    "parse_pipeline_layout",
    "pipeline_stages",
    "read_hierarchical_sizes",
]
