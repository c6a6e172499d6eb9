"""Fine-grained activation offloading in the two config formats: what a plan writes (Bridge
overrides, Megatron-LM flags) and what ``check`` reads back.

Field names are Megatron-Core 0.19.2's ``TransformerConfig`` (transformer_config.py:1229-1265:
``fine_grained_activation_offloading``, ``offload_modules``, ``activation_offload_fraction``),
which Bridge's GPT provider inherits as ``model.*``; Megatron-LM derives its flags from the same
fields (``--fine-grained-activation-offloading``, ``--offload-modules`` nargs, ``--activation-
offload-fraction``: lcmoe/data/config_fields.yaml, generated from the released wheels)."""

from __future__ import annotations

from typing import Any

from lcmoe.errors import LcmoeError
from lcmoe.units import real_number
from lcmoe.workload import TrainingOptions

ENABLE_FIELD = "fine_grained_activation_offloading"
MODULES_FIELD = "offload_modules"
FRACTION_FIELD = "activation_offload_fraction"


def bridge_offload_overrides(options: TrainingOptions) -> dict[str, Any]:
    """The ``model.*`` overrides of the options' offloading; nothing when it is off (Bridge's
    defaults: off, no modules, fraction 1.0), so configs without it stay as they were."""
    if not options.activation_offload_modules:
        return {}
    out: dict[str, Any] = {
        f"model.{ENABLE_FIELD}": True,
        f"model.{MODULES_FIELD}": sorted(options.activation_offload_modules),
    }
    if options.activation_offload_fraction != 1.0:
        out[f"model.{FRACTION_FIELD}"] = options.activation_offload_fraction
    return out


def megatron_offload_args(options: TrainingOptions) -> list[str]:
    """The Megatron-LM flags of the options' offloading ([] when off)."""
    if not options.activation_offload_modules:
        return []
    args = ["--fine-grained-activation-offloading", "--offload-modules", *sorted(options.activation_offload_modules)]
    if options.activation_offload_fraction != 1.0:
        args.append(f"--activation-offload-fraction={options.activation_offload_fraction}")
    return args


def mcore_offload_kwargs(options: TrainingOptions) -> dict[str, Any]:
    """``TransformerConfig`` keyword arguments of the options' offloading ({} when off)."""
    return {key.removeprefix("model."): value for key, value in bridge_offload_overrides(options).items()}


def offload_options(
    enabled: object, modules: list[str], fraction: object, *, cpu_offloading: object, names: tuple[str, str, str]
) -> dict[str, Any]:
    """``TrainingOptions`` fields of a read-back config (``names``: how the config spells the
    enable switch, the module list and the fraction, for the messages). Off: {} (Megatron-Core
    ignores the module list then). On, Megatron-Core refuses an empty list (transformer_config.py:
    1852) and layer-level ``cpu_offloading`` beside it (:1848-1851)."""
    if enabled is None or enabled is False:
        return {}
    if enabled is not True:
        raise LcmoeError(names[0], enabled, "must be true or false", f"write {names[0]}=true or false")
    if not modules:
        raise LcmoeError(names[1], "[]", "must name the modules to offload when offloading is on", "e.g. expert_fc1")
    if cpu_offloading is True:
        raise LcmoeError(
            names[0],
            True,
            "cannot be combined with layer-level cpu_offloading (transformer_config.py:1848-1851)",
            "turn one of the two off",
        )
    share = 1.0 if fraction is None else real_number(fraction, field=names[2], fix="use a fraction between 0 and 1")
    return {"activation_offload_modules": frozenset(modules), "activation_offload_fraction": share}


def bridge_offload_options(values: dict[str, Any], modules: list[str]) -> dict[str, Any]:
    """``offload_options`` of flattened Bridge overrides (``modules``: ``model.offload_modules``
    already read as a list)."""
    key = f"model.{ENABLE_FIELD}"
    return offload_options(
        _unset_none(values.get(key)),
        modules,
        _unset_none(values.get(f"model.{FRACTION_FIELD}")),
        cpu_offloading=_unset_none(values.get("model.cpu_offloading")),
        names=(key, f"model.{MODULES_FIELD}", f"model.{FRACTION_FIELD}"),
    )


def megatron_offload_options(args: dict[str, Any]) -> dict[str, Any]:
    """``offload_options`` of parsed Megatron-LM flags (names without the dashes)."""
    enabled = True if args.get("fine-grained-activation-offloading") else None
    return offload_options(
        enabled,
        [str(m) for m in args.get("offload-modules") or []],
        args.get("activation-offload-fraction"),
        cpu_offloading=True if args.get("cpu-offloading") else None,
        names=("--fine-grained-activation-offloading", "--offload-modules", "--activation-offload-fraction"),
    )


def _unset_none(value: object) -> object:
    """Bridge override spellings of "unset" (None, "None", "null") as None."""
    return None if value is None or value in ("None", "null") else value
