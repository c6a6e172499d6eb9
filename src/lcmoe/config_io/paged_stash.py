"""Sync-free experts and the MoE paged stash in the config formats: what a plan writes (Bridge
``model.*`` overrides, Megatron-LM flags, ``TransformerConfig`` keyword arguments, the CuTe DSL
switch in the environment) and what ``check`` reads back. Field names are Megatron-Core's
(transformer_config.py:977, 1268-1284, 511; Megatron-LM's flags are generated from them:
``--moe-expert-rank-capacity-factor``, ``--moe-paged-stash``, ``--moe-paged-stash-buffer-size-
factor-cuda`` / ``-cpu``, ``--use-transformer-engine-op-fuser``: lcmoe/data/config_fields.yaml)."""

from __future__ import annotations

from typing import Any

from lcmoe.errors import LcmoeError
from lcmoe.units import real_number
from lcmoe.workload import TrainingOptions

CAPACITY_FIELD = "moe_expert_rank_capacity_factor"
STASH_FIELD = "moe_paged_stash"
CUDA_FIELD = "moe_paged_stash_buffer_size_factor_cuda"
CPU_FIELD = "moe_paged_stash_buffer_size_factor_cpu"
FUSER_FIELD = "use_transformer_engine_op_fuser"
# TE's fused grouped MLP takes the CuTe DSL kernel for GLU experts only with this set (mcore
# experts.py:394-400 mirrors TE's fuse_grouped_mlp_ops matching; Bridge's Qwen3 GB200 recipes
# set it, perf_recipes/qwen/gb200/qwen3_moe.py:189).
CUTEDSL_ENV = "NVTE_CUTEDSL_FUSED_GROUPED_MLP"


def mcore_stash_kwargs(options: TrainingOptions) -> dict[str, Any]:
    """``TransformerConfig`` fields of the options' rank capacity and paged stash ({} without a
    rank capacity factor): the factor, the TE op fuser it needs with HybridEP (tc:1699-1705), and
    the stash with both buffer factors written out (Megatron-Core's defaults 1.10 / 0.0 are not
    Bridge's recipes' 1.2 / 1.0, so neither is left implicit)."""
    cap = options.moe_expert_rank_capacity_factor
    if cap is None:
        return {}
    out: dict[str, Any] = {CAPACITY_FIELD: cap, FUSER_FIELD: True}
    if options.moe_paged_stash:
        out[STASH_FIELD] = True
        out[CUDA_FIELD] = options.moe_paged_stash_buffer_size_factor_cuda
        out[CPU_FIELD] = options.moe_paged_stash_buffer_size_factor_cpu
    return out


def bridge_stash_overrides(options: TrainingOptions) -> dict[str, Any]:
    """The ``model.*`` overrides of ``mcore_stash_kwargs``, and with the stash an empty
    ``offload_modules`` where nothing is offloaded: Megatron-Core intersects that list with the
    expert modules when the stash is on (transformer_config.py:1912-1914), a recipe that leaves it
    None fails there, and Bridge's stash recipes set it empty (perf_recipes/qwen/common.py:44)."""
    out = {f"model.{key}": value for key, value in mcore_stash_kwargs(options).items()}
    if options.moe_paged_stash and not options.activation_offload_modules:
        out["model.offload_modules"] = []
    return out


def megatron_stash_args(options: TrainingOptions) -> list[str]:
    """The Megatron-LM flags of ``mcore_stash_kwargs`` ([] without a rank capacity factor)."""
    args: list[str] = []
    for key, value in mcore_stash_kwargs(options).items():
        flag = "--" + key.replace("_", "-")
        args.append(flag if value is True else f"{flag}={value}")
    return args


def stash_environment(options: TrainingOptions, gated: bool) -> dict[str, tuple[str, str]]:
    """The CuTe DSL switch for a GLU model's fused grouped MLP ({} otherwise)."""
    if options.moe_expert_rank_capacity_factor is None or not gated:
        return {}
    return {
        CUTEDSL_ENV: (
            "1",
            "the TE op fuser's grouped MLP takes the CuTe DSL SwiGLU kernel only with it (experts.py:394-400); "
            "without it Megatron-Core asserts at start-up (experts.py:286-289)",
        )
    }


def stash_options(
    capacity: object,
    stash: object,
    factors: tuple[object, object],
    *,
    fuser: object,
    cpu_offloading: object,
    names: tuple[str, str, str, str, str],
) -> dict[str, Any]:
    """``TrainingOptions`` fields of a read-back config (``names``: how the config spells the rank
    capacity factor, the stash switch, the two buffer factors and the op fuser, for the
    messages). Megatron-Core refuses the capacity factor with HybridEP without the op fuser
    (tc:1699-1705) and the stash beside layer-level ``cpu_offloading`` (:1905-1906); the other
    rules are ``rules.paged_stash``'s, judged on the run."""
    out: dict[str, Any] = {}
    if capacity is not None:
        out["moe_expert_rank_capacity_factor"] = real_number(capacity, field=names[0], fix="e.g. 1.5")
        if fuser is not True:
            raise LcmoeError(
                names[4],
                fuser,
                f"must be true beside {names[0]} (transformer_config.py:1699-1705: HybridEP's static budget "
                "needs the TE op fuser)",
                f"set {names[4]}",
            )
    if stash is None or stash is False:
        return out
    if stash is not True:
        raise LcmoeError(names[1], stash, "must be true or false", f"write {names[1]}=true or false")
    if cpu_offloading is True:
        raise LcmoeError(
            names[1], True, "cannot be combined with cpu_offloading (transformer_config.py:1905-1906)", "turn one off"
        )
    out["moe_paged_stash"] = True
    # Unset factors are Megatron-Core's defaults (transformer_config.py:1274, 1280).
    defaults = (1.10, 0.0)
    for field, name, value, default in zip((CUDA_FIELD, CPU_FIELD), names[2:4], factors, defaults, strict=True):
        out[field] = default if value is None else real_number(value, field=name, fix="e.g. 1.2")
    return out


def bridge_stash_options(values: dict[str, Any]) -> dict[str, Any]:
    """``stash_options`` of flattened Bridge overrides."""

    def get(field: str) -> object:
        value = values.get(f"model.{field}")
        return None if value is None or value in ("None", "null") else value

    return stash_options(
        get(CAPACITY_FIELD),
        get(STASH_FIELD),
        (get(CUDA_FIELD), get(CPU_FIELD)),
        fuser=get(FUSER_FIELD),
        cpu_offloading=get("cpu_offloading"),
        names=tuple(f"model.{f}" for f in (CAPACITY_FIELD, STASH_FIELD, CUDA_FIELD, CPU_FIELD, FUSER_FIELD)),  # type: ignore[arg-type]
    )


def megatron_stash_options(args: dict[str, Any]) -> dict[str, Any]:
    """``stash_options`` of parsed Megatron-LM flags (names without the dashes)."""
    flags = tuple(f.replace("_", "-") for f in (CAPACITY_FIELD, STASH_FIELD, CUDA_FIELD, CPU_FIELD, FUSER_FIELD))
    return stash_options(
        args.get(flags[0]),
        True if args.get(flags[1]) else None,
        (args.get(flags[2]), args.get(flags[3])),
        fuser=True if args.get(flags[4]) else None,
        cpu_offloading=True if args.get("cpu-offloading") else None,
        names=tuple(f"--{f}" for f in flags),  # type: ignore[arg-type]
    )
