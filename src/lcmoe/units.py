"""Parsing and formatting of sizes at the edges. Internally everything is bytes, seconds, tokens."""

from __future__ import annotations

import math
import re

from lcmoe.errors import LcmoeError

GIB = 1024**3
GB = 1e9

_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?(?:[eE]\d+)?)\s*([kKmM]?)\s*$")


MAX_WHOLE = 2**53  # the largest integer a float holds exactly


def whole_number(value: object, *, field: str, fix: str = "fix the value") -> int:
    """A config value that must be a whole number: ints, integral finite floats and their
    spellings (``"8"``, ``"8.0"``, ``"1e3"``); booleans, fractions, NaN and ±inf are refused."""
    if isinstance(value, bool):
        raise LcmoeError(field, value, "must be a whole number, not true/false", fix)
    if isinstance(value, int):
        if abs(value) > MAX_WHOLE:
            raise LcmoeError(field, value, "is larger than any size lcmoe can reason about (2^53)", "check the units")
        return value
    try:
        number = float(str(value).strip())
    except ValueError:
        raise LcmoeError(field, value, "must be a whole number", fix) from None
    if not math.isfinite(number) or number != int(number):
        raise LcmoeError(field, value, "must be a finite whole number", fix)
    if abs(number) > MAX_WHOLE:
        raise LcmoeError(field, value, "is larger than any size lcmoe can reason about (2^53)", "check the units")
    return int(number)


def real_number(value: object, *, field: str, fix: str = "fix the value") -> float:
    """A config value that must be a finite number (booleans refused)."""
    if isinstance(value, bool):
        raise LcmoeError(field, value, "must be a number, not true/false", fix)
    try:
        number = float(str(value).strip()) if not isinstance(value, int | float) else float(value)
    except (ValueError, OverflowError):
        raise LcmoeError(field, value, "must be a number", fix) from None
    if not math.isfinite(number):
        raise LcmoeError(field, value, "must be a finite number", fix)
    return number


def parse_token_count(text: str | int, *, field: str = "seq_len") -> int:
    """Parse a token count: ``4096``, ``4k``/``4K`` (×1024), ``1M`` (×1024²), ``1e6``.

    ``k`` means 1024 because sequence lengths are powers of two in practice (128K = 131072).
    The result must be a positive whole number.
    """
    if isinstance(text, bool):
        raise LcmoeError(field, text, "must be a positive whole number of tokens", "write e.g. 4096 or 128k")
    if isinstance(text, int):
        value = float(text)
    else:
        match = _TOKENS.match(str(text))
        if not match:
            raise LcmoeError(field, text, "is not a token count", "write e.g. 4096, 4k or 128K")
        number, suffix = match.groups()
        scale = {"": 1, "k": 1024, "m": 1024**2}[suffix.lower()]
        value = float(number) * scale
    if not math.isfinite(value) or value <= 0 or value != int(value):
        raise LcmoeError(field, text, "must be a positive whole number of tokens", "write e.g. 4096 or 128k")
    if value > 2**40:
        raise LcmoeError(field, text, "is larger than any sequence lcmoe can reason about (2^40)", "check the units")
    return int(value)


def format_tokens(n: int) -> str:
    """``131072`` → ``128K``; non-multiples of 1024 are printed as is."""
    if n >= 1024**2 and n % (1024**2) == 0:
        return f"{n // 1024**2}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n // 1024}K"
    return str(n)


def gib(n_bytes: float) -> float:
    """Bytes → GiB (1024³), the unit of ``torch.cuda`` memory reports and nvidia-smi MiB/1024."""
    return n_bytes / GIB
