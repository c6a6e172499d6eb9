"""Kernel-rate table and lookups (issue 32 item 2): every measured point comes back exactly,
interpolation stays between neighbours, GPUs fall back to siblings by peak ratio, and the shape
effects the time model relies on hold in the data."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from lcmoe.errors import LcmoeError
from lcmoe.estimate.kernel_rates import (
    KernelRates,
    KernelRow,
    RateLookup,
    attention_rate,
    dsa_indexer_rate,
    dsa_sparse_rate,
    gdn_scan_rate,
    gemm_rate,
    grouped_gemm_rate,
    kernel_rates_from_dict,
    load_kernel_rates,
    mamba_scan_rate,
    resolve_gpu,
)

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "lcmoe" / "data" / "kernel_rates.yaml"


@pytest.fixture(scope="module")
def rates() -> KernelRates:
    return load_kernel_rates()


def _int(row: KernelRow, name: str) -> int:
    value = row.get(name)
    assert isinstance(value, int | float)
    return int(value)


def _lookup_row(rates: KernelRates, row: KernelRow) -> RateLookup | None:
    """The public lookup called with a row's own GPU and shape."""
    g, d, p = row.gpu, row.dtype, str(row.get("pass"))
    if row.kernel == "attention":
        kind = str(row.get("kind"))
        window = _int(row, "window") if kind == "swa" else None
        hq, hv, seq = _int(row, "head_dim_qk"), _int(row, "head_dim_v"), _int(row, "seq")
        return attention_rate(rates, g, kind, p, hq, hv, seq, window=window, causal=row.get("causal") is True, dtype=d)
    if row.kernel == "dsa_indexer":
        return dsa_indexer_rate(rates, g, _int(row, "seq_kv"), str(row.get("key_ranges")), p, dtype=d)
    if row.kernel == "dsa_sparse":
        return dsa_sparse_rate(rates, g, p, _int(row, "head_dim_qk"), _int(row, "topk"), dtype=d)
    if row.kernel == "gdn":
        th = _int(row, "token_heads")
        return gdn_scan_rate(rates, g, p, _int(row, "head_dim"), th, 1, chunk=_int(row, "chunk"), dtype=d)
    if row.kernel == "mamba2":
        return mamba_scan_rate(rates, g, p, _int(row, "d_state"), _int(row, "headdim"), _int(row, "seq"), dtype=d)
    if row.kernel == "grouped_gemm":
        tpe, k, n = _int(row, "tokens_per_expert"), _int(row, "k_in"), _int(row, "n_out")
        return grouped_gemm_rate(rates, g, d, tpe, k, n)
    return gemm_rate(rates, g, d, _int(row, "m"), _int(row, "n"), _int(row, "k"))


def test_every_measured_point_is_reproduced_exactly(rates: KernelRates) -> None:
    rows = [r for r in rates.rows if r.lookup]
    assert len(rows) > 300
    for row in rows:
        got = _lookup_row(rates, row)
        assert got is not None, row.row_id
        assert got.value == row.value, row.row_id
        assert got.rows == (row,) and got.factors == (1.0,) and not got.clamped and not got.substitutions


def test_every_row_cites_a_source_and_has_a_positive_rate(rates: KernelRates) -> None:
    for row in rates.rows:
        assert row.source.strip() and row.value > 0 and row.unit in ("flop/s", "token_head/s"), row.row_id


def test_derived_values_are_marked(rates: KernelRates) -> None:
    # the GDN backward rows are fwd+bwd − fwd: this file's arithmetic, not the source's
    gdn = [r for r in rates.rows if r.kernel == "gdn" and r.gpu == "gb200"]
    bwd = [r for r in gdn if r.get("pass") == "bwd"]
    assert bwd and all(r.derived for r in bwd)

    def ms(pass_: str, row: KernelRow) -> float:
        """Measured time (ms) of the same shape: token·heads / rate."""
        same = [r for r in gdn if r.get("pass") == pass_ and r.get("batch") == row.get("batch")]
        same = [r for r in same if r.get("token_heads") == row.get("token_heads")]
        return _int(same[0], "token_heads") / same[0].value * 1e3

    for r in bwd:
        assert ms("bwd", r) == pytest.approx(ms("fwd_bwd", r) - ms("fwd", r), abs=1e-9), r.row_id


def test_gdn_token_heads_is_batch_times_seq_times_heads(rates: KernelRates) -> None:
    for r in rates.rows:
        if r.kernel == "gdn":
            assert r.get("token_heads") == _int(r, "batch") * _int(r, "seq") * _int(r, "heads"), r.row_id


def test_interpolation_is_linear_in_log_shape(rates: KernelRates) -> None:
    # FA3 H100 d128 causal fwd: 2K → 521, 4K → 579 TFLOP/s; at √(2K·4K) the rate is the midpoint
    got = attention_rate(rates, "h100", "mha", "fwd", 128, 128, round(math.sqrt(2048 * 4096)))
    assert got is not None
    assert got.value / 1e12 == pytest.approx((521 + 579) / 2, rel=1e-3)
    assert [r.row_id for r in got.rows] == ["fa3-h100-fwd-d128-causal[seq=2048]", "fa3-h100-fwd-d128-causal[seq=4096]"]


def _rising(lookups: list[RateLookup | None], *, strictly: bool = False) -> bool:
    """Every lookup found and each rate ≥ (or > with ``strictly``) the one before."""
    values = [lk.value for lk in lookups if lk is not None]
    pairs = list(itertools.pairwise(values))
    return len(values) == len(lookups) and all(b > a if strictly else b >= a for a, b in pairs)


def test_interpolation_is_monotone_where_the_data_is(rates: KernelRates) -> None:
    seqs = [int(512 * 2 ** (i / 8)) for i in range(41)]  # 512 … 16K, 8 steps per doubling
    values = [attention_rate(rates, "h100", "mha", "fwd", 128, 128, s) for s in seqs]
    assert _rising(values)
    # GDN on GB200, d128: rate rises with token·heads (launch-bound small calls)
    th = [131072 * 2 ** (i / 4) for i in range(13)]
    gdn = [gdn_scan_rate(rates, "gb200", "fwd", 128, int(t), 1) for t in th]
    assert _rising(gdn)


def test_outside_the_measured_range_the_rate_is_clamped(rates: KernelRates) -> None:
    far = attention_rate(rates, "h100", "mha", "fwd", 128, 128, 1 << 20)
    edge = attention_rate(rates, "h100", "mha", "fwd", 128, 128, 16384)
    assert far is not None and edge is not None
    assert far.value == edge.value == 616e12 and far.clamped == ("seq",) and "clamped" in far.citation()


def test_h200_falls_back_to_h100_at_factor_one(rates: KernelRates) -> None:
    # no MHA rows are measured on H200: the H100 FA3 rows are used, same 989 TFLOP/s peak
    got = attention_rate(rates, "NVIDIA H200", "mha", "fwd", 128, 128, 8192, causal=False)
    assert got is not None and got.measured_gpus == ("h100",) and got.factors == (1.0,) and got.value == 646e12
    assert any("measured on h100" in s for s in got.substitutions)


def test_gb200_falls_back_to_b200_by_peak_ratio(rates: KernelRates) -> None:
    # grouped GEMM BF16 is measured on B200 only: GB200 = B200 × 2500/2250
    b200 = grouped_gemm_rate(rates, "b200", "bf16", 16000, 7168, 2048)
    gb200 = grouped_gemm_rate(rates, "gb200-nvl72", "bf16", 16000, 7168, 2048)
    assert b200 is not None and gb200 is not None and gb200.measured_gpus == ("b200",)
    assert gb200.value == pytest.approx(b200.value * 2500 / 2250)


def test_a_sparse_series_on_the_gpu_does_not_hide_a_siblings_curve(rates: KernelRates) -> None:
    # H200 has one grouped-GEMM point (128000 tok/expert, 705 TFLOP/s); at 512 tok/expert the
    # H100 torch._grouped_mm point (525) is used, and the H200 point still wins its own key
    small = grouped_gemm_rate(rates, "h200", "bf16", 512, 5120, 8192)
    own = grouped_gemm_rate(rates, "h200", "bf16", 128000, 7168, 7168)
    assert small is not None and own is not None
    assert small.measured_gpus == ("h100",) and small.value < 0.8 * own.value
    assert own.measured_gpus == ("h200",) and own.factors == (1.0,)


def test_the_gpus_own_point_wins_a_shared_key(rates: KernelRates) -> None:
    # GB200 MLA causal fwd at 8K: cuDNN on GB200 (1585), not FA4 on B200 × 2500/2250
    got = attention_rate(rates, "gb200", "mla", "fwd", 192, 128, 8192)
    assert got is not None and got.value == 1585e12 and got.measured_gpus == ("gb200",)


def test_no_measurement_in_the_family_gives_none(rates: KernelRates) -> None:
    assert dsa_sparse_rate(rates, "h100", "bwd", 576, 2048) is None  # no public Hopper sparse-MLA backward
    assert mamba_scan_rate(rates, "h100", "bwd", 128, 64, 16384) is None
    assert attention_rate(rates, "h100", "swa", "fwd", 64, 64, 8192, window=128, dtype="mxfp8") is None


def test_hopper_mla_backward_borrows_the_d128_curve_and_says_so(rates: KernelRates) -> None:
    got = attention_rate(rates, "h100", "mla", "bwd", 192, 128, 16384)
    assert got is not None and got.substitutions and "head_dim_qk" in got.clamped


def test_backward_is_slower_than_forward_per_flop(rates: KernelRates) -> None:
    for gpu, kind, d in (("h100", "mha", 128), ("h200", "gqa", 128), ("gb200", "mla", 192), ("gb300", "gqa", 128)):
        for seq in (2048, 8192, 32768):
            fwd = attention_rate(rates, gpu, kind, "fwd", d, 128, seq, causal=False)
            bwd = attention_rate(rates, gpu, kind, "bwd", d, 128, seq, causal=False)
            assert fwd is not None and bwd is not None and bwd.value < fwd.value, (gpu, kind, seq)


def test_sliding_window_at_128k_is_cheaper_than_full_causal(rates: KernelRates) -> None:
    seq, window, heads, d = 131072, 128, 64, 64
    full_flop = 4 * heads * d * seq * seq / 2  # fwd = 2 GEMMs × 2·S²·H·d, causal half
    swa_flop = 4 * heads * d * seq * window  # W keys per query
    for gpu in ("gb200", "h200"):
        full = attention_rate(rates, gpu, "gqa", "fwd", d, d, seq)
        swa = attention_rate(rates, gpu, "swa", "fwd", d, d, seq, window=window)
        assert full is not None and swa is not None
        assert swa.seconds(swa_flop) < full.seconds(full_flop) / 10, gpu


def test_small_head_dim_is_slower_per_flop(rates: KernelRates) -> None:
    for seq in (1024, 4096, 16384):
        for pass_ in ("fwd", "bwd"):
            d64 = attention_rate(rates, "h100", "mha", pass_, 64, 64, seq, causal=False)
            d128 = attention_rate(rates, "h100", "mha", pass_, 128, 128, seq, causal=False)
            assert d64 is not None and d128 is not None and d64.value < d128.value
    d96 = attention_rate(rates, "h100", "mha", "fwd", 96, 96, 4096, causal=False)
    assert d96 is not None and 476e12 < d96.value < 638e12  # between the d64 and d128 points


def test_fewer_tokens_per_expert_is_slower(rates: KernelRates) -> None:
    rate = [grouped_gemm_rate(rates, "h800", "fp8_blockwise", t, 7168, 4096) for t in (256, 512, 1024, 8192)]
    assert _rising(rate, strictly=True)


def test_gpu_names_resolve_to_families(rates: KernelRates) -> None:
    assert resolve_gpu(rates, "NVIDIA-H100-80GB-HBM3") == "h100"
    assert resolve_gpu(rates, "GB200 NVL72") == "gb200"
    assert resolve_gpu(rates, "b200") == "b200"
    with pytest.raises(LcmoeError, match="has no kernel-rate family"):
        resolve_gpu(rates, "a100")


def test_bad_arguments_are_one_sentence(rates: KernelRates) -> None:
    with pytest.raises(LcmoeError, match="chunk_tokens"):
        attention_rate(rates, "h100", "mha", "fwd", 128, 128, 0)
    with pytest.raises(LcmoeError, match="window"):
        attention_rate(rates, "h100", "swa", "fwd", 64, 64, 8192)
    with pytest.raises(LcmoeError, match="kind"):
        attention_rate(rates, "h100", "linear", "fwd", 64, 64, 8192)


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LcmoeError, match="cannot be read"):
        load_kernel_rates(tmp_path / "absent.yaml")


def _shipped_dict() -> dict[str, Any]:
    data = yaml.safe_load(SHIPPED.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_a_series_without_source_is_refused() -> None:
    data = _shipped_dict()
    del data["series"][0]["source"]
    with pytest.raises(LcmoeError, match="source"):
        kernel_rates_from_dict(data, origin="t.yaml")


def test_duplicate_lookup_keys_are_refused() -> None:
    data = _shipped_dict()
    data["series"].append(dict(data["series"][0], id="copy"))
    with pytest.raises(LcmoeError, match="same lookup key"):
        kernel_rates_from_dict(data, origin="t.yaml")


def test_unknown_sibling_is_refused() -> None:
    data = _shipped_dict()
    data["gpus"]["h100"]["siblings"] = ["h999"]
    with pytest.raises(LcmoeError, match="siblings"):
        kernel_rates_from_dict(data, origin="t.yaml")


def test_the_shipped_file_loads_from_a_path_too() -> None:
    assert load_kernel_rates(SHIPPED) == load_kernel_rates()
