"""The report as one self-contained HTML page.

The page embeds the plan payload verbatim (``<script type="application/json" id="lcmoe-payload">``),
so a reader — or a test — can check the page against the JSON."""

from __future__ import annotations

import html
import json
import re
from typing import Any

from lcmoe.i18n import Language, context_language, translate
from lcmoe.plan.format import (
    PLAN_COLUMNS,
    at_risk_note,
    labelled_rows,
    layout_text,
    peft_text,
    ranking_notes,
    settings_table_rows,
)
from lcmoe.report.content import (
    SETTINGS_HEADING,
    SETTINGS_TABLE_COLUMNS,
    SWEEP_COLUMNS,
    Figure,
    ReportInputs,
    assumptions,
    period,
    plans_heading,
    rules_applied,
    searched_text,
    sweep_rows,
)
from lcmoe.report.strings import say

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
    parts += [f'<p class="muted">{html.escape(period(translate(note, lang), lang))}</p>' for note in notes if note]
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


def _bullets(items: list[str]) -> str:
    return "<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"


def render_html(inputs: ReportInputs, figs: list[Figure], lang: Language | None = None) -> str:
    """The page in ``lang`` (default: the running command's --lang, i18n); the embedded payload
    stays as ``lcmoe plan --json`` prints it."""
    lang = context_language() if lang is None else lang
    payload = inputs.payload
    meta = payload["inputs"]
    title = say("title", model=meta["model"], seq_len=meta["seq_len"], num_gpus=meta["num_gpus"], gpu=meta["gpu"])
    title, searched = translate(title, lang), translate(searched_text(payload), lang)
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
            [f"<p>{html.escape(period(translate(peft_text(meta['peft']), lang), lang))}</p>"]
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
                parts.append(_table(SWEEP_COLUMNS, sweep_rows(inputs.sweep), lang))
    rules = [
        f'<span class="rule">{html.escape(rule)}</span> {html.escape(title_)} — {html.escape(text)}'
        for rule, title_, text in rules_applied(payload, inputs.rules, lang)
    ]
    parts += [f"<h2>{heading('rules_heading')}</h2>", _bullets(rules)]
    parts.append(f"<h2>{heading('config_heading')}</h2><p>{heading('bridge_overrides')}</p>")
    parts.append(f"<pre>{html.escape(inputs.overrides)}</pre><p>{heading('megatron_args')}</p>")
    parts.append(f"<pre>{html.escape(inputs.megatron_args)}</pre>")
    parts.append(f"<h2>{heading('assumptions_heading')}</h2>")
    parts.append(_bullets([html.escape(line) for line in assumptions(inputs, lang)]))
    # <, > and & as JSON \u escapes: no "</script>" or "<!--" in a user string can end the block.
    blob = json.dumps(payload, default=str).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    parts.append(f'<script type="application/json" id="lcmoe-payload">{blob}</script>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
