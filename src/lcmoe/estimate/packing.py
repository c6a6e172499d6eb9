"""What packed, variable-length documents (``TrainingOptions.doc_lengths``) change in a run's
amounts: the attention length per token that the kernels really run, the one Bridge's TFLOP/s
counts, and the pack slots that CP padding takes from real tokens. Every function returns the
fixed-length value (or None) when ``doc_lengths`` is None, so fixed-length numbers are unchanged.

Sources (Megatron Bridge 0.6.2, Megatron-Core 0.19.2 wheels):

* THD load balance under CP: each document is cut into 2·CP chunks and rank r keeps chunks r and
  2·CP − 1 − r ("per-document zigzag"), so each rank does 1/CP of every document's causal work;
  "Each document length must be divisible by 2 * cp_size" (mcore ``utils.py:2406-2413``,
  ``_get_batch_on_this_cp_rank_per_document_balancing``, TE ``thd_get_partitioned_indices``).
* Bridge's count: ŝ = S2/S1 with S1 = padded pack tokens and S2 = Σ sᵢ² over the real documents
  (``flop_utils.py:258-360``, ``:465-483``), but only with CP = 1: "forward cu_seqlens only for
  CP == 1 so CP > 1 stays on the BSHD term" (``gpt_step.py:394-430``), i.e. S2 = S² per pack.
"""

from __future__ import annotations

from dataclasses import dataclass

from lcmoe.layout import ParallelLayout
from lcmoe.specs.model import AttentionKind, ModelSpec
from lcmoe.workload import TrainingOptions


@dataclass(frozen=True, slots=True)
class AttentionLengths:
    """Per pack token: ``core`` = E[Σ dᵢ²]/S over real documents (S for fixed length), ``window``
    = a sliding-window layer's 2·c̄ over them (None: no sliding window)."""

    core: float
    window: float | None = None


def pad_multiple(layout: ParallelLayout) -> int:
    """Tokens each document's length must be a multiple of: 2·CP under CP (THD zigzag split,
    mcore utils.py:2413), else 1."""
    return 2 * layout.cp if layout.cp > 1 else 1


def real_token_share(layout: ParallelLayout, options: TrainingOptions) -> float:
    """Real (document) tokens per pack slot, 1/(1 + p) with p the padding per real token
    (``DocLengths.padding_per_token``); 1 for fixed length."""
    docs = options.doc_lengths
    if docs is None:
        return 1.0
    return 1.0 / (1.0 + docs.padding_per_token(options.seq_len, pad_multiple(layout)))


def attention_lengths(model: ModelSpec, layout: ParallelLayout, options: TrainingOptions) -> AttentionLengths | None:
    """The attention the kernels run per pack slot, ``real_token_share`` × the distribution's
    ŝ (and 2·c̄ for a sliding window); None for fixed length (the formulas' own s)."""
    docs = options.doc_lengths
    if docs is None:
        return None
    share = real_token_share(layout, options)
    s = options.seq_len
    window = docs.window_context(s, model.window_tokens) * share if _has_window(model) else None
    return AttentionLengths(core=docs.attention_length(s) * share, window=window)


def bridge_core_length(layout: ParallelLayout, options: TrainingOptions) -> float | None:
    """Bridge's ŝ = S2/S1 for its logged TFLOP/s: None (ŝ = s) for fixed length and for packed
    runs with CP > 1 (Bridge 0.6.2 counts those as BSHD, gpt_step.py:394-430); with CP = 1 the
    real documents' E[Σ dᵢ²] over the pack width S."""
    docs = options.doc_lengths
    if docs is None or layout.cp > 1:
        return None
    return docs.attention_length(options.seq_len) * real_token_share(layout, options)


def _has_window(model: ModelSpec) -> bool:
    from lcmoe.estimate.params import attention_kind

    return any(attention_kind(model, i) is AttentionKind.SWA for i in range(model.num_layers))


def packing_summary(model: ModelSpec, layout: ParallelLayout, options: TrainingOptions) -> dict[str, object] | None:
    """A plan's packing record (plan JSON ``packing``): the padding multiple, the real-token share
    of the pack slots, the attention length the kernels run (``attention_length``) and the one
    Bridge's TFLOP/s counts (``bridge_attention_length``), each per pack token, against s."""
    docs = options.doc_lengths
    if docs is None:
        return None
    lengths = attention_lengths(model, layout, options)
    bridge = bridge_core_length(layout, options)
    s = options.seq_len
    return {
        "pad_multiple": pad_multiple(layout),
        "real_token_share": real_token_share(layout, options),
        "docs_per_pack": docs.docs_per_pack(s),
        "attention_length": lengths.core if lengths else float(s),
        "bridge_attention_length": float(s) if bridge is None else bridge,
        "attention_share_of_fixed": (lengths.core if lengths else s) / s,
        "counted_over_real_flops": counted_over_real_flops(model, layout, options),
        "caveats": packing_caveats(layout),
    }


def counted_over_real_flops(model: ModelSpec, layout: ParallelLayout, options: TrainingOptions) -> float:
    """Bridge's model FLOPs per pack over those of the real documents (both on Bridge's formula,
    ``estimate.flops``): 1 at CP = 1, above 1 at CP > 1 where Bridge counts seq_len² per pack, so
    its logged TFLOP/s (and MFU, which can pass 100%) over-state the work by this factor."""
    from lcmoe.estimate.flops import flops_per_token

    lengths = attention_lengths(model, layout, options)
    if lengths is None:
        return 1.0
    s, tp = options.seq_len, layout.tp
    counted = flops_per_token(model, s, tp=tp, core_len=bridge_core_length(layout, options)).total
    return counted / flops_per_token(model, s, tp=tp, core_len=lengths.core).total


def packing_caveats(layout: ParallelLayout) -> list[str]:
    """What a packed run on this layout must take care of that lcmoe's configs cannot do for it."""
    out = []
    if layout.cp > 1:
        out.append(
            f"each document must be a multiple of 2·CP = {2 * layout.cp} tokens (mcore utils.py:2406-2413): "
            "Megatron's GPTDataset with inter_document_masking does not pad documents, so pad or trim them "
            "to that multiple when preparing the data"
        )
        out.append(
            "Bridge 0.6.2 logs TFLOP/s on seq_len² per pack when CP > 1 (gpt_step.py:394-430): the logged "
            "TFLOP/s (and lcmoe's, which follow Bridge) do not fall with the documents while the step time does, "
            "so they over-state the work by packing.counted_over_real_flops (MFU can pass 100%)"
        )
    if layout.pp > 2 or layout.vpp > 1:
        out.append(
            "Bridge 0.6.2 hands the batch (and its cu_seqlens) to middle pipeline chunks only for offline or "
            "in-batch packing (gpt_step.py:109-124, 290-313): with GPTDataset inter_document_masking and "
            "PP > 2 or VPP > 1 the middle chunks get no document boundaries; use PP ≤ 2 without VPP, or check "
            "your release"
        )
    return out
