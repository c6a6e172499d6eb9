"""Turn a pydantic validation report into lcmoe's one-sentence error."""

from __future__ import annotations

from types import UnionType
from typing import TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from lcmoe.errors import LcmoeError
from lcmoe.units import MAX_WHOLE

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
        if isinstance(value, dict | list) and len(value) > 8:
            value = f"({type(value).__name__})"
        message = err["msg"].removeprefix("Value error, ").rstrip(".")
        raise LcmoeError(f"{origin}: {field}", value, message, "fix that field") from None


def _leaf_types(annotation: object) -> set[object]:
    """The scalar types an annotation admits anywhere inside it (unions, lists, dicts, tuples)."""
    args = get_args(annotation)
    if not args:
        return {annotation}
    found: set[object] = set()
    for arg in args:
        found |= _leaf_types(arg)
    return found


def _top_types(annotation: object) -> set[object]:
    """The types an annotation admits at its top level (the members of a union)."""
    if get_origin(annotation) in (Union, UnionType):
        return {get_origin(a) or a for a in get_args(annotation)}
    return {get_origin(annotation) or annotation}


def _bools_inside(value: object) -> bool:
    if isinstance(value, bool):
        return True
    if isinstance(value, dict):
        return any(isinstance(v, bool) for v in value.values())
    if isinstance(value, list | tuple):
        return any(isinstance(v, bool) for v in value)
    return False


class StrictSpec(BaseModel):
    """Base of the spec models: no truthy coercion and only finite numbers (issue #31).

    Pydantic's lax mode reads ``num_layers: true`` as 1 layer and ``hbm_bytes: .inf`` as a GPU
    with infinite memory; here a number field (or a list/dict of numbers) refuses true/false, a
    flag refuses anything but true/false, and every float must be finite (``allow_inf_nan``).
    Numeric spellings such as ``"8"`` or ``8.0`` stay accepted, since they are not ambiguous."""

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_truthy_coercion(cls, value: object, info: ValidationInfo) -> object:
        name = info.field_name
        if name is None or name not in cls.model_fields:
            return value
        annotation = cls.model_fields[name].annotation
        top, leaves = _top_types(annotation), _leaf_types(annotation)
        if bool in top and not (top - {bool, type(None)}):
            if value is not None and not isinstance(value, bool):
                raise ValueError("must be true or false (a YAML/JSON boolean, not a string or number)")
            return value
        plain = leaves <= {int, float, str, type(None)}  # not a nested model, not Any
        if plain and _bools_inside(value):
            raise ValueError("must be a number or text, not true/false")
        if isinstance(value, int) and abs(value) > MAX_WHOLE:
            raise ValueError("is larger than any size lcmoe can reason about (2^53)")
        return value
