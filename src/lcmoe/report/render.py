"""Report document → self-contained HTML and a Markdown twin.

Every number shown is formatted from the plan payload (the dictionary ``lcmoe plan --json``
prints), and the HTML embeds that payload verbatim (``<script type="application/json"
id="lcmoe-payload">``), so a reader — or a test — can check the page against the JSON."""

from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from lcmoe.i18n import Language, context_language, has_cjk, translate
from lcmoe.plan.format import (
    PLAN_COLUMNS,
    SETTING_COLUMNS,
    at_risk_note,
    labelled_rows,
    layout_text,
    model_notes,
    peft_text,
    ranking_notes,
    recompute_text,
    settings_table_rows,
)
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


def _period(text: str, lang: Language) -> str:
    """``text`` ended as a sentence in its language ("。" after Chinese, "." after English)."""
    return text + ("。" if lang is Language.ZH and has_cjk(text) else ".")


def _rules_applied(
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


def _sweep_rows(sweep: list[dict[str, Any]]) -> list[list[str]]:
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


def _assumptions(inputs: ReportInputs, lang: Language = Language.EN) -> list[str]:
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
    lines += [_period(translate(note, lang), lang) for note in model_notes(inputs.payload)]
    if inputs_.get("peft"):
        lines.append(say("lora"))
    return [translate(line, lang) for line in lines]


# ----- HTML ------------------------------------------------------------------------------------
# Responsive: the page never scrolls sideways (tables scroll inside their own box, long words
# wrap), figures shrink to the column and never grow past their drawn size, and on a wide screen
# a plan's two figures sit side by side. tests/test_report.py checks 390 px and 1400 px.
_CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;padding:16px 24px;
max-width:1500px;color:#222;overflow-wrap:anywhere}
@media (max-width:600px){body{padding:8px 10px}h1{font-size:18px}h2{font-size:16px}}
.scroll{overflow-x:auto;max-width:100%}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap;overflow-wrap:normal}
td.wrap{white-space:normal;text-align:left;min-width:8em}
th{background:#f4f4f4}figure{margin:12px 0;min-width:0}figcaption{font-size:12px;color:#555}
.figs{display:grid;grid-template-columns:repeat(auto-fill,minmax(min(100%,460px),1fr));column-gap:24px}
figure svg{display:block;width:100%;height:auto}
pre{background:#f7f7f7;padding:8px;font-size:11px;overflow-x:auto;overflow-wrap:normal}.rule{font-family:monospace}
.muted{color:#666;font-size:12px}
"""
_CHECK_SCRIPT = """
window.lcmoeErrors = [];
window.addEventListener('error', function (e) { window.lcmoeErrors.push(String(e.message)); });
document.addEventListener('DOMContentLoaded', function () {
  var plots = document.querySelectorAll('figure svg').length;
  document.body.setAttribute('data-plots', String(plots));
  var payload = JSON.parse(document.getElementById('lcmoe-payload').textContent);
  document.body.setAttribute('data-plans', String(payload.plans.length));
  document.body.setAttribute('data-errors', String(window.lcmoeErrors.length));
});
"""
# Columns whose values may wrap: spaces in a layout, commas in a module or scope list.
WRAP_COLUMNS = frozenset({"layout", "recompute", "graphs", "optimizer", "pipeline layout"})
_SVG_SIZE = re.compile(r'^<svg([^>]*?) width="([\d.]+)pt" height="([\d.]+)pt"')
# A plot's words (svg.fonttype none keeps them as text): titles, axis labels, legend entries.
_SVG_TEXT = re.compile(r"(<text\b[^>]*>)([^<]*)(</text>)")
PX_PER_PT = 4.0 / 3.0


def _cell(value: str, wrap: bool) -> str:
    if not wrap:
        return f"<td>{html.escape(value)}</td>"
    # A line may break after each "," of a list and each "|" of a pipeline layout string.
    parts = re.split(r"(?<=[,|])", value)
    return '<td class="wrap">' + "<wbr>".join(html.escape(part) for part in parts) + "</td>"


def _table(columns: tuple[str, ...], rows: list[list[str]], lang: Language = Language.EN) -> str:
    head = "".join(f"<th>{html.escape(translate(c, lang))}</th>" for c in columns)
    wrap = [c in WRAP_COLUMNS for c in columns]
    body = "".join(
        "<tr>" + "".join(_cell(translate(v, lang), w) for v, w in zip(row, wrap, strict=False)) + "</tr>"
        for row in rows
    )
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _svg_words(svg: str, lang: Language) -> str:
    """The plot's text elements in ``lang`` (numbers and names come back as they are)."""
    if lang is Language.EN:
        return svg

    def one(match: re.Match[str]) -> str:
        words = translate(html.unescape(match.group(2)), lang)
        return match.group(1) + html.escape(words, quote=False) + match.group(3)

    return _SVG_TEXT.sub(one, svg)


def _inline_svg(fig: Figure, lang: Language = Language.EN) -> str:
    """The figure for the page: matplotlib's fixed width/height (pt) become a CSS max-width (its
    drawn size in px), so the viewBox scales it down to the column but never up."""
    svg = _svg_words(fig.svg, lang)
    match = _SVG_SIZE.match(svg)
    if match is None:
        return svg
    attrs, width_pt = match.group(1), float(match.group(2))
    label = html.escape(translate(fig.caption, lang))
    opening = f'<svg{attrs} style="max-width:{width_pt * PX_PER_PT:.0f}px" role="img" aria-label="{label}"'
    return opening + svg[match.end() :]


def _figure(fig: Figure | None, lang: Language = Language.EN) -> str:
    if fig is None:
        return ""
    caption = html.escape(translate(fig.caption, lang))
    return f"<figure>{_inline_svg(fig, lang)}<figcaption>{caption}</figcaption></figure>"


def plans_heading(payload: dict[str, Any]) -> str:
    """What the plans are ranked by, from the payload's rank record (plan/payload.py)."""
    rank = payload.get("rank") or {}
    if str(rank.get("by", "")).endswith("_low") and rank.get("bands"):
        return say("plans_by_low_edge")
    if rank.get("mode") == "expected":
        return say("plans_by_prediction")
    return say("plans_by_speed")


def _plans_html(payload: dict[str, Any], lang: Language = Language.EN) -> list[str]:
    parts = [f"<h2>{html.escape(translate(plans_heading(payload), lang))}</h2>"]
    if not payload["plans"]:
        need = payload.get("min_gpus_needed")
        verdict = say("no_fit_need", need=need) if need else say("no_fit")
        return [*parts, f"<p>{html.escape(translate(verdict, lang))}</p>"]
    parts.append(_table(PLAN_COLUMNS, labelled_rows(payload), lang))
    parts.append(f"<h3>{html.escape(translate(SETTINGS_HEADING, lang))}</h3>")
    parts.append(_table(SETTINGS_TABLE_COLUMNS, settings_table_rows(payload), lang))
    notes = [*ranking_notes(payload), at_risk_note(payload)]
    parts += [f'<p class="muted">{html.escape(_period(translate(note, lang), lang))}</p>' for note in notes if note]
    return parts


def _plan_sections(payload: dict[str, Any], by_name: dict[str, Figure], lang: Language = Language.EN) -> list[str]:
    parts = []
    for i, plan in enumerate(payload["plans"][:3]):
        heading = translate(say("plan_heading", n=i + 1, layout=layout_text(plan["layout"])), lang)
        reasons = "".join(
            f'<li><span class="rule">[{html.escape(r["rule"])}]</span> {html.escape(translate(r["text"], lang))}</li>'
            for r in plan["reasons"]
        )
        figures_ = "".join(_figure(by_name.get(f"plan{i + 1}_{kind}"), lang) for kind in ("memory", "time"))
        parts += [f"<h2>{html.escape(heading)}</h2>", f"<ul>{reasons}</ul>", f'<div class="figs">{figures_}</div>']
    return parts


def _searched(payload: dict[str, Any]) -> str:
    counts = {key: payload[key] for key in ("searched", "legal", "fit")}
    return say("searched", version=payload["lcmoe_version"], **counts)


def _bullets(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def render_html(inputs: ReportInputs, figs: list[Figure], lang: Language | None = None) -> str:
    """The page in ``lang`` (default: the running command's --lang, i18n); the embedded payload
    stays as ``lcmoe plan --json`` prints it."""
    lang = context_language() if lang is None else lang
    payload = inputs.payload
    meta = payload["inputs"]
    title = say("title", model=meta["model"], seq_len=meta["seq_len"], num_gpus=meta["num_gpus"], gpu=meta["gpu"])
    title, searched = translate(title, lang), translate(_searched(payload), lang)
    by_name = {f.name: f for f in figs}

    def heading(key: str) -> str:
        return html.escape(translate(say(key), lang))

    parts = [
        "<!DOCTYPE html>",
        f'<html lang="{"zh-CN" if lang is Language.ZH else "en"}"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style>",
        f"<script>{_CHECK_SCRIPT}</script>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="muted">{html.escape(searched)}</p>',
        *(
            [f"<p>{html.escape(_period(translate(peft_text(meta['peft']), lang), lang))}</p>"]
            if meta.get("peft")
            else []
        ),
        *_plans_html(payload, lang),
        *_plan_sections(payload, by_name, lang),
    ]
    for name, key in (("pareto", "pareto_heading"), ("sweep", "sweep_heading")):
        if name in by_name:
            parts.append(f"<h2>{heading(key)}</h2>{_figure(by_name[name], lang)}")
            if name == "sweep":
                parts.append(_table(SWEEP_COLUMNS, _sweep_rows(inputs.sweep), lang))
    rules = [
        f'<span class="rule">{html.escape(rule)}</span> {html.escape(title_)} — {html.escape(text)}'
        for rule, title_, text in _rules_applied(payload, inputs.rules, lang)
    ]
    parts += [f"<h2>{heading('rules_heading')}</h2>", _bullets(rules)]
    parts.append(f"<h2>{heading('config_heading')}</h2><p>{heading('bridge_overrides')}</p>")
    parts.append(f"<pre>{html.escape(inputs.overrides)}</pre><p>{heading('megatron_args')}</p>")
    parts.append(f"<pre>{html.escape(inputs.megatron_args)}</pre>")
    parts.append(f"<h2>{heading('assumptions_heading')}</h2>")
    parts.append(_bullets([html.escape(line) for line in _assumptions(inputs, lang)]))
    # <, > and & as JSON \u escapes: no "</script>" or "<!--" in a user string can end the block.
    blob = json.dumps(payload, default=str).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    parts.append(f'<script type="application/json" id="lcmoe-payload">{blob}</script>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# ----- Markdown --------------------------------------------------------------------------------
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#!~])")


def _md_text(value: object) -> str:
    """A user-supplied string (model or GPU name, a path) as inert Markdown text: HTML
    metacharacters become entities (a ``<script>`` in a model name stays text in every viewer)
    and Markdown's own punctuation is backslash-escaped (no links, emphasis or table breaks)."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(str(value), quote=False))


def _md_inline(value: object) -> str:
    """lcmoe's own sentences that may quote user values: HTML metacharacters escaped only."""
    return html.escape(str(value), quote=False)


def _md_fence(text: str) -> list[str]:
    """``text`` in a code fence longer than any backtick run inside it (so it cannot close it)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence, text, fence]


def _md_table(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    def cell(v: str) -> str:
        return html.escape(str(v), quote=False).replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def render_markdown(inputs: ReportInputs, figs: list[Figure], plots_dir: str, lang: Language | None = None) -> str:
    """The Markdown twin in ``lang`` (default: the command's --lang); its SVG files keep English labels."""
    lang = context_language() if lang is None else lang

    def tr(text: str) -> str:
        return translate(text, lang)

    payload = inputs.payload
    meta = payload["inputs"]
    title = say(
        "title",
        model=_md_text(meta["model"]),
        seq_len=_md_text(meta["seq_len"]),
        num_gpus=_md_text(meta["num_gpus"]),
        gpu=_md_text(meta["gpu"]),
    )
    searched = tr(_searched(payload))
    plan_rows = [[tr(v) for v in row] for row in labelled_rows(payload)]
    out = [
        f"# {tr(title)}",
        "",
        searched,
        "",
        *([_md_inline(_period(tr(peft_text(meta["peft"])), lang)), ""] if meta.get("peft") else []),
        f"## {_md_inline(tr(plans_heading(payload)))}",
        "",
        _md_table(tuple(tr(c) for c in PLAN_COLUMNS), plan_rows) if payload["plans"] else tr(say("no_fit_short")),
    ]
    if payload["plans"]:
        settings = [[tr(v) for v in row] for row in settings_table_rows(payload)]
        out += [
            "",
            f"### {tr(SETTINGS_HEADING)}",
            "",
            _md_table(tuple(tr(c) for c in SETTINGS_TABLE_COLUMNS), settings),
        ]
    notes = [*ranking_notes(payload), at_risk_note(payload)] if payload["plans"] else []
    out += [line for note in notes if note for line in ("", _md_inline(_period(tr(note), lang)))]
    by_name = {f.name: f for f in figs}
    for i, plan in enumerate(payload["plans"][:3]):
        out += ["", f"## {_md_inline(tr(say('plan_heading', n=i + 1, layout=layout_text(plan['layout']))))}", ""]
        out += [f"- [{_md_inline(r['rule'])}] {_md_inline(tr(r['text']))}" for r in plan["reasons"]]
        for kind in ("memory", "time"):
            fig = by_name.get(f"plan{i + 1}_{kind}")
            if fig:
                out += ["", f"![{_md_text(tr(fig.caption))}]({quote(plots_dir)}/{quote(fig.name)}.svg)"]
    for name, key in (("pareto", "pareto_heading"), ("sweep", "sweep_heading")):
        fig = by_name.get(name)
        if fig:
            image = f"![{_md_text(tr(fig.caption))}]({quote(plots_dir)}/{quote(fig.name)}.svg)"
            out += ["", f"## {_md_inline(tr(say(key)))}", "", image]
            if name == "sweep":
                sweep_rows = [[tr(v) for v in row] for row in _sweep_rows(inputs.sweep)]
                out += ["", _md_table(tuple(tr(c) for c in SWEEP_COLUMNS), sweep_rows)]
    out += ["", f"## {_md_inline(tr(say('rules_heading')))}", ""]
    out += [
        f"- `{_md_inline(rule)}` {_md_inline(title_)} — {_md_inline(text)}"
        for rule, title_, text in _rules_applied(payload, inputs.rules, lang)
    ]
    out += ["", f"## {_md_inline(tr(say('config_heading')))}", ""]
    out += [*_md_fence(inputs.overrides.rstrip()), "", *_md_fence(inputs.megatron_args.rstrip())]
    out += ["", f"## {_md_inline(tr(say('assumptions_heading')))}", ""]
    out += [f"- {_md_inline(line)}" for line in _assumptions(inputs, lang)]
    return "\n".join(out) + "\n"
