"""The catalog half of lcmoe's translation: the output language (``Language``, from ``--lang`` or
the locale), the data catalog (``data/messages_zh.yaml``) of English templates with named
placeholders → Chinese templates, and ``translate``, which turns a printed line into Chinese.

Everything lcmoe prints for a person is written in English first. JSON stays English (it is for
machines). A line no template matches stays English: a missing translation is a gap, never a crash.

Matching is linear in the line's length: each template is one anchored regex whose placeholders
sit in atomic groups (``(?>(?P<x>.+?)LITERAL)``), so a placeholder takes the first occurrence of
the literal after it and the engine never backtracks into it (no catastrophic backtracking on
hostile input, e.g. a 10 kB model name), and lines longer than MAX_LINE_CHARS are left as they are.

Terminology follows the glossary of README.zh-CN.md (张量并行 TP, 上下文并行 CP, 专家并行 EP,
流水线并行 PP, 重计算, 显存, …); option names, field names, model names and numbers are kept.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache

# A line this long is a user's value echoed back (an error clips its value at 200 characters);
# translating it is not worth the regex work.
MAX_LINE_CHARS = 4000
# How deep a ``{name:t}`` placeholder (a value that is itself translated) may nest.
MAX_DEPTH = 3
PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)(?::([stl]))?\}")
# What a placeholder's value may be: {x} one word (a number, a name, an option value); {x:s}
# words (spaces, no ";"); {x:t} any text, itself translated; {x:l} a ", " list whose items are
# translated one by one (joined with "、").
VALUE_CLASS = {"": r"[^\s;]", "s": r"[^;]", "t": r".", "l": r"[^;]"}
CJK = re.compile(r"[\u3000-\u303f\u3400-\u4dbf\u4e00-\u9fff\uff00-\uffef]")
# Printed prefixes kept apart from the sentence they introduce ("error: …", "  [LC-GBS] …").
PREFIX = re.compile(r"(?P<indent>\s*)(?P<tag>(?:\[[A-Z][A-Z0-9-]{0,40}\] )?)")
SEGMENT_SEPARATORS = (("; ", "；"), (": ", "："))
# Two lowercase English words in a row: prose (a name, a number or an option value is not).
PROSE = re.compile(r"\b[a-z]{2,} [a-z]{2,}\b")


class Language(enum.Enum):
    """The language of lcmoe's output for people (``--lang``; JSON is always English)."""

    EN = "en"
    ZH = "zh"


LANG_ENV = ("LC_ALL", "LC_MESSAGES", "LANG")  # POSIX order: the first one set wins


def parse_language(value: str) -> Language | None:
    """``en`` / ``zh`` (also ``zh-CN``, ``zh_CN.UTF-8``, ``English``…) → Language; None when unknown."""
    text = value.strip().lower().replace("-", "_")
    if text.startswith("zh"):
        return Language.ZH
    if text.startswith("en") or text in ("c", "posix"):
        return Language.EN
    return None


def language_from_env(environ: Mapping[str, str]) -> Language:
    """The language the locale asks for: ``zh_*`` in LC_ALL, else LC_MESSAGES, else LANG → Chinese;
    anything else → English (the first of them that is set decides, as POSIX locales do)."""
    for name in LANG_ENV:
        value = environ.get(name, "").strip()
        if value:
            return Language.ZH if value.lower().startswith("zh") else Language.EN
    return Language.EN


@dataclass(frozen=True, slots=True)
class Template:
    """One catalog entry: the compiled English pattern, its Chinese text and the placeholders
    whose captured values are themselves translated (``{name:t}``)."""

    english: str
    chinese: str
    pattern: re.Pattern[str]
    first_literal: str
    kinds: Mapping[str, str]  # placeholder name → "", "s", "t" or "l" (PLACEHOLDER)


@dataclass(frozen=True, slots=True)
class Catalog:
    """Templates, most literal text first (the first that matches wins), and exact sentences."""

    exact: Mapping[str, str]
    templates: tuple[Template, ...]


def compile_template(english: str) -> tuple[re.Pattern[str], str, dict[str, str]]:
    """The anchored, backtrack-free regex of one English template.

    Every placeholder but the last is ``(?>(?P<x>V+?)LITERAL)``: the shortest value (of the
    placeholder's VALUE_CLASS) followed by the next literal, committed once found; the last is
    ``(?P<x>V+)LITERAL\\Z``. Two placeholders must be separated by literal text, and a name may
    occur once."""
    parts = PLACEHOLDER.split(english)
    literals, names, kinds = parts[0::3], parts[1::3], parts[2::3]
    if len(set(names)) != len(names):
        raise ValueError(f"template {english!r}: a placeholder name occurs twice")
    if any(not lit for lit in literals[1:-1]):
        raise ValueError(f"template {english!r}: two placeholders need text between them")
    regex = [r"\A", re.escape(literals[0])]
    for i, (name, kind) in enumerate(zip(names, kinds, strict=True)):
        literal, value = re.escape(literals[i + 1]), VALUE_CLASS[kind or ""]
        last = i == len(names) - 1
        regex.append(f"(?P<{name}>{value}+){literal}" if last else f"(?>(?P<{name}>{value}+?){literal})")
    regex.append(r"\Z")
    return re.compile("".join(regex), re.DOTALL), literals[0], {n: k or "" for n, k in zip(names, kinds, strict=True)}


def build_catalog(entries: Mapping[str, str]) -> Catalog:
    """A Catalog from {English template: Chinese template}; a Chinese template may use only the
    English one's placeholder names (ValueError otherwise: the catalog is lcmoe's own data)."""
    exact: dict[str, str] = {}
    templates: list[Template] = []
    for english, chinese in entries.items():
        if not isinstance(english, str) or not isinstance(chinese, str):
            raise ValueError(f"catalog entry {english!r}: both sides must be strings")
        if not PLACEHOLDER.search(english):
            exact[english.replace("{{", "{").replace("}}", "}")] = chinese
            continue
        pattern, first, kinds = compile_template(english)
        unknown = {n for n, _ in PLACEHOLDER.findall(chinese)} - {n for n, _ in PLACEHOLDER.findall(english)}
        if unknown:
            raise ValueError(f"catalog entry {english!r}: the Chinese side names {sorted(unknown)} it does not have")
        templates.append(Template(english, chinese, pattern, first, kinds))
    # The most specific template first: the one with the most literal text ("plan {i} — why:"
    # before "plan {i}"), so the catalog's order does not matter.
    templates.sort(key=lambda t: -len(PLACEHOLDER.sub("", t.english)))
    return Catalog(exact=exact, templates=tuple(templates))


@lru_cache(maxsize=1)
def zh_catalog() -> Catalog:
    """The Chinese catalog shipped in lcmoe/data (read once; it is constant package data)."""
    from importlib import resources

    import yaml

    text = resources.files("lcmoe.data").joinpath("messages_zh.yaml").read_text(encoding="utf-8")
    return build_catalog(yaml.safe_load(text) or {})


def _fill(template: Template, match: re.Match[str], depth: int) -> tuple[str, bool]:
    values: dict[str, str] = {}
    complete = True
    for name, value in match.groupdict().items():
        kind = template.kinds[name]
        if kind == "t":
            value, done = _translate_line(value, depth + 1)
            complete = complete and done
        elif kind == "l":
            items = [_translate_line(item, depth + 1) for item in value.split(", ")]
            value = "、".join(text for text, _ in items)
            complete = complete and all(done for _, done in items)
        values[name] = value
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template.chinese), complete


def _sentence(text: str, depth: int) -> tuple[str, bool] | None:
    """One sentence through the catalog: an exact entry, else the first template that matches."""
    catalog = zh_catalog()
    stripped = text.rstrip(".")
    for candidate in (text, stripped) if stripped != text else (text,):
        if candidate in catalog.exact:
            return catalog.exact[candidate], True
        for template in catalog.templates:
            if candidate.startswith(template.first_literal):
                match = template.pattern.match(candidate)
                if match:
                    return _fill(template, match, depth)
    return None


def _translate_line(line: str, depth: int = 0) -> tuple[str, bool]:
    """(Chinese line, whether every part that is prose was translated). Indentation and a leading rule
    tag (``[LC-GBS] ``) are kept; a line no template takes whole is tried segment by segment
    (split at "; " then ": "), and what still matches nothing stays English."""
    if depth > MAX_DEPTH or len(line) > MAX_LINE_CHARS or not line.strip():
        return line, not line.strip()
    head = PREFIX.match(line)
    prefix = head.group(0) if head else ""
    body = line[len(prefix) :].rstrip()
    found = _sentence(body, depth)
    if found is not None:
        return prefix + found[0] + line[len(prefix) + len(body) :], found[1]
    for separator, joiner in SEGMENT_SEPARATORS:
        pieces = body.split(separator)
        if len(pieces) > 1:
            done = [_translate_line(piece, depth + 1) for piece in pieces]
            changed = [text != piece for (text, _), piece in zip(done, pieces, strict=True)]
            if any(changed):
                return prefix + _join(done, changed, separator, joiner), all(ok for _, ok in done)
    return line, PROSE.search(line) is None  # "moe_act", "TP1 CP2" need no translation


def _join(done: list[tuple[str, bool]], changed: list[bool], separator: str, joiner: str) -> str:
    """Segments joined again: the Chinese mark after a translated label ("错误：…"), and between
    two translated clauses ("…；…"); English text that stayed English keeps its own separator."""
    text = done[0][0]
    for i in range(1, len(done)):
        label = changed[i - 1] and (separator == ": " or changed[i])
        text += (joiner if label else separator) + done[i][0]
    return text


def translate(text: str, lang: Language) -> str:
    """``text`` in ``lang``: each line through the catalog, English where no entry matches."""
    if lang is Language.EN or not text:
        return text
    return "\n".join(_translate_line(line)[0] for line in text.split("\n"))


def untranslated(text: str) -> list[str]:
    """The lines of ``text`` (English source) that the Chinese catalog leaves partly English."""
    return [line for line in text.split("\n") if not _translate_line(line)[1]]


def has_cjk(text: str) -> bool:
    """Whether ``text`` holds a Chinese character (or CJK punctuation)."""
    return CJK.search(text) is not None


def translate_all(texts: Iterable[str], lang: Language) -> list[str]:
    return [translate(t, lang) for t in texts]


def error_sentence(field: str, value: str, rule: str, fix: str, lang: Language) -> str:
    """An LcmoeError's sentence (errors.LcmoeError: "FIELD = VALUE: RULE; FIX.") in ``lang``:
    rule and fix go through the catalog one by one; field and value are the user's own words."""
    if lang is Language.EN:
        text = f"{field} = {value}: {rule}" + (f"; {fix}" if fix else "")
        return text if text.endswith((".", "?", "!")) else text + "."
    rule_zh = translate(rule.rstrip("."), lang)
    fix_zh = translate(fix.rstrip("."), lang) if fix else ""
    return f"{field} = {value}：{rule_zh}" + (f"；{fix_zh}" if fix_zh else "") + "。"
