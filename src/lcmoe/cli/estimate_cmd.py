"""`lcmoe estimate`: per-stage memory by component, step time and throughput for one layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from lcmoe.cli import run_options as ro
from lcmoe.cli.common import EXIT_FINDINGS, JSON, abort, print_json, stdout
from lcmoe.cli.estimate_view import render_explanation
from lcmoe.plan.format import cp_exchange_text, packing_text, peft_text

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


MODEL = typer.Option(None, "--model", "-m", help="catalog model, lcmoe YAML or HF config.json (or --from-plan)")
GPUS = typer.Option(None, "--gpus", "-n", help="total GPUs (or --from-plan)", callback=ro.check_gpus)
SEQ = typer.Option(None, "--seq-len", "-s", help="tokens per sequence: 4096, 32k, 128K (or --from-plan)")
FROM_PLAN = typer.Option(
    None,
    "--from-plan",
    help="plan.json (from lcmoe plan --json or --emit, or its directory): estimate that plan's exact "
    "settings (give the plan's --calibration too, if it had one)",
)
PLAN_RANK = typer.Option(1, "--rank", min=1, help="with --from-plan: which plan, 1 = the best (the # column)")
# With --from-plan the plan fixes the run; these may still be given.
FROM_PLAN_EXTRAS = frozenset({"from_plan", "rank", "calibration", "json_output", "quiet", "explain", "stage"})
EXPLAIN = typer.Option(
    False,
    "--explain",
    help="print every step-time term of one pipeline stage as amount / rate = seconds, and how they add "
    "up to the step (with --json: under time.explain)",
)
STAGE = typer.Option(
    None, "--stage", min=0, help="with --explain: the pipeline stage to explain (default: the slowest)"
)


def estimate(
    ctx: typer.Context,
    model: str | None = MODEL,
    gpu: str = ro.GPU,
    gpus: int | None = GPUS,
    seq_len: str | None = SEQ,
    tp: int = typer.Option(1, "--tp", min=1, help="tensor parallel size"),
    cp: int = typer.Option(1, "--cp", min=1, help="context parallel size"),
    ep: int = typer.Option(1, "--ep", min=1, help="expert parallel size"),
    etp: int = typer.Option(1, "--etp", min=1, help="expert tensor parallel size"),
    pp: int = typer.Option(1, "--pp", min=1, help="pipeline parallel size"),
    vpp: int = typer.Option(1, "--vpp", min=1, help="virtual pipeline stages per rank"),
    mbs: int = typer.Option(1, "--mbs", min=1, help="micro-batch size"),
    gbs: int = typer.Option(None, "--gbs", min=1, help="global batch (default GA = 4·PP, 8 without PP)"),
    recompute: str = ro.RECOMPUTE,
    precision: str = ro.PRECISION,
    optimizer_offload: float = typer.Option(
        0.0, "--optimizer-offload", min=0.0, max=1.0, help="fraction of optimizer state on the host"
    ),
    offload_modules: str | None = ro.OFFLOAD_MODULES,
    activation_offload_fraction: float = ro.OFFLOAD_FRACTION,
    moe_rank_capacity_factor: float | None = ro.RANK_CAPACITY,
    paged_stash: bool = ro.PAGED_STASH,
    paged_stash_cuda_factor: float = ro.STASH_CUDA_FACTOR,
    paged_stash_cpu_factor: float = ro.STASH_CPU_FACTOR,
    dispatcher: str = ro.DISPATCHER,
    cuda_graph: str = ro.CUDA_GRAPH,
    ep_overlap: bool = typer.Option(
        False,
        "--ep-overlap/--no-ep-overlap",
        help="overlap the EP all-to-all with compute (overlap_moe_expert_parallel_comm)",
    ),
    delay_wgrad_compute: bool = typer.Option(
        False,
        "--delay-wgrad-compute",
        help="delay the weight-gradient GEMMs in the EP-overlap schedule (delay_wgrad_compute; needs --ep-overlap)",
    ),
    optimizer: str = ro.OPTIMIZER,
    muon_ns_steps: int = ro.MUON_NS_STEPS,
    muon_tp_mode: str = ro.MUON_TP_MODE,
    cp_comm_type: str | None = ro.CP_COMM_TYPE,
    hierarchical_cp_sizes: str | None = ro.HIERARCHICAL_CP_SIZES,
    dynamic_cp: bool = ro.DYNAMIC_CP,
    max_seqlen_per_dp_cp_rank: int | None = ro.MAX_SEQLEN_PER_DP_CP_RANK,
    min_dynamic_cp_size: int = ro.MIN_DYNAMIC_CP_SIZE,
    pipeline_layout: str = typer.Option(
        None,
        "--pipeline-layout",
        help="Megatron layout string, e.g. Et*3|t*4|t*4|mL (default: the model's Bridge recipe layout "
        "for this PP×VPP, else a balanced one)",
    ),
    sequence_parallel: bool = typer.Option(
        None, "--sequence-parallel/--no-sequence-parallel", help="default: on when TP > 1"
    ),
    precision_aware_optimizer: bool = typer.Option(
        False, "--precision-aware-optimizer", help="BF16 Adam moments (and BF16 main grads unless --main-grads-dtype)"
    ),
    main_grads_dtype: str = typer.Option(
        None,
        "--main-grads-dtype",
        help="bf16 | fp32: the gradient buffer (default bf16 with --precision-aware-optimizer, else fp32)",
        autocompletion=ro.complete_one(("bf16", "fp32")),
    ),
    moe_imbalance: float = typer.Option(
        1.0, "--moe-imbalance", min=1.0, help="tokens on the busiest expert rank / mean"
    ),
    expandable_segments: bool = typer.Option(
        True, "--expandable-segments/--no-expandable-segments", help="PyTorch allocator expandable segments"
    ),
    fp8_params: bool = typer.Option(
        None,
        "--fp8-params/--no-fp8-params",
        help="FP8/NVFP4 parameters (fp8/fp4_param_gather); default: what Bridge's precision recipe keeps",
    ),
    peft: str = ro.PEFT,
    lora_rank: int = ro.LORA_RANK,
    lora_targets: str = ro.LORA_TARGETS_OPTION,
    lora_input_regather: bool = ro.LORA_REGATHER,
    doc_lengths: str = ro.DOC_LENGTHS,
    hardware_file: Path = ro.HW_FILE,
    hw: list[str] = ro.HW_SET,
    scaleout_gbps: float = ro.SCALEOUT,
    gpus_per_node: int = ro.PER_NODE,
    calibration: Path = ro.CALIBRATION,
    from_plan: Path = FROM_PLAN,
    rank: int = PLAN_RANK,
    json_output: bool = JSON,
    quiet: bool = typer.Option(False, "--quiet", "-q", help="verdict line only"),
    explain: bool = EXPLAIN,
    stage: int | None = STAGE,
) -> None:
    """Predict per-GPU memory (every pipeline stage, by component) and the step time of one layout."""
    given = [name for name in ctx.params if _given(ctx, name)]
    if from_plan is not None:
        _refuse_flags_with_plan(ctx, given)
        run = _run_from_plan(from_plan, rank)
    else:
        run = _run_from_flags(ctx.params, given)
    _estimate_and_print(
        run,
        calibration,
        from_plan=(from_plan, rank) if from_plan is not None else None,
        json_output=json_output,
        quiet=quiet,
        explain=explain,
        stage=stage,
    )


def _refuse_flags_with_plan(ctx: typer.Context, given: list[str]) -> None:
    """The plan fixes the run: refuse the first flag given that would change it."""
    from lcmoe.errors import LcmoeError

    extra = [name for name in given if name not in FROM_PLAN_EXTRAS]
    if extra:
        flag = _flag_name(ctx, extra[0])
        why = "cannot be combined with --from-plan (the plan fixes the run)"
        raise LcmoeError(flag, ctx.params[extra[0]], why, f"drop {flag}")


def _run_from_flags(params: dict[str, Any], given: list[str]) -> Any:
    """The run the command-line flags describe. ``params``: the command's parsed parameters
    (``ctx.params``, as plan and sweep read theirs: PlanOptions.from_params)."""
    from lcmoe.errors import LcmoeError

    if "rank" in given:
        raise LcmoeError("--rank", params["rank"], "picks a plan of --from-plan", "add --from-plan plan.json")
    model, gpus, seq_len = params["model"], params["gpus"], params["seq_len"]
    missing = [flag for flag, value in (("--model", model), ("--gpus", gpus), ("--seq-len", seq_len)) if not value]
    if missing:
        abort(f"{' '.join(missing)}: required, or pass --from-plan plan.json; e.g. {_EXAMPLE}")
    main_grads_dtype = params["main_grads_dtype"]
    if main_grads_dtype not in (None, "bf16", "fp32"):
        raise LcmoeError("--main-grads-dtype", main_grads_dtype, "must be bf16 or fp32", "e.g. bf16")
    run = ro.build_run(
        model=str(model),
        gpu=params["gpu"],
        gpus=int(gpus or 0),
        seq_len=str(seq_len),
        tp=params["tp"],
        cp=params["cp"],
        ep=params["ep"],
        etp=params["etp"],
        pp=params["pp"],
        vpp=params["vpp"],
        mbs=params["mbs"],
        gbs=params["gbs"],
        recompute=params["recompute"],
        precision=params["precision"],
        optimizer_offload=params["optimizer_offload"],
        dispatcher=params["dispatcher"],
        cuda_graph=params["cuda_graph"],
        cp_comm_type=params["cp_comm_type"],
        pipeline_layout=params["pipeline_layout"],
        sequence_parallel=params["sequence_parallel"],
        precision_aware_optimizer=params["precision_aware_optimizer"],
        moe_imbalance=params["moe_imbalance"],
        expandable_segments=params["expandable_segments"],
        fp8_params=params["fp8_params"],
        hardware_file=params["hardware_file"],
        hw=params["hw"],
        scaleout_gbps=params["scaleout_gbps"],
        gpus_per_node=params["gpus_per_node"],
        peft=ro.peft_options(
            params["peft"], params["lora_rank"], params["lora_targets"], params["lora_input_regather"]
        ),
        doc_lengths=params["doc_lengths"],
        hierarchical_cp_sizes=params["hierarchical_cp_sizes"],
        offload_modules=params["offload_modules"],
        activation_offload_fraction=params["activation_offload_fraction"],
        paged_stash=ro.paged_stash_options(
            params["moe_rank_capacity_factor"],
            params["paged_stash"],
            params["paged_stash_cuda_factor"],
            params["paged_stash_cpu_factor"],
        ),
    )
    return _with_knobs(
        run,
        ep_overlap=params["ep_overlap"],
        delay_wgrad=params["delay_wgrad_compute"],
        main_grads_dtype=main_grads_dtype,
        optimizer=ro.muon_fields(params["optimizer"], params["muon_ns_steps"], params["muon_tp_mode"]),
        dynamic_cp=ro.dynamic_cp_fields(
            params["dynamic_cp"], params["max_seqlen_per_dp_cp_rank"], params["min_dynamic_cp_size"]
        ),
    )


def _estimate_and_print(
    run: Any,
    calibration: Path | None,
    *,
    from_plan: tuple[Path, int] | None,
    json_output: bool,
    quiet: bool,
    explain: bool,
    stage: int | None,
) -> None:
    """Check the run's legality, estimate it (with the ``--calibration`` file, if any) and print
    (table or JSON; ``--explain``'s terms); exit 1 when it does not fit."""
    from lcmoe.errors import LcmoeError
    from lcmoe.estimate.report import estimate_run
    from lcmoe.rules.legality import violations

    broken = violations(run)
    if broken:
        first = broken[0]
        more = f" (+{len(broken) - 1} more; `lcmoe check` lists all)" if len(broken) > 1 else ""
        abort(f"[{first.rule}] {first.message}; fix: {first.fix}{more}.")  # the rule's source: check --json
    if stage is not None and not explain:
        raise LcmoeError("--stage", stage, "picks the stage --explain lists", "add --explain")
    coefficients = ro.time_coefficients(calibration, run.hardware)
    result = estimate_run(run, coefficients)
    result["inputs"].update(_settings(run))
    if from_plan is not None:
        result["inputs"]["from_plan"] = {"path": str(from_plan[0]), "rank": from_plan[1]}
    explanation = None
    if explain:
        from lcmoe.estimate.time.explain import explain_time

        explanation = explain_time(run, coefficients, stage)
        result["time"]["explain"] = explanation.as_dict()
    if json_output:
        print_json(result)
    else:
        render_estimate(result, quiet=quiet)
        if explanation is not None and not quiet:
            render_explanation(explanation)
    if not result["memory"]["fits"]:
        raise typer.Exit(EXIT_FINDINGS)


_EXAMPLE = "lcmoe estimate -m qwen3-30b-a3b -n 16 -s 16k --ep 8"


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the user set option ``name`` (on the command line or through the environment)."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")


def _flag_name(ctx: typer.Context, name: str) -> str:
    for param in ctx.command.params:
        if param.name == name and param.opts:
            return max(param.opts, key=len)
    return name


def _run_from_plan(path: Path, rank: int) -> Any:
    """Plan ``rank`` (1 = best) of plan.json, rebuilt exactly as the planner evaluated it."""
    from lcmoe.config_io.plan_json import read_plan, run_from_plan
    from lcmoe.errors import LcmoeError

    doc = read_plan(path)
    count = len(doc["plans"])
    if count and rank > count:
        raise LcmoeError("--rank", rank, f"must be from 1 to {count} (the plans in {path})", "e.g. --rank 1")
    return run_from_plan(doc, index=rank - 1)


def _with_knobs(
    run: Any,
    *,
    ep_overlap: bool,
    delay_wgrad: bool,
    main_grads_dtype: str | None,
    optimizer: dict[str, Any],
    dynamic_cp: dict[str, Any] | None = None,
) -> Any:
    """The knobs run_options.build_run does not take: EP overlap, delayed wgrad, the gradient
    buffer's dtype, the optimizer (``run_options.muon_fields``) and dynamic CP
    (``run_options.dynamic_cp_fields``)."""
    from dataclasses import replace

    options = run.options
    changes: dict[str, Any] = {k: v for k, v in optimizer.items() if getattr(options, k) != v}
    changes |= dynamic_cp or {}
    if dynamic_cp and dynamic_cp.get("max_seqlen_per_dp_cp_rank") is None:  # the emitted default, seq_len / CP
        changes["max_seqlen_per_dp_cp_rank"] = max(options.seq_len // run.layout.cp, 1)
    if ep_overlap != options.overlap_moe_expert_parallel_comm:
        changes["overlap_moe_expert_parallel_comm"] = ep_overlap
    if delay_wgrad != options.delay_wgrad_compute:
        changes["delay_wgrad_compute"] = delay_wgrad
    if main_grads_dtype is not None and main_grads_dtype != options.main_grads_dtype:
        changes["main_grads_dtype"] = main_grads_dtype
    return replace(run, options=replace(options, **changes)) if changes else run


def _settings(run: Any) -> dict[str, Any]:
    """The run's settings beyond layout/precision/recompute: the optimizer, gradients and overlap."""
    opt = run.options
    return {
        "optimizer": opt.optimizer,
        **opt.muon_summary(),
        "precision_aware_optimizer": opt.precision_aware_optimizer,
        "main_grads_dtype": opt.main_grads_dtype,
        "exp_avg_dtype": opt.exp_avg_dtype,
        "overlap_moe_expert_parallel_comm": opt.overlap_moe_expert_parallel_comm,
        "delay_wgrad_compute": opt.delay_wgrad_compute,
        "dynamic_context_parallel": opt.dynamic_context_parallel,
        "moe_token_imbalance": opt.moe_token_imbalance,
        "expandable_segments": opt.expandable_segments,
        "fp8_param_gather": opt.quantized_params,
    }


def _gib(value: float) -> str:
    return f"{value / 1024**3:.2f}"


def render_estimate(result: dict[str, Any], *, quiet: bool = False) -> None:
    memory = result["memory"]
    verdict = verdict_line(memory)
    if quiet:
        stdout.print(verdict, soft_wrap=True)
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
    stdout.print(settings_line(inputs, layout), highlight=False)
    if inputs.get("doc_lengths"):
        stdout.print(packing_text(inputs["doc_lengths"], result.get("packing")), highlight=False)
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
        parts = ["optimizer"] if result["inputs"].get("optimizer_offload_fraction") else []
        parts += ["activations"] if result["inputs"].get("activation_offload") else []
        stash = result["inputs"].get("paged_stash") or {}
        parts += ["paged-stash pages"] if stash.get("stash") and stash.get("cpu_factor") else []
        what = " and ".join(parts) or "optimizer"
        stdout.print(f"host memory per GPU (offloaded {what}): {_gib(memory['host_bytes_per_gpu'])} GiB")
    time = result.get("time")
    if time:
        render_time(time)
    stdout.print(verdict)


def _ep_overlap_text(inputs: dict[str, Any]) -> str:
    """``on`` / ``off``, with ``+ delayed wgrad`` when delay_wgrad_compute is on."""
    if not inputs.get("overlap_moe_expert_parallel_comm"):
        return "off"
    return "on + delayed wgrad" if inputs.get("delay_wgrad_compute") else "on"


def settings_line(inputs: dict[str, Any], layout: dict[str, Any]) -> str:
    """The rest of what the estimate assumed, in the words plan cards use (cli/plan_view.py)."""
    from lcmoe.cli.plan_view import optimizer_text

    graphs = ",".join(inputs["cuda_graph_scope"]) or "none"
    parts = [
        f"dispatcher {inputs['dispatcher']}",
        f"EP overlap {_ep_overlap_text(inputs)}",
        f"CUDA graphs {graphs}",
        f"optimizer {optimizer_text(inputs)}",
        f"CP exchange {cp_exchange_text(layout) if layout['cp'] > 1 else layout['cp_comm_type']}",
        f"sequence parallel {'on' if layout['sequence_parallel'] else 'off'}",
    ]
    if layout.get("pipeline_layout"):
        parts.append(f"pipeline layout {layout['pipeline_layout']}")
    return "; ".join(parts)


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
