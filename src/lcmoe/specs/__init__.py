"""Specs: what the model is and what hardware it runs on (pure data, validated on construction)."""

from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec

__all__ = ["HardwareSpec", "ModelSpec"]
