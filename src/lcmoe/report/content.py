"""What a report says, before it is HTML or Markdown: its inputs, its figures, and the sentences and
table rows both renderers show (``report/html_page.py``, ``report/markdown.py``).

Every number is formatted from the plan payload (the dictionary ``lcmoe plan --json`` prints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lcmoe.i18n import Language, has_cjk, translate
from lcmoe.plan.format import SETTING_COLUMNS, layout_text, model_notes, recompute_text
from lcmoe.report import plots
from lcmoe.report.strings import say

GIB = 1024.0**3

# The settings the plans table leaves out (plan/format.py), so every setting a plan uses is shown.
SETTINGS_HEADING = "the rest of each plan's settings"
SETTINGS_TABLE_COLUMNS = ("#", "recompute", *SETTING_COLUMNS)


@dataclass(frozen=True, slots=True)
class ReportInputs:
    payload: dict[str, Any]  # plan_payload(request, result)
    fitting_points: list[tuple[float, float]]
    sweep: list[dict[str, Any]]  # [{"seq_len", "seq_len_label", "plan": plan dict | None}]
    overrides: str  # emitted Bridge overrides of plan 1
    megatron_args: str
    accuracy: dict[str, Any]  # time/memory model error figures
    rules: dict[str, str] = field(default_factory=dict)  # rule id → title


@dataclass(frozen=True, slots=True)
class Figure:
    name: str
    caption: str
    svg: str


def figures(inputs: ReportInputs, per_plan: int = 3) -> list[Figure]:
    payload = inputs.payload
    out: list[Figure] = []
    for i, plan in enumerate(payload["plans"][:per_plan]):
        n, layout = i + 1, layout_text(plan["layout"])
        out.append(
            Figure(
                f"plan{n}_memory",
                say("caption_memory", n=n, layout=layout),
                plots.memory_by_stage(plan, say("memory_title", n=n)),
            )
        )
        out.append(
            Figure(
                f"plan{n}_time",
                say("caption_time", n=n, layout=layout),
                plots.time_breakdown(plan, say("time_title", n=n)),
            )
        )
    if inputs.fitting_points:
        out.append(
            Figure(
                "pareto",
                say("caption_pareto"),
                plots.pareto_scatter(inputs.fitting_points, payload["pareto"], payload["plans"]),
            )
        )
    if any(row["plan"] for row in inputs.sweep):
        capacity = payload["plans"][0]["memory"]["capacity_bytes"] / GIB if payload["plans"] else 80.0
        out.append(Figure("sweep", say("caption_sweep"), plots.sweep_curves(inputs.sweep, capacity)))
    return out


def period(text: str, lang: Language) -> str:
    """``text`` ended as a sentence in its language ("。" after Chinese, "." after English)."""
    return text + ("。" if lang is Language.ZH and has_cjk(text) else ".")


def rules_applied(
    payload: dict[str, Any], titles: dict[str, str], lang: Language = Language.EN
) -> list[tuple[str, str, str]]:
    """(rule, its title, "plan N: what it says") for each rule the plans cite, in ``lang``."""
    seen: dict[tuple[str, str], str] = {}
    for i, plan in enumerate(payload["plans"]):
        for reason in plan["reasons"]:
            seen.setdefault((reason["rule"], reason["text"]), translate(say("where_plan", n=i + 1), lang))
    colon = "：" if lang is Language.ZH else ": "
    return [
        (rule, translate(titles.get(rule, ""), lang), f"{where}{colon}{translate(text, lang)}")
        for (rule, text), where in seen.items()
    ]


def sweep_rows(sweep: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for row in sweep:
        p = row["plan"]
        if p is None:
            rows.append([row["seq_len_label"], say("sweep_no_fit"), "", "", "", "", ""])
            continue
        rows.append(
            [
                row["seq_len_label"],
                layout_text(p["layout"]),
                recompute_text(p),
                p["precision"],
                f"{p['memory']['peak_reserved_bytes'] / GIB:.1f}",
                f"{p['time']['tokens_per_sec_per_gpu']:.0f}",
                f"{100 * p['time']['mfu']:.1f}%",
            ]
        )
    return rows


SWEEP_COLUMNS = ("seq", "layout", "recompute", "precision", "peak GiB", "tok/s/GPU", "MFU")


def _time_accuracy(acc: dict[str, Any]) -> str:
    """The time model's error as the fit record states it (data/time_coefficients.yaml ``fit``,
    benchmarks/fit_time.py), or the user's calibration's own error."""
    if acc.get("calibration"):
        return say("time_calibrated", calibration=acc["calibration"], mape_pct=acc.get("time_in_sample_pct") or 0.0)
    figures_ = [acc.get(k) for k in ("time_in_sample_pct", "time_lomo_pct", "time_lomo_moe_pct", "time_runs")]
    if any(v is None for v in figures_):
        return say("time_accuracy_unrecorded")
    in_sample, lomo, lomo_moe, runs = figures_
    return say("time_accuracy", in_sample_pct=in_sample, lomo_pct=lomo, lomo_moe_pct=lomo_moe, runs=runs)


def _band_evidence(payload: dict[str, Any]) -> list[str]:
    """How often the plans' ±bands held, from the payload's rank evidence (time_evidence.yaml)."""
    evidence = (payload.get("rank") or {}).get("evidence") or {}
    if not all(isinstance(evidence.get(k), (int, float)) for k in ("coverage", "runs", "median_band_pct")):
        return []
    return [
        say(
            "band_evidence",
            coverage_pct=100 * evidence["coverage"],
            runs=evidence["runs"],
            median_band_pct=evidence["median_band_pct"],
        )
    ]


def assumptions(inputs: ReportInputs, lang: Language = Language.EN) -> list[str]:
    acc = inputs.accuracy
    inputs_ = inputs.payload["inputs"]
    lines = [_time_accuracy(acc), *_band_evidence(inputs.payload)]
    if acc.get("memory_runs"):
        lines.append(
            say(
                "memory_accuracy",
                median_pct=acc["memory_median_pct"],
                p90_pct=acc["memory_p90_pct"],
                runs=acc["memory_runs"],
                margin_pct=100 * inputs_["memory_margin"],
            )
        )
    lines += [say("routing"), say("software", megatron_core=inputs_["megatron_core_version"])]
    if acc.get("reference_container") and not acc.get("calibration"):
        slower = 100 * (1 - acc["slowest_container_factor"])
        lines.append(say("containers", container=acc["reference_container"], slower_pct=slower))
    lines += [period(translate(note, lang), lang) for note in model_notes(inputs.payload)]
    if inputs_.get("peft"):
        lines.append(say("lora"))
    return [translate(line, lang) for line in lines]


def plans_heading(payload: dict[str, Any]) -> str:
    """What the plans are ranked by, from the payload's rank record (plan/payload.py)."""
    rank = payload.get("rank") or {}
    if str(rank.get("by", "")).endswith("_low") and rank.get("bands"):
        return say("plans_by_low_edge")
    if rank.get("mode") == "expected":
        return say("plans_by_prediction")
    return say("plans_by_speed")


def searched_text(payload: dict[str, Any]) -> str:
    counts = {key: payload[key] for key in ("searched", "legal", "fit")}
    return say("searched", version=payload["lcmoe_version"], **counts)
