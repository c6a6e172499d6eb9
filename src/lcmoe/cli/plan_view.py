"""The plans as the terminal can show them: one table (plus a table of the remaining settings)
when it fits the width, else one card per plan whose values wrap instead of being cut.

Cells come from plan/format.py (PLAN_COLUMNS, labelled_rows), so a column added there shows up
in both forms; the settings those columns leave out (optimizer, EP overlap, CP exchange, sequence
parallelism, pipeline layout) come from ``setting_rows`` (plan/format.py, shared with the report),
so every setting a plan uses is on screen and `lcmoe estimate --from-plan` can be checked against it."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.padding import Padding
from rich.table import Table

from lcmoe.i18n import Language, context_language, translate, translate_renderable
from lcmoe.plan.format import (  # re-exported: the helpers lived here first
    PLAN_COLUMNS,
    SETTING_COLUMNS,
    labelled_entries,
    labelled_rows,
    optimizer_text,
    recompute_spec,
    setting_rows,
)

__all__ = [
    "SETTING_COLUMNS",
    "optimizer_text",
    "plan_cards",
    "plan_rows",
    "plan_tables",
    "print_plans",
    "recompute_spec",
]
__all__ += ["setting_rows"]

LEFT_COLUMNS = ("layout", "recompute", "dispatcher", "graphs")
# Comma lists: shown as "a, b, c" so a narrow cell wraps between entries instead of cutting one.
LIST_COLUMNS = ("recompute", "graphs")


_entries = labelled_entries


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
