"""Measured kernel rates keyed by GPU and shape, and pure lookups that interpolate between them.

The data is ``lcmoe/data/kernel_rates.yaml``: published kernel measurements (FA3, cuDNN SDPA, FA4,
DeepGEMM, FLA, mamba_ssm, torch/TE grouped GEMM, XLA's GEMM grids), each row with its source. A
lookup returns a :class:`RateLookup`: the rate, the rows it came from (so ``estimate --explain``
can cite them), which axes were clamped and which substitutions (another GPU, another attention
kind, the other mask) were needed. ``None`` means no measured row exists for the GPU's family for
that kernel and shape class; the caller then keeps its fitted efficiency.

Interpolation (every lookup): rows are filtered to one GPU, dtype and set of categorical keys, then
interpolated axis by axis in the order each function states. On one axis with measured values
x_lo ≤ x ≤ x_hi (the nearest below and above):

    r(x) = r(x_lo) + (r(x_hi) − r(x_lo)) · ln(x / x_lo) / ln(x_hi / x_lo)

i.e. linear in log(shape), so a measured point is reproduced exactly and r stays between its two
neighbours (monotone wherever the data is). Outside the measured range x is clamped to the nearest
end (no extrapolation) and the axis is listed in ``RateLookup.clamped``.

GPU fallback: rows are pooled from the GPU and its siblings in the order the YAML lists (H200 ←
H100, H800; GB200 ← B200, GB300, B300; …); a sibling row fills only a shape key the GPU itself has
not measured and is scaled by the ratio of dense peaks for the dtype (kernels-and-links.md §7:
H100 = H800 = H200 = 989 TFLOP/s BF16 at the same 1.98 GHz clock, factor 1; B200 2250 vs GB200
2500, factor 1.111). Each scaled row is named in ``RateLookup.substitutions``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lcmoe.errors import LcmoeError
from lcmoe.estimate.kernel_rate_table import (
    KERNEL_KEYS,
    KernelRates,
    KernelRow,
    Scalar,
    is_number,
    kernel_rates_from_dict,
    load_kernel_rates,
    positive_float,
)

__all__ = [
    "KERNEL_KEYS",
    "KernelRates",
    "KernelRow",
    "RateLookup",
    "attention_rate",
    "dsa_indexer_rate",
    "dsa_sparse_rate",
    "gdn_scan_rate",
    "gemm_rate",
    "grouped_gemm_rate",
    "kernel_rates_from_dict",
    "load_kernel_rates",
    "mamba_scan_rate",
    "resolve_gpu",
]

ATTENTION_KINDS = ("mha", "gqa", "mla", "swa", "sink")


@dataclass(frozen=True, kw_only=True)
class RateLookup:
    """A looked-up rate: ``value`` in ``unit`` for ``gpu``. ``rows`` are the measured points
    interpolated between and ``factors`` the peak-ratio scale applied to each (1.0 for the GPU's
    own rows; peak(gpu)/peak(row's gpu) for a sibling's)."""

    value: float
    unit: str
    gpu: str
    rows: tuple[KernelRow, ...]
    factors: tuple[float, ...]
    clamped: tuple[str, ...] = ()
    substitutions: tuple[str, ...] = ()

    @property
    def measured_gpus(self) -> tuple[str, ...]:
        """The GPUs whose rows were used, in order of first use."""
        return tuple(dict.fromkeys(r.gpu for r in self.rows))

    def seconds(self, amount: float) -> float:
        """Time for ``amount`` FLOPs (or token·heads) at this rate: amount / value."""
        return amount / self.value

    def citation(self) -> str:
        """The rows used and their sources, for ``--explain``."""
        sources = dict.fromkeys(r.source for r in self.rows)
        ids = ", ".join(r.row_id for r in self.rows)
        notes = "; ".join((*self.substitutions, *(f"{a} clamped to the measured range" for a in self.clamped)))
        return f"{ids} — {' | '.join(sources)}" + (f" ({notes})" if notes else "")


# ----------------------------------------------------------------------------- lookups


def resolve_gpu(rates: KernelRates, gpu_family_or_name: str) -> str:
    """The GPU family of a name such as "H100", "nvidia-h100-80gb-hbm3" or "GB200 NVL72": the
    longest listed family its letters and digits start with (after an "nvidia" prefix)."""
    key = re.sub(r"[^a-z0-9]", "", str(gpu_family_or_name).lower()).removeprefix("nvidia")
    matches = [g.name for g in rates.gpus if key.startswith(g.name)]
    if not matches:
        names = ", ".join(g.name for g in rates.gpus)
        raise LcmoeError("gpu", gpu_family_or_name, "has no kernel-rate family", f"use one of: {names}")
    return max(matches, key=len)


def _positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and (not is_number(value) or value <= 0):
            raise LcmoeError(name, value, "must be a positive number", "pass the per-rank shape")


def _choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise LcmoeError(name, value, f"must be one of {list(allowed)}", "")


def _bracket(points: Sequence[float], x: float) -> tuple[float, float]:
    """The measured values just below and above x (both the nearest end when x is outside)."""
    if x <= points[0]:
        return points[0], points[0]
    if x >= points[-1]:
        return points[-1], points[-1]
    hi = next(p for p in points if p >= x)
    lo = max(p for p in points if p <= x)
    return lo, hi


Scaled = tuple[KernelRow, float]  # a row and the peak-ratio factor its value is scaled by


def _interpolate(
    rows: Sequence[Scaled], axes: Sequence[tuple[str, float]]
) -> tuple[float, tuple[Scaled, ...], tuple[str, ...]]:
    """(rate, rows used, clamped axes): on the first axis r = r_lo + (r_hi − r_lo)·ln(x/x_lo)/ln(x_hi/x_lo)
    between the nearest measured values, each side interpolated on the remaining axes first."""
    if not axes:
        row, factor = rows[0]  # unique: _check_unique and _pool refuse duplicate keys
        return row.value * factor, (rows[0],), ()
    (name, x), rest = axes[0], axes[1:]
    points = sorted({v for r, _ in rows if (v := positive_float(r.get(name))) is not None})
    lo, hi = _bracket(points, x)
    clamped = (name,) if not points[0] <= x <= points[-1] else ()
    v_lo, used_lo, c_lo = _interpolate([rf for rf in rows if rf[0].get(name) == lo], rest)
    if hi == lo:
        return v_lo, used_lo, tuple(dict.fromkeys((*clamped, *c_lo)))
    v_hi, used_hi, c_hi = _interpolate([rf for rf in rows if rf[0].get(name) == hi], rest)
    t = math.log(x / lo) / math.log(hi / lo)
    return v_lo + t * (v_hi - v_lo), used_lo + used_hi, tuple(dict.fromkeys((*clamped, *c_lo, *c_hi)))


def _pool(rates: KernelRates, gpu: str, kernel: str, dtype: str, want: Mapping[str, Scalar]) -> list[Scaled]:
    """Matching rows of ``gpu``, then of its siblings in order for shape keys not yet measured,
    each sibling row scaled by peak(gpu, dtype) / peak(sibling, dtype) — so one sparse series on
    the GPU does not hide a sibling's shape curve, and the GPU's own point wins a shared key."""
    categorical, axes = KERNEL_KEYS[kernel]
    pooled: dict[tuple[Scalar | None, ...], Scaled] = {}
    for measured in (gpu, *rates.gpu(gpu).siblings):
        factor = rates.gpu(gpu).peak(dtype) / rates.gpu(measured).peak(dtype)
        for r in rates.rows:
            if not (r.lookup and r.kernel == kernel and r.gpu == measured and r.dtype == dtype):
                continue
            if all(r.get(k) == v and type(r.get(k)) is type(v) for k, v in want.items()):
                pooled.setdefault(tuple(r.get(k) for k in (*categorical, *axes)), (r, factor))
    return list(pooled.values())


def _lookup(
    rates: KernelRates,
    gpu_name: str,
    kernel: str,
    dtype: str,
    tiers: Sequence[tuple[str, Mapping[str, Scalar]]],
    axes: Sequence[tuple[str, float]],
) -> RateLookup | None:
    """The first tier (categorical keys) with rows on the GPU or its siblings (``_pool``),
    interpolated on ``axes``."""
    gpu = resolve_gpu(rates, gpu_name)
    for note, want in tiers:
        rows = _pool(rates, gpu, kernel, dtype, want)
        if not rows:
            continue
        value, used, clamped = _interpolate(rows, axes)
        moved = tuple(
            f"{r.row_id} measured on {r.gpu}, scaled ×{f:.3f} (dense {dtype} peak ratio)"
            for r, f in used
            if r.gpu != gpu
        )
        return RateLookup(
            value=value, unit=used[0][0].unit, gpu=gpu, rows=tuple(r for r, _ in used),
            factors=tuple(f for _, f in used), clamped=clamped, substitutions=((note,) if note else ()) + moved,
        )  # fmt: skip
    return None


def attention_rate(
    rates: KernelRates,
    gpu_family_or_name: str,
    kind: str,
    pass_: str,
    head_dim_qk: int,
    head_dim_v: int,
    chunk_tokens: int,
    window: int | None = None,
    causal: bool = True,
    dtype: str = "bf16",
) -> RateLookup | None:
    """Core-attention FLOP/s per useful FLOP (unmasked elements; a window counts W keys) for one
    call over ``chunk_tokens`` queries. Axes: head_dim_qk, then window (kind "swa" only), then seq.
    d_v is not an axis: the d_qk 192 / d_v 128 shape is kind "mla". Substitutions in order: the
    kinds in ``attention_kind_fallback`` (mla → mha → gqa…), then the other mask (causal and
    non-causal TFLOP/s agree within ~5% from 8K up, kernels-and-links.md §1b)."""
    _choice("kind", kind, ATTENTION_KINDS)
    _choice("pass", pass_, ("fwd", "bwd"))
    _positive(head_dim_qk=head_dim_qk, head_dim_v=head_dim_v, chunk_tokens=chunk_tokens, window=window)
    if (window is None) == (kind == "swa"):
        raise LcmoeError("window", window, "is required for kind 'swa' and only for it", "pass kind='swa' with window")
    kinds = (kind, *dict(rates.kind_fallback).get(kind, ()))
    tiers: list[tuple[str, Mapping[str, Scalar]]] = [
        (_attention_note(kind, k, causal, c), {"kind": k, "pass": pass_, "causal": c})
        for c in (causal, not causal)
        for k in kinds
    ]
    axes = [("head_dim_qk", float(head_dim_qk))]
    axes += [("window", float(window))] if window is not None else []
    return _lookup(rates, gpu_family_or_name, "attention", dtype, tiers, [*axes, ("seq", float(chunk_tokens))])


def _attention_note(kind: str, used: str, causal: bool, used_causal: bool) -> str:
    parts = [f"kind {used} rows for {kind}"] if used != kind else []
    parts += [f"{'causal' if used_causal else 'non-causal'} rows for {'causal' if causal else 'non-causal'}"] * (
        used_causal != causal
    )
    return "; ".join(parts)


def dsa_indexer_rate(
    rates: KernelRates,
    gpu_family_or_name: str,
    keys_per_query: int,
    key_ranges: str = "causal_prefix",
    pass_: str = "fwd",
    dtype: str = "fp8",
) -> RateLookup | None:
    """Lightning-indexer logits FLOP/s (2·valid (q, k) pairs·H·D) at ``keys_per_query`` keys
    (axis seq_kv). key_ranges: "causal_prefix" (each query sees its prefix) or "cp" (context-
    parallel key ranges). No public backward or SM100 absolute rate exists (None)."""
    _choice("key_ranges", key_ranges, ("causal_prefix", "cp"))
    _positive(keys_per_query=keys_per_query)
    tiers: list[tuple[str, Mapping[str, Scalar]]] = [("", {"pass": pass_, "key_ranges": key_ranges})]
    return _lookup(rates, gpu_family_or_name, "dsa_indexer", dtype, tiers, [("seq_kv", float(keys_per_query))])


def dsa_sparse_rate(
    rates: KernelRates, gpu_family_or_name: str, pass_: str, head_dim_qk: int, topk: int, dtype: str = "bf16"
) -> RateLookup | None:
    """Top-k sparse MLA FLOP/s (2·S_q·H·topk·(D_qk + D_v) fwd, (3·D_qk + 2·D_v) bwd); axes
    head_dim_qk then topk. Hopper has a forward rate only (FlashMLA); backward is SM100-only."""
    _choice("pass", pass_, ("fwd", "bwd"))
    _positive(head_dim_qk=head_dim_qk, topk=topk)
    axes = [("head_dim_qk", float(head_dim_qk)), ("topk", float(topk))]
    return _lookup(rates, gpu_family_or_name, "dsa_sparse", dtype, [("", {"pass": pass_})], axes)


def gdn_scan_rate(
    rates: KernelRates,
    gpu_family_or_name: str,
    pass_: str,
    head_dim: int,
    tokens: int,
    heads: int,
    chunk: int = 64,
    dtype: str = "bf16",
) -> RateLookup | None:
    """Gated DeltaNet ``chunk_gated_delta_rule`` rate in token·heads per second for one call over
    ``tokens`` (all sequences of the micro-batch on this rank) × ``heads`` (local heads); axes
    head_dim then token_heads = tokens·heads (small calls are launch-bound, so the rate rises
    with it). pass_: "fwd", "bwd" (derived: fwd+bwd − fwd) or "fwd_bwd"."""
    _choice("pass", pass_, ("fwd", "bwd", "fwd_bwd"))
    _positive(head_dim=head_dim, tokens=tokens, heads=heads, chunk=chunk)
    axes = [("head_dim", float(head_dim)), ("token_heads", float(tokens) * float(heads))]
    return _lookup(rates, gpu_family_or_name, "gdn", dtype, [("", {"pass": pass_, "chunk": chunk})], axes)


def mamba_scan_rate(
    rates: KernelRates,
    gpu_family_or_name: str,
    pass_: str,
    d_state: int,
    headdim: int,
    seq: int,
    dtype: str = "bf16",
) -> RateLookup | None:
    """Mamba-2 SSD (``mamba_chunk_scan_combined``) rate in token·heads per second; axes d_state,
    headdim, seq. Only an H100 forward curve is public (None for backward)."""
    _choice("pass", pass_, ("fwd", "bwd", "fwd_bwd"))
    _positive(d_state=d_state, headdim=headdim, seq=seq)
    axes = [("d_state", float(d_state)), ("headdim", float(headdim)), ("seq", float(seq))]
    return _lookup(rates, gpu_family_or_name, "mamba2", dtype, [("", {"pass": pass_})], axes)


def grouped_gemm_rate(
    rates: KernelRates, gpu_family_or_name: str, dtype: str, tokens_per_expert: float, k_in: int, n_out: int
) -> RateLookup | None:
    """Expert grouped-GEMM FLOP/s (2·M·N·K); axes tokens_per_expert, k_in (reduce dim: hidden for
    the up-projection, ffn for the down one), n_out (ffn, ×2 with a fused GLU; hidden)."""
    _positive(tokens_per_expert=tokens_per_expert, k_in=k_in, n_out=n_out)
    axes = [("tokens_per_expert", float(tokens_per_expert)), ("k_in", float(k_in)), ("n_out", float(n_out))]
    return _lookup(rates, gpu_family_or_name, "grouped_gemm", dtype, [("", {})], axes)


def gemm_rate(rates: KernelRates, gpu_family_or_name: str, dtype: str, m: int, n: int, k: int) -> RateLookup | None:
    """Dense GEMM FLOP/s for C[m,n] = A[m,k]·B[k,n]; axes m, n, k."""
    _positive(m=m, n=n, k=k)
    return _lookup(
        rates, gpu_family_or_name, "gemm", dtype, [("", {})], [("m", float(m)), ("n", float(n)), ("k", float(k))]
    )
