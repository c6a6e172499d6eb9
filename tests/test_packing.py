"""Packed, variable-length documents (issue #35 item 1): the histogram type and its files, the
attention amounts and time it changes (ratios worked by hand in each test), what it leaves alone
(memory with flash attention, every fixed-length number), the configs that carry it and the
planner that takes it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lcmoe.errors import LcmoeError
from lcmoe.estimate.flops import flops_per_token
from lcmoe.estimate.memory import estimate_memory
from lcmoe.estimate.packing import bridge_core_length, real_token_share
from lcmoe.estimate.time import estimate_time
from lcmoe.estimate.time.amounts import time_amounts
from lcmoe.estimate.time.coefficients import shipped_time_coefficients
from lcmoe.estimate.time.compute import attention_saturation
from lcmoe.estimate.time.stage import stage_time
from lcmoe.rules.legality import violations
from lcmoe.specs.doc_lengths import PRESETS, DocLengths, doc_lengths_from_shares, load_doc_lengths, preset
from tests.conftest import run_cli
from tests.helpers import make_run, with_layout, with_options

S = 32768


def docs(*pairs: tuple[int, float], share_of: str = "tokens") -> DocLengths:
    return doc_lengths_from_shares("test", dict(pairs), share_of=share_of)  # type: ignore[arg-type]


def qwen(cp: int = 1, **options: object):  # type: ignore[no-untyped-def]
    # Qwen3-30B-A3B (GQA, 48 layers), 16 H100: TP2, EP8, no PP — every layer on one stage.
    return make_run("qwen3-30b-a3b", seq_len=S, tp=2, cp=cp, ep=8, pp=1, vpp=1, gpus=16, **options)


# ----- the distribution ------------------------------------------------------------------------
def test_attention_length_is_the_token_weighted_mean_piece() -> None:
    """Half the tokens in 1,024-token documents, half in 4,096: a 32K pack holds 16 + 4 documents,
    Σd² = 16·1024² + 4·4096² = 83,886,080, over S: ŝ = 2,560 = ½·1024 + ½·4096."""
    d = docs((1024, 0.5), (4096, 0.5))
    assert d.docs_per_pack(S) == pytest.approx(20.0)
    assert d.attention_length(S) == pytest.approx((16 * 1024**2 + 4 * 4096**2) / S)
    assert d.attention_length(S) == pytest.approx(2560.0)


def test_documents_longer_than_the_pack_are_split_into_pack_long_pieces() -> None:
    """A 10,000-token document at S = 4,096: two 4,096 pieces (81.92% of its tokens) and one of
    1,808 (18.08%): ŝ = 0.8192·4096 + 0.1808·1808 = 3,682.3."""
    d = docs((10_000, 1.0))
    assert d.pieces(4096) == ((1808, pytest.approx(0.1808)), (4096, pytest.approx(0.8192)))
    assert d.attention_length(4096) == pytest.approx(0.8192 * 4096 + 0.1808 * 1808)
    assert docs((S, 1.0)).attention_length(S) == S  # one document per pack: the fixed length


def test_document_shares_become_token_shares() -> None:
    """3 documents of 100 tokens per 1 of 700: tokens 300 : 700."""
    d = docs((100, 3.0), (700, 1.0), share_of="documents")
    assert d.token_shares == pytest.approx((0.3, 0.7))


def test_padding_per_token_under_cp() -> None:
    """CP 4: documents padded to multiples of 8, (8 − 1)/2 = 3.5 tokens each on average: 4,096-token
    documents carry 3.5/4096 padding per real token; S-long pieces none."""
    assert docs((4096, 1.0)).padding_per_token(S, 8) == pytest.approx(3.5 / 4096)
    assert docs((S, 1.0)).padding_per_token(S, 8) == 0.0
    assert docs((4096, 1.0)).padding_per_token(S, 1) == 0.0


@pytest.mark.parametrize("name", PRESETS)
def test_presets_cite_their_shape(name: str) -> None:
    d = preset(name)
    assert "illustrative" in d.source
    assert sum(d.token_shares) == pytest.approx(1.0)
    assert 0 < d.attention_length(S) <= S


# ----- attention FLOPs and time ------------------------------------------------------------------
def _attention_seconds(run) -> float:  # type: ignore[no-untyped-def]
    amounts = time_amounts(run)
    return stage_time(amounts, amounts.stages[0], shipped_time_coefficients(run.hardware.architecture)).attention


def test_attention_flops_and_time_fall_by_the_formula() -> None:
    """The same 32K-token packs as 4,096-token documents (CP 1): core attention per pack falls
    from S² to 8·4096², ×1/8. Its rate falls with the kernel's chunk (L / (L + L½)), the chunk
    being the document: time × (1/8) · sat(32768) / sat(4096)."""
    fixed = qwen()
    packed = with_options(fixed, doc_lengths=docs((4096, 1.0)))
    f_fixed, f_packed = time_amounts(fixed).stages[0].groups[0], time_amounts(packed).stages[0].groups[0]
    assert f_packed.attention_flops / f_fixed.attention_flops == pytest.approx(1 / 8)
    assert f_packed.dense_flops == f_fixed.dense_flops  # GEMMs see every token either way
    c = shipped_time_coefficients("hopper")
    expected = (1 / 8) * attention_saturation(S, c) / attention_saturation(4096, c)
    assert _attention_seconds(packed) / _attention_seconds(fixed) == pytest.approx(expected, rel=1e-9)
    assert estimate_time(packed).step_seconds < estimate_time(fixed).step_seconds


def test_attention_under_cp_pays_the_padding() -> None:
    """CP 2: documents padded to multiples of 4 (1.5 tokens each on average), so a pack holds
    S/(1 + 1.5/4096) real tokens and attention is (1/8)/(1 + 1.5/4096) of the fixed length's; the
    kernel chunk is 4096/(2·2) against 32768/(2·2)."""
    fixed = qwen(cp=2)
    packed = with_options(fixed, doc_lengths=docs((4096, 1.0)))
    share = 1 / (1 + 1.5 / 4096)
    assert real_token_share(packed.layout, packed.options) == pytest.approx(share)
    f_fixed, f_packed = time_amounts(fixed).stages[0].groups[0], time_amounts(packed).stages[0].groups[0]
    assert f_packed.attention_flops / f_fixed.attention_flops == pytest.approx(share / 8)
    c = shipped_time_coefficients("hopper")
    expected = share / 8 * attention_saturation(S / 4, c) / attention_saturation(4096 / 4, c)
    assert _attention_seconds(packed) / _attention_seconds(fixed) == pytest.approx(expected, rel=1e-9)
    # tokens/s counts the real tokens: GBS·S·share per step.
    assert time_amounts(packed).tokens_per_step == pytest.approx(fixed.layout.gbs * S * share)


def test_bridge_tflops_follow_the_documents_only_at_cp1() -> None:
    """Bridge 0.6.2 counts Σ sᵢ² of the real documents with CP = 1 and S² with CP > 1
    (gpt_step.py:394-430), so its logged model FLOPs per step are
    GBS·S·flops_per_token(core = 4096) at CP 1 and the fixed-length count at CP 2."""
    for cp, core in ((1, 4096.0), (2, None)):
        fixed = qwen(cp=cp)
        packed = with_options(fixed, doc_lengths=docs((4096, 1.0)))
        assert bridge_core_length(packed.layout, packed.options) == core
        per_token = flops_per_token(packed.model, S, tp=2, core_len=core).total
        assert time_amounts(packed).model_flops_per_step == pytest.approx(fixed.layout.gbs * S * per_token)
    assert flops_per_token(fixed.model, S, tp=2, core_len=S).total == flops_per_token(fixed.model, S, tp=2).total
    # At CP 2 Bridge's count over the documents' is flops(core = S) / flops(core = 4096·share).
    from lcmoe.estimate.packing import counted_over_real_flops

    share = 1 / (1 + 1.5 / 4096)
    ratio = (
        flops_per_token(fixed.model, S, tp=2).total / flops_per_token(fixed.model, S, tp=2, core_len=4096 * share).total
    )
    assert counted_over_real_flops(packed.model, packed.layout, packed.options) == pytest.approx(ratio)
    assert ratio > 1
    cp1 = with_options(qwen(), doc_lengths=docs((4096, 1.0)))
    assert counted_over_real_flops(cp1.model, cp1.layout, cp1.options) == pytest.approx(1.0)


def test_sliding_window_time_uses_each_document() -> None:
    """GPT-OSS (window 128): per piece 2c = 2·(W − W(W−1)/(2d)); for 64-token documents (shorter
    than the window) 2c = d = 64, against 2·(128 − 128·127/(2S)) at the fixed length."""
    d = docs((64, 1.0))
    assert d.window_context(S, 128) == pytest.approx(64.0)
    assert docs((S, 1.0)).window_context(S, 128) == pytest.approx(2 * (128 - 128 * 127 / (2 * S)))


# ----- what packing leaves alone -----------------------------------------------------------------
def test_memory_with_flash_attention_does_not_change() -> None:
    """Flash/fused attention keeps O(tokens) activations (output + log-sum-exp), never a d² or S²
    score matrix, and the worst pack is still S tokens wide: the peak is the fixed-length one."""
    fixed = qwen()
    packed = with_options(fixed, doc_lengths=docs((512, 1.0)))
    a = estimate_memory(fixed.model, fixed.hardware, fixed.layout, fixed.options)
    b = estimate_memory(packed.model, packed.hardware, packed.layout, packed.options)
    assert b.peak_reserved_bytes == a.peak_reserved_bytes


def test_documents_as_long_as_the_pack_give_the_fixed_length_numbers() -> None:
    fixed = qwen(cp=2)
    packed = with_options(fixed, doc_lengths=docs((S, 1.0)))
    assert estimate_time(packed).as_dict() == estimate_time(fixed).as_dict()


def test_packing_rules() -> None:
    run = with_options(qwen(), doc_lengths=docs((4096, 1.0)))
    assert not violations(run)
    rules = {v.rule for v in violations(with_layout(run, mbs=2, gbs=run.layout.gbs * 2))}
    assert "L-PACK-MBS" in rules
    assert "L-PACK-GRAPHS" in {v.rule for v in violations(with_options(run, cuda_graph_scope=frozenset({"attn"})))}
    assert "L-PACK-BACKEND" in {v.rule for v in violations(with_options(run, attention_backend="unfused"))}
    assert not violations(with_options(qwen(), cuda_graph_scope=frozenset({"attn"})))  # fixed length: no rule


# ----- files -------------------------------------------------------------------------------------
def test_yaml_json_and_csv_files(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("share_of: documents\nlengths: {100: 3, 700: 1}\n")
    (tmp_path / "d.json").write_text(json.dumps({"lengths": {"300": 0.3, "700": 0.7}}))
    (tmp_path / "d.csv").write_text("# my SFT set\nlength,tokens\n300,0.3\n700,0.7\n")
    for name in ("d.yaml", "d.json", "d.csv"):
        loaded = load_doc_lengths(str(tmp_path / name))
        assert loaded is not None
        assert loaded.lengths == (300, 700) if name != "d.yaml" else loaded.lengths == (100, 700)
        assert loaded.token_shares == pytest.approx((0.3, 0.7))
    assert load_doc_lengths("fixed") is None


HOSTILE = {
    "negative.yaml": ("lengths: {512: -1}", "≥ 0"),
    "nan.yaml": ("lengths: {512: .nan}", "finite"),
    "bool.yaml": ("lengths: {512: true}", "finite"),
    "text-length.yaml": ("lengths: {abc: 1}", "whole number"),
    "zero-length.yaml": ("lengths: {0: 1}", "whole number"),
    "huge-length.yaml": ("lengths: {99999999999999999: 1}", "2^40"),
    "all-zero.yaml": ("lengths: {512: 0}", "positive"),
    "not-a-mapping.yaml": ("- 512\n- 1024", "mapping"),
    "lengths-list.yaml": ("lengths: [512, 1024]", "mapping"),
    "unknown-key.yaml": ("lengths: {512: 1}\nweights: 3", "is not one of"),
    "share-of.yaml": ("share_of: bytes\nlengths: {512: 1}", "tokens or documents"),
    "duplicate.yaml": ("lengths: {512: 1, '512': 2}", "twice"),
    "empty.yaml": ("", "mapping"),
    "bad-header.csv": ("len,share\n512,1", "header"),
    "bad-row.csv": ("length,tokens\n512;1", "row 2"),
    "bad-share.csv": ("length,tokens\n512,lots", "not a number"),
    "repeated.csv": ("length,tokens\n512,1\n512,2", "twice"),
    "many.csv": ("length,tokens\n" + "\n".join(f"{i},1" for i in range(1, 10_003)), "10,000"),
    "deep.json": ("[" * 500 + "]" * 500, "nests"),
    "big-int.yaml": ("lengths: {512: " + "9" * 200 + "}", "longer than"),
    "notes.txt": ("512,1", "preset"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_histogram_files_are_refused_in_one_sentence(name: str, tmp_path: Path) -> None:
    text, needle = HOSTILE[name]
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(LcmoeError) as err:
        load_doc_lengths(str(path))
    message = str(err.value)
    assert "\n" not in message and len(message) < 600, message
    assert "--doc-lengths" in message and needle.lower() in message.lower(), message


def test_hostile_file_through_the_cli(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("lengths: {512: -3}")
    code, _out, err = run_cli(
        "estimate", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "32k", "--doc-lengths", str(tmp_path / "d.yaml")
    )
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    (tmp_path / "dir.yaml").mkdir()
    code, _, err = run_cli(
        "plan", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "32k", "--doc-lengths", str(tmp_path / "dir.yaml")
    )
    assert code == 2 and "directory" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = run_cli("plan", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "32k", "--doc-lengths", "sft")
    assert code == 2 and "preset" in err, err


# ----- planner, configs, read-back ---------------------------------------------------------------
def test_plan_emit_check_round_trip(tmp_path: Path) -> None:
    out = tmp_path / "plan"
    args = ["plan", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "32k", "--doc-lengths", "sft-chat", "--top", "2"]
    code, stdout, err = run_cli(*args, "--json", "--emit", str(out), "--yes")
    assert code == 0, err
    payload = json.loads(stdout)
    assert payload["inputs"]["doc_lengths"]["name"] == "sft-chat"
    for plan in payload["plans"]:
        assert plan["layout"]["mbs"] == 1 and plan["cuda_graph_scope"] == []
        assert 0 < plan["packing"]["attention_share_of_fixed"] < 0.1
    assert "dataset.inter_document_masking=true" in (out / "overrides.txt").read_text()
    assert "--dataloader-inter-document-masking" in (out / "megatron_lm_args.txt").read_text()
    for name in ("overrides.txt", "megatron_lm_args.txt"):
        code, stdout, err = run_cli("check", str(out / name), "--json")
        assert code == 0, err
        checked = json.loads(stdout)
        assert checked["inputs"]["doc_lengths"]["name"] == "sft-chat"  # from the plan.json beside it
        assert checked["time"]["step_seconds"] == pytest.approx(payload["plans"][0]["time"]["step_seconds"])
    # Without a plan.json: the config packs, the lengths are unknown (one S document per pack).
    raw = tmp_path / "raw.txt"
    raw.write_text((out / "overrides.txt").read_text())
    code, stdout, err = run_cli("check", str(raw), "-m", "qwen3-30b-a3b", "-n", "16", "--json")
    assert code == 0, err
    assert json.loads(stdout)["inputs"]["doc_lengths"]["name"] == "unknown"
    # --doc-lengths on a config that packs nothing is refused.
    raw.write_text("\n".join(x for x in raw.read_text().splitlines() if "inter_document" not in x))
    code, _, err = run_cli("check", str(raw), "-m", "qwen3-30b-a3b", "-n", "16", "--doc-lengths", "sft-chat")
    assert code == 2 and "packs no documents" in err, err


def test_fixed_length_json_has_no_packing_keys() -> None:
    code, stdout, err = run_cli(
        "estimate", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "32k", "--tp", "2", "--ep", "8", "--json"
    )
    assert code in (0, 1), err
    doc = json.loads(stdout)
    assert "packing" not in doc and "doc_lengths" not in doc["inputs"]
    assert math.isfinite(doc["time"]["step_seconds"])


def test_packed_json_matches_the_shipped_schema(tmp_path: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schemas = Path(__file__).resolve().parent.parent / "docs" / "schema"
    out = tmp_path / "plan"
    base = ["-m", "qwen3-30b-a3b", "-n", "16", "-s", "32k", "--doc-lengths", "pretrain-web"]
    code, plan_json, err = run_cli("plan", *base, "--top", "1", "--json", "--emit", str(out), "--yes")
    assert code == 0, err
    code, estimate_json, err = run_cli("estimate", *base, "--tp", "2", "--ep", "8", "--json")
    assert code in (0, 1), err
    code, check_json, err = run_cli("check", str(out / "overrides.txt"), "--json")
    assert code in (0, 1), err
    for text, name in ((plan_json, "plan"), (estimate_json, "estimate"), (check_json, "check")):
        document = json.loads(text)
        assert document.get("packing") or document["plans"][0]["packing"], name
        schema = json.loads((schemas / f"{name}.schema.json").read_text(encoding="utf-8"))
        jsonschema.validate(document, schema, cls=jsonschema.Draft202012Validator)


def test_sparse_attention_keeps_the_fixed_length_kernel_chunk() -> None:
    """DSA's top-k core reads k keys per query whatever the document's length (work ∝ d, not d²),
    so the ŝ-weighted chunk does not apply: the chunk stays s/cp/2; only the FLOPs follow ŝ."""
    fixed = with_layout(
        make_run("glm-5.2", seq_len=S, tp=1, cp=2, ep=32, pp=4, vpp=1, gpus=256), cp_comm_type="all_gather"
    )
    packed = with_options(fixed, doc_lengths=docs((1024, 1.0)))
    assert time_amounts(packed).attention_chunk == time_amounts(fixed).attention_chunk == S / 4
    qwen_packed = with_options(qwen(cp=2), doc_lengths=docs((1024, 1.0)))
    assert time_amounts(qwen_packed).attention_chunk == 1024 / 4
