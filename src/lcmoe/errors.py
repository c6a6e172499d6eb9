"""Domain errors: one clear sentence naming the field, the value, the rule and a fix.

The CLI maps every :class:`LcmoeError` to exit code 2 and prints only its message; a
traceback is shown only with ``--debug``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from lcmoe.i18n import Language

# How much of a user-supplied value a message echoes back (issue #31: a 10 MB value must not
# come back as a 10 MB message). The field, rule and fix are lcmoe's own words but may quote
# user text too (a path, a key), so they get a looser cap of their own.
MAX_VALUE_CHARS = 200
MAX_PART_CHARS = 400


def clip(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` cut to ``limit`` characters (with an ellipsis and the full length), on one line."""
    flat = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text[: limit + 1])
    if len(text) <= limit and len(flat) <= limit:
        return flat
    return f"{flat[:limit]}… ({len(text):,} characters)"


def show_value(value: object) -> str:
    """``repr(value)`` capped at MAX_VALUE_CHARS, without building the repr of a huge value:
    long strings are cut before ``repr``; a huge int is shown by its digit count (``repr`` of an
    int over 4300 digits raises)."""
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            return f"{repr(value[:MAX_VALUE_CHARS])[: MAX_VALUE_CHARS + 2]}… ({len(value):,} characters)"
        return clip(repr(value))
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 600:  # > ~180 digits
            return f"<a {value.bit_length():,}-bit integer>"
        return clip(repr(value))
    if isinstance(value, bytes | bytearray):
        return clip(repr(bytes(value[: MAX_VALUE_CHARS + 1])))
    if isinstance(value, dict | list | tuple | set | frozenset) and len(value) > 20:
        return f"<a {type(value).__name__} of {len(value):,} items>"
    try:
        text = repr(value)
    except (ValueError, RecursionError):
        return f"<a {type(value).__name__}>"
    return clip(text)


class LcmoeError(Exception):
    """Bad input that the user can fix. ``str(err)`` is the whole user-facing sentence: one line,
    echoing at most MAX_VALUE_CHARS characters of the value."""

    def __init__(self, field: str, value: object, rule: str, fix: str = "") -> None:
        self.field = field
        self.value = value
        self.rule = rule
        self.fix = fix
        # The clipped parts, kept so the CLI can say the sentence in another language (i18n).
        self.parts = (clip(str(field), MAX_PART_CHARS), show_value(value), clip(str(rule), MAX_PART_CHARS))
        self.fix_text = clip(str(fix), MAX_PART_CHARS) if fix else ""
        text = f"{self.parts[0]} = {self.parts[1]}: {self.parts[2]}"
        if fix:
            text += f"; {self.fix_text}"
        if not text.endswith((".", "?", "!")):
            text += "."
        super().__init__(text)

    def sentence(self, lang: Language) -> str:
        """The message in ``lang`` (``str(self)`` is the English one)."""
        from lcmoe.i18n import Language, error_sentence

        if lang is Language.EN:
            return str(self)
        return error_sentence(*self.parts, self.fix_text, lang)


class UnknownNameError(LcmoeError):
    """A catalog name that does not exist, with the closest known names as the fix."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        import difflib

        close = difflib.get_close_matches(name.lower()[:MAX_VALUE_CHARS], known, n=3, cutoff=0.4)
        fix = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(known))}"
        super().__init__(kind, name, f"no {kind} of that name", fix)
        self.known = known
