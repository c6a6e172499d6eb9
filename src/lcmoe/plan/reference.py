"""The guidance's representative layouts (catalog/reference_layouts.yaml) as RunConfigs."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import yaml

from lcmoe.run import RunConfig, build_layout
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import TrainingOptions


@functools.cache
def reference_entries() -> tuple[dict[str, Any], ...]:
    text = resources.files("lcmoe.catalog").joinpath("reference_layouts.yaml").read_text(encoding="utf-8")
    return tuple(yaml.safe_load(text) or [])


def reference_run(
    model: ModelSpec, hardware: HardwareSpec, num_gpus: int, seq_len: int, gbs: int | None = None
) -> tuple[str, RunConfig] | None:
    """The guidance layout for exactly this request, if the guidance gives one, at ``gbs`` (the
    GBS the request's plans run, rounded to a legal multiple for this layout if it is not one;
    None: GA = 4·PP, ``run.default_global_batch``)."""
    for entry in reference_entries():
        if (entry["model"], entry["gpu"], entry["gpus"], entry["seq_len"]) != (
            model.name,
            hardware.name,
            num_gpus,
            seq_len,
        ):
            continue
        lay = entry["layout"]
        layout = build_layout(
            model,
            num_gpus,
            tp=lay["tp"],
            cp=lay["cp"],
            ep=lay["ep"],
            etp=lay["etp"],
            pp=lay["pp"],
            vpp=lay["vpp"],
            gbs=gbs,
            round_gbs=True,
        )
        options = TrainingOptions(
            seq_len=seq_len,
            precision=entry["precision"],
            recompute_granularity="selective",
            recompute_modules=frozenset(entry["recompute"]),
            dispatcher=entry["dispatcher"],
            optimizer_offload_fraction=float(entry["optimizer_offload_fraction"]),
            cuda_graph_scope=frozenset(entry["cuda_graph_scope"]),
            main_grads_dtype="bf16",
            exp_avg_dtype="bf16",
        )
        return entry["name"], RunConfig(model, hardware, layout, options)
    return None
