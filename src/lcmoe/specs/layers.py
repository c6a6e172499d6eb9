"""What kind each decoder layer of a model is: its sequence mixer and its signature (the facts
that make two layers cost the same). A property of the model, so it lives with the spec: the
layout code (pipeline stages) and the estimators both read it, and neither imports the other."""

from __future__ import annotations

from lcmoe.specs.model import AttentionKind, ModelSpec

LayerSignature = tuple[bool, AttentionKind, bool, bool]


def attention_kind(spec: ModelSpec, layer: int) -> AttentionKind:
    """Sequence-mixer kind of decoder layer ``layer`` (0-based); MTP layers pass
    ``spec.mtp_layer`` (the rule is ``ModelSpec._attention_kinds``, cached on the frozen spec)."""
    return spec._attention_kinds[layer]


def layer_signature(spec: ModelSpec, layer: int) -> LayerSignature:
    """What makes two layers identical for every cost lcmoe computes: MoE or not, mixer kind,
    MLP or not (hybrid layers hold one of the two), DSA indexer or not."""
    return spec._layer_signatures[layer]
