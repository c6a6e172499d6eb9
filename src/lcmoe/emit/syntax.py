"""One writer per target syntax for every value lcmoe puts into a file someone will run.

A value reaches a launcher through exactly one of these functions; each refuses what its syntax
cannot hold safely (one sentence naming the field, the value, the rule and a fix) instead of
escaping it into something nobody wrote:

* ``sbatch_word``   — an ``#SBATCH`` directive value. sbatch reads these lines itself (no shell
  quoting applies to a comment line), so a value must already be a safe word.
* ``slurm_job_name`` — free text (a model name, a user's job name) reduced to a safe word.
* ``shell_word``    — one argument or export value of a shell line: no control character, then
  ``shlex.quote``.
* ``python_literal`` — a value inside generated Python: strings free of control characters,
  written with ``repr`` (which cannot end the literal), containers recursively.
* ``python_identifier`` — a name used in an ``import`` line of generated Python.
* ``markdown_text`` — user text in a Markdown file (RUN.md): escapes Markdown and HTML.
* ``comment_text``  — text after ``#`` on a shell line: no line break can end the comment.
"""

from __future__ import annotations

import html
import re
import shlex
from typing import Any

from lcmoe.errors import LcmoeError

# C0 and C1 controls, DEL, and the Unicode line and paragraph separators: any of them can end a
# line (or a terminal escape) in some reader of the file.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
# A value longer than this is no name, path or URL anyone typed; refusing it keeps launchers small.
MAX_VALUE_CHARS = 4096


def check_plain(field: str, value: str) -> str:
    """``value`` unchanged if it is a string of printable characters, else LcmoeError."""
    if not isinstance(value, str):
        raise LcmoeError(field, value, "must be text", "pass a string")
    if len(value) > MAX_VALUE_CHARS:
        raise LcmoeError(field, value, f"is longer than {MAX_VALUE_CHARS} characters", "shorten it")
    bad = _CONTROL.search(value)
    if bad:
        raise LcmoeError(
            field,
            value,
            f"contains the control character U+{ord(bad.group()):04X} (a line break or escape would let the "
            "rest of the value run as a command in the launcher)",
            "remove it",
        )
    return value


def _check_pattern(field: str, value: str, pattern: re.Pattern[str], rule: str, fix: str) -> str:
    check_plain(field, value)
    if not pattern.fullmatch(value):
        raise LcmoeError(field, value, rule, fix)
    return value


# Slurm names (accounts, partitions, QoS): letters, digits and ._- ; a partition list is comma-separated.
_SLURM_NAME = re.compile(r"[A-Za-z0-9._-]+(,[A-Za-z0-9._-]+)*")
# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds (sbatch(1), option --time), or UNLIMITED / INFINITE.
_SLURM_TIME = re.compile(r"(\d{1,6}-)?\d{1,6}(:\d{1,2}){0,2}|UNLIMITED|INFINITE", re.IGNORECASE)


def sbatch_word(field: str, value: str) -> str:
    """A Slurm name for an ``#SBATCH`` line (``--account``, ``--partition``)."""
    return _check_pattern(
        field,
        value,
        _SLURM_NAME,
        "is not a Slurm name (letters, digits, '.', '_' and '-'; a list separated by commas)",
        "use the name `sacctmgr show assoc` or `sinfo` prints",
    )


def slurm_time(field: str, value: str) -> str:
    """An ``#SBATCH --time`` value."""
    return _check_pattern(
        field,
        value,
        _SLURM_TIME,
        "is not a Slurm time limit",
        "write MINUTES, HH:MM:SS or DAYS-HH:MM:SS (e.g. 04:00:00)",
    )


_JOB_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def slurm_job_name(value: str) -> str:
    """Free text as a job name: every run of other characters becomes one '-' (at most 128 chars)."""
    name = _JOB_NAME_UNSAFE.sub("-", str(value)).strip("-.")[:128]
    return name or "lcmoe"


def shell_word(field: str, value: str) -> str:
    """One shell word: printable text, single-quoted where needed."""
    return shlex.quote(check_plain(field, value))


# Container references as pyxis/enroot and docker spell them (registry/name:tag, name@sha256:…,
# enroot's registry#image): no spaces, quotes or shell metacharacters.
_CONTAINER = re.compile(r"[A-Za-z0-9/.][A-Za-z0-9._/:@#+-]*")


def container_image(field: str, value: str) -> str:
    return _check_pattern(
        field,
        value,
        _CONTAINER,
        "is not a container image reference",
        "write REGISTRY/NAME:TAG (e.g. nvcr.io/nvidia/nemo:26.08) or a .sqsh path",
    )


def container_mount(field: str, value: str) -> str:
    """A pyxis mount ``SRC[:DST[:FLAGS]]``; mounts are joined with commas, so none may hold one."""
    check_plain(field, value)
    if "," in value or not value.strip():
        raise LcmoeError(field, value, "must be one SRC:DST mount without commas", "repeat --mount for each mount")
    return value


_URL = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!$&'()*+,;=%-]+|file:///[A-Za-z0-9._~:/%-]*")


def url(field: str, value: str) -> str:
    return _check_pattern(
        field, value, _URL, "is not an http(s):// or file:/// URL without spaces", "write the index URL pip would take"
    )


def environment_name(field: str, value: str) -> str:
    return _check_pattern(
        field, value, re.compile(r"[A-Za-z_][A-Za-z0-9_]*"), "is not an environment variable name", "use [A-Za-z_0-9]"
    )


def python_identifier(field: str, value: str) -> str:
    return _check_pattern(
        field,
        value,
        re.compile(r"[A-Za-z_][A-Za-z0-9_]*"),
        "is not a Python name",
        "name a recipe function of megatron.bridge.recipes",
    )


def python_literal(field: str, value: Any) -> str:
    """``repr`` of ``value`` after every string inside it passed ``check_plain``."""
    _check_literal(field, value)
    return repr(value)


def _check_literal(field: str, value: Any) -> None:
    if isinstance(value, str):
        check_plain(field, value)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_literal(field, key)
            _check_literal(field, item)
    elif isinstance(value, list | tuple):
        for item in value:
            _check_literal(field, item)
    elif value is not None and not isinstance(value, bool | int | float):
        raise LcmoeError(field, value, "cannot be written as a Python literal", "pass text, a number or a list")


def comment_text(field: str, value: str) -> str:
    """Text after a ``#`` on a shell or Python line."""
    return check_plain(field, value)


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_{}\[\]()#+!|>~-])")


def markdown_text(value: str) -> str:
    """User text inside Markdown: HTML escaped, Markdown punctuation backslash-escaped, one line."""
    one_line = _CONTROL.sub(" ", str(value))
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(one_line, quote=True))
