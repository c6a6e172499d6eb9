"""Megatron-LM ``pretrain_gpt.py`` arguments → (ModelSpec, ParallelLayout, TrainingOptions).

Defaults are Megatron-LM's own where an argument is absent (megatron/training/arguments.py):
tied embeddings, biases on, GeLU, dropout 0.1, allgather dispatcher, ETP = TP, FFN = 4h (or
int(4h·2/3/64)·64 with SwiGLU), kv_channels = h/n, vocabulary padded to a multiple of 128·TP.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Literal

from lcmoe.config_io.activation_offload import megatron_offload_options
from lcmoe.config_io.dynamic_cp import megatron_dynamic_cp_options
from lcmoe.config_io.paged_stash import megatron_stash_options
from lcmoe.errors import LcmoeError
from lcmoe.layout import ParallelLayout, read_hierarchical_sizes
from lcmoe.specs.doc_lengths import DocLengths
from lcmoe.specs.model import ModelSpec, model_from_dict, split_hybrid_pattern
from lcmoe.units import real_number, whole_number
from lcmoe.workload import TrainingOptions

# Flags that take a list of values (nargs='+').
_LIST_FLAGS = {
    "recompute-modules",
    "offload-modules",
    "cuda-graph-modules",
    "hierarchical-context-parallel-sizes",
    "cuda-graph-scope",
}
GPT2_BPE_VOCAB = 50257


@dataclass(frozen=True, slots=True)
class ParsedRun:
    model: ModelSpec
    layout: ParallelLayout
    options: TrainingOptions
    args: dict[str, Any]


class UnsupportedConfig(LcmoeError):
    """A configuration lcmoe cannot model (e.g. Mamba hybrids); the message says which part."""


# A pretrain_gpt.py command line is a few kilobytes (Linux caps one argument at 128 KiB); shlex
# splits character by character (~50-150 kB/s on a loaded CI core), so this bound keeps any
# input within the 10 s budget (issue #31).
MAX_ARGS_CHARS = 256 * 1024


def tokenize_args(text: str | list[str]) -> dict[str, Any]:
    """``--flag``, ``--flag value``, ``--flag=value`` and list flags → {flag: value}."""
    if isinstance(text, str) and len(text) > MAX_ARGS_CHARS:
        raise LcmoeError(
            "arguments", f"({len(text):,} characters)", "are longer than 256 KiB", "pass the training command line only"
        )
    try:
        tokens = shlex.split(text) if isinstance(text, str) else list(text)
    except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
        raise LcmoeError("arguments", None, f"cannot be split like a shell line ({exc})", "balance quotes") from None
    args: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            i += 1
            continue
        key, eq, value = tok[2:].partition("=")
        if key in _LIST_FLAGS:
            values = value.strip("[]'\"").replace(",", " ").split() if eq else []
            while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
                i += 1
                values.extend(tokens[i].strip("[]'\"").replace(",", " ").split())
            args[key] = [v for v in values if v]
        elif eq:
            args[key] = value
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            args[key] = tokens[i + 1]
            i += 1
        else:
            args[key] = True
        i += 1
    return args


def _int(args: dict[str, Any], key: str, default: int | None = None) -> int | None:
    value = args.get(key)
    if value is None or value is True:
        return default
    return whole_number(value, field=f"--{key}", fix="fix the argument")


def _req(args: dict[str, Any], key: str) -> int:
    value = _int(args, key)
    if value is None:
        raise LcmoeError(f"--{key}", None, "is required to size the model", f"pass --{key}")
    return value


def _switch(args: dict[str, Any], key: str) -> bool:
    """A store_true flag: present (True) or absent. A value after it (``--sequence-parallel
    false``) is refused rather than read as truthy text (issue #31)."""
    value = args.get(key)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise LcmoeError(f"--{key}", value, "is a switch and takes no value", f"write --{key} alone, or leave it out")


def _choice(args: dict[str, Any], key: str, default: str, allowed: tuple[str, ...]) -> str:
    """A flag with choices (argparse ``choices=``): one of ``allowed``, never a silent default."""
    value = args.get(key, default)
    if not isinstance(value, str) or value not in allowed:
        raise LcmoeError(f"--{key}", value, f"must be one of {', '.join(allowed)}", f"e.g. --{key} {allowed[0]}")
    return value


def _float(args: dict[str, Any], key: str, default: float) -> float:
    value = args.get(key)
    if value is None or value is True:
        return default
    return real_number(value, field=f"--{key}", fix="fix the argument")


def model_from_args(args: dict[str, Any], *, vocab_size: int | None = None, name: str = "megatron-args") -> ModelSpec:
    pattern = args.get("hybrid-layer-pattern")
    if args.get("mamba-num-heads") and not isinstance(pattern, str):
        raise UnsupportedConfig(
            "--mamba-num-heads",
            args.get("mamba-num-heads"),
            "Mamba layers are modelled only in a hybrid model",
            "give --hybrid-layer-pattern (pretrain_hybrid.py)",
        )
    hidden = _req(args, "hidden-size")
    heads = _req(args, "num-attention-heads")
    swiglu = _switch(args, "swiglu")
    default_ffn = int(4 * hidden * 2 / 3 / 64) * 64 if swiglu else 4 * hidden
    ffn = _int(args, "ffn-hidden-size", default_ffn) or default_ffn
    mla = _switch(args, "multi-latent-attention")
    num_experts = _int(args, "num-experts")
    freq_raw = args.get("moe-layer-freq", 1)
    data: dict[str, Any] = {
        "name": name,
        "family": "megatron-args",
        "num_layers": _int(args, "num-layers") if isinstance(pattern, str) else _req(args, "num-layers"),
        "hidden_size": hidden,
        "ffn_hidden_size": ffn,
        "num_attention_heads": heads,
        "num_query_groups": _int(args, "num-query-groups") if args.get("group-query-attention") else None,
        "kv_channels": _int(args, "kv-channels"),
        "gated_linear_unit": swiglu,
        "add_bias_linear": not _switch(args, "disable-bias-linear"),
        "add_qkv_bias": not _switch(args, "disable-bias-linear") or _switch(args, "add-qkv-bias"),
        "qk_layernorm": _switch(args, "qk-layernorm"),
        "multi_latent_attention": mla,
        "vocab_size": vocab_size or _int(args, "vocab-size") or GPT2_BPE_VOCAB,
        "make_vocab_size_divisible_by": _int(args, "make-vocab-size-divisible-by", 128),
        "untie_embeddings_and_output_weights": _switch(args, "untie-embeddings-and-output-weights"),
        "mtp_num_layers": _int(args, "mtp-num-layers", 0),
        "mtp_use_repeated_layer": _switch(args, "mtp-use-repeated-layer"),
    }
    if mla:
        data.update(
            q_lora_rank=_int(args, "q-lora-rank"),
            kv_lora_rank=_int(args, "kv-lora-rank", 512),
            qk_head_dim=_int(args, "qk-head-dim", 128),
            qk_pos_emb_head_dim=_int(args, "qk-pos-emb-head-dim", 64),
            v_head_dim=_int(args, "v-head-dim", 128),
            kv_channels=None,
            num_query_groups=None,
        )
    if num_experts:
        data.update(
            num_moe_experts=num_experts,
            moe_router_topk=_int(args, "moe-router-topk", 2),
            moe_ffn_hidden_size=_int(args, "moe-ffn-hidden-size"),
            moe_shared_expert_intermediate_size=_int(args, "moe-shared-expert-intermediate-size"),
            moe_layer_freq=str(freq_raw) if not isinstance(freq_raw, int) else freq_raw,
            moe_router_enable_expert_bias=_switch(args, "moe-router-enable-expert-bias"),
            moe_latent_size=_int(args, "moe-latent-size") or None,
        )
    if isinstance(pattern, str):
        data.update(hybrid_fields(args, pattern, hidden))
    return model_from_dict(data, origin="Megatron-LM arguments")


def hybrid_fields(args: dict[str, Any], pattern: str, hidden: int) -> dict[str, Any]:
    """pretrain_hybrid.py's model fields: the pattern (its layer and MTP-depth counts stand in
    for --num-layers / --mtp-num-layers when those are absent, as in parse_hybrid_pattern) and
    the Mamba sizes with Megatron's defaults (arguments.py: state 128, head dim 64, 8 groups,
    heads 2h/head_dim when --mamba-num-heads is unset)."""
    try:
        layers, _, depths = split_hybrid_pattern(pattern)
    except ValueError as err:
        raise UnsupportedConfig("--hybrid-layer-pattern", pattern, str(err), "use M, *, - and E layers") from None
    head_dim = _int(args, "mamba-head-dim", 64) or 64
    return {
        "hybrid_layer_pattern": pattern,
        "num_layers": _int(args, "num-layers", len(layers)) or len(layers),
        "mtp_num_layers": _int(args, "mtp-num-layers", depths) or 0,
        "moe_layer_freq": 1,
        "mamba_num_heads": _int(args, "mamba-num-heads", 2 * hidden // head_dim),
        "mamba_head_dim": head_dim,
        "mamba_state_dim": _int(args, "mamba-state-dim", 128),
        "mamba_num_groups": _int(args, "mamba-num-groups", 8),
    }


def layout_from_args(args: dict[str, Any], *, world_size: int, num_layers: int) -> ParallelLayout:
    tp = _int(args, "tensor-model-parallel-size", 1) or 1
    pp = _int(args, "pipeline-model-parallel-size", 1) or 1
    cp = _int(args, "context-parallel-size", 1) or 1
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        raise LcmoeError(
            "world_size",
            world_size,
            f"is not a multiple of TP·PP·CP = {model_parallel}",
            "use a world size that the layout divides",
        )
    vpp = _int(args, "virtual-pipeline-model-parallel-size") or _int(args, "num-virtual-stages-per-pipeline-rank")
    per_virtual = _int(args, "num-layers-per-virtual-pipeline-stage")
    layout_str = args.get("pipeline-model-parallel-layout")
    if vpp is None and per_virtual:
        extra = int(_switch(args, "account-for-embedding-in-pipeline-split")) + int(
            _switch(args, "account-for-loss-in-pipeline-split")
        )
        vpp = (num_layers + extra) // pp // per_virtual
    if vpp is None and isinstance(layout_str, str):
        from lcmoe.layout import parse_pipeline_layout

        vpp = max(len(parse_pipeline_layout(layout_str)) // pp, 1)
    cp_comm_type = str(args.get("cp-comm-type", "p2p"))
    return ParallelLayout(
        tp=tp,
        cp=cp,
        pp=pp,
        vpp=vpp or 1,
        dp=world_size // model_parallel,
        ep=_int(args, "expert-model-parallel-size", 1) or 1,
        etp=_int(args, "expert-tensor-parallel-size", tp) or tp,
        mbs=_int(args, "micro-batch-size", 1) or 1,
        gbs=_int(args, "global-batch-size", 1) or 1,
        sequence_parallel=_switch(args, "sequence-parallel"),
        cp_comm_type=cp_comm_type,
        hierarchical_context_parallel_sizes=read_hierarchical_sizes(
            args.get("hierarchical-context-parallel-sizes"),
            field="--hierarchical-context-parallel-sizes",
            cp_comm_type=cp_comm_type,
        ),
        pipeline_layout=layout_str if isinstance(layout_str, str) else None,  # bounded in layout/parallel.py
        decoder_first_pipeline_num_layers=_int(args, "decoder-first-pipeline-num-layers"),
        decoder_last_pipeline_num_layers=_int(args, "decoder-last-pipeline-num-layers"),
        account_for_embedding_in_pipeline_split=_switch(args, "account-for-embedding-in-pipeline-split"),
        account_for_loss_in_pipeline_split=_switch(args, "account-for-loss-in-pipeline-split"),
    )


_FP8_RECIPES = ("delayed", "tensorwise", "mxfp8", "blockwise", "custom")  # arguments.py choices


def _precision(args: dict[str, Any]) -> str:
    if args.get("fp4-format") or args.get("fp4-recipe"):  # NVFP4 is Megatron's one FP4 recipe
        return "nvfp4"
    fmt, recipe = args.get("fp8-format"), args.get("fp8-recipe")
    if fmt or recipe:
        return {
            "tensorwise": "fp8-tensorwise",
            "blockwise": "fp8-blockwise",
            "mxfp8": "mxfp8",
            "delayed": "fp8-delayed",
        }.get(_choice({"fp8-recipe": recipe or "delayed"}, "fp8-recipe", "delayed", _FP8_RECIPES), "fp8-delayed")
    return "fp16" if args.get("fp16") else "bf16"


def _dispatcher(args: dict[str, Any]) -> str:
    """``--moe-token-dispatcher-type`` (argparse choices allgather, alltoall, flex) and, for flex,
    ``--moe-flex-dispatcher-backend`` (deepep, hybridep); anything else is refused, never read
    as alltoall."""
    kind = _choice(args, "moe-token-dispatcher-type", "allgather", ("allgather", "alltoall", "flex"))
    if kind == "flex":
        return _choice(args, "moe-flex-dispatcher-backend", "deepep", ("deepep", "hybridep"))
    return kind


def _muon_fields(args: dict[str, Any]) -> dict[str, Any]:
    """optimizer, distributed_optimizer and the Muon fields: ``--optimizer muon`` (or the
    deprecated ``dist_muon``, which also turns the layer-wise distributed optimizer on,
    arguments.py:1669-1682), ``--muon-num-ns-steps`` and ``--muon-tp-mode`` (:2538-2542)."""
    name = str(args.get("optimizer", "adam"))
    distributed = _switch(args, "use-distributed-optimizer")
    if name not in ("muon", "dist_muon"):
        return {"optimizer": "sgd" if name == "sgd" else "adam", "distributed_optimizer": distributed}
    return {
        "optimizer": "muon",
        "distributed_optimizer": distributed or name == "dist_muon",
        "muon_num_ns_steps": _int(args, "muon-num-ns-steps", 5) or 5,
        "muon_tp_mode": _choice(args, "muon-tp-mode", "blockwise", ("blockwise", "duplicated", "distributed")),
    }


def options_from_args(args: dict[str, Any], *, doc_lengths: DocLengths | None = None) -> TrainingOptions:
    """The options a Megatron-LM command line sets; ``doc_lengths``: the documents
    ``--dataloader-inter-document-masking`` packs (unset: ``unknown_lengths``)."""
    from lcmoe.config_io.bridge import packed_doc_lengths

    granularity = _choice(args, "recompute-granularity", "none", ("none", "full", "selective"))
    method = _choice(args, "recompute-method", "uniform", ("uniform", "block"))
    modules = args.get("recompute-modules") or (["core_attn"] if granularity == "selective" else [])
    graphs = _cuda_graphs(args)
    aware = _switch(args, "use-precision-aware-optimizer")
    main_grads, exp_avg, main_params = _optimizer_dtypes(args, aware=aware)
    offload = _float(args, "optimizer-offload-fraction", 1.0) if args.get("optimizer-cpu-offload") else 0.0
    backend = _choice(args, "attention-backend", "auto", ("auto", "flash", "fused", "unfused", "local"))
    return TrainingOptions(
        seq_len=_int(args, "seq-length", 4096) or 4096,
        precision=_precision(args),
        fp8_param_gather=_switch(args, "fp8-param-gather") or _switch(args, "fp4-param-gather"),
        **_muon_fields(args),
        num_distributed_optimizer_instances=_int(args, "num-distributed-optimizer-instances", 1) or 1,
        megatron_fsdp=_switch(args, "use-megatron-fsdp"),
        main_grads_dtype=main_grads,
        precision_aware=aware,
        exp_avg_dtype=exp_avg,
        main_params_dtype=main_params,
        optimizer_offload_fraction=offload,
        recompute_granularity=granularity if granularity in ("selective", "full") else "none",  # type: ignore[arg-type]
        recompute_modules=frozenset(modules),
        recompute_method="block" if method == "block" else "uniform",
        recompute_num_layers=_int(args, "recompute-num-layers", 1) or 1,
        attention_backend=backend if backend in ("flash", "fused", "unfused") else "auto",  # type: ignore[arg-type]
        deterministic=_switch(args, "deterministic-mode"),
        hidden_dropout=_float(args, "hidden-dropout", 0.1),
        attention_dropout=_float(args, "attention-dropout", 0.1),
        cross_entropy_fusion=_switch(args, "cross-entropy-loss-fusion"),
        dispatcher=_dispatcher(args),
        moe_grouped_gemm=_switch(args, "moe-grouped-gemm"),
        moe_router_dtype_fp32=args.get("moe-router-dtype") == "fp32",
        overlap_moe_expert_parallel_comm=_switch(args, "overlap-moe-expert-parallel-comm"),
        delay_wgrad_compute=_switch(args, "delay-wgrad-compute"),
        cuda_graph_scope=graphs,
        doc_lengths=packed_doc_lengths(
            _switch(args, "dataloader-inter-document-masking"),
            doc_lengths,
            _int(args, "seq-length", 4096) or 4096,
            config_key="--dataloader-inter-document-masking",
        ),
        **megatron_offload_options(args),
        **megatron_dynamic_cp_options(args),
        **megatron_stash_options(args),
    )


def _cuda_graphs(args: dict[str, Any]) -> frozenset[str]:
    """The CUDA-graphed scopes (``--cuda-graph-modules``, earlier ``--cuda-graph-scope``); none when
    ``--cuda-graph-impl`` is unset or none."""
    graph_modules = args.get("cuda-graph-modules") or args.get("cuda-graph-scope") or []
    graphs = frozenset(graph_modules) if args.get("cuda-graph-impl") not in (None, "none") else frozenset()
    # Megatron-Core 0.19 names the local full-iteration graph --cuda-graph-impl=full_iteration.
    if args.get("cuda-graph-impl") == "full_iteration" or (args.get("cuda-graph-impl") == "local" and not graphs):
        graphs = frozenset({"full_iteration"})
    return graphs


def _optimizer_dtypes(
    args: dict[str, Any], *, aware: bool
) -> tuple[Literal["fp32", "bf16"], Literal["fp32", "bf16", "fp8"], Literal["fp32", "fp16", "bf16"]]:
    """(main grads, Adam moments, main params) dtypes; the last two are FP32 but for a
    precision-aware optimizer."""
    main_grads: Literal["fp32", "bf16"] = (
        "bf16"
        if (
            args.get("grad-reduce-in-bf16")
            or args.get("megatron-fsdp-main-grads-dtype") in ("bf16", "auto")
            or (aware and args.get("main-grads-dtype") == "bf16")
        )
        else "fp32"
    )
    exp_avg: Literal["fp32", "bf16", "fp8"] = "fp32"
    if aware and args.get("exp-avg-dtype") in ("bf16", "fp8"):
        exp_avg = "bf16" if args.get("exp-avg-dtype") == "bf16" else "fp8"
    main_params: Literal["fp32", "fp16", "bf16"] = "fp32"
    if aware and args.get("main-params-dtype") in ("fp16", "bf16"):
        main_params = "fp16" if args.get("main-params-dtype") == "fp16" else "bf16"
    return main_grads, exp_avg, main_params


def parse_megatron_args(text: str | list[str], *, world_size: int, vocab_size: int | None = None) -> ParsedRun:
    """The whole run a ``pretrain_gpt.py`` command line describes, for ``world_size`` GPUs."""
    args = tokenize_args(text)
    model = model_from_args(args, vocab_size=vocab_size)
    layout = layout_from_args(args, world_size=world_size, num_layers=model.num_layers)
    return ParsedRun(model, layout, options_from_args(args), args)


# Argument dump names whose command-line flag is not the name with '-' for '_'
# (megatron/training/arguments.py: ``--fp8-format`` has dest ``fp8``; ``--disable-bias-linear``
# is ``store_false`` into ``add_bias_linear``).
_DUMP_RENAMES = {"fp8": "fp8-format"}
_DUMP_STORE_FALSE = {"add_bias_linear": "disable-bias-linear"}


def args_from_dump(dump: dict[str, str]) -> dict[str, Any]:
    """The ``-- arguments --`` block a Megatron-LM run prints (``_print_args``: ``name .... value``
    with Python ``str()`` values) → the {flag: value} form :func:`tokenize_args` gives, so a log's
    own configuration goes through the same parser as a command line."""
    import ast

    args: dict[str, Any] = {}
    for name, text in dump.items():
        value = text.strip()
        if name in _DUMP_STORE_FALSE:
            if value == "False":
                args[_DUMP_STORE_FALSE[name]] = True
            continue
        if value in ("None", "False", ""):
            continue
        flag = _DUMP_RENAMES.get(name, name.replace("_", "-"))
        if value == "True":
            args[flag] = True
        elif value.startswith("[") and value.endswith("]"):
            try:
                parsed = ast.literal_eval(value)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                continue
            if flag in _LIST_FLAGS:
                args[flag] = [str(v) for v in parsed] if isinstance(parsed, list) else [str(parsed)]
            else:
                args[flag] = value.replace(" ", "")
        else:
            args[flag] = value
    return args


def run_args_from_dump(dump: dict[str, str]) -> tuple[dict[str, Any], int | None, int | None]:
    """(flags, world size, padded vocabulary) from an argument dump; the last two are None when absent."""
    args = args_from_dump(dump)
    world = _int(args, "world-size")
    vocab = _int(args, "padded-vocab-size")
    return args, world, vocab


def parse_megatron_dump(
    dump: dict[str, str], *, world_size: int | None = None, model: ModelSpec | None = None
) -> ParsedRun:
    """The whole run an argument dump describes; ``world_size`` overrides the dump's own, and a
    given ``model`` (a catalog spec) replaces the architecture the dump spells out."""
    args, dumped_world, vocab = run_args_from_dump(dump)
    world = world_size or dumped_world
    if not world:
        raise LcmoeError("world_size", None, "is not in the argument dump", "pass --gpus")
    model = model or model_from_args(args, vocab_size=vocab, name="from-log")
    layout = layout_from_args(args, world_size=world, num_layers=model.num_layers)
    return ParsedRun(model, layout, options_from_args(args), args)
