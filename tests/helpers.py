"""Small builders shared by tests."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from lcmoe.catalog import load_hardware, load_model
from lcmoe.run import RunConfig, build_layout
from lcmoe.workload import TrainingOptions


def make_run(
    model: str = "deepseek-v3",
    gpu: str = "h100",
    *,
    seq_len: int = 131072,
    tp: int = 1,
    cp: int = 32,
    ep: int = 32,
    pp: int = 8,
    vpp: int = 4,
    gpus: int = 256,
    mbs: int = 1,
    gbs: int | None = None,
    **options: Any,
) -> RunConfig:
    spec = load_model(model)
    layout = build_layout(
        spec,
        gpus,
        tp=tp,
        cp=cp,
        ep=ep,
        pp=pp,
        vpp=vpp,
        mbs=mbs,
        gbs=gbs if gbs is not None else mbs * (gpus // (tp * cp * pp)) * 4 * pp,
    )
    defaults: dict[str, Any] = {"precision": "bf16", "main_grads_dtype": "bf16", "exp_avg_dtype": "bf16"}
    defaults.update(options)
    return RunConfig(spec, load_hardware(gpu), layout, TrainingOptions(seq_len=seq_len, **defaults))


def with_options(run: RunConfig, **changes: Any) -> RunConfig:
    return replace(run, options=replace(run.options, **changes))


def with_layout(run: RunConfig, **changes: Any) -> RunConfig:
    return replace(run, layout=replace(run.layout, **changes))


# A small config.json that every supported HF model type can read (each takes the keys it needs).
HF_FAMILY_BASE: dict[str, object] = {
    "num_hidden_layers": 8,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
    "num_experts": 16,
    "num_local_experts": 16,
    "n_routed_experts": 16,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 128,
    "shared_expert_intermediate_size": 128,
    "full_attention_interval": 4,
    "linear_num_key_heads": 4,
    "linear_num_value_heads": 8,
    "linear_key_head_dim": 32,
    "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4,
    "sliding_window": 128,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
}


# A small dense Hugging Face config (a ~1B Llama): a custom model that plans in about a second.
SMALL_HF_CONFIG = {
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 40960,
}


def write_hf_config(folder: Path) -> Path:
    """``folder/config.json`` holding SMALL_HF_CONFIG (the folder is created)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(SMALL_HF_CONFIG), encoding="utf-8")
    return path
