"""One place that turns a RunConfig into the estimate dictionary every surface prints
(`estimate --json`, plan entries, check, reports), so the numbers are identical everywhere."""

from __future__ import annotations

from typing import Any

from lcmoe.estimate.memory import estimate_memory
from lcmoe.estimate.time import TimeCoefficients, estimate_time
from lcmoe.run import RunConfig
from lcmoe.units import format_tokens


def estimate_run(run: RunConfig, coefficients: TimeCoefficients | None = None) -> dict[str, Any]:
    """``coefficients``: a user calibration (estimate/calibration.py); None = the shipped fit."""
    from lcmoe.estimate.dynamic_cp import dcp_memory_options, dcp_summary

    memory = estimate_memory(run.model, run.hardware, run.layout, dcp_memory_options(run))
    result: dict[str, Any] = {
        "inputs": {
            "model": run.model.name,
            "gpu": run.hardware.name,
            "num_gpus": run.num_gpus,
            "seq_len": run.options.seq_len,
            "seq_len_label": format_tokens(run.options.seq_len),
            "precision": run.options.precision,
            "recompute": run.options.recompute_label(),
            "dispatcher": run.options.dispatcher,
            "cuda_graph_scope": sorted(run.options.cuda_graph_scope),
            "optimizer_offload_fraction": run.options.optimizer_offload_fraction,
            "peft": run.options.peft_summary(),
            **run.options.activation_offload_summary(),
            **run.options.dynamic_cp_summary(),
            **run.options.paged_stash_summary(),
            **run.options.muon_summary(),
        },
        "layout": run.layout.as_dict(),
        "memory": memory.as_dict(),
    }
    result["time"] = estimate_time(run, coefficients).as_dict()
    docs = run.options.doc_lengths
    if docs is not None:  # packed documents; fixed-length results keep their keys
        from lcmoe.estimate.packing import packing_summary

        result["inputs"]["doc_lengths"] = docs.summary(run.options.seq_len)
        result["packing"] = packing_summary(run.model, run.layout, run.options)
    dynamic_cp = dcp_summary(run)
    if dynamic_cp is not None:  # runs without dynamic CP keep their keys
        result["dynamic_cp"] = dynamic_cp
    return result
