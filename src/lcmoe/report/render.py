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

from lcmoe.plan.format import (
    PLAN_COLUMNS,
    at_risk_note,
    labelled_rows,
    layout_text,
    model_notes,
    peft_text,
    recompute_text,
)
from lcmoe.report import plots

GIB = 1024.0**3


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
        label = f"plan {i + 1}: {layout_text(plan['layout'])}"
        out.append(
            Figure(
                f"plan{i + 1}_memory",
                f"{label} — memory by stage and component",
                plots.memory_by_stage(plan, f"plan {i + 1} memory per GPU"),
            )
        )
        out.append(
            Figure(
                f"plan{i + 1}_time",
                f"{label} — step-time breakdown",
                plots.time_breakdown(plan, f"plan {i + 1} step time"),
            )
        )
    if inputs.fitting_points:
        out.append(
            Figure(
                "pareto",
                "every plan that fits: memory against throughput",
                plots.pareto_scatter(inputs.fitting_points, payload["pareto"], payload["plans"]),
            )
        )
    if any(row["plan"] for row in inputs.sweep):
        capacity = payload["plans"][0]["memory"]["capacity_bytes"] / GIB if payload["plans"] else 80.0
        out.append(
            Figure("sweep", "best plan per sequence length: MFU and memory", plots.sweep_curves(inputs.sweep, capacity))
        )
    return out


def _rules_applied(payload: dict[str, Any], titles: dict[str, str]) -> list[tuple[str, str, str]]:
    seen: dict[tuple[str, str], str] = {}
    for i, plan in enumerate(payload["plans"]):
        for reason in plan["reasons"]:
            seen.setdefault((reason["rule"], reason["text"]), f"plan {i + 1}")
    return [(rule, titles.get(rule, ""), f"{where}: {text}") for (rule, text), where in seen.items()]


def _sweep_rows(sweep: list[dict[str, Any]]) -> list[list[str]]:
    rows = []
    for row in sweep:
        p = row["plan"]
        if p is None:
            rows.append([row["seq_len_label"], "no plan fits", "", "", "", "", ""])
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


def _assumptions(inputs: ReportInputs) -> list[str]:
    acc = inputs.accuracy
    inputs_ = inputs.payload["inputs"]
    lines = [
        f"Step time: ±{acc['time_mape_pct']:.0f}% typical error ({acc['time_source']}); read the ranking as a short "
        "list to A/B, not a verdict.",
        f"Memory: median {acc['memory_median_pct']:.1f}% / p90 {acc['memory_p90_pct']:.1f}% error on peak allocated "
        "(Megatron-LM CI runs); plans keep a "
        f"{100 * inputs_['memory_margin']:.0f}% margin below the GPU's capacity.",
        "Routing is assumed balanced (the published perf recipes force balance); real dropless routing "
        "adds expert-activation spikes.",
        "GBS, when not given, is GA = 4·PP microbatches per DP rank (8 without PP).",
        f"Target software: megatron-core {inputs_['megatron_core_version']}; Bridge field names of megatron-bridge "
        "0.6.2.",
    ]
    if acc.get("reference_container") and not acc.get("calibration"):
        lines.append(
            f"Speeds are for the NeMo {acc['reference_container']} container; the same recipes ran up to "
            f"{100 * (1 - acc['slowest_container_factor']):.0f}% slower on older containers (LC-CONTAINER)."
        )
    if acc.get("calibration"):
        lines.append(f"Calibrated with {acc['calibration']}.")
    lines += [note + "." for note in model_notes(inputs.payload)]
    if inputs_.get("peft"):
        lines.append(
            "LoRA: the five published Llama3-70B LoRA runs (and the five full-finetuning ones) ran ~15% slower "
            "than predicted (tokens/s, not fitted; benchmarks/throughput_accuracy.py); the memory of the "
            "frozen base and the adapters is derived, not fitted."
        )
    return lines


# ----- HTML ------------------------------------------------------------------------------------
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1500px;color:#222}
.scroll{overflow-x:auto}
h1{font-size:22px}h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}
td:nth-child(2),td:nth-child(3){text-align:left}
th{background:#f4f4f4}figure{margin:12px 0}figcaption{font-size:12px;color:#555}
pre{background:#f7f7f7;padding:8px;font-size:11px;overflow-x:auto}.rule{font-family:monospace}
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


def _table(columns: tuple[str, ...], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def render_html(inputs: ReportInputs, figs: list[Figure]) -> str:
    payload = inputs.payload
    meta = payload["inputs"]
    title = f"lcmoe plan — {meta['model']} at {meta['seq_len']} tokens on {meta['num_gpus']} × {meta['gpu']}"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style>",
        f"<script>{_CHECK_SCRIPT}</script>",
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="muted">lcmoe {html.escape(str(payload["lcmoe_version"]))}: searched {payload["searched"]} '
        f"candidates, {payload['legal']} legal, {payload['fit']} fit.</p>",
        *([f"<p>{html.escape(peft_text(meta['peft']))}.</p>"] if meta.get("peft") else []),
        "<h2>Plans, fastest first</h2>",
    ]
    if payload["plans"]:
        parts.append(_table(PLAN_COLUMNS, labelled_rows(payload)))
        note = at_risk_note(payload)
        if note:
            parts.append(f'<p class="muted">{html.escape(note)}.</p>')
    else:
        need = payload.get("min_gpus_needed")
        parts.append(f"<p>No layout fits; {'at least ' + str(need) + ' GPUs are needed' if need else 'add GPUs'}.</p>")
    by_name = {f.name: f for f in figs}
    for i, plan in enumerate(payload["plans"][:3]):
        parts.append(f"<h2>Plan {i + 1}: {html.escape(layout_text(plan['layout']))}</h2>")
        parts.append(
            "<ul>"
            + "".join(
                f'<li><span class="rule">[{html.escape(r["rule"])}]</span> {html.escape(r["text"])}</li>'
                for r in plan["reasons"]
            )
            + "</ul>"
        )
        for kind in ("memory", "time"):
            fig = by_name.get(f"plan{i + 1}_{kind}")
            if fig:
                parts.append(f"<figure>{fig.svg}<figcaption>{html.escape(fig.caption)}</figcaption></figure>")
    for name, heading in (("pareto", "Memory against throughput"), ("sweep", "Sequence-length sweep")):
        fig = by_name.get(name)
        if fig:
            parts.append(
                f"<h2>{heading}</h2><figure>{fig.svg}<figcaption>{html.escape(fig.caption)}</figcaption></figure>"
            )
            if name == "sweep":
                parts.append(_table(SWEEP_COLUMNS, _sweep_rows(inputs.sweep)))
    parts.append(
        "<h2>Rules applied</h2><ul>"
        + "".join(
            f'<li><span class="rule">{html.escape(rule)}</span> {html.escape(title_)} — {html.escape(text)}</li>'
            for rule, title_, text in _rules_applied(payload, inputs.rules)
        )
        + "</ul>"
    )
    parts.append("<h2>Emitted config (plan 1)</h2><p>Megatron Bridge overrides:</p>")
    parts.append(f"<pre>{html.escape(inputs.overrides)}</pre><p>Megatron-LM arguments:</p>")
    parts.append(f"<pre>{html.escape(inputs.megatron_args)}</pre>")
    parts.append(
        "<h2>Assumptions and error bands</h2><ul>"
        + "".join(f"<li>{html.escape(line)}</li>" for line in _assumptions(inputs))
        + "</ul>"
    )
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


def render_markdown(inputs: ReportInputs, figs: list[Figure], plots_dir: str) -> str:
    payload = inputs.payload
    meta = payload["inputs"]
    out = [
        f"# lcmoe plan — {_md_text(meta['model'])} at {_md_text(meta['seq_len'])} tokens on "
        f"{_md_text(meta['num_gpus'])} × {_md_text(meta['gpu'])}",
        "",
        f"lcmoe {payload['lcmoe_version']}: searched {payload['searched']} candidates, {payload['legal']} legal, "
        f"{payload['fit']} fit.",
        "",
        *([_md_inline(peft_text(meta["peft"])) + ".", ""] if meta.get("peft") else []),
        "## Plans, fastest first",
        "",
        _md_table(PLAN_COLUMNS, labelled_rows(payload)) if payload["plans"] else "No layout fits.",
    ]
    note = at_risk_note(payload) if payload["plans"] else ""
    if note:
        out += ["", _md_inline(note) + "."]
    by_name = {f.name: f for f in figs}
    for i, plan in enumerate(payload["plans"][:3]):
        out += ["", f"## Plan {i + 1}: {_md_inline(layout_text(plan['layout']))}", ""]
        out += [f"- [{_md_inline(r['rule'])}] {_md_inline(r['text'])}" for r in plan["reasons"]]
        for kind in ("memory", "time"):
            fig = by_name.get(f"plan{i + 1}_{kind}")
            if fig:
                out += ["", f"![{_md_text(fig.caption)}]({quote(plots_dir)}/{quote(fig.name)}.svg)"]
    for name, heading in (("pareto", "Memory against throughput"), ("sweep", "Sequence-length sweep")):
        fig = by_name.get(name)
        if fig:
            out += ["", f"## {heading}", "", f"![{_md_text(fig.caption)}]({quote(plots_dir)}/{quote(fig.name)}.svg)"]
            if name == "sweep":
                out += ["", _md_table(SWEEP_COLUMNS, _sweep_rows(inputs.sweep))]
    out += ["", "## Rules applied", ""]
    out += [
        f"- `{_md_inline(rule)}` {_md_inline(title)} — {_md_inline(text)}"
        for rule, title, text in _rules_applied(payload, inputs.rules)
    ]
    out += ["", "## Emitted config (plan 1)", ""]
    out += [*_md_fence(inputs.overrides.rstrip()), "", *_md_fence(inputs.megatron_args.rstrip())]
    out += ["", "## Assumptions and error bands", ""]
    out += [f"- {_md_inline(line)}" for line in _assumptions(inputs)]
    return "\n".join(out) + "\n"
