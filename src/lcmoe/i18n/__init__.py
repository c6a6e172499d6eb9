"""The language of lcmoe's words for people: English (the source) or Chinese (a translation).

``i18n/catalog.py`` holds the language, the Chinese catalog and ``translate``; ``i18n/console.py``
applies them to what rich prints. Callers import both from here."""

from lcmoe.i18n.catalog import (
    LANG_ENV,
    Catalog,
    Language,
    Template,
    build_catalog,
    compile_template,
    error_sentence,
    has_cjk,
    language_from_env,
    parse_language,
    translate,
    translate_all,
    untranslated,
    zh_catalog,
)
from lcmoe.i18n.console import (
    Hanging,
    OutputContext,
    cjk_line_breaks,
    cjk_text,
    context_language,
    render_hook,
    translate_renderable,
)

__all__ = [
    "LANG_ENV",
    "Catalog",
    "Hanging",
    "Language",
    "OutputContext",
    "Template",
    "build_catalog",
    "cjk_line_breaks",
    "cjk_text",
    "compile_template",
    "context_language",
    "error_sentence",
    "has_cjk",
    "language_from_env",
    "parse_language",
    "render_hook",
    "translate",
    "translate_all",
    "translate_renderable",
    "untranslated",
    "zh_catalog",
]
