"""What each pipeline stage holds: Megatron's ``pipeline_model_parallel_layout`` parsed and
checked, the even split when there is none, and the layout lcmoe writes when layers do not split
evenly."""

from __future__ import annotations

import functools
import itertools
import re
from dataclasses import dataclass, field

from lcmoe.errors import LcmoeError
from lcmoe.layout.parallel import MAX_LAYOUT_CHARS, ParallelLayout
from lcmoe.specs.layers import LayerSignature, layer_signature
from lcmoe.specs.model import ModelSpec


@dataclass(frozen=True, slots=True)
class ModelChunk:
    """What one virtual pipeline stage (model chunk) holds."""

    decoder_layers: tuple[int, ...]
    embedding: bool = False
    loss: bool = False
    mtp_layers: int = 0


@dataclass(frozen=True, slots=True)
class PipelineStage:
    """One physical pipeline rank: its chunks in order (chunk v is virtual stage v·pp + rank)."""

    rank: int
    chunks: tuple[ModelChunk, ...]
    # (first layer, count) per distinct layer signature (MoE flag, attention kind) among the
    # decoder layers, in order of first appearance: the estimators cost one layer per group.
    layer_groups: tuple[tuple[int, int], ...]
    # Derived once: the estimators walk a stage's layers for every candidate the planner times.
    decoder_layers: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layers = tuple(layer for chunk in self.chunks for layer in chunk.decoder_layers)
        object.__setattr__(self, "decoder_layers", layers)

    @property
    def has_embedding(self) -> bool:
        return any(c.embedding for c in self.chunks)

    @property
    def has_loss(self) -> bool:
        return any(c.loss for c in self.chunks)

    @property
    def mtp_layers(self) -> int:
        return sum(c.mtp_layers for c in self.chunks)


_LAYOUT_REPEAT = re.compile(r"\(([^()]*)\)\s*\*\s*(\d+)")
_LAYOUT_TOKEN = re.compile(r"([Etm L])(?:\s*\*\s*(\d+))?")


def parse_pipeline_layout(text: str) -> list[list[str]]:
    """Expand Megatron's ``pipeline_model_parallel_layout`` (e.g. ``Et|(tt|)*6mL``) into one token
    list per virtual stage. Tokens: E embedding, t transformer layer, m MTP layer, L loss
    (megatron/core/transformer/pipeline_parallel_layer_layout.py ``parse_str_to_list``)."""
    return [list(stage) for stage in _parsed_layout(text)]


def _expand_repeats(text: str, body: str) -> str:
    """One pass of ``(…)*n`` expansion, refusing a result longer than MAX_LAYOUT_CHARS before
    building it."""
    size = len(body)
    for match in _LAYOUT_REPEAT.finditer(body):
        count = _repeat_count(text, match.group(2))
        size += len(match.group(1)) * count - len(match.group(0))
        if size > MAX_LAYOUT_CHARS:
            raise _too_long(text)
    return _LAYOUT_REPEAT.sub(lambda m: m.group(1) * int(m.group(2)), body)


def _repeat_count(text: str, digits: str) -> int:
    if len(digits) > 7:
        raise _too_long(text)
    return int(digits)


def _too_long(text: str) -> LcmoeError:
    return LcmoeError(
        "pipeline_layout",
        text,
        f"expands to more than {MAX_LAYOUT_CHARS:,} characters (one t per layer)",
        "write one t per decoder layer, e.g. Et*3|t*4|t*4|t*3mL",
    )


@functools.lru_cache(maxsize=512)
def _parsed_layout(text: str) -> tuple[tuple[str, ...], ...]:
    # Cached (a pure function of the string): the planner re-reads the same few layouts for
    # every candidate it checks and times. Every repeat is bounded before it is expanded.
    if len(text) > MAX_LAYOUT_CHARS:
        raise _too_long(text)
    body = text.strip().strip("'\"")
    for _ in range(32):
        expanded = _expand_repeats(text, body)
        if expanded == body:
            break
        body = expanded
    stages: list[tuple[str, ...]] = []
    total = 0
    for part in body.split("|"):
        tokens: list[str] = []
        pos = 0
        part = part.replace(" ", "")
        while pos < len(part):
            match = _LAYOUT_TOKEN.match(part, pos)
            if not match or match.end() == pos:
                raise LcmoeError(
                    "pipeline_layout",
                    text,
                    f"has an unknown token at {part[pos : pos + 40]!r}",
                    "use E, t, m, L, |, (…)*n and x*n",
                )
            count = _repeat_count(text, match.group(2) or "1")
            total += count
            if total > MAX_LAYOUT_CHARS:
                raise _too_long(text)
            tokens.extend(match.group(1) * count)
            pos = match.end()
        stages.append(tuple(tokens))
    return tuple(stages)


def check_pipeline_layout(model: ModelSpec, layout: ParallelLayout) -> None:
    """Raise LcmoeError unless ``layout.pipeline_layout`` parses into pp·vpp stages placing every
    decoder layer once (the checks of Megatron's PipelineParallelLayerLayout)."""
    text = layout.pipeline_layout
    if not text:
        return
    stage_tokens = _parsed_layout(text)
    num_virtual = layout.pp * layout.vpp
    if len(stage_tokens) != num_virtual:
        raise LcmoeError(
            "pipeline_layout",
            text,
            f"has {len(stage_tokens)} stages but pp·vpp = {num_virtual}",
            "write one |-separated stage per virtual stage",
        )
    placed = sum(tokens.count("t") for tokens in stage_tokens)
    if placed != model.num_layers:
        raise LcmoeError(
            "pipeline_layout",
            text,
            f"places {placed} transformer layers but the model has {model.num_layers}",
            "make the count of t equal num_layers",
        )


def pipeline_stages(model: ModelSpec, layout: ParallelLayout) -> list[PipelineStage]:
    """Assign decoder layers, embedding, loss and MTP layers to every pipeline rank and chunk.

    Explicit layout: as written. Otherwise Megatron's split (transformer_block.py
    ``get_num_layers_to_build``): optional first/last stage counts, then an even split of the
    rest over the remaining virtual stages, with embedding/loss counted as a layer when the
    ``account_for_*`` flags are set; MTP goes with the loss on the last virtual stage.
    """
    num_virtual = layout.pp * layout.vpp
    if layout.pipeline_layout:
        check_pipeline_layout(model, layout)
        chunks: list[ModelChunk] = []
        next_layer = 0
        for tokens in _parsed_layout(layout.pipeline_layout):
            count = tokens.count("t")
            chunks.append(
                ModelChunk(
                    tuple(range(next_layer, next_layer + count)), "E" in tokens, "L" in tokens, tokens.count("m")
                )
            )
            next_layer += count
    else:
        chunks = _even_chunks(model, layout, num_virtual)
    stages = []
    for rank in range(layout.pp):
        own = tuple(chunks[v * layout.pp + rank] for v in range(layout.vpp))
        groups: dict[LayerSignature, list[int]] = {}
        for chunk in own:
            for layer in chunk.decoder_layers:
                groups.setdefault(layer_signature(model, layer), [layer, 0])[1] += 1
        stages.append(PipelineStage(rank, own, tuple((first, count) for first, count in groups.values())))
    return stages


def _even_chunks(model: ModelSpec, layout: ParallelLayout, num_virtual: int) -> list[ModelChunk]:
    counts: list[int]
    first, last = layout.decoder_first_pipeline_num_layers, layout.decoder_last_pipeline_num_layers
    total = model.num_layers
    if first is not None or last is not None:
        middle_stages = num_virtual - (first is not None) - (last is not None)
        rest = total - (first or 0) - (last or 0)
        if rest < 0 or (middle_stages and rest % middle_stages) or (not middle_stages and rest):
            raise LcmoeError(
                "decoder_first/last_pipeline_num_layers",
                (first, last),
                f"leave {rest} layers that do not split over {middle_stages} stages",
                "choose counts that leave an even split",
            )
        each = rest // middle_stages if middle_stages else 0
        counts = ([first] if first is not None else []) + [each] * middle_stages + ([last] if last is not None else [])
    else:
        extra_first = int(layout.account_for_embedding_in_pipeline_split)
        extra_last = int(layout.account_for_loss_in_pipeline_split)
        padded = total + extra_first + extra_last
        if padded % num_virtual:
            raise LcmoeError(
                "pp·vpp",
                num_virtual,
                f"does not divide the {padded} layers to split",
                "use an explicit pipeline_layout or uneven first/last stages",
            )
        each = padded // num_virtual
        counts = [each] * num_virtual
        counts[0] -= extra_first
        counts[-1] -= extra_last
    chunks = []
    start = 0
    for index, count in enumerate(counts):
        is_last = index == num_virtual - 1
        chunks.append(
            ModelChunk(tuple(range(start, start + count)), index == 0, is_last, model.mtp_num_layers if is_last else 0)
        )
        start += count
    return chunks


def inflight_microbatch_chunks(layout: ParallelLayout, rank: int) -> int:
    """Model-chunk activations a pipeline rank holds at its peak (per microbatch-chunk).

    1F1B (vpp = 1): min(pp − rank, M) microbatches (schedules.py
    ``forward_backward_pipelining_without_interleaving``: warm-up pp − rank − 1, then one more).
    Interleaved: warm-up (pp − rank − 1)·2 + (vpp − 1)·pp chunks, then one more
    (``get_pp_rank_microbatches``), capped at M·vpp.
    """
    m = max(layout.num_microbatches, 1)
    if layout.pp == 1:
        return 1
    if layout.vpp == 1:
        return min(layout.pp - rank, m)
    warmup = (layout.pp - rank - 1) * 2 + (layout.vpp - 1) * layout.pp
    return min(warmup + 1, m * layout.vpp)


def layers_split_evenly(model: ModelSpec, pp: int, vpp: int) -> bool:
    """Whether Megatron's default split works: L divisible by pp·vpp (MTP rides on the last stage)."""
    return model.num_layers % (pp * vpp) == 0


def needs_explicit_layout(model: ModelSpec, pp: int, vpp: int) -> bool:
    """Whether Megatron's default even split cannot run the model at PP×VPP: the layers do not
    divide, or a DSA model shares top-k indices and a chunk of the even split would start on a
    layer that reuses an earlier one's (dsa.py: "Cross-PP top-k sharing is not supported")."""
    if not layers_split_evenly(model, pp, vpp):
        return True
    if not model.shares_dsa_topk:
        return False
    per_chunk = model.num_layers // (pp * vpp)
    return not all(model.has_dsa_indexer(start) for start in range(0, model.num_layers, per_chunk))


def _snap_to_dsa_indexers(model: ModelSpec, counts: list[int]) -> list[int]:
    """Move every chunk boundary to the nearest layer that computes DSA top-k (the later one on a
    tie, never before the previous boundary; other models keep theirs); a chunk may end up empty,
    as in Bridge's GLM-5.2 VPP layout."""
    if not model.shares_dsa_topk:
        return counts
    starts = [layer for layer in range(model.num_layers) if model.has_dsa_indexer(layer)]
    bounds, position = [0], 0
    for count in counts[:-1]:
        position += count
        nearest = min(starts, key=lambda layer: (abs(layer - position), -layer))
        bounds.append(max(nearest, bounds[-1]))
    bounds.append(model.num_layers)
    return [b - a for a, b in itertools.pairwise(bounds)]


def auto_pipeline_layout(model: ModelSpec, pp: int, vpp: int = 1) -> str | None:
    """A balanced ``pipeline_model_parallel_layout`` for models whose layers do not split evenly
    (DeepSeek-V3's 61 + MTP). Embedding and loss each count as one layer of work and each MTP
    layer as one, as Bridge's recipe layouts do; the remainder goes to the middle stages so the
    first and last stages (which also hold the embedding / output layer) stay lighter. A DSA
    model that shares top-k indices has each boundary moved to the nearest layer that computes
    them (``_snap_to_dsa_indexers``). None when the stages cannot all hold at least one layer's
    worth."""
    stages = pp * vpp
    extra_last = 1 + model.mtp_num_layers
    total = model.num_layers + 1 + extra_last
    if stages == 1 or stages > total:  # more stages than layers of work: some would hold nothing
        return None
    base, remainder = divmod(total, stages)
    counts = [base] * stages
    middle = list(range(1, stages - 1)) or list(range(stages))
    for i in range(remainder):
        counts[middle[i % len(middle)]] += 1
    counts[0] -= 1
    counts[-1] -= extra_last
    if min(counts) < 0 or sum(counts) != model.num_layers:
        return None
    counts = _snap_to_dsa_indexers(model, counts)
    parts = []
    for index, count in enumerate(counts):
        text = "E" if index == 0 else ""
        text += f"t*{count}" if count > 1 else ("t" if count == 1 else "")
        if index == stages - 1:
            text += "m" * model.mtp_num_layers + "L"
        parts.append(text)
    return "|".join(parts)
