"""Context-parallel rules: the sequence lengths CP, sequence parallelism and packed (THD) documents
need, the heads an all-to-all needs, and hierarchical (``a2a+p2p``) CP's group sizes; plus the
hierarchical split the planner tries (``sensible_hierarchical_sizes``).

Sources are the pinned releases lcmoe targets: megatron-core 0.19.2 (``mcore``), megatron-bridge
0.6.2 (``bridge``), Megatron-LM's ``megatron/training`` as shipped beside them, and Transformer
Engine's ``transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py``
(``TE context_parallel.py``), where the all-to-all head checks live (neither Bridge nor
Megatron-Core checks heads for a2a).

Transformer Engine version gates (mcore extensions/transformer_engine.py:1865-1883): TE < 1.10
is never handed ``cp_comm_type`` (every CP layer runs the p2p ring, whatever the config says) and
``a2a+p2p`` asserts TE ≥ 1.12 at model construction. lcmoe's target stack (the NeMo container of
megatron-bridge 0.6.2) ships TE 2.x, so no rule here fires on the version; ``lcmoe preflight``
checks the installed TE against ``MIN_TE_CP_COMM_TYPE`` / ``MIN_TE_HIERARCHICAL_CP``.
"""

from __future__ import annotations

from lcmoe.rules.records import LegalityRule
from lcmoe.run import RunConfig
from lcmoe.specs.model import ModelSpec

MIN_TE_CP_COMM_TYPE = "1.10.0"  # mcore extensions/transformer_engine.py:1869
MIN_TE_HIERARCHICAL_CP = "1.12.0"  # mcore extensions/transformer_engine.py:1872-1876


def attention_heads_per_tp_rank(model: ModelSpec, tp: int) -> tuple[int, int]:
    """(query heads, K/V heads) one TP rank hands Transformer Engine's attention: n/tp, and g/tp
    for GQA (at least 1: TP beyond the groups replicates them); MLA expands K and V to every head
    (mcore multi_latent_attention.py), so n/tp for both."""
    heads = model.num_attention_heads // tp
    if model.multi_latent_attention:
        return heads, heads
    return heads, max(model.query_groups // tp, 1)


def _seq_cp(r: RunConfig) -> str | None:
    s, cp = r.options.seq_len, r.layout.cp
    if cp > 1 and s % (2 * cp):
        return f"sequence {s} is not divisible by 2·CP = {2 * cp}"
    return None


def _seq_sp(r: RunConfig) -> str | None:
    lay = r.layout
    if lay.sequence_parallel and lay.tp > 1 and (r.options.seq_len // lay.cp) % lay.tp:
        return f"the per-CP-rank sequence {r.options.seq_len // lay.cp} is not divisible by TP = {lay.tp}"
    return None


def _cp_a2a(r: RunConfig) -> str | None:
    """The all-to-all scatters heads over its group: Q and K/V heads per TP rank must both divide
    by its size (cp for a2a, the inner size for a2a+p2p)."""
    lay = r.layout
    size = lay.cp_a2a_size
    if lay.cp <= 1 or size <= 1:
        return None
    heads, kv_heads = attention_heads_per_tp_rank(r.model, lay.tp)
    if heads % size:
        return f"{lay.cp_comm_type} CP needs the {heads} heads per TP rank divisible by its a2a size {size}"
    if kv_heads % size:
        return f"{lay.cp_comm_type} CP needs the {kv_heads} K/V heads per TP rank divisible by its a2a size {size}"
    return None


def _cp_hier_sizes(r: RunConfig) -> str | None:
    lay = r.layout
    if lay.cp_comm_type == "a2a+p2p" and lay.hierarchical_context_parallel_sizes is None:
        return (
            f"a2a+p2p CP {lay.cp} has no hierarchical_context_parallel_sizes "
            "(without them CP communication is silently off)"
        )
    return None


def _cp_hier_thd(r: RunConfig) -> str | None:
    if r.layout.cp > 1 and r.layout.cp_comm_type == "a2a+p2p" and r.options.is_packed:
        return "packed documents (THD) with a2a+p2p CP are refused by Transformer Engine before its PR #3290"
    return None


SEQ_CP = LegalityRule(
    "L-SEQ-CP",
    "bridge training/config.py:1435-1438 and Megatron-LM training/arguments.py:1295-1298 (seq_length % "
    "(2·CP)); mcore utils.py:2456-2470 (each CP rank "
    "takes 2 of the 2·CP chunks); packed THD: mcore utils.py:2405-2414 (each document padded to a multiple "
    "of 2·CP: Bridge's pad_seq_to_mult, recipes/common.py:164)",
    "use a sequence length divisible by 2·CP",
    _seq_cp,
)
SEQ_SP = LegalityRule(
    "L-SEQ-SP",
    "mcore tensor_parallel/mappings.py:60-81 (the s/CP rows are split over TP); bridge training/config.py:"
    "1213-1231 (SFT collate padding lcm(2·CP, CP·TP))",
    "use TP dividing seq/CP, or drop SP",
    _seq_sp,
)
CP_A2A_HEADS = LegalityRule(
    "L-CP-A2A-HEADS",
    "TE context_parallel.py AttnFuncWithCPAndQKVOA2A.forward ('The number of attention heads needs to be "
    "divisible by CP size!': q and k heads) and flash_attn_a2a_communicate (view(..., cp_size, h // cp_size, "
    "d) of q, k, v for a2a+p2p's a2a group)",
    "use p2p, or an a2a size dividing the Q and K/V heads per TP rank",
    _cp_a2a,
)
CP_HIER_SIZES = LegalityRule(
    "L-CP-HIER-SIZES",
    "bridge training/config.py:1543-1550; Megatron-LM training/arguments.py:565-567; product = CP: "
    "bridge config.py:1552-1557, mcore parallel_state.py:1127-1128",
    "set hierarchical_context_parallel_sizes to [a2a size, p2p size] with product CP, the a2a group inside "
    "one NVLink domain (e.g. [8, 2] for CP 16 on 8-GPU nodes)",
    _cp_hier_sizes,
)
CP_HIER_THD = LegalityRule(
    "L-CP-HIER-THD",
    "TE context_parallel.py AttnFuncWithCPAndKVP2P.forward ('thd format is not supported with hierarchical "
    "CP implementation yet!', TE 2.4: NVIDIA/TransformerEngine#2208; gate removed by PR #3290)",
    "use p2p or a2a CP for packed documents",
    _cp_hier_thd,
)


def sensible_hierarchical_sizes(
    model: ModelSpec, tp: int, cp: int, nvlink_domain: int, *, only_beyond_domain: bool = True
) -> tuple[int, int] | None:
    """The (a2a size, p2p size) split the planner tries for ``a2a+p2p``, or None when there is none
    worth trying: the largest a2a size a < cp that divides cp, keeps its tp·a GPUs inside one NVLink
    domain (the a2a group is consecutive CP ranks, each TP ranks apart: mcore parallel_state.py:
    378-414) and divides the Q and K/V heads per TP rank (L-CP-A2A-HEADS); a > 1. Only where the
    CP group itself spans beyond the NVLink domain (tp·cp > domain): inside one domain a2a or p2p
    alone already runs on NVLink, and a2a+p2p's point is to keep the all-to-all off the network
    (TE docstring: 'a2a across each CP sub-group (e.g., via NVLink), then p2p between sub-groups
    (e.g., via IBLink)'). ``only_beyond_domain`` False drops that condition (``estimate`` asked for
    a2a+p2p without sizes)."""
    if cp <= 1 or (only_beyond_domain and tp * cp <= nvlink_domain):
        return None
    heads, kv_heads = attention_heads_per_tp_rank(model, tp)
    for a2a in range(cp - 1, 1, -1):
        if cp % a2a == 0 and tp * a2a <= nvlink_domain and heads % a2a == 0 and kv_heads % a2a == 0:
            return a2a, cp // a2a
    return None
