"""The plans as the terminal can show them: one table (plus a table of the remaining settings)
when it fits the width, else one card per plan whose values wrap instead of being cut.

Cells come from plan/format.py (PLAN_COLUMNS, labelled_rows), so a column added there shows up
in both forms; the settings those columns leave out (optimizer, EP overlap, CP exchange, sequence
parallelism, pipeline layout) come from ``setting_rows`` here, so every setting a plan uses is on
screen and `lcmoe estimate --from-plan` can be checked against it."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.table import Table

from lcmoe.i18n import Language, context_language, translate, translate_renderable
from lcmoe.plan.format import PLAN_COLUMNS, labelled_rows

LEFT_COLUMNS = ("layout", "recompute", "dispatcher", "graphs")
# Comma lists: shown as "a, b, c" so a narrow cell wraps between entries instead of cutting one.
LIST_COLUMNS = ("recompute", "graphs")
SETTING_COLUMNS = ("optimizer", "EP overlap", "CP exchange", "sequence parallel", "pipeline layout")


def optimizer_text(entry: dict[str, Any]) -> str:
    """The optimizer as a plan (or estimate's inputs) sets it: precision-aware or not, the Adam
    moments' and the gradient buffer's dtype, and the share offloaded to the host when estimate
    reports it."""
    aware = bool(entry.get("precision_aware_optimizer"))
    moments = str(entry.get("exp_avg_dtype") or ("bf16" if aware else "fp32")).upper()
    grads = str(entry.get("main_grads_dtype") or "fp32").upper()
    text = f"{'precision-aware' if aware else 'plain'} Adam, {moments} moments, {grads} main grads"
    offload = entry.get("optimizer_offload_fraction")
    if "exp_avg_dtype" in entry and offload:
        text += f", {100 * float(offload):g}% on the host"
    return text


def recompute_spec(plan: dict[str, Any]) -> str:
    """Recompute as `lcmoe estimate --recompute` takes it (full:METHOD:N keeps method and count)."""
    rc = plan["recompute"]
    if rc["granularity"] == "full":
        return f"full:{rc.get('method') or 'uniform'}:{rc.get('num_layers') or 1}"
    if rc["granularity"] == "selective":
        return ",".join(rc["modules"]) or "none"
    return "none"


def setting_rows(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(SETTING_COLUMNS label, value) for the settings PLAN_COLUMNS leaves out."""
    lay = plan["layout"]
    pipeline = lay.get("pipeline_layout") or ("-" if lay["pp"] == 1 else "Megatron's even split")
    values = (
        optimizer_text(plan),
        "on" if plan.get("overlap_moe_expert_parallel_comm") else "off",
        str(lay["cp_comm_type"]) if lay["cp"] > 1 else "-",
        "on" if lay.get("sequence_parallel") else "off",
        str(pipeline),
    )
    return list(zip(SETTING_COLUMNS, values, strict=True))


def _entries(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The plans in labelled_rows' order: the plans, then the fallback and the guidance layout."""
    return [*payload["plans"], *(payload[k] for k in ("fallback", "reference") if payload.get(k))]


def plan_rows(payload: dict[str, Any]) -> list[list[str]]:
    """labelled_rows with the recompute cell spelled out whole (full:METHOD:N) and the comma
    lists spaced (LIST_COLUMNS)."""
    rows = labelled_rows(payload)
    for row, entry in zip(rows, _entries(payload), strict=False):
        if "recompute" in PLAN_COLUMNS:
            row[PLAN_COLUMNS.index("recompute")] = recompute_spec(entry)
        for col in LIST_COLUMNS:
            if col in PLAN_COLUMNS:
                at = PLAN_COLUMNS.index(col)
                row[at] = ", ".join(row[at].split(","))
    return rows


def plan_tables(payload: dict[str, Any], title: str) -> tuple[Table, Table]:
    """The wide form: the plans table and the table of their remaining settings (no cell wraps)."""
    rows = plan_rows(payload)
    main = Table(title=title)
    for col in PLAN_COLUMNS:
        main.add_column(col, justify="left" if col in LEFT_COLUMNS else "right", no_wrap=col not in LIST_COLUMNS)
    for row in rows:
        main.add_row(*row)
    settings = Table(title="the rest of each plan's settings")
    settings.add_column("#", justify="right", no_wrap=True)
    for col in SETTING_COLUMNS:
        settings.add_column(col, no_wrap=True)
    for row, entry in zip(rows, _entries(payload), strict=False):
        settings.add_row(row[0], *(value for _, value in setting_rows(entry)))
    return main, settings


def plan_cards(payload: dict[str, Any]) -> list[tuple[str, Table]]:
    """The narrow form: (title, card) per plan, every value whole (a value longer than the line
    folds onto the next ones, never cut)."""
    cards = []
    for row, entry in zip(plan_rows(payload), _entries(payload), strict=False):
        label = row[0]
        card = Table.grid(padding=(0, 2), pad_edge=True)
        card.add_column(no_wrap=True)
        card.add_column(overflow="fold")
        for col, value in [*zip(PLAN_COLUMNS[1:], row[1:], strict=False), *setting_rows(entry)]:
            card.add_row(col, value)
        cards.append((f"plan {label}" if label.isdigit() else label, card))
    return cards


def fits(console: Console, table: Table) -> bool:
    """Whether ``table`` shows every cell whole at the console's width: rendered there, no cell
    is cut to "…" (a comma list may wrap between its entries)."""
    buffer = io.StringIO()
    Console(file=buffer, width=console.width, color_system=None, legacy_windows=False).print(table)
    return "…" not in buffer.getvalue()


def print_plans(console: Console, payload: dict[str, Any], title: str, lang: Language | None = None) -> None:
    """The plans of ``payload`` under ``title``: a table when the console is wide enough, else cards.
    Headers and words are in ``lang`` (default: the running command's --lang) before the width is
    measured, so a Chinese table (two columns per character) is judged at its own width."""
    lang = context_language() if lang is None else lang
    tables = [translate_renderable(t, lang) for t in plan_tables(payload, title)]
    if all(fits(console, t) for t in tables):
        for table in tables:
            console.print(table)
        return
    console.print(translate(title, lang), highlight=False, soft_wrap=False, markup=False)
    for card_title, card in plan_cards(payload):
        console.print(translate(card_title, lang), style="bold", highlight=False, markup=False)
        console.print(Padding(translate_renderable(card, lang), (0, 0, 0, 2), expand=False), highlight=False)
