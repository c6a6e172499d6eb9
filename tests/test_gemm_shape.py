"""Dense GEMM time by shape (time.GemmShapeCost, fitted to XLA's measured GEMM grids)."""

from __future__ import annotations

import pytest

from lcmoe.catalog import load_model
from lcmoe.estimate.time import dense_gemm_kernels, gemm_shape_cost, narrow_m_factor


def _efficiency(architecture: str, peak: float, m: int, n: int, k: int) -> float:
    """Achieved share of a kernel's large-shape rate: FLOPs / (FLOPs·(1 + m½/M) + t0·peak)."""
    cost = gemm_shape_cost(architecture, "bf16")
    flops = 2.0 * m * n * k
    return flops / (flops * narrow_m_factor(m, cost) + cost.fixed_seconds * peak)


def test_xla_grid_points_reproduced() -> None:
    """H100 BF16 4096×1024×1024 measured 488 TFLOP/s = 0.49 of 989 (kernel-rates-by-shape.md §1a);
    at the grid's 0.88 large-shape rate the shape cost gives 0.88 × 0.58 = 0.51, within 10%."""
    assert 0.88 * _efficiency("hopper", 989e12, 4096, 1024, 1024) == pytest.approx(488 / 989, rel=0.1)


def test_small_hidden_slower_than_wide() -> None:
    """A 2880-wide GEMM (gpt-oss) reaches a smaller share of its rate than a 7168-wide one (DeepSeek-V3)."""
    for architecture, peak in (("hopper", 989e12), ("blackwell", 2250e12)):
        assert _efficiency(architecture, peak, 4096, 2880, 2880) < _efficiency(architecture, peak, 4096, 7168, 7168)


def test_blackwell_small_gemm_penalty() -> None:
    """The same small GEMM loses a larger share on Blackwell (twice the peak, the same ~6.5 µs
    fixed time per kernel): 1024×1024×2048 measured 21% of peak on sm_100 vs 35% on H100 (§1b)."""
    small = (1024, 1024, 2048)
    assert _efficiency("blackwell", 2250e12, *small) < _efficiency("hopper", 989e12, *small)


def test_dense_gemm_kernels_per_layer() -> None:
    """A GQA transformer layer runs QKV, output, fc1, fc2 = 4 GEMMs × 3 passes = 12 kernels."""
    assert dense_gemm_kernels(load_model("llama3-8b"), 0, 3) == 12.0
