"""Every emitted Bridge override / YAML path exists in the released megatron-bridge 0.6.2
``ConfigContainer`` dataclasses (with megatron-core 0.19.2 bases), and its value fits the field's
annotation. Read from the wheels' source, no import (tests/bridge_fields.py)."""

from __future__ import annotations

import ast
import zipfile

import pytest

from lcmoe.config_io.bridge import MIXED_PRECISION, overrides_from_run
from lcmoe.run import RunConfig
from lcmoe.specs.doc_lengths import preset
from tests import bridge_fields as bf
from tests.helpers import make_run, with_layout, with_options

pytestmark = pytest.mark.skipif(not bf.available(), reason="megatron-bridge/core wheels not downloaded")


def _feature_runs() -> list[RunConfig]:
    """One run per emitter branch: selective/full recompute, TE and full-iteration graphs, offload,
    each dispatcher, a2a and a2a+p2p CP, explicit layout and plain VPP, BF16 and FP8, LoRA."""
    base = make_run()
    return [
        base,
        with_options(base, recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
        with_options(
            base,
            cuda_graph_scope=frozenset({"attn", "moe_router", "moe_preprocess"}),
            dispatcher="hybridep",
            overlap_moe_expert_parallel_comm=True,
        ),
        with_options(base, cuda_graph_scope=frozenset({"full_iteration"}), dispatcher="deepep"),
        with_options(base, optimizer_offload_fraction=0.5, precision="fp8-blockwise"),
        # a2a CP at TP 1: the 4 K/V groups split over CP 4 (at TP 4, one K/V head a rank: L-CP-A2A-HEADS).
        with_layout(
            make_run("qwen3-235b-a22b", "gb200", tp=1, cp=4, ep=32, pp=4, vpp=12, gpus=128), cp_comm_type="a2a"
        ),
        make_run("llama3-70b", cp=4, ep=1, pp=8, vpp=5, gpus=256, dispatcher="alltoall"),
        make_run("qwen3-30b-a3b", tp=2, cp=1, ep=8, pp=1, vpp=1, gpus=16, peft="lora", lora_input_regather=True),
        # Packed documents: dataset.inter_document_masking (inherited from MCore's GPTDatasetConfig).
        make_run("qwen3-30b-a3b", tp=2, cp=2, ep=8, pp=1, vpp=1, gpus=16, doc_lengths=preset("sft-chat")),
        # Hierarchical CP: model.hierarchical_context_parallel_sizes (a list of ints).
        with_layout(
            make_run("llama3-70b", cp=16, ep=1, pp=4, vpp=1, gpus=64),
            cp_comm_type="a2a+p2p",
            hierarchical_context_parallel_sizes=(8, 2),
        ),
    ]


@pytest.mark.parametrize("run", _feature_runs())
def test_every_override_path_exists_with_a_compatible_type(run: RunConfig) -> None:
    container = bf.container_fields()
    assert {"model", "train", "optimizer", "ddp", "dataset", "comm_overlap", "mixed_precision"} <= set(container)
    for key, value in overrides_from_run(run).items():
        section, _, field = key.partition(".")
        if not field:
            assert section in container, key
            continue
        assert section in bf.SECTIONS, f"{key}: unknown ConfigContainer section"
        fields = bf.fields_of(*bf.SECTIONS[section])
        assert field in fields, f"{key} is not a field of {bf.SECTIONS[section][1]}"
        assert bf.accepts(fields[field], value), f"{key}={value!r} does not fit {fields[field]}"


def test_every_mixed_precision_name_is_registered() -> None:
    wheel = next(bf.WHEELS.glob("megatron_bridge-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        tree = ast.parse(archive.read("megatron/bridge/training/mixed_precision.py").decode())
    defined = {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)}
    assert set(MIXED_PRECISION.values()) <= defined
