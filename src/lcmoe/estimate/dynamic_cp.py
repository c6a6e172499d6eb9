"""Dynamic context parallelism (``TrainingOptions.dynamic_context_parallel``): where each document
of a packed step runs, and the step time and memory that follow.

What Megatron-Core 0.19.2 does (``hybrid_context_parallel``; sources below are that wheel):

* The DP×CP ranks (N = dp·cp) form one pool. The data iterator is wrapped
  (Megatron-LM ``training/training.py:3478-3479``, ``HybridCPDataLoaderWrapper``,
  ``core/datasets/data_schedule.py:12-301``): every step it all-gathers the documents' lengths
  over DP, schedules them, and all-to-alls each document's tokens to the ranks that run it.
* A document of length ℓ runs on g(ℓ) = max(1, 2^⌈log₂(ℓ/M)⌉) ranks, M =
  ``max_seqlen_per_dp_cp_rank`` (``pipeline_parallel/hybrid_cp_schedule.py:43-52``
  ``gpus_needed``); Megatron-LM dev lower-bounds it by ``min_dynamic_context_parallel_size``
  (``data_schedule_utils.py:933-936`` ``dcp_gpus_needed``). A group of g ranks is g consecutive
  DP×CP ranks (``parallel_state.py:440-462``), so it spans g·tp GPUs.
* Each document is its own forward and backward (``hybrid_cp_schedule.py:477-669``: one
  ``forward_step`` per sub-sample, a barrier over DP×CP after each group of sub-samples), with
  Transformer Engine's CP group switched to the document's group
  (``extensions/transformer_engine.py:1984-2002``). Megatron-LM dev packs a rank's documents of
  one group into microbatches of up to M tokens (``data_schedule.py`` ``build_packed_microbatches``);
  lcmoe prices 0.19.2's one document per microbatch, the only released behaviour.
* Documents must be multiples of 2·N (·TP with sequence parallelism): a document may land on any
  group up to the whole pool (``core/datasets/gpt_dataset.py:62-67``; Megatron-LM dev
  ``training/datasets/sft_dataset.py`` ``_calculate_padding_divisor`` pads to it).

Step time (``dynamic_cp_time``). The pieces of ``DocLengths.pieces(S)`` are put in classes c by
(g, ⌊log₂ ℓ⌋). A class runs as a fixed-length run of its token-weighted mean length L_c (rounded
up to a multiple of 2·g, ·tp with sequence parallelism: what the chunks and L-SEQ-SP need) on a layout with
cp = g, dp = N/g (the CP ring of g ranks, its attention chunks and span, every other term as the
estimator prices a fixed-length run), whose microbatch takes t_c seconds:

    step = Σ_c t_c · k_c + dp_comm + optimizer + regroup
    k_c  = P · Σ_{ℓ∈c} s_ℓ/ℓ′ / (N/g)        documents of class c per rank and step

with P = gbs·S the step's pack slots, s_ℓ the share of them in pieces of length ℓ padded to ℓ′
(``dcp_padding_per_token``) and dp_comm, optimizer the fixed-CP run's (same N, same parameters).
The attention work Σd² is the same as fixed CP's; what changes is that a document shorter than M
needs no CP exchange at all and one on g < cp ranks passes the ring g − 1 times instead of
cp − 1, in chunks ℓ/(2g) instead of ℓ/(2·cp); what it costs is one microbatch per document, the
2·N padding and ``regroup_seconds``. The scheduler balances ranks to within 5 %
(``hybrid_cp_schedule.py:104-125``, ``delta``); lcmoe takes the balance as exact, as it does for
fixed CP.

Memory (``dcp_memory_options``): a rank holds at most M tokens of one document per microbatch,
so activations are a fixed-CP run's with seq_len/cp = M (``seq_len`` = M·cp); at the default
M = S/cp that is the fixed-CP run itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from lcmoe.estimate.time import TimeCoefficients, TimeEstimate, estimate_time
from lcmoe.layout import ParallelLayout
from lcmoe.run import RunConfig
from lcmoe.specs.doc_lengths import DocLengths
from lcmoe.workload import TrainingOptions, unchecked_replace

# The latency floor of one small collective (kernels-and-links.md §3d): all-reduce of ≤ 1 KiB
# ≈ 26 µs on 8 H100 over NVLink, ≈ 46–48 µs across 2 nodes (NVIDIA/nccl#1244).
COLLECTIVE_LATENCY_NVLINK_S = 26e-6
COLLECTIVE_LATENCY_SCALEOUT_S = 48e-6
# Bytes per token the data iterator re-routes (data_schedule.py:134-240: one all-to-all per batch
# key): int64 tokens, labels and position ids, a float32 loss mask.
REROUTE_BYTES_PER_TOKEN = 3 * 8 + 4
# Collectives of the wrapper per step besides the barriers: two all-gathers of the lengths over
# DP (data_schedule.py:55-104) and one all-to-all per batch key (four, above).
WRAPPER_COLLECTIVES = 2 + 4


@dataclass(frozen=True, slots=True)
class DcpClass:
    """Pieces that run alike: group size ``group``, token-weighted mean padded length ``length``
    (tokens), ``slot_share`` of the step's pack slots and ``docs_per_slot`` (Σ s_ℓ/ℓ′)."""

    group: int
    length: float
    slot_share: float
    docs_per_slot: float


def dcp_pool(layout: ParallelLayout) -> int:
    """N = dp·cp, the ranks dynamic CP regroups (parallel_state.py:1040-1049 ``get_ranks('dp-cp')``)."""
    return layout.dp * layout.cp


def max_seqlen(options: TrainingOptions, layout: ParallelLayout) -> int:
    """M: ``max_seqlen_per_dp_cp_rank``, or seq_len / cp when unset (model_parallel_config.py:111-118:
    'a good starting point is ... maximum sequence length / context parallel size')."""
    return options.max_seqlen_per_dp_cp_rank or max(options.seq_len // layout.cp, 1)


def group_size(length: int, most: int, min_size: int = 1) -> int:
    """g(ℓ) = max(min_size, 2^⌈log₂(ℓ/M)⌉), at least 1 (hybrid_cp_schedule.py:43-52; the
    lower bound: Megatron-LM dev data_schedule_utils.py:933-936)."""
    return max(min_size, 1 << max(math.ceil(math.log2(length / most)), 0))


def largest_group(options: TrainingOptions, layout: ParallelLayout) -> int:
    """The group the longest piece (a whole pack, S tokens) needs: g(S)."""
    return group_size(options.seq_len, max_seqlen(options, layout), options.min_dynamic_context_parallel_size)


def dcp_pad_multiple(layout: ParallelLayout) -> int:
    """m = 2·N, × TP with sequence parallelism (gpt_dataset.py:62-67)."""
    return 2 * dcp_pool(layout) * (layout.tp if layout.sequence_parallel and layout.tp > 1 else 1)


def padded_length(length: int, multiple: int, seq_len: int) -> float:
    """ℓ′ = ℓ + max(m − ℓ, (m − 1)/2) for a piece shorter than the pack: one shorter than m is
    padded up to m, a longer one by the mean residue (m − 1)/2, as ``DocLengths.padding_per_token``
    takes it; an S-long piece needs none (S is a multiple of m by L-DCP-SEQ)."""
    if multiple <= 1 or length >= seq_len:
        return float(length)
    return length + max(multiple - length, (multiple - 1) / 2)


def dcp_padding_per_token(docs: DocLengths, seq_len: int, multiple: int) -> float:
    """p = Σ_ℓ t_ℓ·(ℓ′ − ℓ)/ℓ, padding tokens per real token at the 2·N multiple."""
    return sum(
        share * (padded_length(length, multiple, seq_len) - length) / length for length, share in docs.pieces(seq_len)
    )


def dcp_classes(run: RunConfig) -> tuple[DcpClass, ...]:
    """The classes of pieces (module docstring): by (g, ⌊log₂ ℓ⌋), each with its share of the pack
    slots s = t_ℓ·(ℓ′/ℓ)/(1 + p), its token-weighted mean padded length and Σ s/ℓ′."""
    docs = run.options.doc_lengths
    if docs is None:
        return ()
    layout, options = run.layout, run.options
    most, multiple = max_seqlen(options, layout), dcp_pad_multiple(layout)
    grow = 1.0 + dcp_padding_per_token(docs, options.seq_len, multiple)
    sums: dict[tuple[int, int], list[float]] = {}
    for length, share in docs.pieces(options.seq_len):
        padded = padded_length(length, multiple, options.seq_len)
        slots = share * padded / length / grow
        key = (group_size(length, most, options.min_dynamic_context_parallel_size), int(math.log2(length)))
        acc = sums.setdefault(key, [0.0, 0.0, 0.0])
        acc[0] += slots
        acc[1] += slots * padded
        acc[2] += slots / padded
    return tuple(
        DcpClass(group=g, length=acc[1] / acc[0], slot_share=acc[0], docs_per_slot=acc[2])
        for (g, _), acc in sorted(sums.items())
        if acc[0] > 0
    )


def class_run(run: RunConfig, cls: DcpClass) -> tuple[RunConfig, float]:
    """(the fixed-length run one document of ``cls`` is priced on, its documents per rank k_c):
    cp = g, dp = N/g, p2p ring, seq_len L_c rounded up to a multiple of 2·g (·tp with sequence parallelism), GBS a whole
    number of documents per rank (≥ 1) near k_c."""
    layout, g = run.layout, cls.group
    pool = dcp_pool(layout)
    step = 2 * g * (layout.tp if layout.sequence_parallel else 1)
    seq = max(step, math.ceil(cls.length / step) * step)
    per_rank = layout.gbs * run.options.seq_len * cls.docs_per_slot / (pool / g)
    whole = max(1, round(per_rank))
    sub_layout = replace(
        layout,
        cp=g,
        dp=max(pool // g, 1),
        cp_comm_type="p2p",
        hierarchical_context_parallel_sizes=None,
        mbs=1,
        gbs=whole * max(pool // g, 1),
    )
    options = unchecked_replace(
        run.options,
        seq_len=seq,
        doc_lengths=None,
        dynamic_context_parallel=False,
        max_seqlen_per_dp_cp_rank=None,
        min_dynamic_context_parallel_size=1,
    )
    return RunConfig(run.model, run.hardware, sub_layout, options), per_rank


def microbatch_seconds(estimate: TimeEstimate, microbatches: int) -> float:
    """One microbatch of a priced run: (step − exposed DP − optimizer) / microbatches (PP = 1,
    which 0.19.2's dynamic CP needs, has no bubble)."""
    tail = estimate.breakdown.get("dp_comm", 0.0) + estimate.breakdown.get("optimizer", 0.0)
    return (estimate.step_seconds - tail) / microbatches


def regroup_seconds(run: RunConfig, classes: tuple[DcpClass, ...], documents_per_rank: float) -> float:
    """Per step: one barrier over DP×CP per group size in the step (the scheduler makes one bucket
    per distinct CP size, hybrid_cp_schedule.py:54-101, and barriers after each group, :604-609)
    and the wrapper's ``WRAPPER_COLLECTIVES``, each a collective latency λ (NVLink when the pool
    fits the NVLink domain, else scale-out); one TP broadcast λ_NVLink per document with TP > 1
    (hybrid_cp_schedule.py:525-552); and the re-routed tokens, (gbs·S/dp)·(1 − 1/N)·28 B per rank
    over the scale-out link (data_schedule.py:134-240)."""
    layout, hw = run.layout, run.hardware
    pool = dcp_pool(layout)
    inside = pool * layout.tp <= hw.nvlink_domain_size
    latency = COLLECTIVE_LATENCY_NVLINK_S if inside else COLLECTIVE_LATENCY_SCALEOUT_S
    groups = len({c.group for c in classes})
    broadcasts = documents_per_rank * COLLECTIVE_LATENCY_NVLINK_S if layout.tp > 1 else 0.0
    tokens = layout.gbs * run.options.seq_len / layout.dp * (1 - 1 / pool)
    bandwidth = hw.nvlink_bandwidth if inside else hw.scaleout_bandwidth
    return (groups + WRAPPER_COLLECTIVES) * latency + broadcasts + tokens * REROUTE_BYTES_PER_TOKEN / bandwidth


def fixed_cp_run(run: RunConfig) -> RunConfig:
    """``run`` with dynamic CP off: the fixed-CP run it replaces."""
    options = unchecked_replace(
        run.options, dynamic_context_parallel=False, max_seqlen_per_dp_cp_rank=None, min_dynamic_context_parallel_size=1
    )
    return RunConfig(run.model, run.hardware, run.layout, options)


def dynamic_cp_time(run: RunConfig, coefficients: TimeCoefficients | None = None) -> TimeEstimate:
    """Step time under dynamic CP (module docstring): Σ_c t_c·k_c + the fixed-CP run's exposed DP
    and optimizer seconds + ``regroup_seconds``. Tokens/s count the real tokens, P/(1 + p);
    model TFLOP/s keep the fixed-CP run's counted FLOPs per step (the same packs)."""
    fixed = estimate_time(fixed_cp_run(run), coefficients)
    classes = dcp_classes(run)
    if not classes:
        return fixed
    breakdown: dict[str, float] = {}
    microbatch_phase = documents = 0.0
    for cls in classes:
        sub_run, per_rank = class_run(run, cls)
        priced = estimate_time(sub_run, coefficients)
        whole = max(sub_run.layout.num_microbatches, 1)
        microbatch_phase += microbatch_seconds(priced, whole) * per_rank
        documents += per_rank
        for key, value in priced.breakdown.items():
            if key not in ("dp_comm", "optimizer", "pipeline_bubble"):
                breakdown[key] = breakdown.get(key, 0.0) + value * per_rank / whole
    regroup = regroup_seconds(run, classes, documents)
    tail = fixed.breakdown.get("dp_comm", 0.0) + fixed.breakdown.get("optimizer", 0.0)
    step = microbatch_phase + tail + regroup
    world = run.layout.world_size
    counted_flops = fixed.model_tflops_per_gpu * 1e12 * fixed.step_seconds * world
    docs = run.options.doc_lengths
    real = 1.0 / (1.0 + dcp_padding_per_token(docs, run.options.seq_len, dcp_pad_multiple(run.layout))) if docs else 1.0
    tflops = counted_flops / step / world / 1e12
    breakdown.update(
        dp_comm=fixed.breakdown.get("dp_comm", 0.0),
        optimizer=fixed.breakdown.get("optimizer", 0.0),
        pipeline_bubble=0.0,
        dynamic_cp_regroup=regroup,
    )
    return TimeEstimate(
        step_seconds=step,
        tokens_per_sec_per_gpu=run.layout.gbs * run.options.seq_len * real / step / world,
        model_tflops_per_gpu=tflops,
        mfu=fixed.mfu * tflops / fixed.model_tflops_per_gpu if fixed.model_tflops_per_gpu else 0.0,
        breakdown=breakdown,
        critical_stage=0,
    )


def dcp_memory_options(run: RunConfig) -> TrainingOptions:
    """The options whose memory estimate is the dynamic-CP run's: seq_len = M·cp (a rank holds at
    most M tokens of a document, module docstring); ``run.options`` itself without dynamic CP or
    at the default M."""
    options = run.options
    if not options.dynamic_context_parallel or options.max_seqlen_per_dp_cp_rank is None:
        return options
    return unchecked_replace(options, seq_len=options.max_seqlen_per_dp_cp_rank * run.layout.cp)


def dcp_summary(run: RunConfig) -> dict[str, object] | None:
    """The plan/estimate JSON ``dynamic_cp`` record: M, the pool, the padding multiple and each
    class's group, length and share of the pack slots; None without dynamic CP."""
    if not run.options.dynamic_context_parallel:
        return None
    layout, options = run.layout, run.options
    docs = options.doc_lengths
    multiple = dcp_pad_multiple(layout)
    return {
        "max_seqlen_per_dp_cp_rank": max_seqlen(options, layout),
        "min_dynamic_context_parallel_size": options.min_dynamic_context_parallel_size,
        "pool": dcp_pool(layout),
        "pad_multiple": multiple,
        "padding_per_token": dcp_padding_per_token(docs, options.seq_len, multiple) if docs else 0.0,
        "classes": [
            {"group": c.group, "length": round(c.length, 1), "slot_share": round(c.slot_share, 6)}
            for c in dcp_classes(run)
        ],
        "caveats": dynamic_cp_caveats(run),
    }


def dynamic_cp_caveats(run: RunConfig) -> list[str]:
    """What a dynamic-CP run must take care of that lcmoe's configs cannot do for it."""
    if not run.options.dynamic_context_parallel:
        return []
    multiple = dcp_pad_multiple(run.layout)
    return [
        "launch it with Megatron-LM's pretrain_gpt.py (the emitted Megatron-LM arguments): Megatron Bridge 0.6.2 "
        "passes hybrid_context_parallel to initialize_model_parallel (initialize.py:799-806) but never wraps its "
        "data iterator in HybridCPDataLoaderWrapper and slices batches with is_hybrid_cp=False (gpt_step.py:336)",
        f"each document must be a multiple of 2·DP·CP (·TP with SP) = {multiple} tokens (gpt_dataset.py:62-67): "
        "pad them to it when preparing the data; lcmoe counts that padding",
    ]
