"""Turn a pydantic validation report into lcmoe's one-sentence error."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from lcmoe.errors import LcmoeError

SpecT = TypeVar("SpecT", bound=BaseModel)


def _printable(part: object) -> str:
    """A field path part as text; a key with control characters (a YAML key of "\n\f") quoted
    with escapes, so the sentence stays on one line."""
    text = str(part)
    return text if text.isprintable() else repr(text)


def validate_or_explain(cls: type[SpecT], data: object, *, origin: str) -> SpecT:
    """``cls.model_validate(data)``; on failure raise LcmoeError naming the first bad field."""
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(_printable(p) for p in err["loc"]) or cls.__name__
        value = err.get("input")
        if isinstance(value, dict | list):
            value = f"({type(value).__name__})"
        message = err["msg"].removeprefix("Value error, ").rstrip(".")
        raise LcmoeError(f"{origin}: {field}", value, message, "fix that field") from None
