"""One test per legality rule (the arithmetic in the comment), and rule-id integrity."""

from __future__ import annotations

import pytest

from lcmoe.rules.advice import RULE_IDS as ADVICE_IDS
from lcmoe.rules.advice import advise, suggested_cp
from lcmoe.rules.legality import RULE_IDS, RULES, violations
from tests.helpers import make_run, with_layout, with_options


def broken(run) -> set[str]:  # type: ignore[no-untyped-def]
    return {v.rule for v in violations(run)}


def test_guidance_layout_is_legal() -> None:
    assert broken(make_run()) == set()


def test_expert_grid_must_fold() -> None:
    # 256 GPUs, EP 3·PP 8 = 24 does not divide 256
    assert "L-WORLD-EP-FOLD" in broken(with_layout(make_run(), ep=3))


def test_experts_must_split_over_ep() -> None:
    # 256 experts over EP 512
    assert "L-EXPERTS-EP" in broken(with_layout(make_run(gpus=512, cp=64), ep=512))


def test_heads_must_split_over_tp() -> None:
    # Qwen3-235B: 4 query groups, TP 8 → 8 % 4 == 0 is fine; 64 heads / TP 3 is not
    assert "L-HEADS-TP" in broken(with_layout(make_run("qwen3-235b-a22b", cp=4, gpus=96), tp=3))


def test_moe_with_biases_needs_etp_1() -> None:
    run = make_run("gpt-oss-120b", seq_len=32768, tp=2, cp=4, ep=8, pp=4, vpp=1, gpus=64)
    assert "L-MOE-BIAS-ETP" in broken(with_layout(run, etp=2))


def test_gbs_must_divide_by_mbs_dp() -> None:
    run = make_run(cp=8, gpus=256)  # DP 4
    assert "L-GBS" in broken(with_layout(run, gbs=6))


def test_vpp_needs_microbatches_multiple_of_pp() -> None:
    run = make_run()  # PP 8, VPP 4, DP 1
    assert "L-VPP-MICROBATCHES" in broken(with_layout(run, gbs=12))


def test_layers_must_split_without_layout() -> None:
    assert "L-PP-LAYERS" in broken(with_layout(make_run(), pipeline_layout=None))


def test_sequence_divisible_by_twice_cp() -> None:
    assert "L-SEQ-CP" in broken(with_options(make_run(), seq_len=131072 + 32))


def test_a2a_cp_needs_heads_divisible() -> None:
    run = make_run("qwen3-235b-a22b", seq_len=131072, tp=4, cp=32, ep=32, pp=1, vpp=1, gpus=128)
    assert "L-CP-A2A-HEADS" in broken(with_layout(run, cp_comm_type="a2a"))  # 16 heads per TP rank, CP 32


def test_gdn_heads_split_over_tp_cp() -> None:
    # Qwen3-Next: 16 key heads, TP·CP = 32
    run = make_run("qwen3-next-80b-a3b", seq_len=131072, tp=4, cp=8, ep=8, pp=1, vpp=1, gpus=64)
    assert "L-GDN-TPCP" in broken(run)


def test_gdn_with_cp_is_version_keyed() -> None:
    run = make_run("qwen3-next-80b-a3b", seq_len=131072, tp=1, cp=4, ep=8, pp=1, vpp=1, gpus=64)
    assert "L-GDN-CP-VERSION" in {v.rule for v in violations(run, megatron_core_version="0.16.1")}
    assert "L-GDN-CP-VERSION" not in {v.rule for v in violations(run, megatron_core_version="0.19.2")}


def test_deepep_refused_on_nvl72() -> None:
    run = make_run("qwen3-235b-a22b", "gb200", tp=4, cp=4, ep=32, pp=4, vpp=12, gpus=128, dispatcher="deepep")
    assert "L-DISPATCHER-GPU" in broken(run)


def test_offload_needs_distributed_optimizer() -> None:
    run = with_options(make_run(), optimizer_offload_fraction=0.5, distributed_optimizer=False)
    assert "L-OFFLOAD-DISTOPT" in broken(run)


def test_full_recompute_with_te_graphs_refused() -> None:
    run = with_options(make_run(), recompute_granularity="full", cuda_graph_scope=frozenset({"attn"}))
    assert "L-RECOMPUTE-GRAPHS" in broken(run)


def test_mla_up_proj_needs_mla() -> None:
    run = make_run(
        "qwen3-235b-a22b",
        cp=4,
        gpus=1024,
        recompute_granularity="selective",
        recompute_modules=frozenset({"mla_up_proj"}),
    )
    assert "L-RECOMPUTE-MODULES" in broken(run)


def test_ep_overlap_needs_vpp_with_pp() -> None:
    run = with_options(
        with_layout(make_run(), vpp=1, pipeline_layout="Et*7|t*8|t*8|t*8|t*8|t*8|t*8|t*6mL"),
        overlap_moe_expert_parallel_comm=True,
    )
    assert "L-EP-OVERLAP" in broken(run)


def test_ep_overlap_with_mtp_needs_pp() -> None:
    # Found by building Megatron-Core's TransformerConfig from a DSV3 PP1 plan (0.16.1 refuses it).
    run = with_options(make_run(cp=8, pp=1, vpp=1), overlap_moe_expert_parallel_comm=True)
    assert "L-EP-OVERLAP" in broken(run)


def test_mxfp8_refused_on_hopper() -> None:
    assert "L-PRECISION-GPU" in broken(with_options(make_run(), precision="mxfp8"))


def test_every_rule_has_source_and_fix() -> None:
    for rule in RULES:
        assert rule.source and rule.fix and rule.id.startswith("L-")
    assert len(RULE_IDS) == len(RULES)


def test_advice_ids_match_the_guidance_table() -> None:
    guidance = {
        "LC-CP-START",
        "LC-DP-BUDGET",
        "LC-FIT-ONLY",
        "LC-BASELINE-DRIFT",
        "LC-GPU-FEASIBLE",
        "LC-GBS-SHRINK",
        "LC-RECOMPUTE-SELECTIVE",
        "LC-NO-ATTN-RECOMPUTE",
        "LC-OFFLOAD-128K",
        "LC-PRECISION",
        "LC-TP-FOR-CP",
        "LC-CP-COMM",
        "LC-DISPATCHER",
        "LC-CUDA-GRAPH-STATIC",
        "LC-CP-NOT-EP",
        "LC-CONTAINER",
    }
    assert guidance == ADVICE_IDS


@pytest.mark.parametrize("seq,cp", [(4096, 1), (16384, 4), (131072, 32), (262144, 64)])
def test_cp_starting_guess(seq: int, cp: int) -> None:
    assert suggested_cp(seq) == cp


def test_dp1_warns() -> None:
    assert "LC-DP-BUDGET" in {a.rule for a in advise(make_run())}
