"""Every heading, sentence and plot label the report writes, in one place: a translation replaces
these tables and nothing else. Numbers are filled in with ``str.format`` fields, so a translated
template may reorder them. Sentences shared with the terminal (plan columns, ranking notes,
at-risk note) come from ``lcmoe.plan.format``."""

from __future__ import annotations

# Memory components (StageMemory.components() keys, estimate/memory/stage.py) in plain words.
COMPONENT_NAMES: dict[str, str] = {
    "weights": "weights",
    "weight_copies": "weight copies (FP8)",
    "gradients": "gradients",
    "optimizer": "optimizer state",
    "state_overhead": "buffer padding (DDP, optimizer)",
    "activations": "stored activations",
    "logits_loss": "logits and loss",
    "transient": "backward working set",
    "workspace": "kernel workspaces",
    "cuda_graphs": "CUDA graph pools",
    "fragmentation": "allocator fragmentation",
    "cuda_context": "CUDA context",
    "nccl_buffers": "NCCL buffers",
    "dispatcher_buffers": "MoE dispatcher buffers",
}

# Step-time terms (the plan's time.breakdown keys, estimate/time/stage.py and pipeline.py).
TERM_NAMES: dict[str, str] = {
    "attention": "attention",
    "dense_gemm": "dense matmuls",
    "expert_gemm": "expert matmuls",
    "scan": "linear-attention scan",
    "elementwise": "norms, activations",
    "recompute": "recompute",
    "tp_comm": "tensor-parallel comm.",
    "cp_comm": "context-parallel comm.",
    "ep_comm": "expert dispatch, combine",
    "moe_permute": "MoE token permute",
    "pp_comm": "pipeline send, receive",
    "pipeline_bubble": "pipeline bubble",
    "dp_comm": "gradient sync (DP)",
    "optimizer": "optimizer step",
    "activation_offload": "activation offload",
    "paged_stash": "MoE paged stash copies",
    "paged_stash_rerun": "MoE paged stash re-runs (assumed 1% of steps)",
    "overhead": "host launch overhead",
}

TEXT: dict[str, str] = {
    # page
    "title": "lcmoe plan — {model} at {seq_len} tokens on {num_gpus} × {gpu}",
    "searched": "lcmoe {version}: searched {searched} candidates, {legal} legal, {fit} fit.",
    "plans_by_low_edge": "Plans, best first by the low edge of the tokens/s band (--rank conservative)",
    "plans_by_prediction": "Plans, fastest first by predicted tokens/s (--rank expected)",
    "plans_by_speed": "Plans, fastest first by predicted tokens/s",
    "no_fit_need": "No layout fits; at least {need} GPUs are needed.",
    "no_fit": "No layout fits; add GPUs.",
    "no_fit_short": "No layout fits.",
    "no_plan": "(no plan fits)",
    "plan_heading": "Plan {n}: {layout}",
    "pareto_heading": "Memory against throughput",
    "sweep_heading": "Sequence-length sweep",
    "rules_heading": "Rules applied",
    "config_heading": "Emitted config (plan 1)",
    "bridge_overrides": "Megatron Bridge overrides:",
    "megatron_args": "Megatron-LM arguments:",
    "assumptions_heading": "Assumptions and error bands",
    "where_plan": "plan {n}",
    "planner": "planner",
    # figure captions
    "caption_memory": "plan {n}: {layout} — memory by stage and component",
    "caption_time": "plan {n}: {layout} — step-time breakdown",
    "caption_pareto": "every plan that fits: memory against throughput",
    "caption_sweep": "best plan per sequence length: MFU and memory",
    # sweep table
    "sweep_no_fit": "no plan fits",
    # plots
    "memory_title": "plan {n} memory per GPU",
    "time_title": "plan {n} step time",
    "pipeline_stage": "pipeline stage",
    "gib_reserved": "GiB per GPU (reserved)",
    "capacity": "GPU capacity {gib:.0f} GiB",
    "seconds_per_step": "seconds per step",
    "term_value": "{seconds:.2f} s ({share:.0f}%)",
    "fitting_candidates": "fitting candidates",
    "pareto_front": "Pareto front",
    "pareto_x": "peak reserved GiB per GPU (worst stage)",
    "pareto_y": "tokens/s/GPU (predicted)",
    "pareto_title": "memory vs throughput of every plan that fits",
    "mfu_y": "MFU % (of dense BF16 peak)",
    "sequence_length": "sequence length",
    "mfu_title": "MFU of the best plan",
    "peak_y": "peak reserved GiB per GPU",
    "peak_title": "memory of the best plan",
    # assumptions
    "time_accuracy": (
        "Step time: typical error {in_sample_pct:.1f}% on the {runs} published runs it was fitted to, "
        "{lomo_pct:.1f}% (MoE {lomo_moe_pct:.1f}%) on a model left out of the fit; read the ranking as a short "
        "list to A/B, not a verdict."
    ),
    "time_accuracy_unrecorded": "Step time: no fit error is recorded for these coefficients; treat the "
    "ranking as a short list to A/B.",
    "time_calibrated": "Step time: calibrated with {calibration} (error {mape_pct:.1f}% on its own runs).",
    "band_evidence": "Each plan's ±band held {coverage_pct:.0f}% of {runs} measured runs, each predicted "
    "without its own model (median band ±{median_band_pct:.0f}%).",
    "memory_accuracy": (
        "Memory: median {median_pct:.1f}% / p90 {p90_pct:.1f}% error on peak allocated, held out over {runs} "
        "Megatron-LM CI runs; plans keep a {margin_pct:.0f}% margin below the GPU's capacity."
    ),
    "routing": "Routing is assumed balanced (the published perf recipes force balance); real dropless routing "
    "adds expert-activation spikes.",
    "software": "Target software: megatron-core {megatron_core}; Bridge field names of megatron-bridge 0.6.2.",
    "containers": "Speeds are for the NeMo {container} container; the same recipes ran up to {slower_pct:.0f}% "
    "slower on older containers (LC-CONTAINER).",
    "lora": "LoRA: no finetuning run is in the time fit, so its band rests on full-training runs; the memory of "
    "the frozen base and the adapters is derived, not fitted.",
}


def say(key: str, **values: object) -> str:
    """The report's text ``key`` with ``values`` filled in."""
    return TEXT[key].format(**values)


def component_name(key: str) -> str:
    """A memory component in plain words (an unknown key with its underscores as spaces)."""
    return COMPONENT_NAMES.get(key, key.replace("_", " "))


def term_name(key: str) -> str:
    """A step-time term in plain words (an unknown key with its underscores as spaces)."""
    return TERM_NAMES.get(key, key.replace("_", " "))
