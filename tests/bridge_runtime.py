"""Run Megatron Bridge's own ``runtime_config_update`` on lcmoe's emitted configs, on a CPU.

This file runs under a *separate* interpreter that has megatron-bridge 0.6.2 and megatron-core
0.19.2 installed (``.ci/run`` builds it; ``LCMOE_BRIDGE_PYTHON`` points at it). It imports
neither lcmoe nor pytest: a test sends it JSON cases on stdin and reads one JSON result per case
from stdout, through the session's one process (``--serve``, tests/bridge_service.py).

For each case it does what ``scripts/training/run_recipe.py`` does on a cluster node:
build the named recipe's ``ConfigContainer``, apply the emitted ``KEY=VALUE`` overrides (or
merge the emitted YAML) with Bridge's own Hydra/OmegaConf machinery
(``training/utils/omegaconf_utils.py: process_config_with_overrides``), then run
``training/config.py: runtime_config_update`` with ``WORLD_SIZE`` set to the plan's GPU count.
That is Bridge's full start-up validation: mixed-precision setup, data-parallel size,
comm-overlap setup and ``cfg.validate()`` → ``model.finalize()`` (MCore ``__post_init__``).

What a CPU box lacks, and what is done about it (shared/reference/dependencies.md §2.2–2.5):
* Transformer Engine: ``peft/lora_layers.py`` imports it unconditionally → stub module (LoRA
  is not used); MCore's ``transformer_config.py`` gates checks on ``is_te_min_version`` →
  answered as the TE ``TE_VERSION`` of a current NeMo container, so the TE-gated checks behave
  as on the cluster instead of refusing everything.
* triton: ``moe/ops/paged_stash.py`` imports it at module level for two GPU kernels → that one
  module is stubbed (the kernels raise if called; validation never calls them).
* GPU-only features are switched to their CPU stand-ins *after* the overrides, each recorded
  in the result: fused RoPE and fused permutation (need TE), the flex dispatcher (queries the GPU), the
  DSA kernel backend (cuDNN needs a device), the precision-aware optimizer (needs TE's FusedAdam; FP32
  dtypes instead). None of them changes
  a parallel size, batch size or layout.
* Recipes fetch ``config.json`` from the Hugging Face Hub: ``AutoBridge.from_hf_pretrained``
  is redirected to local directories (tests/data/hf), so nothing touches the network.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import sys
import traceback
import types
from typing import Any

TE_VERSION = "2.20.2"


def _install_cpu_stubs() -> None:
    import torch
    import torch.nn as nn

    del torch
    paged = types.ModuleType("megatron.core.transformer.moe.ops.paged_stash")
    paged.GLOBAL_BLOCK_SIZE = 1024  # type: ignore[attr-defined]

    def _kernel(*_: Any, **__: Any) -> None:
        raise RuntimeError("paged-stash kernels need triton and a GPU")

    paged.paged_stash_copy_kernel = paged.paged_stash_pop_kernel = _kernel  # type: ignore[attr-defined]
    sys.modules[paged.__name__] = paged

    lora = types.ModuleType("megatron.bridge.peft.lora_layers")

    class _NeedsTE(nn.Module):
        def __init__(self, *_: Any, **__: Any) -> None:
            raise RuntimeError("LoRA layers need transformer_engine")

    for name in ("LinearAdapter", "LoRALinear", "LoRATopKRouter", "TEFusedLoRALinear", "TELinearAdapter"):
        setattr(lora, name, type(name, (_NeedsTE,), {}))
    sys.modules[lora.__name__] = lora

    # megatron-core 0.19 uses typing.override (3.12+); Python 3.11 gets typing_extensions'.
    import typing

    import typing_extensions

    if not hasattr(typing, "override"):
        typing.override = typing_extensions.override  # type: ignore[attr-defined]


def _answer_te_version() -> None:
    import megatron.core.transformer.transformer_config as tc
    from packaging.version import Version

    tc.is_te_min_version = lambda version, check_equality=True: Version(TE_VERSION) >= Version(version)  # type: ignore[assignment]
    tc.get_te_version = lambda: Version(TE_VERSION)  # type: ignore[assignment]


def _redirect_hub() -> dict[str, str]:
    """Sends ``AutoBridge.from_hf_pretrained`` to local directories: the mapping returned (Hub name →
    folder), which each request fills with its ``hf_dirs``."""
    from megatron.bridge import AutoBridge

    original = AutoBridge.from_hf_pretrained.__func__  # type: ignore[attr-defined]
    local_dirs: dict[str, str] = {}

    def from_local(cls: Any, path: Any, **kwargs: Any) -> Any:
        return original(cls, local_dirs.get(str(path), path), **kwargs)

    AutoBridge.from_hf_pretrained = classmethod(from_local)  # type: ignore[assignment]
    return local_dirs


def _cpu_stand_ins(cfg: Any) -> list[str]:
    import torch

    changed = []
    if getattr(cfg.model, "apply_rope_fusion", False):
        cfg.model.apply_rope_fusion = False
        changed.append("model.apply_rope_fusion=false (needs TE)")
    if getattr(cfg.model, "moe_permute_fusion", False):
        cfg.model.moe_permute_fusion = False
        changed.append("model.moe_permute_fusion=false (needs TE)")
    if getattr(cfg.model, "moe_token_dispatcher_type", None) == "flex":
        cfg.model.moe_token_dispatcher_type = "alltoall"
        changed.append("model.moe_token_dispatcher_type=alltoall (flex queries the GPU)")
    if getattr(cfg.model, "dsa_kernel_backend", "none") != "none":
        cfg.model.dsa_kernel_backend = "none"
        changed.append("model.dsa_kernel_backend=none (cudnn/tilelang kernels need a CUDA device)")
    # Beside Muon the precision-aware optimizer is refused before TE is imported
    # (optimizer_config.py:430-433): keep it, so that the refusal is Megatron-Core's own.
    muon = "muon" in str(getattr(cfg.optimizer, "optimizer", "adam"))
    if getattr(cfg.optimizer, "use_precision_aware_optimizer", False) and not muon:
        cfg.optimizer.use_precision_aware_optimizer = False
        for field in ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"):
            setattr(cfg.optimizer, field, torch.float32)
        changed.append("optimizer.use_precision_aware_optimizer=false with FP32 dtypes (needs TE FusedAdam)")
    return changed


def _model_summary(model: Any) -> dict[str, Any]:
    fields = (
        "num_layers",
        "hidden_size",
        "ffn_hidden_size",
        "num_attention_heads",
        "num_query_groups",
        "num_moe_experts",
        "moe_router_topk",
        "moe_ffn_hidden_size",
        "mtp_num_layers",
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "virtual_pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
        "sequence_parallel",
        "seq_length",
        "recompute_granularity",
        "cp_comm_type",
        "overlap_moe_expert_parallel_comm",
        "delay_wgrad_compute",
        "hybrid_context_parallel",
        "max_seqlen_per_dp_cp_rank",
        "calculate_per_token_loss",
    )
    out = {name: getattr(model, name, None) for name in fields}
    return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in out.items()}


def _optimizer_summary(cfg: Any) -> dict[str, Any]:
    """The optimizer Bridge will build (optim.py:95-110) and the DDP settings it runs under."""
    opt, ddp = cfg.optimizer, cfg.ddp
    return {
        "optimizer": str(opt.optimizer),
        "optimizer.use_distributed_optimizer": bool(opt.use_distributed_optimizer),
        "ddp.use_distributed_optimizer": bool(ddp.use_distributed_optimizer),
        "ddp.overlap_param_gather": bool(ddp.overlap_param_gather),
        "optimizer.overlap_param_gather": bool(opt.overlap_param_gather),
        "muon_num_ns_steps": getattr(opt, "muon_num_ns_steps", None),
        "muon_tp_mode": getattr(opt, "muon_tp_mode", None),
        "ddp.use_megatron_fsdp": bool(getattr(ddp, "use_megatron_fsdp", False)),
        "ddp.data_parallel_sharding_strategy": str(getattr(ddp, "data_parallel_sharding_strategy", "")),
    }


def _peft_summary(peft: Any) -> dict[str, Any] | None:
    """What the run's cfg.peft trains: None for full training."""
    if peft is None:
        return None
    return {
        "class": type(peft).__name__,
        "dim": peft.dim,
        "target_modules": sorted(peft.target_modules),
        "sequence_parallel_input_regather": bool(getattr(peft, "sequence_parallel_input_regather", False)),
    }


def _changed_overrides(cfg: Any, overrides: list[str], stand_ins: list[str]) -> dict[str, list[str]]:
    """Overrides whose field holds another value after start-up: {key: [written, final]}. Left
    out: what a CPU stand-in changed (its own key, and the optimizer dtypes with the
    precision-aware optimizer), ``mixed_precision`` (compared field by field elsewhere), the
    deprecated ``model.cuda_graph_scope`` (Megatron-Core 0.19 moves it to
    ``cuda_graph_modules``, reported as ``cuda_graph``) and paths."""
    import yaml

    skipped = {entry.split("=", 1)[0] for entry in stand_ins}
    if "optimizer.use_precision_aware_optimizer" in skipped:
        skipped |= {"optimizer.main_grads_dtype", "optimizer.exp_avg_dtype", "optimizer.exp_avg_sq_dtype"}
    if "model.moe_token_dispatcher_type" in skipped:
        skipped.add("model.moe_flex_dispatcher_backend")
    changed = {}
    for line in overrides:
        key, _, raw = line.lstrip("+").partition("=")
        if key in skipped or key in ("mixed_precision", "model.cuda_graph_scope", "model.cuda_graph_impl"):
            continue
        if key.startswith("checkpoint."):
            continue
        node: Any = cfg
        for part in key.split("."):
            node = getattr(node, part, None)
        written = yaml.safe_load(raw)
        final = list(node) if isinstance(node, (list, tuple, set, frozenset)) else node
        if isinstance(written, list) and isinstance(final, list):
            same = sorted(map(str, written)) == sorted(map(str, final))
        else:
            same = written == final or str(written) == str(final)
        if not same:
            changed[key] = [str(written), str(final)]
    return changed


def _precision_fields(config: Any) -> dict[str, Any]:
    """A MixedPrecisionConfig's fields, the torch dtypes left out."""
    import dataclasses

    out = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    return {k: v for k, v in out.items() if isinstance(v, (int, float, str, bool, type(None)))}


def registered_precisions(names: list[str]) -> dict[str, dict[str, Any]]:
    """The fields of each registered mixed-precision config (mixed_precision.py)."""
    from megatron.bridge.training.mixed_precision import get_mixed_precision_config

    return {name: _precision_fields(get_mixed_precision_config(name)) for name in names}


@contextlib.contextmanager
def _case_environment(case: dict[str, Any]) -> Any:
    """The case's ``env`` (what the plan's launcher exports) and, with ``te_gate``, Bridge's own
    TE version checks answered as ``TE_VERSION`` (its validators import megatron.core.utils'
    is_te_min_version, which says 0.0.0 without TE: e.g. the NVTE_CPU_OFFLOAD_V1 gate of
    fine-grained activation offloading, config.py:2053-2059; comm_overlap.py imports it by name,
    for the delayed-wgrad gates at :519-529); both undone afterwards."""
    import megatron.bridge.training.comm_overlap as comm_overlap
    import megatron.core.utils as mcore_utils
    from packaging.version import Version

    saved_env = {name: os.environ.get(name) for name in case.get("env", {})}
    saved_gate, saved_overlap_gate = mcore_utils.is_te_min_version, comm_overlap.is_te_min_version
    os.environ.update(case.get("env", {}))
    if case.get("te_gate"):
        gate = lambda version, check_equality=True: Version(TE_VERSION) >= Version(version)  # noqa: E731
        mcore_utils.is_te_min_version = gate  # type: ignore[assignment]
        comm_overlap.is_te_min_version = gate  # type: ignore[assignment]
    try:
        yield
    finally:
        mcore_utils.is_te_min_version = saved_gate  # type: ignore[assignment]
        comm_overlap.is_te_min_version = saved_overlap_gate  # type: ignore[assignment]
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def check_case(case: dict[str, Any]) -> dict[str, Any]:
    import megatron.bridge.recipes as recipes
    from megatron.bridge.training.config import runtime_config_update
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    result: dict[str, Any] = {"name": case["name"], "ok": False}
    stage = "recipe"
    try:
        # run_recipe.py --mode lora builds the recipe with peft_scheme="lora" (load_recipe).
        recipe_fn = getattr(recipes, case["recipe"])
        cfg = recipe_fn(peft_scheme="lora") if case["recipe"].endswith("_peft_config") else recipe_fn()
        result["recipe_has_comm_overlap"] = cfg.comm_overlap is not None
        result["recipe_mixed_precision_is_object"] = not isinstance(cfg.mixed_precision, str)
        stage = "overrides"
        cfg = process_config_with_overrides(
            cfg, config_filepath=case.get("yaml"), cli_overrides=case.get("overrides") or None
        )
        result["cpu_stand_ins"] = _cpu_stand_ins(cfg)
        os.environ["WORLD_SIZE"] = str(case["world_size"])
        stage = "runtime_config_update"
        cfg = copy.deepcopy(cfg)  # validate() mutates and is not idempotent after a failure
        with _case_environment(case):
            runtime_config_update(cfg)
        if case.get("dump_yaml"):
            cfg.to_yaml(case["dump_yaml"])  # what logger.save_config_filepath writes (setup.py)
        result.update(
            ok=True,
            data_parallel_size=cfg.data_parallel_size,
            global_batch_size=cfg.train.global_batch_size,
            micro_batch_size=cfg.train.micro_batch_size,
            model=_model_summary(cfg.model),
            peft=_peft_summary(cfg.peft),
            optimizer=_optimizer_summary(cfg),
            changed_overrides=_changed_overrides(cfg, case.get("overrides") or [], result["cpu_stand_ins"]),
            cuda_graph=[
                str(cfg.model.cuda_graph_impl),
                sorted(getattr(m, "name", str(m)) for m in (cfg.model.cuda_graph_modules or [])),
            ],
            # What MixedPrecisionConfig.setup left on the DDP config and the precision it runs.
            ddp_grad_reduce_in_fp32=bool(cfg.ddp.grad_reduce_in_fp32),
            mixed_precision=_precision_fields(cfg.mixed_precision),
        )
    except Exception as exc:  # the verdict is the point: report it, do not crash the batch
        error = f"{type(exc).__name__}: {exc}"[:2000]
        result.update(stage=stage, error=error, traceback=traceback.format_exc()[-4000:])
    return result


def _answer(request: dict[str, Any], local_dirs: dict[str, str]) -> dict[str, Any]:
    local_dirs.update(request.get("hf_dirs", {}))
    results = [check_case(case) for case in request["cases"]]
    registered = registered_precisions(request.get("mixed_precision_names", []))
    return {"results": results, "registered_precisions": registered}


def main(argv: list[str]) -> int:
    """One JSON request on stdin, one JSON answer on stdout; with ``--serve``, one request per line
    and one answer per line (flushed) until stdin closes, so the ~25 s import chain is paid once
    for every test that asks (tests/bridge_service.py)."""
    answers = sys.stdout
    # Bridge and its dependencies print banners and warnings; keep stdout for the JSON answers.
    noise = io.StringIO()
    with contextlib.redirect_stdout(noise):
        _install_cpu_stubs()
        import megatron.bridge  # noqa: F401  (the whole import chain, as run_recipe.py does)

        _answer_te_version()
        local_dirs = _redirect_hub()
        if "--serve" not in argv:
            json.dump(_answer(json.load(sys.stdin), local_dirs), answers)
            return 0
        answers.write("ready\n")
        answers.flush()
        for line in sys.stdin:
            if line.strip():
                answers.write(json.dumps(_answer(json.loads(line), local_dirs)) + "\n")
                answers.flush()
                noise.seek(0)
                noise.truncate()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
