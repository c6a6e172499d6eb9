"""Domain errors: one clear sentence naming the field, the value, the rule and a fix.

The CLI maps every :class:`LcmoeError` to exit code 2 and prints only its message; a
traceback is shown only with ``--debug``.
"""

from __future__ import annotations


class LcmoeError(Exception):
    """Bad input that the user can fix. ``str(err)`` is the whole user-facing sentence."""

    def __init__(self, field: str, value: object, rule: str, fix: str = "") -> None:
        self.field = field
        self.value = value
        self.rule = rule
        self.fix = fix
        text = f"{field} = {value!r}: {rule}"
        if fix:
            text += f"; {fix}"
        if not text.endswith((".", "?", "!")):
            text += "."
        super().__init__(text)


class UnknownNameError(LcmoeError):
    """A catalog name that does not exist, with the closest known names as the fix."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        import difflib

        close = difflib.get_close_matches(name.lower(), known, n=3, cutoff=0.4)
        fix = f"did you mean {', '.join(close)}?" if close else f"known: {', '.join(sorted(known))}"
        super().__init__(kind, name, f"no {kind} of that name", fix)
        self.known = known
