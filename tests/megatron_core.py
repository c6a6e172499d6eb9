"""Build Megatron-Core's own config from lcmoe's values (skipped when megatron-core is absent)."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

from lcmoe.emit.mcore import transformer_config_kwargs
from lcmoe.run import RunConfig


def available() -> bool:
    try:
        import megatron.core.transformer.transformer_config  # noqa: F401
    except Exception:
        return False
    return True


def build(run: RunConfig) -> Any:
    """Construct the config; Megatron's ``__post_init__`` raises on anything it refuses."""
    import torch
    from megatron.core.transformer import transformer_config as tc

    name, kwargs = transformer_config_kwargs(run)
    cls = getattr(tc, name)
    known = {f.name for f in dataclasses.fields(cls)}
    missing = set(kwargs) - known
    assert not missing, f"megatron-core has no fields {sorted(missing)}"
    kwargs.update(params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kwargs)
