"""Time bands (estimate.band), the conservative ranking and the common GBS (plan.search)."""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from importlib import resources

import pytest
import yaml

from lcmoe.catalog import load_hardware, load_model
from lcmoe.estimate.band import (
    DIMENSIONS,
    BandParameters,
    EvidenceRun,
    RunDescriptor,
    TimeEvidence,
    describe_run,
    evidence_from_dict,
    quantile,
    time_band,
)
from lcmoe.plan.search import PlanRequest, common_global_batch, search
from tests.conftest import run_cli

SMALL = ("-m", "qwen3-30b-a3b", "-n", "16", "-s", "16k")


@functools.cache
def shipped_evidence() -> TimeEvidence:
    text = resources.files("lcmoe.data").joinpath("time_evidence.yaml").read_text(encoding="utf-8")
    return evidence_from_dict(yaml.safe_load(text))


MEASURED = RunDescriptor(
    mixer="MLA", moe=True, gpu="h100", family="hopper", tp=1, chunk_tokens=4096, ep_domains=4.0, seq_len=131072
)


def test_band_is_base_plus_weighted_distance_to_the_one_run() -> None:
    # One run with |error| 6%: band = 6 + Σ w_i·d_i. TP 1 → 8 is 3 doublings (3·2 = 6), H100 →
    # GB200 another family (1·5), 128K → 32K at the same chunk is 2 halvings of seq (2·1).
    run = EvidenceRun("dsv3 128K", "deepseek-v3", MEASURED, -6.0)
    params = BandParameters(weights_pct=(10.0, 5.0, 2.0, 3.0, 4.0, 1.0), neighbours=1, quantile=0.8)
    assert time_band(MEASURED, [run], params).pct == pytest.approx(6.0)
    moved = replace(MEASURED, tp=8, gpu="gb200", family="blackwell", seq_len=32768, chunk_tokens=4096)
    band = time_band(moved, [run], params)
    assert band.pct == pytest.approx(6.0 + 3 * 2.0 + 1 * 5.0 + 2 * 1.0)
    assert dict(zip(DIMENSIONS, band.distance, strict=True)) == {
        "kind": 0.0,
        "gpu": 1.0,
        "tp": 3.0,
        "chunk": 0.0,
        "ep_span": 0.0,
        "seq": 2.0,
    }
    assert band.nearest == "dsv3 128K" and band.base_pct == pytest.approx(6.0)


@pytest.mark.parametrize(
    "step",
    [
        {"tp": 2},
        {"tp": 8},
        {"chunk_tokens": 16384},
        {"chunk_tokens": 65536},
        {"ep_domains": 16.0},
        {"mixer": "GDN"},
        {"mixer": "DSA", "moe": False},
        {"gpu": "h200"},
        {"gpu": "gb200", "family": "blackwell"},
    ],
)
def test_band_grows_with_extrapolation_from_the_shipped_evidence(step: dict[str, object]) -> None:
    """From a measured DeepSeek-V3 H100 128K run, every step away widens the band (or, where
    another measured run is as near, keeps it): never narrower."""
    evidence = shipped_evidence()
    at_run = time_band(MEASURED, evidence.runs, evidence.parameters)
    assert at_run.penalty_pct == pytest.approx(0.0)
    away = time_band(replace(MEASURED, **step), evidence.runs, evidence.parameters)  # type: ignore[arg-type]
    assert away.pct > at_run.pct
    further = {"tp": 8, "chunk_tokens": 65536, "ep_domains": 16.0}
    if set(step) <= set(further) and step != {k: further[k] for k in step}:
        farther = time_band(replace(MEASURED, **{k: further[k] for k in step}), evidence.runs, evidence.parameters)  # type: ignore[arg-type]
        assert farther.pct >= away.pct


def test_quantile_interpolates_like_numpy() -> None:
    # numpy.quantile([1, 2, 3, 10], 0.8) = 3 + 0.4·7 = 5.8
    assert quantile([10.0, 1.0, 3.0, 2.0], 0.8) == pytest.approx(5.8)
    assert quantile([4.0], 0.3) == 4.0


def test_shipped_evidence_meets_its_coverage_targets() -> None:
    evidence = shipped_evidence()
    summary = evidence.summary
    assert len(evidence.runs) == summary["runs"] >= 150
    assert summary["coverage"] >= 0.80 and summary["median_band_pct"] <= 20.0
    assert all(w > 0 for w in evidence.parameters.weights_pct)
    assert {"date", "data", "script"} <= set(summary)


def test_common_gbs_is_the_smallest_every_layout_runs_with_4mi_tokens() -> None:
    # Units 8, 16 and 64 (MBS·DP, ·PP with VPP): lcm 64; 64 × 128K = 8 Mi tokens ≥ 4 Mi.
    assert common_global_batch([8, 16, 64], 131072) == 64
    # lcm 12; at 16K a step needs 256 sequences: the first multiple of 12 at or above is 264.
    assert common_global_batch([4, 6], 16384) == 264


def _request(**kw: object) -> PlanRequest:
    base = dict(model=load_model("qwen3-30b-a3b"), hardware=load_hardware("h100"), num_gpus=16, seq_len=16384, top_k=5)
    return PlanRequest(**(base | kw))  # type: ignore[arg-type]


def test_every_candidate_runs_one_gbs_without_gbs() -> None:
    result = search(_request(time_evidence=shipped_evidence()))
    assert result.gbs and result.plans
    for plan in [*result.plans, result.fallback, *result.pareto]:
        assert plan is not None and plan.run.layout.gbs == result.gbs
    assert f"GBS {result.gbs} for every plan" in result.gbs_reason


def test_conservative_rank_demotes_an_extrapolated_leader() -> None:
    """Evidence of one measured run at the expected leader's TP·CP but TP·2 away from everything
    else, at 40% per TP doubling: the leader keeps its place by the prediction and loses it by the
    lower edge to a plan at the measured TP."""
    expected = search(_request(time_evidence=shipped_evidence(), rank="expected"))
    leader = expected.plans[0]
    tp = leader.run.layout.tp
    measured = describe_run(replace(leader.run, layout=replace(leader.run.layout, tp=tp // 2 if tp > 1 else 2)))
    evidence = TimeEvidence(
        runs=(EvidenceRun("measured", "qwen3-30b-a3b", measured, 2.0),),
        parameters=BandParameters(weights_pct=(10.0, 5.0, 40.0, 40.0, 40.0, 1.0), neighbours=1, quantile=0.5),
    )
    by_centre = search(_request(time_evidence=evidence, rank="expected"))
    by_edge = search(_request(time_evidence=evidence, rank="conservative"))
    assert by_centre.plans[0].run.layout == leader.run.layout
    assert by_edge.plans[0].run.layout != leader.run.layout
    assert by_edge.plans[0].run.layout.tp != tp and by_edge.plans[0].band.penalty_pct < 40.0  # type: ignore[union-attr]
    lows = [p.tokens_per_sec_per_gpu_low for p in by_edge.plans]
    assert lows == sorted(lows, reverse=True)


def test_plan_json_has_band_and_evidence_for_every_plan() -> None:
    code, out, err = run_cli("plan", *SMALL, "--top", "3", "--json")
    assert code == 0, err
    payload = json.loads(out)
    rank = payload["rank"]
    assert (rank["mode"], rank["by"], rank["bands"]) == ("conservative", "time.tokens_per_sec_per_gpu_low", True)
    assert rank["evidence"]["coverage"] >= 0.8
    assert payload["gbs"]["chosen_by"] == "lcmoe" and payload["gbs"]["why"]
    for plan in [*payload["plans"], payload["fallback"]]:
        time = plan["time"]
        assert time["band_pct"] > 0
        assert time["tokens_per_sec_per_gpu_low"] < time["tokens_per_sec_per_gpu"] < time["tokens_per_sec_per_gpu_high"]
        assert time["evidence"]["run"] and set(time["evidence"]["distance"]) == set(DIMENSIONS)
        assert plan["layout"]["gbs"] == payload["gbs"]["value"]
    lows = [p["time"]["tokens_per_sec_per_gpu_low"] for p in payload["plans"]]
    assert lows == sorted(lows, reverse=True)


def test_rank_expected_orders_by_the_prediction_and_text_says_so() -> None:
    code, out, _ = run_cli("plan", *SMALL, "--top", "3", "--rank", "expected", "--json")
    payload = json.loads(out)
    speeds = [p["time"]["tokens_per_sec_per_gpu"] for p in payload["plans"]]
    assert code == 0 and speeds == sorted(speeds, reverse=True) and payload["rank"]["mode"] == "expected"
    code, out, _ = run_cli("plan", *SMALL, "--top", "2")
    assert code == 0 and "band" in out and "nearest measured run" in out and "for every plan" in out
    code, _, err = run_cli("plan", *SMALL, "--rank", "optimistic")
    assert code == 2 and "--rank" in err
