"""What a layer is, and the per-layer patterns in Megatron's spellings: ``AttentionKind`` (a
layer's sequence mixer), the 0/1 layer lists (``moe_layer_freq`` and friends: a period ``f`` or an
explicit list, parsed without ``eval``) and a hybrid model's ``hybrid_layer_pattern`` (one symbol
per layer, ``|`` pipeline boundaries, ``/`` MTP depths;
megatron/core/models/hybrid/hybrid_layer_allocation.py:161-275). ``ModelSpec`` expands its fields
through these into per-layer tuples."""

from __future__ import annotations

import re
from enum import Enum

LayerPattern = int | list[int]


class AttentionKind(str, Enum):
    """The sequence mixer of a layer; ``NONE`` for a hybrid model's MLP-only layers."""

    MLA = "mla"
    GQA = "gqa"
    SWA = "swa"
    GDN = "gdn"
    MAMBA = "mamba"
    CSA = "csa"
    NONE = "none"

    @property
    def is_softmax_attention(self) -> bool:
        """Q·Kᵀ attention (MLA, GQA, sliding window, DeepSeek-V4's CSA): what CP exchanges K/V
        for, and what the core_attn / qkv / attn_proj modules exist in."""
        return self in (AttentionKind.MLA, AttentionKind.GQA, AttentionKind.SWA, AttentionKind.CSA)

    @property
    def is_costed(self) -> bool:
        """Whether lcmoe's time and memory models cover this mixer. CSA (DeepSeek-V4) is counted
        (parameters) but not costed: its compressors, the top-k over compressed keys and the
        sliding window have no FLOP, activation or kernel-rate terms yet."""
        return self is not AttentionKind.CSA


# Hybrid pattern symbols lcmoe models (hybrid_layer_allocation.py Symbols). GDN ('G'), DSA
# ('D') and MLA ('+') layers in a hybrid pattern are not modelled.
HYBRID_MAMBA, HYBRID_ATTENTION, HYBRID_MLP, HYBRID_MOE = "M", "*", "-", "E"
HYBRID_PIPE, HYBRID_MTP_SEPARATOR = "|", "/"
HYBRID_LAYER_SYMBOLS = frozenset({HYBRID_MAMBA, HYBRID_ATTENTION, HYBRID_MLP, HYBRID_MOE})


def split_hybrid_pattern(pattern: str) -> tuple[str, str, int]:
    """(main layers without ``|``, the MTP depth's pattern, number of MTP depths), as Megatron's
    parse_hybrid_pattern reads it (hybrid_layer_allocation.py:200-275): every MTP depth must
    repeat the same pattern."""
    main, *mtp_parts = pattern.split(HYBRID_MTP_SEPARATOR)
    if mtp_parts and all(part == "" for part in mtp_parts):
        mtp_parts = []
    if any(part != mtp_parts[0] for part in mtp_parts):
        raise ValueError(f"hybrid_layer_pattern {pattern!r} has MTP depths that differ; Megatron needs them identical")
    layers = main.replace(HYBRID_PIPE, "")
    mtp = mtp_parts[0] if mtp_parts else ""
    for symbol in layers + mtp:
        if symbol not in HYBRID_LAYER_SYMBOLS:
            raise ValueError(
                f"hybrid_layer_pattern symbol {symbol!r} is not modelled; lcmoe models M (Mamba), * (attention), "
                "- (dense MLP) and E (MoE) layers"
            )
    return layers, mtp, len(mtp_parts)


def hybrid_symbols_per_layer(pattern: str) -> tuple[str, ...]:
    """Per decoder layer the symbol it holds, then the MTP layer's symbols (the MTP depth's mixer
    and MLP, or the last layer's symbol without MTP)."""
    layers, mtp, _ = split_hybrid_pattern(pattern)
    return (*layers, mtp or layers[-1])


def hybrid_symbol_counts(pattern: str) -> dict[str, int]:
    """Symbol counts over main layers and MTP depths (hybrid_layer_allocation.py:161-197
    get_hybrid_layer_counts)."""
    layers, mtp, depths = split_hybrid_pattern(pattern)
    return {symbol: layers.count(symbol) + depths * mtp.count(symbol) for symbol in sorted(HYBRID_LAYER_SYMBOLS)}


_PATTERN_TERM = re.compile(r"^\[\s*([01](?:\s*,\s*[01])*)\s*\]\s*(?:\*\s*(\d{1,9}))?$")
# A per-layer pattern has one entry per decoder layer, and ModelSpec.num_layers ≤ 100,000: the
# expanded length is bounded before anything is built (issue #31: ``[1]*200 * 10⁶`` is 2·10⁸).
MAX_PATTERN_LAYERS = 100_000


def parse_layer_pattern(text: str) -> int | list[int]:
    """Parse Megatron's pattern spelling without ``eval``: ``4``, ``([0]*3+[1]*58)``, ``[1,0,1]``.

    Megatron evaluates the string as Python (arguments.py ``moe_freq_type``); lcmoe accepts the
    same list-repeat-concatenate forms and nothing else.
    """
    body = text.strip()
    if len(body) > 4 * MAX_PATTERN_LAYERS:
        raise ValueError(f"layer pattern is longer than {4 * MAX_PATTERN_LAYERS:,} characters")
    if re.fullmatch(r"\d{1,9}", body):
        return int(body)
    while body.startswith("(") and body.endswith(")"):
        body = body[1:-1].strip()
    result: list[int] = []
    for term in body.split("+"):
        match = _PATTERN_TERM.match(term.strip())
        if not match:
            raise ValueError(f"layer pattern {text!r} is not of the form ([0]*k+[1]*n) or [1,0,...]")
        items = [int(v) for v in match.group(1).split(",")]
        repeat = int(match.group(2) or 1)
        if len(result) + len(items) * repeat > MAX_PATTERN_LAYERS:
            raise ValueError(f"layer pattern expands to more than {MAX_PATTERN_LAYERS:,} layers")
        result.extend(items * repeat)
    return result


def expand_layer_pattern(spec: LayerPattern, num_layers: int, *, true_if_period_hit: bool, offset: int) -> list[bool]:
    if isinstance(spec, list):
        return [bool(v) for v in spec]
    return [((i + offset) % spec == 0) == true_if_period_hit for i in range(num_layers)]
