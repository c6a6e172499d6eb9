"""lcmoe: plan, check and debug long-context Mixture-of-Experts training on Megatron Bridge."""

__version__ = "0.1.0"
