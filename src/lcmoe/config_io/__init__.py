"""Reading and writing configurations in the formats users already have (Megatron-LM args, Bridge YAML/overrides)."""
