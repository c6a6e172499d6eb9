"""The console half of lcmoe's translation: rich renderables translated before they are printed
(``translate_renderable``, the console's ``render_hook``), Chinese wrapped between characters
(``cjk_text``), an indented line that wraps under itself (``Hanging``), and the CLI command's
output language (``OutputContext``, ``context_language``). rich is imported only when printing."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from lcmoe.i18n.catalog import Language, has_cjk, translate

# Where a Chinese line may break: before any CJK character (each is a "word" of its own), except
# before closing punctuation, which stays on the line it closes, and after opening punctuation,
# which goes with what it opens; runs of other characters (an English word, a number, a flag)
# stay whole, as rich keeps them.
_OPENING = "（「『【《“‘"
_CLOSING = "，。；：、！？）」』】》”’%"
_CJK_RANGE = "\u2e80-\u9fff\uf900-\ufaff\u3000-\u303f\uff00-\uffef"
_BREAK_UNIT = re.compile(rf"[{_OPENING}]*(?:[{_CJK_RANGE}]|[^\s{_CJK_RANGE}]+)[{_CLOSING}]*\s*|\s+")


def cjk_line_breaks(text: str, width: int) -> list[int]:
    """Offsets at which to break ``text`` (one line, no newline) so that each piece is at most
    ``width`` cells: greedy, breaking between CJK characters and at spaces; a run longer than the
    width (a URL) is folded at the width."""
    from rich.cells import cell_len

    breaks: list[int] = []
    used = 0
    for match in _BREAK_UNIT.finditer(text):
        unit = match.group()
        shown = cell_len(unit.rstrip())
        if used and used + shown > width:
            breaks.append(match.start())
            used = 0
        if shown > width:  # fold a unit wider than the line, character by character
            for offset, char in enumerate(unit, match.start()):
                cells = cell_len(char)
                if used + cells > width and not char.isspace():
                    breaks.append(offset)
                    used = 0
                used += cells
            continue
        used += cell_len(unit)
    return [b for b in breaks if 0 < b < len(text)]


@lru_cache(maxsize=1)
def _cjk_text_class() -> Any:
    """rich's Text wrapping Chinese between characters (rich breaks only at spaces, so a Chinese
    sentence would move whole to the next line and leave the one before it short)."""
    from rich.containers import Lines
    from rich.text import Text

    class CjkText(Text):
        def wrap(self, console: Any, width: int, **kwargs: Any) -> Lines:
            if kwargs.get("no_wrap") or self.no_wrap or kwargs.get("overflow") == "ignore":
                return super().wrap(console, width, **kwargs)
            lines = Lines()
            for line in self.split(allow_blank=True):
                pieces = line.divide(cjk_line_breaks(line.plain, width))
                for piece in pieces:
                    piece.rstrip_end(width)
                    lines.extend(Text.wrap(piece, console, width, **kwargs))
            return lines

    return CjkText


def cjk_text(text: Any) -> Any:
    """``text`` (a str or rich Text) as a Text that wraps between Chinese characters."""
    cls = _cjk_text_class()  # built on first use: rich is imported only when printing
    if isinstance(text, str):
        return cls(text)
    out = cls(style=text.style, justify=text.justify, overflow=text.overflow, no_wrap=text.no_wrap, end=text.end)
    out.append_text(text)
    return out


@dataclass(frozen=True, slots=True)
class Hanging:
    """A rich renderable: ``renderable`` wrapped ``indent`` columns in, every line (the first and
    its continuations) indented, and no trailing padding (rich's Padding pads each line to the
    width). The CLI prints an indented line of text through it; translate_renderable translates
    what it holds before it is wrapped."""

    renderable: Any
    indent: int

    def __rich_console__(self, console: Any, options: Any) -> Any:
        from rich.segment import Segment

        inner = options.update_width(max(1, options.max_width - self.indent))
        for line in console.render_lines(self.renderable, inner, pad=False):
            yield Segment(" " * self.indent)
            yield from line
            yield Segment.line()


def translate_renderable(renderable: Any, lang: Language) -> Any:
    """A rich renderable with its words translated: a str or Text line by line (a translated line
    keeps the style of its first character), a Table's title, caption, headers and text cells,
    and what a Padding wraps. Anything else comes back as it is."""
    if lang is Language.EN:
        return renderable
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    if isinstance(renderable, str | Text):
        done = _translate_markup(renderable, lang) if isinstance(renderable, str) else _translate_text(renderable, lang)
        plain = done if isinstance(done, str) else done.plain
        if not has_cjk(plain) or (isinstance(done, str) and "[" in done):  # markup rich still reads
            return done
        return cjk_text(done)
    if isinstance(renderable, Hanging):
        return Hanging(translate_renderable(renderable.renderable, lang), renderable.indent)
    if isinstance(renderable, Padding):
        padded = Padding(
            translate_renderable(renderable.renderable, lang),
            (renderable.top, renderable.right, renderable.bottom, renderable.left),
            style=renderable.style,
            expand=renderable.expand,
        )
        return padded
    if isinstance(renderable, Table):
        return _translate_table(renderable, lang)
    return renderable


def _translate_markup(cell: str, lang: Language) -> Any:
    """A table cell or title, which rich reads as markup ("[bold]step[/]"): translated as the
    text it shows, keeping its style."""
    from rich.errors import MarkupError
    from rich.text import Text

    if "[" not in cell:
        return translate(cell, lang)
    try:
        return _translate_text(Text.from_markup(cell), lang)
    except MarkupError:
        return translate(cell, lang)


def _translate_text(text: Any, lang: Language) -> Any:
    from rich.text import Text

    plain = text.plain
    lines = plain.split("\n")
    chinese = [translate(line, lang) for line in lines]
    if chinese == lines:
        return text
    out = Text(style=text.style, justify=text.justify, overflow=text.overflow, no_wrap=text.no_wrap, end=text.end)
    offset = 0
    for i, (english, line) in enumerate(zip(lines, chinese, strict=True)):
        if english == line:
            out.append_text(text[offset : offset + len(english)])
        else:
            spans = [s for s in text.spans if s.start <= offset < s.end]
            out.append(line, style=spans[-1].style if spans else None)
        if i < len(lines) - 1:
            out.append("\n")
        offset += len(english) + 1
    return out


def _translate_table(table: Any, lang: Language) -> Any:
    import copy

    new = copy.copy(table)
    new.title = translate_renderable(table.title, lang) if table.title is not None else None
    new.caption = translate_renderable(table.caption, lang) if table.caption is not None else None
    new.columns = [
        dataclasses.replace(
            column,
            header=translate_renderable(column.header, lang),
            _cells=[translate_renderable(cell, lang) for cell in column._cells],
        )
        for column in table.columns
    ]
    return new


@dataclass(frozen=True, slots=True)
class OutputContext:
    """What the CLI's root hands its commands (typer ``ctx.obj``): the output language."""

    lang: Language = Language.EN


def context_language() -> Language:
    """The language of the running CLI command (its root context's OutputContext); English
    outside a command (a library caller, a test rendering a table itself)."""
    ctx = _current_context()
    obj = ctx.find_root().obj if ctx is not None else None
    return obj.lang if isinstance(obj, OutputContext) else Language.EN


def _current_context() -> Any:
    """The running command's click context: typer ≥ 0.20 runs on its own copy of click (whose
    context stack is not click's); older typer on click itself."""
    import importlib

    for name in ("typer._click.globals", "click"):
        try:
            module = importlib.import_module(name)
        except ImportError:  # typer < 0.20 has no copy of its own
            continue
        return module.get_current_context(silent=True)
    return None


def render_hook(lang: Language) -> Any:
    """A rich RenderHook translating what a console prints (push it with
    ``console.push_render_hook``; the CLI pops it when the command ends)."""
    from rich.console import RenderHook

    class _Translate(RenderHook):
        def process_renderables(self, renderables: list[Any]) -> list[Any]:
            try:
                return [translate_renderable(r, lang) for r in renderables]
            except (ValueError, KeyError, re.error):  # a broken catalog: English, never a crash
                return renderables

    return _Translate()
