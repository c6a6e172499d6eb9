"""The options `plan`, `report` and `sweep` share, as one typed record, and the one function that
validates them and turns them into a ``PlanRequest`` (issue 33 item 6).

A command declares its options (typer needs them in its signature), then builds ``PlanOptions``
once from ``ctx.params``; nothing downstream sees the loose arguments.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from lcmoe.cli import run_options as ro
from lcmoe.cli.common import resolve_hardware, resolve_model, stderr
from lcmoe.errors import LcmoeError

if TYPE_CHECKING:
    from lcmoe.estimate.band import TimeEvidence
    from lcmoe.plan.search import PlanRequest, SearchResult

# The same tuple as plan.search.RANK_MODES (a test keeps them equal); spelled here so that
# `lcmoe --help` does not import the search.
RANK_CHOICES = ("conservative", "expected")
SWEEP_DEFAULT = "4k,16k,32k,64k,128k,256k"

GBS = typer.Option(None, "--gbs", min=1, help="target global batch (rounded to a legal multiple)")
TOP = typer.Option(5, "--top", min=1, max=50, help="how many plans to list")
MARGIN = typer.Option(0.05, "--margin", help="memory safety margin")
MCORE = typer.Option("0.19.2", "--megatron-core-version", help="the Megatron-Core release the rules target")
RANK = typer.Option(
    "conservative",
    "--rank",
    help=f"{ro.choices_text(RANK_CHOICES)} (conservative: rank by the band's lower edge of tokens/s/GPU; "
    "expected: by the prediction)",
    autocompletion=ro.complete_one(RANK_CHOICES),
)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanOptions:
    """What the user asked `plan` / `report` / `sweep` for, as typed on the command line; the
    field names are the commands' parameter names (``from_params`` relies on it)."""

    model: str  # catalog name, lcmoe YAML or HF config.json
    gpu: str  # catalog GPU (ignored with hardware_file)
    gpus: int  # total GPUs
    seq_len: str | None = None  # tokens per sequence as typed (4096, 32k); None for sweep
    gbs: int | None = None  # target global batch; None: the planner picks one
    precision: str | None = None  # comma list of precisions; None: every one the GPU has
    dispatchers: str | None = None  # comma list of token dispatchers; None: the planner's default
    top: int = 5  # plans to list
    margin: float = 0.05  # memory safety margin, a fraction of capacity
    megatron_core_version: str = "0.19.2"
    no_offload: bool = False  # never offload the optimizer
    no_cuda_graphs: bool = False  # variable-length data: no CUDA graphs
    hardware_file: Path | None = None
    hw: tuple[str, ...] = ()  # FIELD=VALUE hardware overrides
    scaleout_gbps: float | None = None  # scale-out NIC Gb/s per GPU
    gpus_per_node: int | None = None
    calibration: Path | None = None  # cluster.yaml from `lcmoe calibrate`
    peft: str = "none"  # none | lora
    lora_rank: int = 32
    lora_targets: str = ""  # comma list of LoRA target modules
    lora_input_regather: bool = False
    rank: str = "conservative"  # RANK_CHOICES
    doc_lengths: str | None = None  # --doc-lengths as typed; None: fixed length
    optimizer: str = "adam"  # adam | muon (a choice, not searched)
    muon_ns_steps: int = 5
    muon_tp_mode: str = "blockwise"

    @classmethod
    def from_params(cls, params: dict[str, Any], **fixed: Any) -> PlanOptions:
        """The options among a command's parsed parameters (``ctx.params``); ``fixed`` sets the
        fields a command does not offer (sweep lists one plan per length: ``top=1``)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in params.items() if k in known and v is not None} | fixed
        values["hw"] = tuple(values.get("hw", ()))
        return cls(**values)


def _comma_choices(text: str | None, *, option: str, allowed: tuple[str, ...], example: str) -> tuple[str, ...] | None:
    """A comma list whose every entry is one of ``allowed`` (None when not given)."""
    if not text:
        return None
    chosen = tuple(t.strip() for t in text.split(","))
    for entry in chosen:
        if entry not in allowed:
            raise LcmoeError(option, entry, f"must be among {', '.join(allowed)}", f"e.g. {example}")
    return chosen


def _check_scalars(options: PlanOptions) -> None:
    """The single-valued options' own ranges."""
    if options.gpus < 1:
        raise LcmoeError("--gpus", options.gpus, "must be at least 1", "e.g. --gpus 256")
    if not 0 <= options.margin < 0.9:
        raise LcmoeError("--margin", options.margin, "must be a fraction in [0, 0.9)", "e.g. 0.05")
    if options.rank not in RANK_CHOICES:
        raise LcmoeError("--rank", options.rank, f"must be {' or '.join(RANK_CHOICES)}", "e.g. --rank expected")


def plan_request(options: PlanOptions, *, seq_len: int | None = None, evidence: Any = None) -> PlanRequest:
    """Validate ``options`` and build the search's request (at ``seq_len`` tokens when given,
    else the options' own --seq-len); ``evidence`` reuses already-loaded time evidence."""
    from lcmoe.plan.search import PlanRequest
    from lcmoe.run import check_precision_supported
    from lcmoe.specs.doc_lengths import load_doc_lengths
    from lcmoe.units import parse_token_count
    from lcmoe.workload import DISPATCHERS, PRECISIONS

    peft = ro.peft_options(options.peft, options.lora_rank, options.lora_targets, options.lora_input_regather)
    spec = resolve_model(options.model)
    hardware = resolve_hardware(
        options.gpu,
        hardware_file=options.hardware_file,
        overrides=list(options.hw),
        scaleout_gbps=options.scaleout_gbps,
        gpus_per_node=options.gpus_per_node,
    )
    precisions = _comma_choices(
        options.precision, option="--precision", allowed=PRECISIONS, example="bf16,fp8-blockwise"
    )
    for precision in precisions or ():
        check_precision_supported(hardware, precision)
    dispatchers = _comma_choices(
        options.dispatchers, option="--dispatchers", allowed=DISPATCHERS, example="alltoall,deepep"
    )
    _check_scalars(options)
    docs = load_doc_lengths(options.doc_lengths) if options.doc_lengths else None
    return PlanRequest(
        model=spec,
        hardware=hardware,
        num_gpus=options.gpus,
        seq_len=seq_len if seq_len is not None else parse_token_count(options.seq_len or ""),
        gbs=options.gbs,
        precisions=precisions,
        dispatchers=dispatchers,
        top_k=options.top,
        memory_margin=options.margin,
        megatron_core_version=options.megatron_core_version,
        allow_offload=not options.no_offload,
        # Packed documents change shapes every step: no CUDA graphs (L-PACK-GRAPHS).
        allow_cuda_graphs=not options.no_cuda_graphs and docs is None,
        time_coefficients=ro.time_coefficients(options.calibration, hardware),
        time_evidence=evidence if evidence is not None else time_evidence(),
        rank="expected" if options.rank == "expected" else "conservative",
        doc_lengths=docs,
        optimizer=tuple(ro.muon_fields(options.optimizer, options.muon_ns_steps, options.muon_tp_mode).items())
        if options.optimizer != "adam"
        else (),
        **peft,
    )


def time_evidence() -> TimeEvidence:
    """The measured runs behind the time bands (data/time_evidence.yaml), read once per command."""
    from importlib import resources

    import yaml

    from lcmoe.estimate.band import evidence_from_dict

    text = resources.files("lcmoe.data").joinpath("time_evidence.yaml").read_text(encoding="utf-8")
    return evidence_from_dict(yaml.safe_load(text) or {})


def search_with_progress(request: PlanRequest, quiet: bool) -> SearchResult:
    """The search, with a transient "searching layouts" bar on a terminal's stderr."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from lcmoe.cli.progress import is_terminal
    from lcmoe.plan.search import search

    if quiet or not is_terminal(stderr):
        return search(request)
    columns = (TextColumn("searching layouts"), BarColumn(), TextColumn("{task.completed}/{task.total}"))
    with Progress(*columns, TimeElapsedColumn(), console=stderr, transient=True) as bar:
        task = bar.add_task("search", total=1)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return search(request, progress=update)


def search_or_min_gpus(request: PlanRequest, quiet: bool) -> SearchResult:
    """The search; when nothing fits, also the smallest GPU count that would (LC-GPU-FEASIBLE)
    and the closest plan (``closest_when_pruned`` when the search kept none)."""
    from lcmoe.plan.search import min_gpus_that_fit

    result = search_with_progress(request, quiet)
    if not result.plans:
        result.min_gpus_needed = min_gpus_that_fit(request)
        # The search keeps the over-capacity candidates as they started (no recompute, no
        # offload) and none it pruned: the closest with every saving on is the honest "how far".
        saving = closest_when_pruned(request, result.gbs)
        if saving is not None and (result.closest is None or _over(saving) < _over(result.closest)):
            result.closest = saving
    return result


# A GPU count whose odd part is at most this leaves TP, CP, EP and PP room (8 = 2^3 · 1 ... 7).
SMALL_ODD_PART = 7


def odd_part(num_gpus: int) -> int:
    """``num_gpus`` without its factors of two (250 → 125)."""
    return num_gpus // (num_gpus & -num_gpus)


def fewer_gpus_that_fit(request: PlanRequest, tries: int = 2) -> int | None:
    """For a GPU count with a large odd factor (250 = 2 · 125) that fits nothing: the largest
    count below it with small factors (odd part ≤ SMALL_ODD_PART; 224 = 32 · 7) on which a plan
    fits, trying at most ``tries`` counts and none below half the request. None otherwise."""
    from dataclasses import replace

    from lcmoe.plan.search import search

    if odd_part(request.num_gpus) <= SMALL_ODD_PART:
        return None
    counts = [n for n in range(request.num_gpus - 1, request.num_gpus // 2, -1) if odd_part(n) <= SMALL_ODD_PART]
    for gpus in counts[:tries]:
        if search(replace(request, num_gpus=gpus, top_k=1)).plans:
            return gpus
    return None


def _over(plan: Any) -> float:
    return float(plan.memory.peak_reserved_bytes - plan.memory.capacity_bytes)


def closest_when_pruned(request: PlanRequest, gbs: int | None = None) -> Any:
    """The legal candidate least over capacity with everything that saves memory turned on (full
    recompute, the whole optimizer on the host), so "nothing fits" names the closest layout and
    how far over each stage is, also when the search estimated no candidate (each one's weights
    and gradients alone exceed the GPU: its static prune). None without a legal candidate.
    ``gbs``: the search's common GBS (without --gbs)."""
    from dataclasses import replace

    from lcmoe.estimate.memory import staged_layout
    from lcmoe.plan.fitting import memory_of, options_with, time_of
    from lcmoe.plan.judge import judge_for
    from lcmoe.plan.search import Plan, base_options, enumerate_layouts, precisions_for, resolved
    from lcmoe.run import RunConfig

    request = resolved(request)
    judge = judge_for(request.megatron_core_version)
    best: tuple[float, Any] | None = None
    starts = [base_options(request, precision) for precision in precisions_for(request)]
    for layout in enumerate_layouts(request, request.gbs or gbs):
        staged = None
        for start in starts:
            saving = options_with(
                start, recompute_granularity="full", recompute_modules=frozenset(), optimizer_offload_fraction=1.0
            )
            run = RunConfig(request.model, request.hardware, layout, saving)
            if not judge.legal(run):
                kept = start.optimizer_offload_fraction  # offload illegal here: keep the start's
                run = replace(run, options=options_with(saving, optimizer_offload_fraction=kept))
                if not judge.legal(run):
                    continue
            staged = staged or staged_layout(run.model, run.layout)
            memory = memory_of(request, run, staged)
            over = memory.peak_reserved_bytes - memory.capacity_bytes
            if best is None or over < best[0]:
                best = (over, Plan(run, memory, time_of(request, run, staged)))
    return best[1] if best else None
