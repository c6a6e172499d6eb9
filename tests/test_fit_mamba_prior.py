"""The Mamba scan fallback of the time fit (benchmarks/fit_time.py): where no fitted row is a Mamba
hybrid, the rate comes from the held-out hybrid's rows that stay inside the fitted rows' range."""

from __future__ import annotations

import dataclasses

import pytest

fit_time = pytest.importorskip("benchmarks.fit_time")


def _fitted_without_hybrids() -> list[object]:
    return [c for c in fit_time.load_cases() if not c.run.model.mamba_num_heads]


def test_prior_rows_stay_inside_the_fitted_range() -> None:
    cases = _fitted_without_hybrids()
    most = max(c.run.model.num_moe_experts // c.run.layout.ep for c in cases if c.run.model.is_moe)
    rows = fit_time.mamba_prior_cases(cases)
    assert rows, "the held-out hybrid has rows inside the fitted range"
    for row in rows:
        assert row.run.model.mamba_num_heads
        assert row.run.layout.tp == 1
        assert row.run.options.tensor_core_precision not in fit_time.MAMBA_PRIOR_EXCLUDED_PRECISIONS
        assert row.run.model.num_moe_experts // row.run.layout.ep <= most
    held = [c for c in fit_time.load_held_out_cases() if c.run.model.mamba_num_heads]
    assert len(rows) < len(held), "NVFP4, TP2 and over-range rows are left out"


def test_prior_rate_minimises_the_prior_rows_log_error() -> None:
    cases = _fitted_without_hybrids()
    rows = fit_time.mamba_prior_cases(cases)
    shipped = {f: fit_time.TimeCoefficients() for f in ("hopper", "blackwell")}
    out = fit_time.with_mamba_scan_prior(shipped, rows)
    rate = out["blackwell"].mamba_scan_flops_per_second
    assert rate == out["hopper"].mamba_scan_flops_per_second
    low, high = fit_time.BOUNDS["mamba_scan_flops_per_second"]
    assert low < rate < high

    def loss(r: float) -> float:
        c = {f: dataclasses.replace(v, mamba_scan_flops_per_second=r) for f, v in shipped.items()}
        return float(sum(fit_time.residuals([row], c[row.run.hardware.architecture])[0] ** 2 for row in rows))

    assert loss(rate) <= min(loss(rate * 0.9), loss(rate * 1.1))


def test_no_prior_rows_leaves_the_coefficients_alone() -> None:
    shipped = {"hopper": fit_time.TimeCoefficients()}
    assert fit_time.with_mamba_scan_prior(shipped, []) is shipped
