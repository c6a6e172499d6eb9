"""`lcmoe estimate`: per-stage memory by component, step time and throughput for one layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from lcmoe.cli import run_options as ro
from lcmoe.cli.common import EXIT_FINDINGS, JSON, abort, print_json, stdout
from lcmoe.plan.format import peft_text

# Allocated components sum to "peak allocated"; adding the reserved-only ones gives "peak reserved".
ALLOCATED_COMPONENTS = (
    "weights",
    "weight_copies",
    "gradients",
    "optimizer",
    "state_overhead",
    "activations",
    "logits_loss",
    "transient",
    "workspace",
    "cuda_graphs",
)
RESERVED_ONLY_COMPONENTS = ("fragmentation", "cuda_context", "nccl_buffers", "dispatcher_buffers")
COMPONENT_ORDER = ALLOCATED_COMPONENTS + RESERVED_ONLY_COMPONENTS


def estimate(
    model: str = ro.MODEL,
    gpu: str = ro.GPU,
    gpus: int = ro.GPUS,
    seq_len: str = ro.SEQ,
    tp: int = typer.Option(1, "--tp", min=1),
    cp: int = typer.Option(1, "--cp", min=1),
    ep: int = typer.Option(1, "--ep", min=1),
    etp: int = typer.Option(1, "--etp", min=1),
    pp: int = typer.Option(1, "--pp", min=1),
    vpp: int = typer.Option(1, "--vpp", min=1),
    mbs: int = typer.Option(1, "--mbs", min=1),
    gbs: int = typer.Option(None, "--gbs", min=1, help="default GA = 4·PP (8 without PP)"),
    recompute: str = typer.Option(
        "none", "--recompute", help="none | full[:uniform|block[:N]] | modules, e.g. mla_up_proj,layernorm,moe_act"
    ),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | fp8-tensorwise | fp8-blockwise | mxfp8 | nvfp4"),
    optimizer_offload: float = typer.Option(
        0.0, "--optimizer-offload", min=0.0, max=1.0, help="fraction of optimizer state on the host"
    ),
    dispatcher: str = typer.Option("alltoall", "--dispatcher", help="alltoall | allgather | deepep | hybridep"),
    cuda_graph: str = typer.Option("none", "--cuda-graph", help="none | scopes, e.g. attn,moe_router,moe_preprocess"),
    cp_comm_type: str | None = typer.Option(
        None, "--cp-comm-type", help="p2p | a2a | a2a+p2p | all_gather (default p2p; all_gather for DSA models)"
    ),
    pipeline_layout: str = typer.Option(
        None,
        "--pipeline-layout",
        help="Megatron layout string, e.g. Et*3|t*4|…|mL (default: the model's Bridge recipe layout "
        "for this PP×VPP, else a balanced one)",
    ),
    sequence_parallel: bool = typer.Option(None, "--sequence-parallel/--no-sequence-parallel"),
    precision_aware_optimizer: bool = typer.Option(
        False, "--precision-aware-optimizer", help="BF16 main grads and Adam moments"
    ),
    moe_imbalance: float = typer.Option(
        1.0, "--moe-imbalance", min=1.0, help="tokens on the busiest expert rank / mean"
    ),
    expandable_segments: bool = typer.Option(True, "--expandable-segments/--no-expandable-segments"),
    fp8_params: bool = typer.Option(
        None,
        "--fp8-params/--no-fp8-params",
        help="FP8/NVFP4 parameters (fp8/fp4_param_gather); default: what Bridge's precision recipe keeps",
    ),
    peft: str = ro.PEFT,
    lora_rank: int = ro.LORA_RANK,
    lora_targets: str = ro.LORA_TARGETS_OPTION,
    lora_input_regather: bool = ro.LORA_REGATHER,
    hardware_file: Path = ro.HW_FILE,
    hw: list[str] = ro.HW_SET,
    scaleout_gbps: float = ro.SCALEOUT,
    gpus_per_node: int = ro.PER_NODE,
    calibration: Path = ro.CALIBRATION,
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="verdict line only"),
) -> None:
    """Predict per-GPU memory (every pipeline stage, by component) and the step time of one layout."""
    from lcmoe.estimate.report import estimate_run

    run = ro.build_run(
        model=model,
        gpu=gpu,
        gpus=gpus,
        seq_len=seq_len,
        tp=tp,
        cp=cp,
        ep=ep,
        etp=etp,
        pp=pp,
        vpp=vpp,
        mbs=mbs,
        gbs=gbs,
        recompute=recompute,
        precision=precision,
        optimizer_offload=optimizer_offload,
        dispatcher=dispatcher,
        cuda_graph=cuda_graph,
        cp_comm_type=cp_comm_type,
        pipeline_layout=pipeline_layout,
        sequence_parallel=sequence_parallel,
        precision_aware_optimizer=precision_aware_optimizer,
        moe_imbalance=moe_imbalance,
        expandable_segments=expandable_segments,
        fp8_params=fp8_params,
        hardware_file=hardware_file,
        hw=hw,
        scaleout_gbps=scaleout_gbps,
        gpus_per_node=gpus_per_node,
        peft=ro.peft_options(peft, lora_rank, lora_targets, lora_input_regather),
    )
    from lcmoe.rules.legality import violations

    broken = violations(run)
    if broken:
        first = broken[0]
        more = f" (+{len(broken) - 1} more; `lcmoe check` lists all)" if len(broken) > 1 else ""
        abort(f"[{first.rule}] {first.message}; fix: {first.fix} ({first.source}){more}.")
    result = estimate_run(run, ro.time_coefficients(calibration, run.hardware))
    if json_output:
        print_json(result)
    else:
        render_estimate(result, quiet=quiet)
    if not result["memory"]["fits"]:
        raise typer.Exit(EXIT_FINDINGS)


def _gib(value: float) -> str:
    return f"{value / 1024**3:.2f}"


def render_estimate(result: dict[str, Any], *, quiet: bool = False) -> None:
    memory = result["memory"]
    verdict = verdict_line(memory)
    if quiet:
        stdout.print(verdict)
        return
    inputs = result["inputs"]
    layout = result["layout"]
    stdout.print(
        f"[bold]{inputs['model']}[/] on {inputs['num_gpus']} × {inputs['gpu']}, seq {inputs['seq_len']}, "
        f"TP{layout['tp']} CP{layout['cp']} EP{layout['ep']} ETP{layout['etp']} PP{layout['pp']} "
        f"VPP{layout['vpp']} DP{layout['dp']} EDP{layout['edp']} MBS{layout['mbs']} GBS{layout['gbs']} "
        f"(GA {layout['ga']}), {inputs['precision']}, recompute {inputs['recompute']}"
        + (f"; {peft_text(inputs['peft'])}" if inputs.get("peft") else "")
    )
    table = Table(title="per-GPU memory by pipeline stage (GiB; worst GPU of each stage)")
    table.add_column("component")
    stages = memory["stages"]
    for stage in stages:
        table.add_column(
            f"stage {stage['stage']} ({stage['layers']}L, {stage['inflight_microbatches']} in flight)", justify="right"
        )
    for group, total, label in (
        (ALLOCATED_COMPONENTS, "peak_allocated_bytes", "peak allocated"),
        (RESERVED_ONLY_COMPONENTS, "peak_reserved_bytes", "peak reserved (nvidia-smi)"),
    ):
        for name in group:
            values = [stage["components"].get(name, 0.0) for stage in stages]
            if any(values):
                table.add_row(name, *(_gib(v) for v in values))
        table.add_row(f"[bold]{label}[/]", *(_gib(s[total]) for s in stages))
    stdout.print(table)
    if memory["host_bytes_per_gpu"]:
        stdout.print(f"host memory per GPU (offloaded optimizer): {_gib(memory['host_bytes_per_gpu'])} GiB")
    time = result.get("time")
    if time:
        render_time(time)
    stdout.print(verdict)


def verdict_line(memory: dict[str, Any]) -> str:
    capacity = memory["capacity_bytes"]
    peak = memory["peak_reserved_bytes"]
    if memory["fits"]:
        line = (
            f"worst stage {memory['worst_stage']} peaks at {_gib(peak)} GiB of {_gib(capacity)} GiB "
            f"({_gib(capacity - peak)} GiB headroom)"
        )
        if memory.get("oom_risk"):
            return (
                f"[yellow]fits, at risk[/]: {line}, less than the estimator's "
                f"{memory['error_band_pct']:.1f}% error band (its held-out 90th percentile): it may OOM"
            )
        return f"[green]fits[/]: {line}"
    return (
        f"[red]OOM[/] at stage {memory['worst_stage']} by {_gib(peak - capacity)} GiB "
        f"({_gib(peak)} GiB needed, {_gib(capacity)} GiB on the GPU)"
    )


def render_time(time: dict[str, Any]) -> None:
    table = Table(title="step time breakdown (seconds per step, critical path)")
    table.add_column("term")
    table.add_column("s", justify="right")
    table.add_column("share", justify="right")
    step = time["step_seconds"]
    for name, value in time["breakdown"].items():
        if value:
            table.add_row(name, f"{value:.3f}", f"{100 * value / step:.1f}%")
    table.add_row("[bold]step[/]", f"[bold]{step:.3f}[/]", "100%")
    stdout.print(table)
    stdout.print(
        f"tokens/s/GPU {time['tokens_per_sec_per_gpu']:.0f}   model TFLOP/s/GPU "
        f"{time['model_tflops_per_gpu']:.0f}   MFU {100 * time['mfu']:.1f}% (of dense BF16 peak)"
    )
