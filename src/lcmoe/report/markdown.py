"""The report's Markdown twin: the same sections as the HTML page, with the plots as SVG files
beside it, and every user-supplied string made inert Markdown text."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import quote

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
    payload = inputs.payload
    meta = payload["inputs"]
    title = say(
        "title",
        model=_md_text(meta["model"]),
        seq_len=_md_text(meta["seq_len"]),
        num_gpus=_md_text(meta["num_gpus"]),
        gpu=_md_text(meta["gpu"]),
    )
    out = [f"# {translate(title, lang)}", "", translate(searched_text(payload), lang), ""]
    if meta.get("peft"):
        out += [_md_inline(period(translate(peft_text(meta["peft"]), lang), lang)), ""]
    out += _md_plans(payload, lang)
    out += _md_figures(inputs, {f.name: f for f in figs}, plots_dir, lang)
    out += _md_closing(inputs, lang)
    return "\n".join(out) + "\n"


def _md_plans(payload: dict[str, Any], lang: Language) -> list[str]:
    """The plans table, the rest of their settings and the ranking notes."""

    def tr(text: str) -> str:
        return translate(text, lang)

    out = [f"## {_md_inline(tr(plans_heading(payload)))}", ""]
    if not payload["plans"]:
        return [*out, tr(say("no_fit_short"))]
    plan_rows = [[tr(v) for v in row] for row in labelled_rows(payload)]
    settings = [[tr(v) for v in row] for row in settings_table_rows(payload)]
    out += [_md_table(tuple(tr(c) for c in PLAN_COLUMNS), plan_rows), "", f"### {tr(SETTINGS_HEADING)}", ""]
    out.append(_md_table(tuple(tr(c) for c in SETTINGS_TABLE_COLUMNS), settings))
    notes = [*ranking_notes(payload), at_risk_note(payload)]
    return out + [line for note in notes if note for line in ("", _md_inline(period(tr(note), lang)))]


def _md_image(fig: Figure, plots_dir: str, lang: Language) -> str:
    return f"![{_md_text(translate(fig.caption, lang))}]({quote(plots_dir)}/{quote(fig.name)}.svg)"


def _md_figures(inputs: ReportInputs, by_name: dict[str, Figure], plots_dir: str, lang: Language) -> list[str]:
    """Each of the first three plans (its reasons, its memory and time plots), then the Pareto
    front and the sequence-length sweep."""
    out: list[str] = []
    for i, plan in enumerate(inputs.payload["plans"][:3]):
        heading = translate(say("plan_heading", n=i + 1, layout=layout_text(plan["layout"])), lang)
        out += ["", f"## {_md_inline(heading)}", ""]
        out += [f"- [{_md_inline(r['rule'])}] {_md_inline(translate(r['text'], lang))}" for r in plan["reasons"]]
        for kind in ("memory", "time"):
            fig = by_name.get(f"plan{i + 1}_{kind}")
            if fig:
                out += ["", _md_image(fig, plots_dir, lang)]
    for name, key in (("pareto", "pareto_heading"), ("sweep", "sweep_heading")):
        fig = by_name.get(name)
        if fig:
            out += ["", f"## {_md_inline(translate(say(key), lang))}", "", _md_image(fig, plots_dir, lang)]
            if name == "sweep":
                rows = [[translate(v, lang) for v in row] for row in sweep_rows(inputs.sweep)]
                out += ["", _md_table(tuple(translate(c, lang) for c in SWEEP_COLUMNS), rows)]
    return out


def _md_closing(inputs: ReportInputs, lang: Language) -> list[str]:
    """The rules the plans cite, the emitted configuration and the assumptions."""

    def heading(key: str) -> str:
        return f"## {_md_inline(translate(say(key), lang))}"

    out = ["", heading("rules_heading"), ""]
    out += [
        f"- `{_md_inline(rule)}` {_md_inline(title)} — {_md_inline(text)}"
        for rule, title, text in rules_applied(inputs.payload, inputs.rules, lang)
    ]
    out += ["", heading("config_heading"), ""]
    out += [*_md_fence(inputs.overrides.rstrip()), "", *_md_fence(inputs.megatron_args.rstrip())]
    out += ["", heading("assumptions_heading"), ""]
    return out + [f"- {_md_inline(line)}" for line in assumptions(inputs, lang)]
