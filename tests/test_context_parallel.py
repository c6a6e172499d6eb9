"""Hierarchical CP (``a2a+p2p`` with ``hierarchical_context_parallel_sizes``), a2a CP's heads and the
sequence lengths CP needs: the layout's sizes, the rules (one passing and one failing case each,
arithmetic in the comments), the a2a+p2p time term recomputed from its docstring, the planner's
choice and the emitters' round trip through the readers ``check`` uses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lcmoe.catalog import load_hardware, load_model
from lcmoe.config_io.bridge import overrides_from_run, parse_override_lines, run_from_overrides
from lcmoe.config_io.megatron_args import layout_from_args, tokenize_args
from lcmoe.emit.bridge import overrides_text
from lcmoe.emit.mcore import transformer_config_kwargs
from lcmoe.emit.megatron_lm import megatron_lm_args
from lcmoe.errors import LcmoeError
from lcmoe.estimate.memory import BF16, token_shape
from lcmoe.estimate.time import (
    attention_cp_bytes,
    estimate_time,
    shipped_time_coefficients,
    stage_terms,
    stage_time,
    time_amounts,
)
from lcmoe.estimate.time.stage import cp_layer_seconds, layer_seconds, stage_rates
from lcmoe.layout import ParallelLayout, read_hierarchical_sizes
from lcmoe.plan.fitting import variants
from lcmoe.plan.plans import PlanRequest
from lcmoe.rules.advice import advise
from lcmoe.rules.context_parallel import sensible_hierarchical_sizes
from lcmoe.rules.legality import violations
from lcmoe.run import RunConfig
from tests.helpers import make_run, with_layout, with_options


def _llama_cp16(comm: str = "a2a+p2p", sizes: tuple[int, ...] | None = (8, 2), seq_len: int = 65536) -> RunConfig:
    """Llama3-70B (64 heads, 8 K/V groups), TP 1, CP 16 over two 8-GPU H100 nodes, PP 4: 64 GPUs."""
    run = make_run("llama3-70b", seq_len=seq_len, tp=1, cp=16, ep=1, pp=4, vpp=1, gpus=64, recompute_granularity="full")
    return with_layout(run, cp_comm_type=comm, hierarchical_context_parallel_sizes=sizes)


def _broken(run: RunConfig) -> set[str]:
    return {v.rule for v in violations(run)}


# ----- the layout field -----------------------------------------------------------------------
def test_sizes_are_two_whole_numbers_whose_product_is_cp() -> None:
    lay = ParallelLayout(cp=16, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=[8, 2])  # type: ignore[arg-type]
    assert lay.hierarchical_context_parallel_sizes == (8, 2)  # a list is kept as a tuple
    assert (lay.cp_a2a_size, lay.cp_ring_size) == (8, 2)
    for sizes, words in (
        ((8, 4), "multiply to 32, not CP = 16"),
        ((16,), "has 1 levels"),
        ((4, 2, 2), "has 3 levels"),
        ((0, 16), "whole numbers of 1 or more"),
        ((8.0, 2), "whole numbers of 1 or more"),
    ):
        with pytest.raises(LcmoeError, match=words):
            ParallelLayout(cp=16, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=sizes)  # type: ignore[arg-type]
    with pytest.raises(LcmoeError, match="apply only to cp_comm_type a2a\\+p2p, not p2p"):
        ParallelLayout(cp=16, cp_comm_type="p2p", hierarchical_context_parallel_sizes=(8, 2))


def test_group_sizes_of_every_exchange() -> None:
    for comm, a2a, ring in (("p2p", 1, 16), ("a2a", 16, 1), ("all_gather", 1, 1)):
        lay = ParallelLayout(cp=16, cp_comm_type=comm)
        assert (lay.cp_a2a_size, lay.cp_ring_size) == (a2a, ring), comm


def test_layout_json_names_the_sizes_only_for_a2a_p2p() -> None:
    assert "hierarchical_context_parallel_sizes" not in ParallelLayout(cp=16).as_dict()
    hierarchical = _llama_cp16().layout.as_dict()
    assert hierarchical["hierarchical_context_parallel_sizes"] == [8, 2]


def test_readers_take_lists_and_text_and_drop_sizes_other_exchanges_ignore() -> None:
    for value in ([8, 2], ["8", "2"], "8,2", "[8, 2]", "8 2"):
        assert read_hierarchical_sizes(value, field="f", cp_comm_type="a2a+p2p") == (8, 2), value
    assert read_hierarchical_sizes([8, 2], field="f", cp_comm_type="p2p") is None
    assert read_hierarchical_sizes(None, field="f", cp_comm_type="a2a+p2p") is None
    with pytest.raises(LcmoeError, match="whole numbers"):
        read_hierarchical_sizes("8,x", field="f", cp_comm_type="a2a+p2p")


# ----- rules ----------------------------------------------------------------------------------
def test_a2a_p2p_needs_its_sizes() -> None:
    assert "L-CP-HIER-SIZES" not in _broken(_llama_cp16())
    assert "L-CP-HIER-SIZES" in _broken(_llama_cp16(sizes=None))  # Bridge config.py:1543-1550


def test_a2a_group_must_divide_query_and_kv_heads_per_tp_rank() -> None:
    # Llama3-70B at TP 1: 64 query heads, 8 K/V heads per rank. a2a size 8 divides both.
    assert "L-CP-A2A-HEADS" not in _broken(_llama_cp16())
    # [16, 1]: 64 % 16 = 0 but 8 K/V heads % 16 ≠ 0 (TE asserts q and k heads % cp == 0).
    assert "L-CP-A2A-HEADS" in _broken(_llama_cp16(sizes=(16, 1)))
    # Flat a2a at CP 16: the same 8 % 16 ≠ 0.
    message = {v.rule: v.message for v in violations(_llama_cp16("a2a", None))}["L-CP-A2A-HEADS"]
    assert "8 K/V heads per TP rank divisible by its a2a size 16" in message
    # Query heads: DeepSeek-V3 (MLA: K/V expanded to all 128 heads) at TP 8 → 16 per rank; a2a 32 ✗, 16 ✓.
    dsv3 = make_run(tp=8, cp=32, ep=32, pp=1, vpp=1, gpus=256)
    assert "L-CP-A2A-HEADS" in _broken(with_layout(dsv3, cp_comm_type="a2a"))
    assert "L-CP-A2A-HEADS" not in _broken(
        with_layout(dsv3, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=(16, 2))
    )


def test_packed_documents_refuse_a2a_p2p() -> None:
    from lcmoe.specs.doc_lengths import preset

    packed = with_options(_llama_cp16(), doc_lengths=preset("sft-chat"))
    assert "L-CP-HIER-THD" in _broken(packed)
    assert "L-CP-HIER-THD" not in _broken(
        with_layout(packed, cp_comm_type="p2p", hierarchical_context_parallel_sizes=None)
    )


def test_sequence_divisibility_for_cp_and_sequence_parallel() -> None:
    # CP 16: s % 32. 65536 = 2048·32 ✓; 65552 = 2048·32 + 16 ✗.
    assert "L-SEQ-CP" not in _broken(_llama_cp16())
    assert "L-SEQ-CP" in _broken(with_options(_llama_cp16(), seq_len=65552))
    # SP with TP 8, CP 2: (s/CP) % TP. 12288/2 = 6144 = 768·8 ✓; 12296/2 = 6148, 6148 % 8 = 4 ✗ (12296 % 4 = 0).
    run = make_run("llama3-70b", seq_len=12288, tp=8, cp=2, ep=1, pp=4, vpp=1, gpus=64)
    assert not {"L-SEQ-CP", "L-SEQ-SP"} & _broken(run)
    odd = with_options(run, seq_len=12296)
    assert "L-SEQ-SP" in _broken(odd) and "L-SEQ-CP" not in _broken(odd)


def test_sensible_split_keeps_the_a2a_group_inside_one_nvlink_domain() -> None:
    llama, dsv3, qwen = load_model("llama3-70b"), load_model("deepseek-v3"), load_model("qwen3-235b-a22b")
    assert sensible_hierarchical_sizes(llama, 1, 16, 8) == (8, 2)  # 8 GPUs of a2a, 2 nodes of ring
    assert sensible_hierarchical_sizes(dsv3, 4, 16, 8) == (2, 8)  # TP 4 · a2a 2 = 8 GPUs
    assert sensible_hierarchical_sizes(llama, 1, 8, 8) is None  # CP inside one node: nothing to gain
    assert sensible_hierarchical_sizes(llama, 1, 8, 8, only_beyond_domain=False) == (4, 2)  # estimate's default
    assert sensible_hierarchical_sizes(dsv3, 8, 8, 8) is None  # TP 8 fills the node: no a2a room
    assert sensible_hierarchical_sizes(qwen, 8, 4, 8) is None  # 4 K/V groups over TP 8: 1 per rank
    assert sensible_hierarchical_sizes(qwen, 1, 16, 8) == (4, 4)  # 4 K/V heads per rank bound the a2a


def test_advice_names_both_levels() -> None:
    (text,) = [a.text for a in advise(_llama_cp16()) if a.rule == "LC-CP-COMM"]
    assert text == (
        "CP 16 uses a2a+p2p with a2a over 8 CP ranks (8 GPUs inside one NVLink domain) and a p2p ring over 2, "
        "spanning 16 GPUs across nodes"
    )


# ----- the time term --------------------------------------------------------------------------
def _dsv3_cp16(comm: str = "a2a+p2p", sizes: tuple[int, ...] | None = (8, 2), seq_len: int = 16384) -> RunConfig:
    """DeepSeek-V3 (MLA: K and V for all 128 heads) at TP 1, CP 16 over two H100 nodes, EP 16, PP 4."""
    run = make_run(tp=1, cp=16, ep=16, pp=4, vpp=1, gpus=64, seq_len=seq_len, recompute_granularity="full")
    return with_layout(run, cp_comm_type=comm, hierarchical_context_parallel_sizes=sizes)


def test_a2a_p2p_layer_time_recomputed_from_the_docstring() -> None:
    """cp = a2a bytes / NVLink + 3·(p − 1)·max(0, t_kv·(1 − hidden) − t_attention/p/3), with
    a2a bytes = 2·2·(a − 1)/a · tokens · 2 B · (2·q width + KV width) / tp (MLA: q width n·(qk + rope),
    KV width n·(qk + rope + v)) over the a2a group's tp·a GPUs (NVLink) and t_kv = tokens · 2 B · KV
    width / tp over the NIC (the ring spans the CP group's 16 GPUs). Here a = 2, p = 8, tp = 1 at 4K
    tokens (256 a rank), so each of the 8 outer steps' attention no longer hides its K/V."""
    run = _dsv3_cp16(sizes=(2, 8), seq_len=4096)
    model, c = run.model, shipped_time_coefficients(run.hardware.architecture)
    tokens = token_shape(run.layout, run.options).tokens
    assert tokens == 4096 / 16
    n = model.num_attention_heads
    q_width = n * (model.qk_head_dim + model.qk_pos_emb_head_dim)
    kv_width = n * (model.qk_head_dim + model.qk_pos_emb_head_dim + model.v_head_dim)
    a2a_bytes = 2 * 2 * (2 - 1) / 2 * tokens * BF16 * (2 * q_width + kv_width)
    kv_bytes = tokens * BF16 * kv_width
    assert attention_cp_bytes(run, 0) == pytest.approx((kv_bytes, a2a_bytes))
    amounts = time_amounts(run)
    assert (amounts.cp_outer_ring, amounts.cp_a2a_span, amounts.cp_span) == (8, 2, 16)
    rates = stage_rates(amounts, c)
    nvlink = run.hardware.nvlink_bandwidth * c.nvlink_efficiency
    nic = run.hardware.scaleout_bandwidth * c.scaleout_efficiency
    assert (rates.cp_a2a_bytes_per_second, rates.cp_bytes_per_second) == pytest.approx((nvlink, nic))
    group = amounts.stages[0].groups[0]
    attention = layer_seconds(amounts, group, c, rates).attention
    ring = 3 * (8 - 1) * max(0.0, kv_bytes / nic * (1 - c.cp_ring_hidden) - attention / 8 / 3)
    expected = a2a_bytes / nvlink + ring
    got = cp_layer_seconds(amounts, group, c, rates.cp_bytes_per_second, attention, a2a_bw=nvlink)
    assert got == pytest.approx(expected, rel=1e-12)
    assert ring > 0  # the case exercises both parts


def test_a2a_p2p_limits_are_the_flat_exchanges() -> None:
    """[cp, 1] is flat a2a (the same bytes over the same link, no ring); [1, cp] is the flat ring."""
    dsv3 = make_run(tp=2, cp=32, ep=32, pp=1, vpp=1, gpus=256, seq_len=65536)  # 64 heads per TP rank
    step = {
        name: estimate_time(
            with_layout(dsv3, cp_comm_type=comm, hierarchical_context_parallel_sizes=sizes)
        ).step_seconds
        for name, comm, sizes in (
            ("a2a", "a2a", None),
            ("[32,1]", "a2a+p2p", (32, 1)),
            ("p2p", "p2p", None),
            ("[1,32]", "a2a+p2p", (1, 32)),
        )
    }
    assert step["[32,1]"] == pytest.approx(step["a2a"], rel=1e-12)
    assert step["[1,32]"] == pytest.approx(step["p2p"], rel=1e-12)


def test_a2a_p2p_terms_add_up_to_the_stage_time() -> None:
    run = _dsv3_cp16()
    c = shipped_time_coefficients(run.hardware.architecture)
    amounts = time_amounts(run)
    for stage in amounts.stages:
        time = stage_time(amounts, stage, c)
        terms = stage_terms(amounts, stage, c, time.pp_comm)
        names = {t.name for t in terms if t.field == "cp_comm" and t.amount}
        assert names == {"CP all-to-all", "CP ring KV exchange"}
        cp = sum(t.seconds for t in terms if t.field == "cp_comm")
        assert cp == pytest.approx(time.cp_comm, rel=1e-9)


def test_a2a_p2p_beats_the_flat_ring_where_the_ring_is_exposed() -> None:
    """DeepSeek-V3 at TP 1 (K/V of 128 MLA heads per token) over CP 16, 1K tokens a rank: the flat
    ring's 15 steps over the NIC outrun their attention; a2a+p2p runs 1 outer step and moves the
    rest onto NVLink. At TP 4 (a quarter of the K/V per rank) and 128K the ring hides, and p2p wins."""
    flat, hierarchical = estimate_time(_dsv3_cp16("p2p", None)), estimate_time(_dsv3_cp16())
    assert hierarchical.breakdown["cp_comm"] < flat.breakdown["cp_comm"] / 2
    assert hierarchical.tokens_per_sec_per_gpu > flat.tokens_per_sec_per_gpu
    long_tp4 = make_run(tp=4, cp=16, ep=64, pp=4, vpp=4, gpus=256, recompute_granularity="full")
    hier_tp4 = with_layout(long_tp4, cp_comm_type="a2a+p2p", hierarchical_context_parallel_sizes=(2, 8))
    assert estimate_time(hier_tp4).tokens_per_sec_per_gpu < estimate_time(long_tp4).tokens_per_sec_per_gpu


# ----- the planner ----------------------------------------------------------------------------
def test_planner_tries_a2a_p2p_at_cp16_on_h100_nodes() -> None:
    request = PlanRequest(model=load_model("llama3-70b"), hardware=load_hardware("h100"), num_gpus=64, seq_len=65536)
    run = _llama_cp16("p2p", None)
    legal = [v for v in variants(request, run) if not violations(v)]
    layouts = {(v.layout.cp_comm_type, v.layout.hierarchical_context_parallel_sizes) for v in legal}
    assert layouts == {("p2p", None), ("a2a+p2p", (8, 2))}  # flat a2a: 8 K/V heads do not split over 16
    inside = replace(run, layout=replace(run.layout, cp=8, dp=2))  # CP 8 fits one node
    assert {v.layout.cp_comm_type for v in variants(request, inside)} == {"p2p", "a2a"}


# ----- emitters and readers -------------------------------------------------------------------
def test_bridge_overrides_round_trip() -> None:
    run = _llama_cp16()
    assert overrides_from_run(run)["model.hierarchical_context_parallel_sizes"] == [8, 2]
    assert "model.hierarchical_context_parallel_sizes=[8,2]" in overrides_text(run).split()
    back = run_from_overrides(
        parse_override_lines(overrides_text(run)), model=run.model, hardware=run.hardware, num_gpus=64
    )
    assert back.layout == run.layout
    assert "model.hierarchical_context_parallel_sizes" not in overrides_from_run(_llama_cp16("p2p", None))


def test_bridge_reader_refuses_sizes_that_do_not_multiply_to_cp() -> None:
    run = _llama_cp16()
    text = overrides_text(run).replace(
        "model.hierarchical_context_parallel_sizes=[8,2]", "model.hierarchical_context_parallel_sizes=[8,4]"
    )
    with pytest.raises(LcmoeError, match="multiply to 32, not CP = 16"):
        run_from_overrides(parse_override_lines(text), model=run.model, hardware=run.hardware, num_gpus=64)


def test_megatron_lm_args_round_trip() -> None:
    run = _llama_cp16()
    args = megatron_lm_args(run)
    at = args.index("--hierarchical-context-parallel-sizes")
    assert args[at - 1 : at + 3] == ["--cp-comm-type=a2a+p2p", "--hierarchical-context-parallel-sizes", "8", "2"]
    back = layout_from_args(tokenize_args(args), world_size=64, num_layers=run.model.num_layers)
    assert (back.cp_comm_type, back.hierarchical_context_parallel_sizes) == ("a2a+p2p", (8, 2))
    assert "--hierarchical-context-parallel-sizes" not in megatron_lm_args(_llama_cp16("p2p", None))


def test_mcore_kwargs_carry_the_sizes() -> None:
    _, kwargs = transformer_config_kwargs(_llama_cp16())
    assert (kwargs["cp_comm_type"], kwargs["hierarchical_context_parallel_sizes"]) == ("a2a+p2p", [8, 2])
    _, flat = transformer_config_kwargs(_llama_cp16("p2p", None))
    assert "hierarchical_context_parallel_sizes" not in flat


def test_plan_json_reads_back() -> None:
    """plan.json's layout carries the sizes; ``check --plan`` / ``diagnose --plan`` read them back."""
    from lcmoe.config_io.plan_json import run_from_plan
    from lcmoe.estimate.memory import estimate_memory
    from lcmoe.plan.plans import Plan

    run = _llama_cp16()
    memory = estimate_memory(run.model, run.hardware, run.layout, run.options)
    entry = Plan(run, memory, estimate_time(run)).as_dict()
    assert entry["layout"]["hierarchical_context_parallel_sizes"] == [8, 2]
    doc = {"inputs": {"model": "llama3-70b", "gpu": "h100", "seq_len": run.options.seq_len}, "plans": [entry]}
    assert run_from_plan(doc).layout == run.layout


# ----- the CLI: estimate takes it, check reads it from both config kinds ----------------------
def test_estimate_takes_a2a_p2p_and_fills_in_the_sizes() -> None:
    import json

    from tests.conftest import run_cli

    base = ("estimate", "-m", "llama3-70b", "-g", "h100", "-n", "64", "-s", "64k", "--tp", "1", "--cp", "16")
    base += ("--pp", "4", "--recompute", "full", "--json", "--cp-comm-type", "a2a+p2p")
    for extra, sizes in (((), [8, 2]), (("--hierarchical-cp-sizes", "4,4"), [4, 4])):
        code, out, err = run_cli(*base, *extra)
        assert code in (0, 1), err  # 1: this layout runs out of memory (PP 4 of a 70B at TP 1)
        doc = json.loads(out)
        assert doc["layout"]["hierarchical_context_parallel_sizes"] == sizes
        assert not doc.get("violations"), doc.get("violations")
    code, _, err = run_cli(*base, "--hierarchical-cp-sizes", "8,4")
    assert code == 2 and "multiply to 32, not CP = 16" in err
    code, _, err = run_cli(*base[:-1], "p2p", "--hierarchical-cp-sizes", "8,2")
    assert code == 2 and "apply only to --cp-comm-type a2a+p2p" in err
    # Qwen3-235B at TP 4 holds one K/V head a rank: no a2a group of 2 or more divides it.
    qwen = ("estimate", "-m", "qwen3-235b-a22b", "-g", "h100", "-n", "64", "-s", "128k", "--tp", "4", "--cp", "8")
    code, _, err = run_cli(*qwen, "--ep", "32", "--pp", "2", "--cp-comm-type", "a2a+p2p")
    assert code == 2 and "has no a2a group to default to at TP 4, CP 8" in err


@pytest.mark.parametrize("kind", ["overrides", "megatron_lm"])
def test_check_reads_a2a_p2p_back(kind: str, tmp_path: object) -> None:
    import json
    from pathlib import Path

    from tests.conftest import run_cli

    run = _llama_cp16()
    path = Path(str(tmp_path)) / ("o.txt" if kind == "overrides" else "args.txt")
    path.write_text(overrides_text(run) if kind == "overrides" else " ".join(megatron_lm_args(run)) + "\n")
    code, out, err = run_cli("check", str(path), "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--json")
    doc = json.loads(out)
    assert doc["layout"]["cp_comm_type"] == "a2a+p2p", err
    assert doc["layout"]["hierarchical_context_parallel_sizes"] == [8, 2]
    assert "L-CP-HIER-SIZES" not in {e["rule"] for e in doc["errors"]}
    # Without its sizes, check names the rule.
    text = path.read_text()
    text = text.replace("model.hierarchical_context_parallel_sizes=[8,2]\n", "").replace(
        " --hierarchical-context-parallel-sizes 8 2", ""
    )
    path.write_text(text)
    code, out, _ = run_cli("check", str(path), "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--json")
    assert code == 2 and "L-CP-HIER-SIZES" in {e["rule"] for e in json.loads(out)["errors"]}


def test_plan_cards_show_both_sizes() -> None:
    from lcmoe.plan.format import cp_exchange_text

    assert cp_exchange_text(_llama_cp16().layout.as_dict()) == "a2a+p2p [8,2]"
    assert cp_exchange_text(_llama_cp16("p2p", None).layout.as_dict()) == "p2p"
    assert cp_exchange_text(ParallelLayout(cp=1).as_dict()) == "-"


def test_diagnose_remedies_keep_the_a2a_group_when_cp_changes() -> None:
    from lcmoe.diagnose.remedies import relayout

    run = with_layout(
        make_run("llama3-70b", seq_len=65536, tp=1, cp=16, ep=1, pp=2, vpp=1, gpus=64),  # DP 2
        cp_comm_type="a2a+p2p",
        hierarchical_context_parallel_sizes=(8, 2),
    )
    doubled = relayout(run, "cp", 2).run  # CP 32 = [8, 4], DP 1
    assert doubled is not None
    assert (doubled.layout.cp_comm_type, doubled.layout.hierarchical_context_parallel_sizes) == ("a2a+p2p", (8, 4))
    halved = relayout(run, "cp", 0.5).run  # CP 8: the a2a group alone, so the ring
    assert halved is not None
    assert (halved.layout.cp_comm_type, halved.layout.hierarchical_context_parallel_sizes) == ("p2p", None)


def test_preflight_checks_transformer_engine_for_the_cp_exchange() -> None:
    """a2a+p2p needs TE ≥ 1.12, any non-ring exchange TE ≥ 1.10 (mcore extensions/transformer_engine.py:1869-1876)."""
    from lcmoe.diagnose.preflight import _te_cp_check

    hierarchical, flat = _llama_cp16(), _dsv3_cp16("a2a", None)
    assert _te_cp_check("1.11.0", hierarchical).status == "fail"
    assert _te_cp_check("1.12.0", hierarchical).status == "pass"
    assert _te_cp_check("1.9.0", flat).status == "fail" and _te_cp_check("2.4.0", flat).status == "pass"
    assert _te_cp_check("1.9.0", _llama_cp16("p2p", None)).status == "pass"
