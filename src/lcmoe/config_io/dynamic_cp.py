"""Dynamic context parallelism in the config formats: what a plan writes (Bridge overrides,
Megatron-LM flags, Megatron-Core ``TransformerConfig`` keywords) and what ``check`` reads back.

Spellings: Megatron-Core 0.19.2 names the feature ``hybrid_context_parallel`` with
``max_seqlen_per_dp_cp_rank`` (model_parallel_config.py:111-125), the flags
``--hybrid-context-parallel`` / ``--max-seqlen-per-dp-cp-rank`` (lcmoe/data/config_fields.yaml);
Megatron-LM's dev branch renames it ``dynamic_context_parallel`` (``--dynamic-context-parallel``)
beside ``min_dynamic_context_parallel_size`` and keeps ``hybrid_context_parallel`` as a deprecated
alias that turns it on (dev model_parallel_config.py:83-96, 496-508). So lcmoe writes the 0.19.2
spelling, which both accept, and the dev one only for a minimum group size above 1, which only dev
has (L-DCP-MIN-SIZE-VERSION). Megatron-LM also asserts ``--calculate-per-token-loss`` and the
'single' data loader with it (training/arguments.py:1404-1409): the flags say both, and the Bridge
and Megatron-Core configs set ``calculate_per_token_loss`` (a ``TransformerConfig`` field)."""

from __future__ import annotations

from typing import Any

from lcmoe.run import RunConfig
from lcmoe.units import whole_number


def mcore_dynamic_cp_kwargs(run: RunConfig) -> dict[str, Any]:
    """``TransformerConfig`` keyword arguments of the run's dynamic CP ({} when off)."""
    opt = run.options
    if not opt.dynamic_context_parallel:
        return {}
    out: dict[str, Any] = {}
    if opt.min_dynamic_context_parallel_size > 1:
        out["dynamic_context_parallel"] = True
        out["min_dynamic_context_parallel_size"] = opt.min_dynamic_context_parallel_size
    else:
        out["hybrid_context_parallel"] = True
    # Unset: seq_len / CP, as estimate.dynamic_cp.max_seqlen takes it (Megatron has no default).
    out["max_seqlen_per_dp_cp_rank"] = opt.max_seqlen_per_dp_cp_rank or max(opt.seq_len // run.layout.cp, 1)
    out["calculate_per_token_loss"] = True
    return out


def bridge_dynamic_cp_overrides(run: RunConfig) -> dict[str, Any]:
    """The ``model.*`` overrides of the run's dynamic CP ({} when off)."""
    return {f"model.{key}": value for key, value in mcore_dynamic_cp_kwargs(run).items()}


def megatron_dynamic_cp_args(run: RunConfig) -> list[str]:
    """The Megatron-LM flags of the run's dynamic CP ([] when off)."""
    kwargs = mcore_dynamic_cp_kwargs(run)
    if not kwargs:
        return []
    args = ["--dynamic-context-parallel" if "dynamic_context_parallel" in kwargs else "--hybrid-context-parallel"]
    if "min_dynamic_context_parallel_size" in kwargs:
        args.append(f"--min-dynamic-context-parallel-size={kwargs['min_dynamic_context_parallel_size']}")
    args += [
        f"--max-seqlen-per-dp-cp-rank={kwargs['max_seqlen_per_dp_cp_rank']}",
        "--calculate-per-token-loss",
        "--dataloader-type=single",
    ]
    return args


def dynamic_cp_options(on: object, most: object, min_size: object, *, names: tuple[str, str, str]) -> dict[str, Any]:
    """``TrainingOptions`` fields of a read-back config: ``on`` (either spelling's switch), the
    per-rank maximum and the minimum group size (``names``: their spellings, for the messages).
    Off: {} (Megatron ignores the two sizes then)."""
    if on is None or on is False or on in ("false", "False"):
        return {}
    if on not in (True, "true", "True"):
        from lcmoe.errors import LcmoeError

        raise LcmoeError(names[0], on, "must be true or false", f"write {names[0]}=true or false")
    fields: dict[str, Any] = {"dynamic_context_parallel": True}
    if most is not None and most not in ("None", "null"):
        fields["max_seqlen_per_dp_cp_rank"] = whole_number(most, field=names[1])
    if min_size is not None and min_size not in ("None", "null"):
        fields["min_dynamic_context_parallel_size"] = whole_number(min_size, field=names[2])
    return fields


def bridge_dynamic_cp_options(values: dict[str, Any]) -> dict[str, Any]:
    """``dynamic_cp_options`` of flattened Bridge overrides (either spelling of the switch)."""
    on = values.get("model.dynamic_context_parallel")
    if on in (None, False, "false", "False"):
        on = values.get("model.hybrid_context_parallel")
    return dynamic_cp_options(
        on,
        values.get("model.max_seqlen_per_dp_cp_rank"),
        values.get("model.min_dynamic_context_parallel_size"),
        names=(
            "model.hybrid_context_parallel",
            "model.max_seqlen_per_dp_cp_rank",
            "model.min_dynamic_context_parallel_size",
        ),
    )


def megatron_dynamic_cp_options(args: dict[str, Any]) -> dict[str, Any]:
    """``dynamic_cp_options`` of parsed Megatron-LM flags (names without the dashes)."""
    on = True if args.get("dynamic-context-parallel") or args.get("hybrid-context-parallel") else None
    return dynamic_cp_options(
        on,
        args.get("max-seqlen-per-dp-cp-rank"),
        args.get("min-dynamic-context-parallel-size"),
        names=("--hybrid-context-parallel", "--max-seqlen-per-dp-cp-rank", "--min-dynamic-context-parallel-size"),
    )
