"""The knobs shared by `estimate`, `plan` and `check`, turned into a RunConfig."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import typer

from lcmoe.cli.common import resolve_hardware, resolve_model
from lcmoe.errors import LcmoeError
from lcmoe.run import RunConfig
from lcmoe.workload import (
    ACTIVATION_OFFLOAD_MODULES,
    CUDA_GRAPH_SCOPES,
    DISPATCHERS,
    LORA_TARGETS,
    PRECISIONS,
    RECOMPUTE_MODULES,
    lora_fields,
)

if TYPE_CHECKING:
    from lcmoe.estimate.time import TimeCoefficients
    from lcmoe.specs.hardware import HardwareSpec
    from lcmoe.specs.model import ModelSpec


def check_gpus(value: int | None) -> int | None:
    """``--gpus`` bounded before any search or allocation uses it: 1 to 2^20 (layout.MAX_GPUS,
    > 5× the largest announced training cluster). A typer callback, so every command that
    takes the option refuses 10^30 GPUs before doing any work."""
    from lcmoe.layout import MAX_GPUS

    if value is None:
        return value
    if not 1 <= value <= MAX_GPUS:
        raise LcmoeError("--gpus", value, f"must be a whole number from 1 to {MAX_GPUS:,}", "e.g. --gpus 256")
    return value


# ----- choices: listed in --help and completed by the shell (--install-completion) -------------
PEFT_SCHEMES = ("none", "lora")
CP_COMM_TYPES = ("p2p", "a2a", "a2a+p2p", "all_gather")
RECOMPUTE_CHOICES = ("none", "full", "full:uniform:1", "full:block:1", *sorted(RECOMPUTE_MODULES))
GRAPH_CHOICES = ("none", *sorted(CUDA_GRAPH_SCOPES))


def choices_text(choices: Iterable[str]) -> str:
    """``a | b | c``: the choices as --help lists them."""
    return " | ".join(choices)


def complete_one(choices: Iterable[str]) -> Callable[[str], list[str]]:
    """A shell-completion callback offering the choices that start with what was typed."""
    options = tuple(choices)

    def complete(incomplete: str) -> list[str]:
        return [c for c in options if c.startswith(incomplete)]

    return complete


def complete_list(choices: Iterable[str], *, exclusive: Iterable[str] = ("none",)) -> Callable[[str], list[str]]:
    """A shell-completion callback for a comma list: completes the entry after the last comma
    with the choices not already in the list (an ``exclusive`` choice only stands alone)."""
    options, alone = tuple(choices), frozenset(exclusive)

    def complete(incomplete: str) -> list[str]:
        head, comma, last = incomplete.rpartition(",")
        taken = {t.strip() for t in head.split(",") if t.strip()}
        prefix = head + comma
        return [
            prefix + c
            for c in options
            if c.startswith(last.strip()) and c not in taken and not (comma and (c in alone or c.startswith("full")))
        ]

    return complete


def _complete_catalog(kind: Literal["model", "hardware"]) -> Callable[[str], list[str]]:
    """Completes catalog names (read when the shell asks, so --help never loads the catalog)."""

    def complete(incomplete: str) -> list[str]:
        from lcmoe.catalog import hardware_names, model_names

        names = model_names() if kind == "model" else hardware_names()
        return [n for n in names if n.startswith(incomplete)]

    return complete


MODEL = typer.Option(
    ...,
    "--model",
    "-m",
    help="catalog model (lcmoe models), lcmoe YAML or HF config.json",
    autocompletion=_complete_catalog("model"),
)
GPU = typer.Option(
    "h100", "--gpu", "-g", help="catalog GPU (lcmoe hardware)", autocompletion=_complete_catalog("hardware")
)
GPUS = typer.Option(..., "--gpus", "-n", help="total GPUs", callback=check_gpus)
SEQ = typer.Option(..., "--seq-len", "-s", help="tokens per sequence: 4096, 32k, 128K")
HW_FILE = typer.Option(None, "--hardware-file", help="your own hardware YAML")
HW_SET = typer.Option([], "--hw", help="override a hardware field, FIELD=VALUE (repeatable)")
SCALEOUT = typer.Option(None, "--scaleout-gbps", help="scale-out NIC Gb/s per GPU")
PER_NODE = typer.Option(None, "--gpus-per-node", help="GPUs per node")
CALIBRATION = typer.Option(None, "--calibration", help="cluster.yaml from `lcmoe calibrate` (your measured speed)")
PEFT = typer.Option(
    "none",
    "--peft",
    help=f"{choices_text(PEFT_SCHEMES)} (lora: frozen base; rank-r adapters train, Bridge cfg.peft=LoRA)",
    autocompletion=complete_one(PEFT_SCHEMES),
)
LORA_RANK = typer.Option(32, "--lora-rank", min=1, help="LoRA dim (Bridge's default 32)")
LORA_TARGETS_OPTION = typer.Option(
    ",".join(sorted(LORA_TARGETS)),
    "--lora-targets",
    help="comma list of LoRA target modules, from: " + ", ".join(sorted(LORA_TARGETS)),
    autocompletion=complete_list(sorted(LORA_TARGETS), exclusive=()),
)
DOC_LENGTHS = typer.Option(
    None,
    "--doc-lengths",
    metavar="PRESET|FILE",
    help="document lengths packed into each --seq-len sample (THD, per-document attention masks): fixed "
    "(default: one document per sample), a preset (pretrain-web, pretrain-long, sft-chat; illustrative) or a "
    "histogram file (.yaml/.json: share_of + lengths {L: share}; .csv: 'length,tokens' or 'length,documents')",
    autocompletion=complete_one(("fixed", "pretrain-web", "pretrain-long", "sft-chat")),
)
LORA_REGATHER = typer.Option(
    False, "--lora-input-regather", help="LoRA.sequence_parallel_input_regather: keep LoRA-A inputs sequence-local"
)

# The single-valued run knobs of `estimate` and the comma lists of `plan`/`sweep`/`report`.
RECOMPUTE = typer.Option(
    "none",
    "--recompute",
    help="none | full[:uniform|block[:N]] | a comma list of modules: " + ", ".join(sorted(RECOMPUTE_MODULES)),
    autocompletion=complete_list(RECOMPUTE_CHOICES),
)
PRECISION = typer.Option("bf16", "--precision", help=choices_text(PRECISIONS), autocompletion=complete_one(PRECISIONS))
DISPATCHER = typer.Option(
    "alltoall", "--dispatcher", help=choices_text(DISPATCHERS), autocompletion=complete_one(DISPATCHERS)
)
CUDA_GRAPH = typer.Option(
    "none",
    "--cuda-graph",
    help="none | a comma list of scopes: " + ", ".join(sorted(CUDA_GRAPH_SCOPES)),
    autocompletion=complete_list(GRAPH_CHOICES),
)
CP_COMM_TYPE = typer.Option(
    None,
    "--cp-comm-type",
    help=f"{choices_text(CP_COMM_TYPES)} (default p2p; all_gather for DSA models)",
    autocompletion=complete_one(CP_COMM_TYPES),
)
HIERARCHICAL_CP_SIZES = typer.Option(
    None,
    "--hierarchical-cp-sizes",
    "--hierarchical-context-parallel-sizes",
    help="A2A,P2P: a2a+p2p CP's group sizes, a2a first, product = CP (default with --cp-comm-type a2a+p2p: "
    "the largest a2a group inside one NVLink domain that divides the heads per TP rank)",
)
OFFLOAD_MODULES = typer.Option(
    None,
    "--offload-modules",
    help="comma list of modules whose inputs fine-grained activation offloading moves to the host "
    "(Megatron-Core offload_modules): " + ", ".join(sorted(ACTIVATION_OFFLOAD_MODULES)),
    autocompletion=complete_list(sorted(ACTIVATION_OFFLOAD_MODULES)),
)
OFFLOAD_FRACTION = typer.Option(
    1.0,
    "--activation-offload-fraction",
    min=0.0,
    max=1.0,
    help="share of the eligible offload groups offloaded (Megatron-Core activation_offload_fraction)",
)
DYNAMIC_CP = typer.Option(
    False,
    "--dynamic-cp/--no-dynamic-cp",
    help="dynamic context parallelism: each packed document runs on the fewest DP×CP ranks its length needs "
    "(mcore 0.19.2 hybrid_context_parallel; needs --doc-lengths)",
)
MAX_SEQLEN_PER_DP_CP_RANK = typer.Option(
    None,
    "--max-seqlen-per-dp-cp-rank",
    min=1,
    help="tokens one rank holds under dynamic CP (default seq_len / CP)",
)
MIN_DYNAMIC_CP_SIZE = typer.Option(
    1,
    "--min-dynamic-cp-size",
    "--min-dynamic-context-parallel-size",
    min=1,
    help="smallest dynamic CP group (Megatron-LM dev's min_dynamic_context_parallel_size; default 1)",
)


def dynamic_cp_fields(on: bool, max_seqlen: int | None, min_size: int) -> dict[str, Any]:
    """TrainingOptions' dynamic-CP fields from the flags; the two sizes without ``--dynamic-cp``
    are refused by name (TrainingOptions checks the values)."""
    if not on:
        if max_seqlen is not None or min_size != 1:
            flag = "--max-seqlen-per-dp-cp-rank" if max_seqlen is not None else "--min-dynamic-cp-size"
            raise LcmoeError(flag, max_seqlen or min_size, "applies only with --dynamic-cp", "add --dynamic-cp")
        return {}
    return {
        "dynamic_context_parallel": True,
        "max_seqlen_per_dp_cp_rank": max_seqlen,
        "min_dynamic_context_parallel_size": min_size,
    }


RANK_CAPACITY = typer.Option(
    None,
    "--moe-rank-capacity-factor",
    min=0.0,
    help="sync-free experts: HybridEP's static per-rank token budget over the balanced count "
    "(Megatron-Core moe_expert_rank_capacity_factor; Bridge's recipes use 1.5; Blackwell, ETP 1)",
)
PAGED_STASH = typer.Option(
    False,
    "--paged-stash/--no-paged-stash",
    help="keep the experts' saved activations in preallocated pages (Megatron-Core moe_paged_stash; "
    "needs --moe-rank-capacity-factor)",
)
STASH_CUDA_FACTOR = typer.Option(
    1.10,
    "--paged-stash-cuda-factor",
    help="GPU pages over the expected tokens (moe_paged_stash_buffer_size_factor_cuda; negative: over the actual)",
)
STASH_CPU_FACTOR = typer.Option(
    0.0,
    "--paged-stash-cpu-factor",
    help="pinned host pages over the expected tokens (moe_paged_stash_buffer_size_factor_cpu; 0: none)",
)
PRECISION_LIST = typer.Option(
    None,
    "--precision",
    help="comma list of " + ", ".join(PRECISIONS) + " (default: all the GPU has)",
    autocompletion=complete_list(PRECISIONS, exclusive=()),
)
DISPATCHER_LIST = typer.Option(
    None,
    "--dispatchers",
    help="comma list of " + ", ".join(DISPATCHERS) + " (default: alltoall,deepep,hybridep; "
    "no deepep past 8-GPU NVLink domains)",
    autocompletion=complete_list(DISPATCHERS, exclusive=()),
)


# Each sequence length of a sweep is one full search (seconds): 32 covers 1K to 2^40 in powers
# of two with room to spare, and bounds the work a single command line can ask for.
MAX_SWEEP_LENGTHS = 32
# A range between two lengths, as the docs write it: 16k..256k, 16k...256k, 16K–256K, 16k-256k,
# 4K to 256K (a length is never negative, so "-" between two lengths can only mean a range).
_RANGE = re.compile(r"^(.+?)\s*(?:\.{2,3}|…|–|—|-|\s+to\s+)\s*(.+)$", re.IGNORECASE)
_ELLIPSIS = ("..", "...", "…")  # a lone entry between two lengths: 4k,…,256k


def powers_of_two_between(low: int, high: int) -> list[int]:
    """``low``, every power of two strictly between, and ``high`` (16K, 256K → 16K … 256K)."""
    inside, power = [], 1 << low.bit_length()
    while power < high:
        inside.append(power)
        power <<= 1
    return [low, *inside, high] if high > low else [low]


def _length_range(low_text: str, high_text: str, *, field: str, entry: str) -> list[int]:
    from lcmoe.units import parse_token_count

    low, high = parse_token_count(low_text, field=field), parse_token_count(high_text, field=field)
    if high < low:
        raise LcmoeError(field, entry, "is a range from a longer to a shorter length", "e.g. 16k..256k")
    return powers_of_two_between(low, high)


def _expand_entries(entries: list[str], *, field: str) -> list[int]:
    """Each entry a length or a range; a lone ``…`` fills the powers of two between its neighbours."""
    from lcmoe.units import parse_token_count

    lengths: list[int] = []
    for i, entry in enumerate(entries):
        if entry in _ELLIPSIS:
            if not lengths or i + 1 == len(entries) or entries[i + 1] in _ELLIPSIS:
                raise LcmoeError(field, ",".join(entries), "has '…' without a length on each side", "e.g. 4k,…,256k")
            high = parse_token_count(entries[i + 1], field=field)
            lengths += _length_range(str(lengths[-1]), str(high), field=field, entry=entry)[1:-1]
            continue
        match = _RANGE.match(entry)
        if match:
            lengths += _length_range(*match.groups(), field=field, entry=entry)
        else:
            lengths.append(parse_token_count(entry, field=field))
    return list(dict.fromkeys(lengths))


def seq_lengths(text: str, *, field: str) -> list[int]:
    """The lengths of a sequence-length list: ``4k,32k,128k``, ranges of powers of two
    (``16k..256k``, ``16K–256K``, ``16k-256k``, ``4K to 256K``, ``4k,…,256k``), repeats dropped. An empty
    list (``,,,``) or more than MAX_SWEEP_LENGTHS lengths is refused, never an empty sweep that
    exits 0."""
    entries = [t.strip() for t in text.split(",") if t.strip()]
    if not entries:
        raise LcmoeError(field, text, "names no sequence length", f"e.g. {field} 4k,32k,128k or 16k..256k")
    if len(entries) > MAX_SWEEP_LENGTHS:  # before expanding: bounds the parsing too
        raise LcmoeError(field, text, f"names {len(entries)} lengths, more than {MAX_SWEEP_LENGTHS}", "sweep fewer")
    lengths = _expand_entries(entries, field=field)
    if len(lengths) > MAX_SWEEP_LENGTHS:
        raise LcmoeError(
            field, text, f"names {len(lengths)} lengths, more than {MAX_SWEEP_LENGTHS}", "sweep fewer lengths"
        )
    return lengths


def check_recompute_text(text: str) -> None:
    """``--recompute full:METHOD:N`` needs N ≥ 1 (Megatron's recompute_num_layers); run.py's
    parser would otherwise clamp ``full:block:-1`` to 1 and evaluate a run nobody asked for."""
    parts = text.strip().lower().split(":")
    if parts[0] == "full" and len(parts) > 2:
        count = parts[2].strip()
        if not count.isdigit() or not 1 <= int(count[:12]) <= 100_000:
            raise LcmoeError(
                "--recompute",
                text,
                "the layer count after full:METHOD: must be a whole number from 1 to 100,000",
                "e.g. full:block:4",
            )
    if len(parts) > 3:
        raise LcmoeError("--recompute", text, "has more than full:METHOD:N", "e.g. full:uniform:1")


def peft_options(peft: str, lora_rank: int, lora_targets: str, lora_input_regather: bool) -> dict[str, Any]:
    """The TrainingOptions fields of ``--peft`` and its LoRA knobs (validated there)."""
    if peft == "none":
        return {}
    targets = (t.strip() for t in lora_targets.split(",") if t.strip())
    return lora_fields(lora_rank, targets, lora_input_regather, scheme=peft)


def time_coefficients(calibration: Path | None, hardware: HardwareSpec) -> TimeCoefficients | None:
    """The calibration file's coefficients for ``hardware``, or None for the shipped fit."""
    if calibration is None:
        return None
    from lcmoe.estimate.calibration import coefficients_for, load_calibration

    return coefficients_for(hardware, load_calibration(calibration))


@dataclass(frozen=True, kw_only=True, slots=True)
class RunKnobs:
    """One run as `estimate` takes it on the command line (strings as typed; parsed by run_from_knobs)."""

    model: str  # catalog name, lcmoe YAML or HF config.json
    gpu: str
    gpus: int
    seq_len: str  # 4096, 32k, 128K
    tp: int
    cp: int
    ep: int
    etp: int | None  # None: 1
    pp: int
    vpp: int
    mbs: int
    gbs: int | None  # None: the default global batch
    recompute: str  # none | full[:METHOD[:N]] | a comma list of modules
    precision: str
    optimizer_offload: float  # fraction of the optimizer state on the host
    dispatcher: str
    cuda_graph: str  # none | a comma list of scopes
    cp_comm_type: str | None  # None: all_gather for DSA models, else p2p
    pipeline_layout: str | None
    sequence_parallel: bool | None
    precision_aware_optimizer: bool  # BF16 main grads and exp_avg
    moe_imbalance: float
    expandable_segments: bool
    fp8_params: bool | None
    hardware_file: Path | None
    hw: list[str]  # FIELD=VALUE hardware overrides
    scaleout_gbps: float | None
    gpus_per_node: int | None
    peft: dict[str, Any] | None = None  # TrainingOptions' peft / lora_* fields (peft_options)
    doc_lengths: str | None = None  # --doc-lengths as typed (None: fixed length)
    hierarchical_cp_sizes: str | None = None  # --hierarchical-cp-sizes as typed (None: the default split)
    offload_modules: str | None = None  # --offload-modules as typed (None: no activation offloading)
    activation_offload_fraction: float = 1.0
    paged_stash: dict[str, Any] | None = None  # TrainingOptions' rank-capacity / paged-stash fields


def paged_stash_options(capacity: float | None, stash: bool, cuda: float, cpu: float) -> dict[str, Any]:
    """TrainingOptions' sync-free / paged-stash fields of the CLI flags; TrainingOptions and
    ``rules.paged_stash`` judge them."""
    return {
        "moe_expert_rank_capacity_factor": capacity,
        "moe_paged_stash": stash,
        "moe_paged_stash_buffer_size_factor_cuda": cuda,
        "moe_paged_stash_buffer_size_factor_cpu": cpu,
    }


OPTIMIZERS = ("adam", "muon")
MUON_TP_MODES = ("blockwise", "duplicated", "distributed")
OPTIMIZER = typer.Option(
    "adam",
    "--optimizer",
    help=f"{choices_text(OPTIMIZERS)}: muon orthogonalises the 2-D weights (Newton-Schulz) and keeps the "
    "embedding, output layer and norms on Adam; layer-wise distributed over DP (Bridge dist_muon)",
    autocompletion=complete_one(OPTIMIZERS),
)
MUON_NS_STEPS = typer.Option(
    5, "--muon-ns-steps", min=1, max=100, help="with --optimizer muon: Newton-Schulz steps (a multiple of 5)"
)
MUON_TP_MODE = typer.Option(
    "blockwise",
    "--muon-tp-mode",
    help=f"with --optimizer muon: {choices_text(MUON_TP_MODES)} (how a TP-sharded matrix is orthogonalised)",
    autocompletion=complete_one(MUON_TP_MODES),
)


def muon_fields(optimizer: str, ns_steps: int, tp_mode: str) -> dict[str, Any]:
    """TrainingOptions' optimizer fields from ``--optimizer``, ``--muon-ns-steps`` and
    ``--muon-tp-mode`` (the Muon ones only with muon: they mean nothing to Adam)."""
    if optimizer not in OPTIMIZERS:
        raise LcmoeError("--optimizer", optimizer, f"must be one of {', '.join(OPTIMIZERS)}", "e.g. --optimizer muon")
    if optimizer != "muon":
        return {"optimizer": optimizer}
    if tp_mode not in MUON_TP_MODES:
        raise LcmoeError("--muon-tp-mode", tp_mode, f"must be one of {', '.join(MUON_TP_MODES)}", "e.g. blockwise")
    return {"optimizer": "muon", "muon_num_ns_steps": ns_steps, "muon_tp_mode": tp_mode}


def build_run(**knobs: Any) -> RunConfig:
    """The RunConfig of `estimate`'s options, given by RunKnobs' field names (a missing or unknown
    name is a TypeError from RunKnobs on the first call). Kept for estimate_cmd; new callers build
    ``run_from_knobs(RunKnobs(...))``, which mypy checks field by field."""
    return run_from_knobs(RunKnobs(**knobs))


def run_from_knobs(knobs: RunKnobs) -> RunConfig:
    """Resolve the model and hardware, check precision and recompute, build the layout and options."""
    from lcmoe.run import build_layout, check_precision_supported, parse_recompute
    from lcmoe.specs.doc_lengths import load_doc_lengths
    from lcmoe.units import parse_token_count
    from lcmoe.workload import TrainingOptions

    spec = resolve_model(knobs.model)
    hardware = resolve_hardware(
        knobs.gpu,
        hardware_file=knobs.hardware_file,
        overrides=knobs.hw,
        scaleout_gbps=knobs.scaleout_gbps,
        gpus_per_node=knobs.gpus_per_node,
    )
    tokens = parse_token_count(knobs.seq_len)
    check_precision_supported(hardware, knobs.precision)
    check_recompute_text(knobs.recompute)
    granularity, modules, method, num_layers = parse_recompute(knobs.recompute)
    scopes = frozenset(s.strip() for s in knobs.cuda_graph.split(",") if s.strip() and s.strip() != "none")
    cp_comm_type = knobs.cp_comm_type or ("all_gather" if spec.is_dsa else "p2p")
    layout = build_layout(
        spec,
        knobs.gpus,
        tp=knobs.tp,
        cp=knobs.cp,
        ep=knobs.ep,
        etp=knobs.etp if knobs.etp is not None else 1,
        pp=knobs.pp,
        vpp=knobs.vpp,
        mbs=knobs.mbs,
        gbs=knobs.gbs,
        # DSA attention runs only all-gather CP (L-DSA-CP); every other model defaults to the ring.
        cp_comm_type=cp_comm_type,
        hierarchical_context_parallel_sizes=_hierarchical_sizes(knobs, spec, hardware, cp_comm_type),
        pipeline_layout=knobs.pipeline_layout,
        sequence_parallel=knobs.sequence_parallel,
    )
    state_dtype: Literal["bf16", "fp32"] = "bf16" if knobs.precision_aware_optimizer else "fp32"
    options = TrainingOptions(
        seq_len=tokens,
        precision=knobs.precision,
        fp8_param_gather=knobs.fp8_params,
        recompute_granularity=granularity,
        recompute_modules=modules,
        recompute_method=method,
        recompute_num_layers=num_layers,
        optimizer_offload_fraction=knobs.optimizer_offload,
        dispatcher=knobs.dispatcher,
        cuda_graph_scope=scopes,
        main_grads_dtype=state_dtype,
        exp_avg_dtype=state_dtype,
        moe_token_imbalance=knobs.moe_imbalance,
        expandable_segments=knobs.expandable_segments,
        doc_lengths=load_doc_lengths(knobs.doc_lengths) if knobs.doc_lengths else None,
        activation_offload_modules=offload_modules_of(knobs.offload_modules),
        activation_offload_fraction=knobs.activation_offload_fraction,
        **(knobs.peft or {}),
        **(knobs.paged_stash or {}),
    )
    return RunConfig(spec, hardware, layout, options)


def offload_modules_of(text: str | None) -> frozenset[str]:
    """``--offload-modules`` as a set (``none`` or nothing: no offloading); unknown names are
    refused by ``TrainingOptions``."""
    names = frozenset(n.strip() for n in (text or "").split(",") if n.strip())
    return frozenset() if names <= {"none"} else names


def _hierarchical_sizes(
    knobs: RunKnobs, spec: ModelSpec, hardware: HardwareSpec, cp_comm_type: str
) -> tuple[int, ...] | None:
    """``--hierarchical-cp-sizes`` (only with ``--cp-comm-type a2a+p2p``), or with a2a+p2p and no
    sizes the planner's split (``sensible_hierarchical_sizes``; an error where there is none)."""
    from lcmoe.layout import read_hierarchical_sizes
    from lcmoe.rules.context_parallel import sensible_hierarchical_sizes

    if knobs.hierarchical_cp_sizes and cp_comm_type != "a2a+p2p":
        raise LcmoeError(
            "--hierarchical-cp-sizes",
            knobs.hierarchical_cp_sizes,
            f"apply only to --cp-comm-type a2a+p2p, not {cp_comm_type}",
            "add --cp-comm-type a2a+p2p, or drop the sizes",
        )
    sizes = read_hierarchical_sizes(
        knobs.hierarchical_cp_sizes, field="--hierarchical-cp-sizes", cp_comm_type=cp_comm_type
    )
    if sizes is None and cp_comm_type == "a2a+p2p" and knobs.cp > 1:
        sizes = sensible_hierarchical_sizes(
            spec, knobs.tp, knobs.cp, hardware.nvlink_domain_size, only_beyond_domain=False
        )
        if sizes is None:
            raise LcmoeError(
                "--cp-comm-type",
                cp_comm_type,
                f"has no a2a group to default to at TP {knobs.tp}, CP {knobs.cp}: none of 2 or more CP ranks fits "
                f"one {hardware.nvlink_domain_size}-GPU NVLink domain and divides the heads per TP rank",
                "give --hierarchical-cp-sizes A2A,P2P, or use p2p",
            )
    return sizes
