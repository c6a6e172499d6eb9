"""What kind each decoder layer of a model is: its sequence mixer and its signature (the facts
that make two layers cost the same). A property of the model, so it lives with the spec: the
layout code (pipeline stages) and the estimators both read it, and neither imports the other."""

from __future__ import annotations

from lcmoe.errors import LcmoeError
from lcmoe.specs.layer_patterns import AttentionKind
from lcmoe.specs.model import ModelSpec

LayerSignature = tuple[bool, AttentionKind, bool, bool]


def attention_kind(spec: ModelSpec, layer: int) -> AttentionKind:
    """Sequence-mixer kind of decoder layer ``layer`` (0-based); MTP layers pass
    ``spec.mtp_layer`` (the rule is ``ModelSpec._attention_kinds``, cached on the frozen spec).

    This is the estimators' door to a layer's mixer, so a model whose time or memory lcmoe does not
    model (``ModelSpec.cost_model_gaps``: DeepSeek-V4's CSA/HCA, hyper-connections) is refused here
    with one sentence instead of being costed as the GQA branch every estimator falls back to.
    Parameter counts read ``mixer_kind``, which does not refuse."""
    if spec.cost_model_gaps:
        raise LcmoeError(
            "model",
            spec.name,
            f"time and memory are not modelled for its {' and '.join(spec.cost_model_gaps)}",
            "lcmoe counts its parameters (lcmoe models) but cannot plan or estimate it yet",
        )
    return spec._attention_kinds[layer]


def mixer_kind(spec: ModelSpec, layer: int) -> AttentionKind:
    """``attention_kind`` without the cost-model check: for parameter counts, which every
    catalogued mixer has."""
    return spec._attention_kinds[layer]


def layer_signature(spec: ModelSpec, layer: int) -> LayerSignature:
    """What makes two layers identical for every cost lcmoe computes: MoE or not, mixer kind,
    MLP or not (hybrid layers hold one of the two), DSA indexer or not."""
    return spec._layer_signatures[layer]
