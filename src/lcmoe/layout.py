"""ParallelLayout: how a model is split over GPUs, and what each pipeline stage holds.

Axes (Megatron-Core names; ``Axis`` glossary):
    tp  tensor parallel (attention/dense MLP; with sequence parallel the residual stream is
        also split over tp)           cp  context parallel (sequence split for attention)
    ep  expert parallel               etp expert tensor parallel (expert FFN split)
    pp  pipeline stages               vpp virtual stages (model chunks) per pipeline rank
    dp  data parallel = world / (tp·cp·pp)
    edp expert data parallel = world / (ep·etp·pp)  (MoE "parallel folding": the expert grid
        re-folds the same tp·cp·dp ranks, megatron-bridge-facts.md §2.1)
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from dataclasses import dataclass, field
from enum import Enum

from lcmoe.errors import LcmoeError
from lcmoe.specs.layers import LayerSignature, layer_signature
from lcmoe.specs.model import ModelSpec


class Axis(str, Enum):
    TP = "tp"
    CP = "cp"
    EP = "ep"
    ETP = "etp"
    PP = "pp"
    VPP = "vpp"
    DP = "dp"
    EDP = "edp"


# Bounds on layout sizes, checked before anything is built from them (issue #31: --vpp 10⁹
# allocated 22 GB). A world of 2^20 GPUs is > 5× the largest announced training cluster; a
# model has at most 100,000 decoder layers (ModelSpec.num_layers), so more virtual stages than
# MAX_VIRTUAL_STAGES cannot each hold a layer; MBS and GBS are counts of sequences per step.
MAX_GPUS = 2**20
MAX_VIRTUAL_STAGES = 100_000
MAX_SEQUENCES = 2**32
_LAYOUT_LIMITS = {
    "tp": MAX_GPUS,
    "cp": MAX_GPUS,
    "ep": MAX_GPUS,
    "etp": MAX_GPUS,
    "pp": MAX_VIRTUAL_STAGES,
    "vpp": MAX_VIRTUAL_STAGES,
    "dp": MAX_GPUS,
    "mbs": MAX_SEQUENCES,
    "gbs": MAX_SEQUENCES,
}
# An expanded pipeline_model_parallel_layout holds one token per layer plus E, L, m and | per
# stage: far below a million characters for any legal layout.
MAX_LAYOUT_CHARS = 1_000_000


@dataclass(frozen=True, slots=True, kw_only=True)
class ParallelLayout:
    """A complete parallel layout for one run. ``dp`` is given explicitly (world = tp·cp·pp·dp)."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    pp: int = 1
    vpp: int = 1
    dp: int = 1
    mbs: int = 1
    gbs: int = 1
    sequence_parallel: bool = True
    cp_comm_type: str = "p2p"
    # Megatron's ``hierarchical_context_parallel_sizes`` (model_parallel_config.py:103-109): for
    # ``a2a+p2p`` CP, (a2a group size, p2p group size), inner first. The a2a group is the CP
    # ranks nearest one another (parallel_state.py:378-414 ``create_hierarchical_groups``: level
    # 0 takes consecutive CP ranks, which sit TP ranks apart), so it spans tp·a GPUs; the p2p
    # ring joins the a2a groups. None for every other exchange. Its product must equal cp and it
    # has exactly two levels (Transformer Engine's a2a+p2p takes two CP groups, the a2a one
    # first: context_parallel.py ``AttnFuncWithCPAndKVP2P.forward``, ``cp_group[0]`` /
    # ``cp_group[1]``); a list is stored as a tuple.
    hierarchical_context_parallel_sizes: tuple[int, ...] | None = None
    pipeline_layout: str | None = None
    decoder_first_pipeline_num_layers: int | None = None
    decoder_last_pipeline_num_layers: int | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "ep", "etp", "pp", "vpp", "dp", "mbs", "gbs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise LcmoeError(name, value, "must be a positive whole number", f"set --{name} to 1 or more")
            if value > _LAYOUT_LIMITS[name]:
                raise LcmoeError(
                    name, value, f"is larger than {_LAYOUT_LIMITS[name]:,}, more than any real run", "check the value"
                )
        if self.pp * self.vpp > MAX_VIRTUAL_STAGES:
            raise LcmoeError(
                "pp·vpp",
                self.pp * self.vpp,
                f"is more than {MAX_VIRTUAL_STAGES:,} virtual stages (a model has at most that many layers)",
                "use fewer pipeline stages",
            )
        if self.tp * self.cp * self.pp * self.dp > MAX_GPUS:
            raise LcmoeError("world size", self.world_size, f"is more than {MAX_GPUS:,} GPUs", "check --gpus")
        if self.pipeline_layout is not None and (
            not isinstance(self.pipeline_layout, str) or len(self.pipeline_layout) > MAX_LAYOUT_CHARS
        ):
            raise LcmoeError(
                "pipeline_layout", self.pipeline_layout, "must be a layout string", "e.g. Et*3|t*4|t*4|t*3mL"
            )
        if self.cp_comm_type not in ("p2p", "a2a", "a2a+p2p", "all_gather"):
            raise LcmoeError(
                "cp_comm_type",
                self.cp_comm_type,
                "must be p2p, a2a, a2a+p2p or all_gather",
                "use p2p unless you have a reason",
            )
        self._check_hierarchical_sizes()

    def _check_hierarchical_sizes(self) -> None:
        """``hierarchical_context_parallel_sizes``: two whole numbers ≥ 1 whose product is cp, set
        only with ``a2a+p2p`` (Bridge config.py:1526-1557 ``_validate_cp_comm_type``;
        parallel_state.py:1127-1128; Megatron-LM arguments.py:562-567). ``a2a+p2p`` without them
        is a rule (L-CP-HIER-SIZES), so that ``check`` reports it with its fix."""
        sizes = self.hierarchical_context_parallel_sizes
        if sizes is None:
            return
        field_name = "hierarchical_context_parallel_sizes"
        if isinstance(sizes, list):
            sizes = tuple(sizes)
            object.__setattr__(self, field_name, sizes)
        if not isinstance(sizes, tuple) or any(
            isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_GPUS for n in sizes
        ):
            raise LcmoeError(field_name, sizes, "must be whole numbers of 1 or more", "e.g. 8,2 (a2a size, p2p size)")
        if self.cp_comm_type != "a2a+p2p":
            raise LcmoeError(
                field_name,
                list(sizes),
                f"apply only to cp_comm_type a2a+p2p, not {self.cp_comm_type}",
                "drop them, or set cp_comm_type a2a+p2p",
            )
        if len(sizes) != 2:
            raise LcmoeError(
                field_name,
                list(sizes),
                f"has {len(sizes)} levels, but a2a+p2p takes two (a2a size, p2p size)",
                "give two sizes, e.g. 8,2",
            )
        if math.prod(sizes) != self.cp:
            raise LcmoeError(
                field_name,
                list(sizes),
                f"multiply to {math.prod(sizes)}, not CP = {self.cp}",
                "choose sizes whose product is the context-parallel size",
            )

    @property
    def cp_a2a_size(self) -> int:
        """CP ranks one all-to-all spans: cp for ``a2a``, the inner size for ``a2a+p2p``, else 1."""
        if self.cp_comm_type == "a2a":
            return self.cp
        if self.cp_comm_type == "a2a+p2p" and self.hierarchical_context_parallel_sizes:
            return self.hierarchical_context_parallel_sizes[0]
        return 1

    @property
    def cp_ring_size(self) -> int:
        """CP ranks the KV ring passes: cp for ``p2p``, the outer size for ``a2a+p2p``, else 1."""
        if self.cp_comm_type == "p2p":
            return self.cp
        if self.cp_comm_type == "a2a+p2p" and self.hierarchical_context_parallel_sizes:
            return self.hierarchical_context_parallel_sizes[1]
        return 1

    @property
    def world_size(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def edp(self) -> int:
        """Expert data parallel: world / (ep·etp·pp); 0 when the expert grid does not fold."""
        grid = self.ep * self.etp * self.pp
        return self.world_size // grid if self.world_size % grid == 0 else 0

    @property
    def num_microbatches(self) -> int:
        """M = GBS / (MBS·DP) per pipeline per step (0 when GBS does not split)."""
        per = self.mbs * self.dp
        return self.gbs // per if self.gbs % per == 0 else 0

    def as_dict(self) -> dict[str, object]:
        return {
            "tp": self.tp,
            "cp": self.cp,
            "ep": self.ep,
            "etp": self.etp,
            "pp": self.pp,
            "vpp": self.vpp,
            "dp": self.dp,
            "edp": self.edp,
            "mbs": self.mbs,
            "gbs": self.gbs,
            "ga": self.num_microbatches,
            "cp_comm_type": self.cp_comm_type,
            **self.hierarchical_cp_dict(),
            "sequence_parallel": self.sequence_parallel,
            "pipeline_layout": self.pipeline_layout,
        }

    def hierarchical_cp_dict(self) -> dict[str, object]:
        """``{"hierarchical_context_parallel_sizes": [a, p]}`` for ``a2a+p2p``, else empty (the key
        is left out so that every other layout's JSON stays as it was)."""
        sizes = self.hierarchical_context_parallel_sizes
        return {"hierarchical_context_parallel_sizes": list(sizes)} if sizes else {}


def read_hierarchical_sizes(value: object, *, field: str, cp_comm_type: str) -> tuple[int, ...] | None:
    """``hierarchical_context_parallel_sizes`` as a config or the command line gives it: a list
    (``[8, 2]``, Megatron-LM's ``8 2``) or text (``8,2``, ``[8,2]``), or None/null. Only ``a2a+p2p``
    reads them (Transformer Engine gets the hierarchical groups for no other exchange:
    mcore extensions/transformer_engine.py:1869-1883), so for any other type they are dropped;
    ``ParallelLayout`` checks the sizes themselves."""
    if value is None or value in ("", "None", "null", "none") or cp_comm_type != "a2a+p2p":
        return None
    items: list[object]
    if isinstance(value, list | tuple):
        items = list(value)
    else:
        items = [part for part in re.split(r"[\s,\[\]]+", str(value)) if part]
    sizes = []
    for item in items:
        text = str(item).strip()
        if isinstance(item, bool) or not text.isdigit() or len(text) > 7:
            raise LcmoeError(field, value, "must be whole numbers of 1 or more", "e.g. 8,2 (a2a size, p2p size)")
        sizes.append(int(text))
    return tuple(sizes)


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
