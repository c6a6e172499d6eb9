"""The uncertainty band of a step-time prediction, from how wrong the model has been on the
measured runs nearest to it plus a penalty for how far it extrapolates beyond them.

The evidence is data (``src/lcmoe/data/time_evidence.yaml``, written by
``benchmarks/time_bands.py --write``): every published run the time model is fitted on, with its
descriptors and its leave-one-model-out (LOMO) error — the error of a prediction made by a refit
that never saw the run's model. The band of a new prediction is

    band_pct = Q_q( |e_j| : j among the k measured runs nearest to it )  +  Σ_i w_i · d_i(nearest)

* ``e_j = 100 · (measured_j / predicted_j − 1)``: run j's LOMO error in percent (tokens/s);
* "nearest" orders the measured runs by the penalty Σ_i w_i · d_i(run) itself, so the nearest run
  is the one the prediction extrapolates least from;
* ``Q_q`` is the q-quantile (linear interpolation); q and the weights w_i are fitted by
  ``benchmarks/time_bands.py`` (a pinball loss above the 80% target, with a prior on each weight;
  k is fixed there) so that at least 80% of the measured runs fall inside the band computed for
  them from the *other* models' runs (the LOMO coverage); the fitted values are in the YAML;
* the distances d_i (``DIMENSIONS``), each 0 for an exact match:
    - ``kind``: 1 per mismatch of the sequence mixer (MLA, DSA, GQA, SWA, GDN, Mamba hybrid) and of
      MoE vs dense (0, 1 or 2);
    - ``gpu``: 0 on the same GPU, 0.5 on another GPU of the same family, 1 across families;
    - ``tp``: |Δ log2 TP|;
    - ``chunk``: |Δ log2 (seq_len / CP)|, the attention chunk each CP rank holds;
    - ``ep_span``: |Δ log2 max(1, EP·ETP / NVLink domain)|, how many NVLink domains one EP group
      spans (its dispatch crosses the NIC beyond 1);
    - ``seq``: |Δ log2 seq_len|.

A plan whose measured twin is in the data gets the base term only; one that changes mixer,
GPU family, or doubles TP or CP beyond anything measured pays for each step away.

Pure functions over frozen records: no files are read here (the CLI loads the YAML once and
passes a ``TimeEvidence`` through ``PlanRequest``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lcmoe.errors import LcmoeError
from lcmoe.run import RunConfig

DIMENSIONS = ("kind", "gpu", "tp", "chunk", "ep_span", "seq")


@dataclass(frozen=True, slots=True)
class RunDescriptor:
    """What the band compares between a prediction and a measured run (all per run, global)."""

    mixer: str  # MLA | DSA | GQA | SWA | GDN | Mamba (hybrid Mamba-2 + attention)
    moe: bool
    gpu: str  # catalog GPU name
    family: str  # hardware architecture: ampere | hopper | blackwell
    tp: int
    chunk_tokens: int  # seq_len / CP: the attention chunk one CP rank holds
    ep_domains: float  # NVLink domains one EP·ETP group spans, at least 1
    seq_len: int

    def as_dict(self) -> dict[str, object]:
        return {
            "mixer": self.mixer,
            "moe": self.moe,
            "gpu": self.gpu,
            "family": self.family,
            "tp": self.tp,
            "chunk_tokens": self.chunk_tokens,
            "ep_domains": self.ep_domains,
            "seq_len": self.seq_len,
        }


def mixer_of(run: RunConfig) -> str:
    """The model's sequence mixer in one word (a Mamba hybrid is "Mamba" whatever its attention)."""
    model = run.model
    if model.mamba_num_heads:
        return "Mamba"
    return {"MLA+DSA": "DSA", "GQA+GDN": "GDN", "GQA+SWA": "SWA"}.get(model.attention_label, model.attention_label)


def describe_run(run: RunConfig) -> RunDescriptor:
    lay = run.layout
    seq = run.options.seq_len
    return RunDescriptor(
        mixer=mixer_of(run),
        moe=run.model.is_moe,
        gpu=run.hardware.name,
        family=run.hardware.architecture,
        tp=lay.tp,
        chunk_tokens=max(1, seq // lay.cp),
        ep_domains=max(1.0, lay.ep * lay.etp / run.hardware.nvlink_domain_size),
        seq_len=seq,
    )


def _log2_gap(a: float, b: float) -> float:
    return abs(math.log2(a) - math.log2(b))


def distances(a: RunDescriptor, b: RunDescriptor) -> tuple[float, ...]:
    """The per-dimension distances of ``DIMENSIONS`` (module docstring), 0 for a match."""
    kind = float(a.mixer != b.mixer) + float(a.moe != b.moe)
    gpu = 0.0 if a.gpu == b.gpu else 0.5 if a.family == b.family else 1.0
    return (
        kind,
        gpu,
        _log2_gap(a.tp, b.tp),
        _log2_gap(a.chunk_tokens, b.chunk_tokens),
        _log2_gap(a.ep_domains, b.ep_domains),
        _log2_gap(a.seq_len, b.seq_len),
    )


@dataclass(frozen=True, slots=True)
class EvidenceRun:
    """One measured run: its descriptors and the time model's LOMO error on it (percent)."""

    name: str
    model: str
    descriptor: RunDescriptor
    error_pct: float  # 100 · (measured / predicted − 1), predicted without this model in the fit


@dataclass(frozen=True, slots=True)
class BandParameters:
    """The fitted constants of the band formula (module docstring)."""

    weights_pct: tuple[float, ...]  # w_i per DIMENSIONS, percent per unit of distance
    neighbours: int = 10  # k
    quantile: float = 0.8  # q

    def __post_init__(self) -> None:
        if len(self.weights_pct) != len(DIMENSIONS) or any(w < 0 for w in self.weights_pct):
            raise LcmoeError("band.weights_pct", self.weights_pct, f"needs {len(DIMENSIONS)} weights ≥ 0", "")
        if self.neighbours < 1 or not 0 <= self.quantile <= 1:
            raise LcmoeError("band", (self.neighbours, self.quantile), "needs k ≥ 1 and 0 ≤ q ≤ 1", "")


@dataclass(frozen=True, slots=True)
class TimeEvidence:
    runs: tuple[EvidenceRun, ...]
    parameters: BandParameters
    summary: Mapping[str, Any] = field(default_factory=dict)  # date, data files, coverage figures


@dataclass(frozen=True, slots=True)
class TimeBand:
    """A prediction's band: ± ``pct`` percent of tokens/s (and of step time, to first order)."""

    pct: float
    base_pct: float  # Q_q of the nearest runs' |LOMO error|
    penalty_pct: float  # Σ w_i · d_i to the nearest run
    nearest: str  # the nearest measured run
    nearest_model: str
    distance: tuple[float, ...]  # d_i per DIMENSIONS to the nearest run
    unmeasured_pct: float = 0.0  # the step's terms priced on an assumption alone (``widened``)

    def as_dict(self) -> dict[str, object]:
        return {
            "run": self.nearest,
            "model": self.nearest_model,
            "distance": dict(zip(DIMENSIONS, self.distance, strict=True)),
            "base_pct": self.base_pct,
            "penalty_pct": self.penalty_pct,
            "unmeasured_pct": self.unmeasured_pct,
        }


def widened(band: TimeBand, unmeasured_seconds: float, step_seconds: float) -> TimeBand:
    """``band`` plus 100 · U / step, U the seconds by which the step's terms that no measured run
    prices could be off (``TimeEstimate.unmeasured_seconds``: fine-grained activation offloading's
    exposure between what compute cannot hide and the whole copy, the paged stash's copies and
    re-runs): the nearest runs' errors say nothing about a term none of them has."""
    if unmeasured_seconds <= 0 or step_seconds <= 0:
        return band
    extra = 100.0 * unmeasured_seconds / step_seconds
    return replace(band, pct=band.base_pct + band.penalty_pct + extra, unmeasured_pct=extra)


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def penalty(weights_pct: Sequence[float], distance: Sequence[float]) -> float:
    return sum(w * d for w, d in zip(weights_pct, distance, strict=True))


def time_band(descriptor: RunDescriptor, runs: Sequence[EvidenceRun], parameters: BandParameters) -> TimeBand:
    """band_pct = Q_q(|e_j| of the k nearest runs) + Σ w_i · d_i(nearest run) (module docstring).
    Among runs at the same penalty the earlier one in ``runs`` is the nearest."""
    if not runs:
        raise LcmoeError(
            "time evidence", 0, "holds no measured runs", "regenerate it: benchmarks/time_bands.py --write"
        )
    scored = sorted(
        (
            (penalty(parameters.weights_pct, d), i, d)
            for i, d in enumerate(distances(descriptor, r.descriptor) for r in runs)
        ),
        key=lambda item: (item[0], item[1]),
    )
    nearest_penalty, nearest_index, nearest_distance = scored[0]
    base = quantile([abs(runs[i].error_pct) for _, i, _ in scored[: parameters.neighbours]], parameters.quantile)
    nearest = runs[nearest_index]
    return TimeBand(
        pct=base + nearest_penalty,
        base_pct=base,
        penalty_pct=nearest_penalty,
        nearest=nearest.name,
        nearest_model=nearest.model,
        distance=nearest_distance,
    )


def plan_band(run: RunConfig, evidence: TimeEvidence) -> TimeBand:
    return time_band(describe_run(run), evidence.runs, evidence.parameters)


# ----- the YAML document (benchmarks/time_bands.py writes it; the CLI reads it) --------------------
def evidence_from_dict(data: Mapping[str, Any]) -> TimeEvidence:
    """A ``TimeEvidence`` from the parsed ``time_evidence.yaml``."""
    band = data.get("band") or {}
    weights = band.get("weights_pct") or {}
    parameters = BandParameters(
        weights_pct=tuple(float(weights[d]) for d in DIMENSIONS),
        neighbours=int(band.get("neighbours", 10)),
        quantile=float(band.get("quantile", 0.8)),
    )
    runs = tuple(
        EvidenceRun(
            name=str(row["name"]),
            model=str(row["model"]),
            descriptor=RunDescriptor(
                mixer=str(row["mixer"]),
                moe=bool(row["moe"]),
                gpu=str(row["gpu"]),
                family=str(row["family"]),
                tp=int(row["tp"]),
                chunk_tokens=int(row["chunk_tokens"]),
                ep_domains=float(row["ep_domains"]),
                seq_len=int(row["seq_len"]),
            ),
            error_pct=float(row["lomo_error_pct"]),
        )
        for row in data.get("runs") or ()
    )
    return TimeEvidence(runs=runs, parameters=parameters, summary=dict(data.get("summary") or {}))
