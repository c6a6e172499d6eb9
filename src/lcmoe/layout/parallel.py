"""ParallelLayout: the parallel sizes of one run, each checked against its bound, and the
hierarchical context-parallel group sizes."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import Enum

from lcmoe.errors import LcmoeError


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
