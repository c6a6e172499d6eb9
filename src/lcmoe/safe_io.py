"""Reading user files safely: only regular files, never blocking, with a size cap; YAML and
JSON parsed with bounded nesting, bounded alias expansion and bounded integer length.

Every failure is one LcmoeError sentence (issue #31). The caps and where they come from:

* ``MAX_CONFIG_BYTES`` (16 MiB): a model, hardware, calibration, plan or run config is at most
  tens of kilobytes (the largest file lcmoe writes, plan.json of a 256-GPU search, is ~30 kB;
  a Bridge ``save_config_filepath`` dump is ~60 kB), so 16 MiB is > 250× any real one.
* ``MAX_YAML_CHARS`` (4 Mi): YAML text, parsed by libyaml at ~1.3 MB/s on a loaded CI core, so
  any YAML lcmoe accepts parses in ≤ 4 s; a Bridge dump (~60 kB) is 70× smaller.
* ``MAX_NODES`` (10⁶): YAML nodes after expanding every alias (``&a``/``*a``) — a Bridge dump
  has ~2,000; anchors can otherwise expand 100 bytes into 10¹⁰ nodes ("billion laughs").
* ``MAX_DEPTH`` (200): nesting of YAML/JSON collections; real configs nest ≤ 6 deep, and
  Python's parsers recurse per level.
* ``MAX_INT_DIGITS`` (100): digits of an integer literal; the largest meaningful count (bytes
  of host memory, ~10¹⁴) has 15, and Python refuses int() of more than 4300 digits.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from lcmoe.errors import LcmoeError

MAX_CONFIG_BYTES = 16 * 1024 * 1024
MAX_YAML_CHARS = 4 * 1024 * 1024
MAX_NODES = 1_000_000
MAX_DEPTH = 200
MAX_INT_DIGITS = 100

_LONG_DIGITS = re.compile(rf"\d{{{MAX_INT_DIGITS + 1}}}")


def check_regular_file(path: str | Path, *, field: str) -> os.stat_result:
    """``os.stat(path)``, refusing anything but a regular file (a FIFO would block the read, a
    device such as /dev/zero never ends, a directory is not a file)."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise LcmoeError(field, str(path), f"cannot be read ({os_reason(exc)})", "check the path") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO, device or socket"
        raise LcmoeError(field, str(path), f"is {kind}, not a regular file", "pass a regular file")
    return info


def read_bytes_capped(path: str | Path, *, field: str, max_bytes: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``. Opened with O_NONBLOCK after a stat,
    and checked again on the open descriptor, so a file swapped for a FIFO cannot block us."""
    info = check_regular_file(path, field=field)
    if info.st_size > max_bytes:
        raise LcmoeError(field, str(path), f"is larger than {_size(max_bytes)}", "pass the config file itself")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise LcmoeError(field, str(path), f"cannot be read ({os_reason(exc)})", "check the path") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LcmoeError(field, str(path), "is not a regular file", "pass a regular file")
        with os.fdopen(fd, "rb", closefd=False) as stream:
            data = stream.read(max_bytes + 1)
    except OSError as exc:
        raise LcmoeError(field, str(path), f"cannot be read ({os_reason(exc)})", "check the path") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise LcmoeError(field, str(path), f"is larger than {_size(max_bytes)}", "pass the config file itself")
    return data


def read_text_capped(path: str | Path, *, field: str, max_bytes: int = MAX_CONFIG_BYTES, errors: str = "strict") -> str:
    """``read_bytes_capped`` decoded as UTF-8."""
    data = read_bytes_capped(path, field=field, max_bytes=max_bytes)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError:
        raise LcmoeError(field, str(path), "is not UTF-8 text", "save it as UTF-8") from None


def os_reason(exc: OSError) -> str:
    """An OSError as a few words: its strerror ("Permission denied", "No space left on device")."""
    return exc.strerror or exc.__class__.__name__


def _size(n: int) -> str:
    return f"{n // 1024**2} MiB" if n >= 1024**2 else f"{n} bytes"


def check_int_literals(text: str, *, origin: str) -> None:
    """Refuse a digit run longer than MAX_INT_DIGITS before a parser turns it into an int."""
    match = _LONG_DIGITS.search(text)
    if match:
        end = match.end()
        while end < len(text) and text[end].isdigit():
            end += 1
        raise LcmoeError(
            origin,
            f"<a {end - match.start():,}-digit number>",
            f"has a number longer than {MAX_INT_DIGITS} digits",
            "no size lcmoe reads is that large; check the value",
        )


# libyaml's parser when present (~14× faster than the pure-Python one, and it refuses nesting
# beyond 1000 levels itself); the constructor is the same SafeConstructor either way.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _check_node_budget(root: yaml.Node) -> None:
    """Expanded node count and depth of a composed YAML graph, computed with memoisation so an
    alias bomb is measured without being expanded."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    # Iterative post-order walk: the graph may be deep, and recursion is what we guard against.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size = 1 + sum(sizes[id(c)] for c in children)
            depth = 1 + max((depths[id(c)] for c in children), default=0)
            if size > MAX_NODES:
                raise _YamlTooLarge(f"expands to more than {MAX_NODES:,} values (YAML aliases)")
            if depth > MAX_DEPTH:
                raise _YamlTooLarge(f"nests deeper than {MAX_DEPTH} levels")
            sizes[key], depths[key] = size, depth
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise _YamlTooLarge("refers to itself (a recursive YAML alias)")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in sizes)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


class _YamlTooLarge(Exception):
    pass


def load_yaml(text: str, *, origin: str) -> Any:
    """``yaml.safe_load`` with bounded integers, nesting and alias expansion; any failure is one
    LcmoeError naming ``origin``."""
    if len(text) > MAX_YAML_CHARS:
        raise LcmoeError(
            origin, f"({len(text):,} characters)", "is larger than 4 MiB of YAML", "pass the config itself"
        )
    check_int_literals(text, origin=origin)
    try:
        loader = _LOADER(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _check_node_budget(node)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except _YamlTooLarge as exc:
        raise LcmoeError(origin, "(file)", str(exc), "write the values out plainly") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise LcmoeError(origin, "(file)", f"is not valid YAML{where}", "fix the syntax") from None
    except RecursionError:
        raise LcmoeError(origin, "(file)", f"nests deeper than {MAX_DEPTH} levels", "flatten it") from None
    except (ValueError, OverflowError, TypeError) as exc:
        raise LcmoeError(
            origin, "(file)", f"has a value YAML cannot hold ({exc.__class__.__name__})", "fix it"
        ) from None


def load_json(text: str, *, origin: str) -> Any:
    """``json.loads`` with bounded integers and nesting; any failure is one LcmoeError."""
    check_int_literals(text, origin=origin)
    depth = max_bracket_depth(text)
    if depth > MAX_DEPTH:
        raise LcmoeError(origin, "(file)", f"nests deeper than {MAX_DEPTH} levels", "flatten it")
    try:
        return json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise LcmoeError(origin, "(file)", "is not JSON", "fix the syntax") from None
    except (RecursionError, ValueError, OverflowError) as exc:
        raise LcmoeError(origin, "(file)", f"cannot be read as JSON ({exc.__class__.__name__})", "fix it") from None


def max_bracket_depth(text: str) -> int:
    """Upper bound of the nesting of a JSON text (brackets inside strings count too)."""
    depth = deepest = 0
    for ch in re.findall(r"[\[\]{}]", text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest
