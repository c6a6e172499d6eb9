"""Workload and training options: everything besides the model and the layout that changes
memory or time (sequence length, precision, recompute, optimizer, dispatcher, CUDA graphs, offload).

Field names follow Megatron-Core / Bridge spellings (megatron-bridge-facts.md §1.2) so that the
emitters map them one to one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args, get_origin, get_type_hints

from lcmoe.errors import LcmoeError
from lcmoe.specs.doc_lengths import DocLengths

RecomputeGranularity = Literal["none", "selective", "full"]
RecomputeMethod = Literal["uniform", "block"]
Peft = Literal["none", "lora"]
Precision = Literal["bf16", "fp16", "fp8-tensorwise", "fp8-delayed", "fp8-blockwise", "mxfp8", "nvfp4"]
PRECISIONS: tuple[str, ...] = ("bf16", "fp16", "fp8-tensorwise", "fp8-delayed", "fp8-blockwise", "mxfp8", "nvfp4")

# Selective-recompute modules Megatron-Core accepts (transformer_config.py recompute_modules).
RECOMPUTE_MODULES = frozenset({"core_attn", "mla_up_proj", "layernorm", "mlp", "moe", "moe_act", "shared_experts"})
DISPATCHERS = ("alltoall", "allgather", "deepep", "hybridep")
# Megatron-Core's offload_modules (transformer_config.py:1854-1863) less ``fused_group_mlp``, which
# needs the TE op fuser (use_transformer_engine_op_fuser, :1895-1897) that lcmoe does not model.
ACTIVATION_OFFLOAD_MODULES = frozenset(
    {"attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act"}
)
CUDA_GRAPH_SCOPES = frozenset({"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba", "full_iteration"})
# Precisions whose Bridge mixed-precision recipe keeps quantized parameters: fp8_param_gather=True
# for current scaling, delayed scaling and MXFP8, fp4_param_gather=True for NVFP4; the blockwise
# (subchannel) recipe keeps BF16 ones (megatron/bridge/training/mixed_precision.py:231, 264,
# 302, 416 vs 384).
QUANTIZED_PARAM_PRECISIONS = frozenset({"fp8-tensorwise", "fp8-delayed", "mxfp8", "nvfp4"})
# LoRA targets lcmoe models: Bridge's default ``LoRA.target_modules`` (peft/lora.py), matched by
# module name (an MLA layer has no linear_qkv; Mamba and Gated DeltaNet projections are
# in_proj/out_proj and stay frozen without adapters).
LORA_TARGETS = frozenset({"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"})


def lora_fields(rank: int, targets: Iterable[str], input_regather: bool, *, scheme: str = "lora") -> dict[str, Any]:
    """TrainingOptions' LoRA fields, the inverse of ``TrainingOptions.peft_summary``: every
    spelling of a LoRA run lcmoe reads (CLI flags, Bridge ``peft.*`` overrides, plan.json) builds
    them here; TrainingOptions validates them."""
    return {
        "peft": scheme,
        "lora_rank": rank,
        "lora_targets": frozenset(targets),
        "lora_input_regather": input_regather,
    }


def tensor_core_precision(precision: str) -> str:
    """The hardware peak a precision runs its GEMMs at: bf16, fp8, mxfp8 or nvfp4."""
    if precision in ("bf16", "fp16"):
        return "bf16"
    if precision.startswith("fp8"):
        return "fp8"
    return precision


# Ranges of the numeric options (issue #31: a non-finite or absurd value must not become a plan).
# The busiest expert's load over the mean is at most E/k (every token on one expert); 1000 is
# above that for every catalog model (DeepSeek-V3: 256/8 = 32).
MAX_TOKEN_IMBALANCE = 1000.0
# Recompute-layer counts and optimizer instances count layers and DP groups: ≤ 100,000 layers
# (ModelSpec.num_layers) and ≤ 2^20 GPUs (layout.MAX_GPUS).
_INT_RANGES = {
    "num_distributed_optimizer_instances": (1, 2**20),
    "muon_num_ns_steps": (1, 100),
    "recompute_num_layers": (0, 100_000),  # < 1 is refused below with its own message
    "lora_rank": (0, 1_000_000),
    "min_dynamic_context_parallel_size": (1, 2**20),
}
# Fractions in [0, 1]: dropout probabilities and the optimizer share kept on the host.
# Quintic Newton-Schulz coefficient sets (emerging_optimizers muon_utils.py ``_COEFFICIENT_SETS``
# "quintic", the default muon_coefficient_type): the step count must be a multiple of it.
MUON_QUINTIC_SETS = 5
_FRACTIONS = ("optimizer_offload_fraction", "activation_offload_fraction", "hidden_dropout", "attention_dropout")


@functools.cache
def _field_checks() -> tuple[tuple[str, str, tuple[object, ...]], ...]:
    """(field, kind, allowed literal values) per TrainingOptions field, from its type hints."""
    hints = get_type_hints(TrainingOptions)
    checks = []
    for item in fields(TrainingOptions):
        hint = hints[item.name]
        args = get_args(hint)
        if get_origin(hint) is Literal:
            checks.append((item.name, "literal", args))
        elif hint is bool:
            checks.append((item.name, "bool", ()))
        elif set(args) == {bool, type(None)}:
            checks.append((item.name, "bool?", ()))
        elif hint is int:
            checks.append((item.name, "int", ()))
        elif hint is float:
            checks.append((item.name, "float", ()))
        elif hint is str:
            checks.append((item.name, "str", ()))
        elif get_origin(hint) is frozenset:
            checks.append((item.name, "strings", ()))
    return tuple(checks)


def _check_field_types(options: TrainingOptions) -> None:
    """Every field has its declared type: enums are one of their values, flags are true/false
    (never a truthy string), numbers are finite and not true/false, sets hold strings."""
    for name, kind, allowed in _field_checks():
        value = getattr(options, name)
        ok = True
        if kind == "literal":
            ok = isinstance(value, str) and value in allowed
            if not ok:
                raise LcmoeError(name, value, f"must be one of {', '.join(map(str, allowed))}", "fix the value")
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "bool?":
            ok = value is None or isinstance(value, bool)
        elif kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
            low, high = _INT_RANGES.get(name, (0, 2**53))
            if ok and not low <= value <= high:
                raise LcmoeError(name, value, f"must be a whole number from {low:,} to {high:,}", "fix the value")
        elif kind == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            if ok and name in _FRACTIONS and not 0.0 <= value <= 1.0:
                raise LcmoeError(name, value, "must be a fraction between 0 and 1", "e.g. 0.5")
        elif kind == "str":
            ok = isinstance(value, str)
        elif kind == "strings":
            ok = isinstance(value, frozenset) and all(isinstance(v, str) for v in value)
        if not ok:
            expected = {"bool": "true or false", "bool?": "true, false or unset", "int": "a whole number"}
            raise LcmoeError(
                name,
                value,
                f"must be {expected.get(kind, 'a finite number' if kind == 'float' else 'text')}",
                "fix the value",
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingOptions:
    """Options that change memory or step time. Defaults are Megatron Bridge's perf-recipe
    defaults for MoE pretraining (BF16, distributed optimizer, no recompute, alltoall)."""

    seq_len: int
    precision: str = "bf16"
    # The data's document lengths, packed into seq_len-token packs with one attention mask per
    # document (THD); None: every sample is one seq_len-token document (fixed length).
    doc_lengths: DocLengths | None = None
    # FP8/FP4 parameters (Megatron ``--fp8-param-gather`` / ``--fp4-param-gather``, Bridge
    # ``mixed_precision.fp8_param_gather`` / ``fp4_param_gather``); None = what Bridge's
    # mixed-precision recipe for ``precision`` sets (``quantized_params``).
    fp8_param_gather: bool | None = None
    # Optimizer and state placement.
    optimizer: Literal["adam", "muon", "sgd"] = "adam"
    # Muon (mcore optimizer/emerging_optimizers.py TensorParallelMuon; estimate.muon): the
    # Newton-Schulz iterations per update (OptimizerConfig.muon_num_ns_steps; the quintic
    # coefficients come in sets of 5, so a multiple of 5) and how a TP-sharded matrix is
    # orthogonalised (muon_tp_mode: blockwise = each shard alone, duplicated = gathered on every
    # TP rank, distributed = TP-aware NS with an all-reduce per iteration). With Muon,
    # ``distributed_optimizer`` means Megatron-Core's layer-wise distributed optimizer (Bridge
    # ``dist_muon``), which shards whole matrices over DP.
    muon_num_ns_steps: int = 5
    muon_tp_mode: Literal["blockwise", "duplicated", "distributed"] = "blockwise"
    distributed_optimizer: bool = True
    num_distributed_optimizer_instances: int = 1
    megatron_fsdp: bool = False
    # What Megatron-FSDP shards over DP·CP (experts over expert-DP): DDPConfig
    # .data_parallel_sharding_strategy (optim = ZeRO-1, optim_grads = ZeRO-2, optim_grads_params =
    # ZeRO-3, no_shard = none; estimate.fsdp). Only read with ``megatron_fsdp``.
    megatron_fsdp_sharding: Literal["optim_grads_params", "optim_grads", "optim", "no_shard"] = "optim_grads_params"
    # The DDP gradient buffer: BF16 under Bridge's ``grad_reduce_in_fp32=False`` / Megatron-LM's
    # ``--grad-reduce-in-bf16``, or a precision-aware optimizer's BF16 main grads.
    main_grads_dtype: Literal["fp32", "bf16"] = "fp32"
    # Megatron's ``use_precision_aware_optimizer``; None: on exactly when the moments or the master
    # parameters are below FP32, which only that optimizer allows (optimizer_config.py).
    precision_aware: bool | None = None
    exp_avg_dtype: Literal["fp32", "bf16", "fp8"] = "fp32"
    # The precision-aware optimizer may keep its master parameters in 16 bits (Nemotron-3 Super).
    main_params_dtype: Literal["fp32", "fp16", "bf16"] = "fp32"
    optimizer_offload_fraction: float = 0.0
    # Activations.
    recompute_granularity: RecomputeGranularity = "none"
    recompute_modules: frozenset[str] = field(default_factory=frozenset)
    recompute_method: RecomputeMethod = "uniform"
    recompute_num_layers: int = 1
    # Fine-grained activation offloading (mcore ``fine_grained_activation_offloading`` on when
    # ``activation_offload_modules`` is non-empty; ``offload_modules``, ``activation_offload_fraction``:
    # transformer_config.py:1229-1265).
    activation_offload_modules: frozenset[str] = field(default_factory=frozenset)
    activation_offload_fraction: float = 1.0
    attention_backend: Literal["auto", "flash", "fused", "unfused"] = "auto"
    # Deterministic algorithms (Megatron ``--deterministic-mode`` / NVTE_ALLOW_NONDETERMINISTIC_ALGO=0)
    # narrow the kernels TE may pick; whether flash-attn (>= 2.4.1) is installed is a property of
    # the container. Together they decide what ``auto`` runs (memory.attention_kernel).
    deterministic: bool = False
    flash_attn_installed: bool = True
    hidden_dropout: float = 0.0
    attention_dropout: float = 0.0
    cross_entropy_fusion: bool = False
    # MoE.
    dispatcher: str = "alltoall"
    moe_grouped_gemm: bool = True
    moe_router_dtype_fp32: bool = True
    moe_token_imbalance: float = 1.0
    overlap_moe_expert_parallel_comm: bool = False
    # Delayed weight-gradient GEMMs in the a2a-overlap schedule (ModelParallelConfig
    # .delay_wgrad_compute, mcore model_parallel_config.py:348; rules.delay_wgrad).
    delay_wgrad_compute: bool = False
    # Dynamic context parallelism (estimate.dynamic_cp): each document runs on a power-of-two
    # group of the DP×CP ranks sized by its length. Megatron-Core 0.19.2 spells it
    # ``hybrid_context_parallel`` with ``max_seqlen_per_dp_cp_rank`` (model_parallel_config.py:
    # 111-125); Megatron-LM's dev branch renames it ``dynamic_context_parallel`` and adds
    # ``min_dynamic_context_parallel_size`` (rules.dynamic_cp). ``max_seqlen_per_dp_cp_rank``
    # None: seq_len / CP, Megatron's suggested start (the same per-rank tokens as fixed CP).
    dynamic_context_parallel: bool = False
    max_seqlen_per_dp_cp_rank: int | None = None
    min_dynamic_context_parallel_size: int = 1
    # Sync-free experts and the MoE paged stash (mcore transformer_config.py:977-982, 1268-1284):
    # HybridEP receives at most T·k·c tokens per rank (c = ``moe_expert_rank_capacity_factor``,
    # None: dropless with a host sync), and ``moe_paged_stash`` keeps what the fused grouped MLP
    # saves for backward in pages sized from the expected tokens (rules.paged_stash).
    moe_expert_rank_capacity_factor: float | None = None
    moe_paged_stash: bool = False
    moe_paged_stash_buffer_size_factor_cuda: float = 1.10
    moe_paged_stash_buffer_size_factor_cpu: float = 0.0
    # Graphs and allocator.
    cuda_graph_scope: frozenset[str] = field(default_factory=frozenset)
    expandable_segments: bool = True
    # Parameter-efficient finetuning (Bridge ``cfg.peft = LoRA(...)``): the base model is frozen
    # and rank-``lora_rank`` adapters train on ``lora_targets``; ``lora_input_regather`` is
    # ``LoRA.sequence_parallel_input_regather``.
    peft: Peft = "none"
    lora_rank: int = 32
    lora_targets: frozenset[str] = LORA_TARGETS
    lora_input_regather: bool = False

    def __post_init__(self) -> None:
        _check_field_types(self)
        _check_single_fields(self)
        _check_combinations(self)
        _check_paged_stash(self)

    @property
    def is_packed(self) -> bool:
        """Whether samples are packs of several documents (THD, per-document attention)."""
        return self.doc_lengths is not None

    @property
    def is_lora(self) -> bool:
        return self.peft == "lora"

    @property
    def is_fp8(self) -> bool:
        return self.precision.startswith("fp8") or self.precision in ("mxfp8", "nvfp4")

    @property
    def quantized_params(self) -> bool:
        """Whether the parameters themselves are FP8 / NVFP4 tensors (``fp8_param_gather``, or the
        Bridge recipe's default for this precision when unset)."""
        if not self.is_fp8:
            return False
        if self.fp8_param_gather is None and self.is_lora:
            # A LoRA base stays in BF16 with TE's quantized copies beside it: the two documented
            # LoRA OOMs of Bridge's Llama3-70B perf recipes (memory_points.csv: FP8 current
            # scaling at TP1·PP1 on GB300, MXFP8 at PP2 on GB200) need the BF16 weights, while
            # FP8 primary weights would leave them at about half to two thirds of capacity.
            return False
        if self.fp8_param_gather is None:
            return self.precision in QUANTIZED_PARAM_PRECISIONS
        return self.fp8_param_gather

    @property
    def precision_aware_optimizer(self) -> bool:
        """Whether the run uses ``use_precision_aware_optimizer`` (``precision_aware``, or when unset
        a moment or master-parameter dtype below FP32, which needs it). A BF16 gradient buffer
        alone does not: Bridge's perf recipes reduce in BF16 with the plain optimizer."""
        if self.precision_aware is not None:
            return self.precision_aware
        return self.exp_avg_dtype != "fp32" or self.main_params_dtype != "fp32"

    @property
    def tensor_core_precision(self) -> str:
        return tensor_core_precision(self.precision)

    def peft_summary(self) -> dict[str, object] | None:
        """The fine-tuning scheme as the JSON outputs spell it (None: every parameter trains)."""
        if not self.is_lora:
            return None
        return {
            "scheme": self.peft,
            "rank": self.lora_rank,
            "targets": sorted(self.lora_targets),
            "input_regather": self.lora_input_regather,
        }

    def activation_offload_summary(self) -> dict[str, object]:
        """``{"activation_offload": {modules, fraction}}`` as the JSON outputs spell it, or {} when
        off: outputs without offloading keep their keys."""
        if not self.activation_offload_modules:
            return {}
        modules = sorted(self.activation_offload_modules)
        return {"activation_offload": {"modules": modules, "fraction": self.activation_offload_fraction}}

    def dynamic_cp_summary(self) -> dict[str, object]:
        """``{"dynamic_cp": {max_seqlen_per_dp_cp_rank, min_dynamic_context_parallel_size}}`` as the
        JSON outputs spell it, or {} when off: outputs without dynamic CP keep their keys."""
        if not self.dynamic_context_parallel:
            return {}
        return {
            "dynamic_cp": {
                "max_seqlen_per_dp_cp_rank": self.max_seqlen_per_dp_cp_rank,
                "min_dynamic_context_parallel_size": self.min_dynamic_context_parallel_size,
            }
        }

    def paged_stash_summary(self) -> dict[str, object]:
        """``{"paged_stash": {rank_capacity_factor, stash, cuda_factor, cpu_factor}}`` as the JSON
        outputs spell it, or {} without a rank capacity factor (outputs keep their keys)."""
        if self.moe_expert_rank_capacity_factor is None:
            return {}
        return {
            "paged_stash": {
                "rank_capacity_factor": self.moe_expert_rank_capacity_factor,
                "stash": self.moe_paged_stash,
                "cuda_factor": self.moe_paged_stash_buffer_size_factor_cuda,
                "cpu_factor": self.moe_paged_stash_buffer_size_factor_cpu,
            }
        }

    def muon_summary(self) -> dict[str, object]:
        """``optimizer`` and the Muon fields as the JSON outputs spell them, or {} under Adam:
        outputs without Muon keep their keys."""
        if self.optimizer != "muon":
            return {}
        return {"optimizer": "muon", "muon_num_ns_steps": self.muon_num_ns_steps, "muon_tp_mode": self.muon_tp_mode}

    def recomputes(self, module: str) -> bool:
        return self.recompute_granularity == "selective" and module in self.recompute_modules

    def recompute_label(self) -> str:
        if self.recompute_granularity == "full":
            return f"full/{self.recompute_method}/{self.recompute_num_layers}"
        if self.recompute_granularity == "selective":
            return ",".join(sorted(self.recompute_modules)) or "none"
        return "none"


def _check_single_fields(o: TrainingOptions) -> None:
    """Each run field's own rule: ranges, and names Megatron knows."""
    if isinstance(o.seq_len, bool) or not isinstance(o.seq_len, int) or not 1 <= o.seq_len <= 2**40:
        raise LcmoeError("seq_len", o.seq_len, "must be a whole number from 1 to 2^40", "e.g. --seq-len 128k")
    if o.doc_lengths is not None and not isinstance(o.doc_lengths, DocLengths):
        raise LcmoeError("doc_lengths", o.doc_lengths, "must be a document-length histogram or unset", "--doc-lengths")
    _check_dynamic_cp_fields(o)
    if o.precision not in PRECISIONS:
        raise LcmoeError("precision", o.precision, f"must be one of {', '.join(PRECISIONS)}", "e.g. bf16")
    if not 0.0 <= o.optimizer_offload_fraction <= 1.0:
        raise LcmoeError(
            "optimizer_offload_fraction", o.optimizer_offload_fraction, "must be between 0 and 1", "e.g. 0.5"
        )
    unknown = set(o.recompute_modules) - RECOMPUTE_MODULES
    if unknown:
        raise LcmoeError(
            "recompute_modules",
            ",".join(sorted(unknown)),
            "are not Megatron recompute modules",
            f"use {', '.join(sorted(RECOMPUTE_MODULES))}",
        )
    unknown_offload = set(o.activation_offload_modules) - ACTIVATION_OFFLOAD_MODULES
    if unknown_offload:
        raise LcmoeError(
            "activation_offload_modules",
            ",".join(sorted(unknown_offload)),
            "are not offload modules lcmoe models "
            "(Megatron-Core's, transformer_config.py:1854-1867, less fused_group_mlp)",
            f"use {', '.join(sorted(ACTIVATION_OFFLOAD_MODULES))}",
        )
    if o.dispatcher not in DISPATCHERS:
        raise LcmoeError(
            "dispatcher",
            o.dispatcher,
            f"must be one of {', '.join(DISPATCHERS)}",
            "alltoall is the safe default",
        )
    bad_scopes = set(o.cuda_graph_scope) - CUDA_GRAPH_SCOPES
    if bad_scopes:
        raise LcmoeError(
            "cuda_graph_scope",
            ",".join(sorted(bad_scopes)),
            "are not CUDA-graph scopes",
            f"use {', '.join(sorted(CUDA_GRAPH_SCOPES))}",
        )
    if not 1.0 <= o.moe_token_imbalance <= MAX_TOKEN_IMBALANCE:
        raise LcmoeError(
            "moe_token_imbalance",
            o.moe_token_imbalance,
            f"must be a finite number from 1 (perfectly balanced) to {MAX_TOKEN_IMBALANCE:g}",
            "use 1.0 under forced balance, ~1.1-1.5 for a real router",
        )


def _check_dynamic_cp_fields(o: TrainingOptions) -> None:
    """``max_seqlen_per_dp_cp_rank``: unset or a whole number of tokens from 1 to seq_len (a rank
    never holds more than a pack); the dynamic-CP fields only with dynamic CP on."""
    most = o.max_seqlen_per_dp_cp_rank
    if most is not None and (isinstance(most, bool) or not isinstance(most, int) or not 1 <= most <= o.seq_len):
        raise LcmoeError(
            "max_seqlen_per_dp_cp_rank", most, f"must be a whole number of tokens from 1 to seq_len = {o.seq_len}",
            "e.g. seq_len / CP",
        )  # fmt: skip
    if not o.dynamic_context_parallel and (most is not None or o.min_dynamic_context_parallel_size != 1):
        raise LcmoeError(
            "max_seqlen_per_dp_cp_rank" if most is not None else "min_dynamic_context_parallel_size",
            most if most is not None else o.min_dynamic_context_parallel_size,
            "applies only with dynamic context parallelism",
            "turn dynamic CP on (--dynamic-cp) or drop it",
        )


def _check_combinations(o: TrainingOptions) -> None:
    """Fields that must agree (FP8 parameters, the precision-aware optimizer) and the PEFT fields."""
    if o.fp8_param_gather and not o.is_fp8:
        raise LcmoeError(
            "fp8_param_gather",
            True,
            f"needs an FP8 or FP4 precision, not {o.precision} (transformer_config.py: fp8_param requires fp8)",
            "drop --fp8-params or pick fp8-tensorwise, fp8-blockwise, mxfp8 or nvfp4",
        )
    if o.precision_aware is False and (o.exp_avg_dtype != "fp32" or o.main_params_dtype != "fp32"):
        raise LcmoeError(
            "precision_aware",
            False,
            f"contradicts exp_avg_dtype={o.exp_avg_dtype}, main_params_dtype={o.main_params_dtype}: "
            "moments or master parameters below FP32 need the precision-aware optimizer "
            "(optimizer_config.py)",
            "set use_precision_aware_optimizer or keep FP32 moments and master parameters",
        )
    if o.muon_num_ns_steps % MUON_QUINTIC_SETS:
        raise LcmoeError(
            "muon_num_ns_steps",
            o.muon_num_ns_steps,
            f"must be a multiple of {MUON_QUINTIC_SETS}: the quintic Newton-Schulz coefficients come in sets of "
            f"{MUON_QUINTIC_SETS} (emerging_optimizers muon_utils.py newton_schulz)",
            "use 5 (Bridge's and Megatron-LM's default) or 10",
        )
    if o.recompute_num_layers < 1:
        raise LcmoeError("recompute_num_layers", o.recompute_num_layers, "must be ≥ 1", "e.g. 1")
    if o.peft not in ("none", "lora"):
        raise LcmoeError("peft", o.peft, "must be none or lora", "e.g. --peft lora")
    if isinstance(o.lora_rank, bool) or not isinstance(o.lora_rank, int) or o.lora_rank < 1:
        raise LcmoeError("lora_rank", o.lora_rank, "must be a whole number ≥ 1", "Bridge's default is 32")
    unknown_targets = set(o.lora_targets) - LORA_TARGETS
    if unknown_targets or not o.lora_targets:
        raise LcmoeError(
            "lora_targets",
            ",".join(sorted(unknown_targets)) or "(none)",
            "must name one or more LoRA targets lcmoe models",
            f"use {', '.join(sorted(LORA_TARGETS))}",
        )


# Paged-stash buffer factors: |factor| is the headroom over the expected (positive) or the
# capture step's actual (negative) tokens (transformer_config.py:1274-1284); 100 is far above
# any capacity (every token of a rank on one expert is at most E/k ≤ MAX_TOKEN_IMBALANCE).
MAX_STASH_FACTOR = 100.0


def _check_paged_stash(o: TrainingOptions) -> None:
    """The sync-free / paged-stash numbers: a rank capacity factor above 0 (or unset), finite
    buffer factors of at most MAX_STASH_FACTOR in magnitude, a CPU factor of 0 without host pages."""
    cap = o.moe_expert_rank_capacity_factor
    if cap is not None and (
        isinstance(cap, bool) or not isinstance(cap, int | float) or not 0.0 < cap <= MAX_TOKEN_IMBALANCE
    ):
        raise LcmoeError(
            "moe_expert_rank_capacity_factor",
            cap,
            f"must be unset or a number above 0 and at most {MAX_TOKEN_IMBALANCE:g} "
            "(the per-rank token budget over the balanced count)",
            "Bridge's full-iteration recipes use 1.5",
        )
    for name in ("moe_paged_stash_buffer_size_factor_cuda", "moe_paged_stash_buffer_size_factor_cpu"):
        value = getattr(o, name)
        if abs(value) > MAX_STASH_FACTOR:
            raise LcmoeError(
                name,
                value,
                f"must be between -{MAX_STASH_FACTOR:g} and {MAX_STASH_FACTOR:g} (positive: over the expected tokens, "
                "negative: over the capture step's actual tokens)",
                "Bridge's recipes use 1.2 (GPU) and 1.0 (host)",
            )


def unchecked_replace(options: TrainingOptions, **changes: object) -> TrainingOptions:
    """``dataclasses.replace(options, **changes)`` without ``TrainingOptions.__post_init__``, for
    the estimators' and the planner's hot paths: they swap values of their own enumerations
    (recompute rungs, offload fractions, dispatchers, graph scopes, EP overlap, the replayed
    backward's "no recompute") into options that were validated when built, and ``violations``
    judges every combination the planner keeps. Re-validating every trial was a tenth of the
    search's time and most of a memory estimate's fixed cost. Not for user input.

    The clone is a bare ``object.__new__`` whose every field is set with ``object.__setattr__``
    (what ``copy.copy`` of a slotted dataclass does through ``__reduce_ex__``, at a third of its
    cost): the same field values, no ``__init__`` or ``__post_init__`` run."""
    for name in changes:
        if name not in _OPTION_FIELD_NAMES:
            raise TypeError(f"TrainingOptions has no field {name!r}")
    clone = object.__new__(type(options))
    for name in _OPTION_FIELDS:
        object.__setattr__(clone, name, changes[name] if name in changes else getattr(options, name))
    return clone


_OPTION_FIELDS = tuple(f.name for f in fields(TrainingOptions))
_OPTION_FIELD_NAMES = frozenset(_OPTION_FIELDS)
