"""`--lang zh` (issue #34 item 9): the output for people in Chinese, JSON in English, the language
from --lang or the locale, a catalog matched in linear time, and tables that still fit with
characters two columns wide."""

from __future__ import annotations

import itertools
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lcmoe.i18n import (
    Language,
    build_catalog,
    compile_template,
    has_cjk,
    language_from_env,
    parse_language,
    translate,
    untranslated,
    zh_catalog,
)
from tests.conftest import run_cli

QWEN = ("-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--top", "3")
ESTIMATE = ("estimate", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "16k", "--ep", "8", "--recompute", "moe_act")
# A check input with pitfalls: the expert grid does not fold, GBS < MBS·DP, full recompute, CP p2p.
PITFALLS = (
    "--tensor-model-parallel-size 4 --context-parallel-size 2 --expert-model-parallel-size 8 --num-layers 48 "
    "--seq-length 32768 --micro-batch-size 2 --recompute-granularity full --cp-comm-type p2p\n"
)
# Two lowercase English words in a row: prose left untranslated. Code spans (`lcmoe models`) and an
# option with its value (--rank conservative) are lcmoe's own words and stay as they are.
PROSE = re.compile(r"\b[a-z]{2,} [a-z]{2,}\b")
KEPT = re.compile(r"`[^`]*`|'[^']*'|--[\w-]+(?:[ =][\w.,-]+)?|lcmoe [a-z]+")
HOSTILE = {
    "unknown model": ("plan", "-m", "nosuchmodel", "-n", "8", "-s", "4k"),
    "bad seq-len": ("plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4kk"),
    "zero GPUs": ("plan", "-m", "qwen3-30b-a3b", "-n", "0", "-s", "4k"),
    "unknown GPU": ("plan", "-m", "qwen3-30b-a3b", "-g", "nogpu", "-n", "8", "-s", "4k"),
    "illegal EP": ("estimate", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "16k", "--ep", "3"),
    "missing file": ("check", "no/such/file.txt", "-m", "qwen3-30b-a3b", "-n", "16"),
    "check without GPUs": ("check", "no/such/file.txt", "-m", "qwen3-30b-a3b"),
    "bad precision": ("plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--precision", "fp3"),
    "bad margin": ("plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--margin", "2"),
    "bad --hw": ("plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--hw", "foo"),
    "bad --hw value": ("plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--hw", "gpus_per_node=abc"),
    "bad rank": ("plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--rank", "wild"),
    "bad recompute": ("estimate", "-m", "qwen3-30b-a3b", "-n", "16", "-s", "16k", "--recompute", "bogus"),
    "no tensor cores": ("estimate", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--precision", "mxfp8"),
    "nothing fits": ("plan", "-m", "deepseek-v3", "-n", "8", "-s", "128k"),
    # usage errors typer finds before lcmoe runs
    "missing option": ("plan", "-m", "qwen3-30b-a3b", "-n", "8"),
    "below an option's minimum": ("plan", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--gbs", "0"),
    "not an integer": ("plan", "-m", "qwen3-30b-a3b", "-n", "abc", "-s", "4k"),
    "unknown option": ("plan", "--foo"),
    "unknown command": ("nosuchcmd",),
    "extra argument": ("flops", "-m", "qwen3-30b-a3b", "extra"),
}


@pytest.fixture
def english_locale(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Runs start from an English locale, whatever the machine's is."""
    for name in ("LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    yield


def _english_prose(text: str) -> list[str]:
    """The lines of ``text`` still holding English prose (lcmoe's own names aside)."""
    return [line for line in text.splitlines() if PROSE.search(KEPT.sub(" ", line))]


# ----- the catalog -------------------------------------------------------------------------------
def test_catalog_loads_and_every_chinese_template_uses_known_placeholders() -> None:
    catalog = zh_catalog()
    assert len(catalog.templates) > 80 and len(catalog.exact) > 80
    for template in catalog.templates:
        assert has_cjk(template.chinese) or not PROSE.search(template.chinese), template.english


def test_a_placeholder_the_english_side_lacks_is_refused() -> None:
    with pytest.raises(ValueError, match="does not have"):
        build_catalog({"GBS {g} is odd": "GBS {h} 是奇数"})
    with pytest.raises(ValueError, match="text between"):
        compile_template("{a}{b} GPUs")


def test_most_specific_template_wins_whatever_the_order() -> None:
    catalog = build_catalog({"plan {i}": "方案 {i}", "plan {i} — why:": "方案 {i} 的理由："})
    assert catalog.templates[0].english == "plan {i} — why:"
    assert translate("plan 2 — why:", Language.ZH) == "方案 2 的理由："


@pytest.mark.parametrize(
    "line",
    [
        "GBS " + "1 is not a multiple of MBS·DP = " * 120,  # a literal repeated: ~3,900 characters
        "CP " + "2 uses p2p and spans " * 190 + "x",
        "error: [" + "[L-X] a; fix: b (" * 230,
        "x" * 3990 + "; " + "y: " * 2,
    ],
)
def test_hostile_lines_translate_in_linear_time(line: str) -> None:
    start = time.perf_counter()
    for _ in range(3):
        translate(line, Language.ZH)
    assert time.perf_counter() - start < 1.0  # backtracking would take minutes at this length


def test_a_line_too_long_is_left_in_english() -> None:
    line = "no plan fits; " + "x" * 10_000
    assert translate(line, Language.ZH) == line


def test_every_fixed_legality_message_has_its_chinese() -> None:
    """The rule messages `check` and `estimate` print: each literal one (a message with numbers
    is a template, checked through the commands) reads in Chinese under --lang zh."""
    import lcmoe.rules.legality as legality

    source = Path(legality.__file__).read_text(encoding="utf-8")
    messages = re.findall(r'^\s+return "([^"{}]+)"$', source, re.M)
    assert "EP overlap forbids full recompute and moe recompute" in messages
    missing = [m for m in messages if not has_cjk(translate(m, Language.ZH))]
    assert not missing, missing


def test_untranslated_sentences_fall_back_to_english() -> None:
    line = "a sentence lcmoe never prints, with no template"
    assert translate(line, Language.ZH) == line and untranslated(line) == [line]
    assert translate("no plan fits", Language.EN) == "no plan fits"


# ----- the language: --lang, then the locale ------------------------------------------------------
@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, Language.EN),
        ({"LANG": "zh_CN.UTF-8"}, Language.ZH),
        ({"LANG": "zh_TW.UTF-8"}, Language.ZH),
        ({"LANG": "en_US.UTF-8", "LC_MESSAGES": "zh_CN.UTF-8"}, Language.ZH),
        ({"LANG": "zh_CN.UTF-8", "LC_ALL": "C"}, Language.EN),  # LC_ALL overrides LANG
        ({"LANG": "zh_CN.UTF-8", "LC_ALL": ""}, Language.ZH),  # set but empty: not set
    ],
)
def test_language_from_the_locale(environ: dict[str, str], expected: Language) -> None:
    assert language_from_env(environ) is expected


def test_lang_option_values() -> None:
    assert parse_language("zh") is parse_language("zh-CN") is parse_language("zh_CN.UTF-8") is Language.ZH
    assert parse_language("en") is Language.EN and parse_language("fr") is None


def test_unknown_lang_is_one_sentence(english_locale: None) -> None:
    code, out, err = run_cli("--lang", "fr", "models")
    assert code == 2 and out == "" and "--lang = 'fr': must be en or zh" in err and "Traceback" not in err


# ----- whole runs ------------------------------------------------------------------------------
def _check_file(tmp_path: Path) -> str:
    path = tmp_path / "args.txt"
    path.write_text(PITFALLS, encoding="utf-8")
    return str(path)


def test_plan_estimate_check_in_chinese(english_locale: None, tmp_path: Path) -> None:
    runs = {
        "plan": ("--lang", "zh", "plan", *QWEN),
        "estimate": ("--lang", "zh", *ESTIMATE),
        "check": ("check", _check_file(tmp_path), "-m", "qwen3-30b-a3b", "-n", "16", "-s", "32k", "--lang=zh"),
    }
    for name, args in runs.items():
        code, out, err = run_cli(*args)
        assert code in (0, 1, 2) and "Traceback" not in err, (name, err)
        assert has_cjk(out), name
        assert not _english_prose(out + err), (name, _english_prose(out + err))
    assert "方案 1 的理由：" in run_cli("--lang", "zh", "plan", *QWEN)[1]


def test_json_stays_english_under_zh(english_locale: None) -> None:
    code, out, _ = run_cli("--lang", "zh", "plan", *QWEN, "--json")
    assert code == 0 and not has_cjk(out)
    assert json.loads(out)["plans"][0]["reasons"]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_inputs_say_why_in_chinese(case: str, english_locale: None) -> None:
    code, out, err = run_cli("--lang", "zh", *HOSTILE[case])
    assert code in (1, 2) and "Traceback" not in err
    printed = [line for line in (out + err).splitlines() if line.strip()]
    assert printed and all(has_cjk(line) for line in printed), printed
    assert not _english_prose(out + err), _english_prose(out + err)


def test_english_stays_english(english_locale: None) -> None:
    code, _, err = run_cli("--lang", "en", *HOSTILE["unknown model"])
    assert code == 2 and err.startswith("error: model = 'nosuchmodel': no model of that name") and not has_cjk(err)
    _, out, _ = run_cli("plan", *QWEN)
    assert not has_cjk(out) and "plan 1 — why:" in out


@pytest.mark.parametrize("args", [("--help",), ("plan", "--help"), ("--version",), ("hardware", "-q")])
def test_help_version_and_exit_codes_are_the_same_in_both_languages(
    args: tuple[str, ...], english_locale: None
) -> None:
    english, chinese = run_cli("--lang", "en", *args), run_cli("--lang", "zh", *args)
    assert english == chinese  # --help stays English; the exit code does not depend on the language


def test_no_command_shows_help_with_a_translated_usage_line(english_locale: None) -> None:
    english, chinese = run_cli("--lang", "en"), run_cli("--lang", "zh")
    assert english[0] == chinese[0] == 2
    assert chinese[2] == english[2].replace("Usage: ", "用法：", 1)


def test_the_locale_picks_chinese_and_lang_en_overrides_it(
    english_locale: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    code, _, err = run_cli(*HOSTILE["bad seq-len"])
    assert code == 2 and err.startswith("错误：seq_len = '4kk'：不是 token 数")
    code, _, err = run_cli(*HOSTILE["bad seq-len"], "--lang", "en")
    assert code == 2 and err.startswith("error: seq_len = '4kk': is not a token count")
    monkeypatch.setenv("LC_ALL", "C")
    assert run_cli(*HOSTILE["bad seq-len"])[2].startswith("error:")


def test_narrow_terminal_in_chinese_wraps_cards_whole(english_locale: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """COLUMNS=80: cards, every value whole, each line within 80 terminal cells (a CJK character
    takes two), the notes after the cards wrapped between characters as Chinese text breaks."""
    import io

    from rich.cells import cell_len
    from rich.console import Console

    from lcmoe.cli import common
    from lcmoe.cli.plan_view import print_plans

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(common.stdout, "width", 80)
    code, out, _ = run_cli("--lang", "zh", "plan", *QWEN)
    assert code == 0 and "…" not in out and "┏" not in out  # cards, nothing cut
    assert "方案 1" in out and "峰值 GiB / 容量" in out and "精度感知 Adam" in out
    assert not _english_prose(out), _english_prose(out)
    # The sentences after the cards wrap at 80 cells too, between characters, never leaving an
    # opening bracket at a line's end or starting a line with closing punctuation.
    assert all(cell_len(line) <= 80 for line in out.splitlines()), out
    assert not [line for line in out.splitlines() if line.rstrip().endswith(("（", "“"))], out
    assert not [line for line in out.splitlines() if line.startswith(("，", "。", "）", "；"))], out
    payload = json.loads(run_cli("plan", *QWEN, "--json")[1])
    buffer = io.StringIO()
    print_plans(Console(file=buffer, width=80, color_system=None), payload, "plans, fastest first", Language.ZH)
    cards = buffer.getvalue()
    assert "…" not in cards and all(cell_len(line) <= 80 for line in cards.splitlines()), cards


@pytest.mark.parametrize(
    ("text", "width", "pieces"),
    [
        ("显存溢出的配置相同", 8, ["显存溢出", "的配置相", "同"]),  # two cells a character
        ("峰值（容量 80），超出", 12, ["峰值（容量 ", "80），超出"]),  # "）" and "，" stay with "80"
        ("请先用 alltoall 调通", 14, ["请先用 ", "alltoall 调通"]),  # an English word stays whole
        ("看（Llama 3）吧", 8, ["看", "（Llama ", "3）吧"]),  # "（" goes with what it opens
        ("x" * 25, 10, ["x" * 10, "x" * 10, "x" * 5]),  # longer than the line: folded
    ],
)
def test_chinese_lines_break_between_characters(text: str, width: int, pieces: list[str]) -> None:
    from lcmoe.i18n import cjk_line_breaks

    breaks = [0, *cjk_line_breaks(text, width), len(text)]
    assert [text[a:b] for a, b in itertools.pairwise(breaks)] == pieces


def test_plan_tables_are_measured_in_the_language_they_are_printed_in(
    english_locale: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """print_plans reads --lang from the running command, so fits() judges the Chinese table."""
    from lcmoe.cli import plan_view

    measured: list[str] = []
    real_fits = plan_view.fits

    def recording_fits(console: Any, table: Any) -> bool:
        measured.extend(str(column.header) for column in table.columns)
        return real_fits(console, table)

    monkeypatch.setattr(plan_view, "fits", recording_fits)
    assert run_cli("--lang", "zh", "plan", *QWEN)[0] == 0
    assert "布局" in measured and "layout" not in measured


def test_wide_terminal_in_chinese_keeps_the_table(english_locale: None) -> None:
    code, out, _ = run_cli("--lang", "zh", "plan", *QWEN)
    assert code == 0 and "┏" in out and "…" not in out and "布局" in out and "各方案的其余设置" in out


@pytest.mark.skipif(os.name == "nt", reason="POSIX locale variables")
def test_cli_subprocess_reads_lang_from_the_environment(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "LANG": "zh_CN.UTF-8", "PYTHONIOENCODING": "utf-8"}
    env.pop("LC_ALL", None)
    env.pop("LC_MESSAGES", None)
    done = subprocess.run(
        [sys.executable, "-c", "from lcmoe.cli import main; main()", *HOSTILE["unknown model"]],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and done.stderr.startswith("错误：model = 'nosuchmodel'：模型目录中没有这个模型")


def test_a_chinese_locale_on_an_ascii_terminal_prints_english() -> None:
    """LANG=zh_CN with an ASCII stream would print only "?": the locale's Chinese is skipped."""
    import subprocess
    import sys

    env = {**os.environ, "LANG": "zh_CN.UTF-8", "PYTHONIOENCODING": "ascii"}
    for name in ("LC_ALL", "LC_MESSAGES"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-c", "from lcmoe.cli import main; main()", *HOSTILE["unknown model"]],
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2 and done.stderr.startswith(b"error: model = 'nosuchmodel': no model of that name")


# ----- the HTML report --------------------------------------------------------------------------
def _page_words(page: str) -> str:
    """The words a reader sees: text between tags, without scripts, styles and code blocks."""
    import html

    page = re.sub(r"<(script|style|pre)\b.*?</\1>", " ", page, flags=re.S)
    return "\n".join(html.unescape(t).strip() for t in re.findall(r">([^<]+)<", page) if t.strip())


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_report_in_both_languages(lang: str, english_locale: None, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "report.html"
    args = ("report", "-m", "qwen3-30b-a3b", "-n", "8", "-s", "4k", "--sweep", "4k,8k", "--top", "2", "-o", str(out))
    code, _, err = run_cli("--lang", lang, *args)
    assert code == 0, err
    page, markdown = out.read_text(encoding="utf-8"), out.with_suffix(".md").read_text(encoding="utf-8")
    blob = re.search(r'id="lcmoe-payload">(.*?)</script>', page, re.S)
    assert blob is not None and not has_cjk(blob.group(1))  # the embedded plan JSON stays English
    if lang == "en":
        assert '<html lang="en">' in page and not has_cjk(page) and not has_cjk(markdown)
        return
    assert '<html lang="zh-CN">' in page and "<h2>用到的规则</h2>" in page and "<th>布局</th>" in page
    assert ">保存的激活<" in page and ">流水线阶段<" in page  # a plot's legend entry and axis label
    assert not _english_prose(_page_words(page)), _english_prose(_page_words(page))
    assert markdown.startswith("# lcmoe 方案") and "| # | 布局 |" in markdown


def test_oom_diagnosis_in_chinese(english_locale: None, tmp_path: Path) -> None:
    """diagnose's OOM evidence, ladder and rejected rungs with their reasons, all in Chinese."""
    from lcmoe.emit.megatron_lm import megatron_lm_args
    from tests import log_fixtures as lf
    from tests.test_diagnose import _dsv3_128k_plan_one

    config = tmp_path / "args.txt"
    config.write_text("\n".join(megatron_lm_args(_dsv3_128k_plan_one())), encoding="utf-8")
    log = tmp_path / "train.log"
    log.write_text(lf.oom_line(3.5, 0, 79.19, 120.0, 300.0) + "\n", encoding="utf-8")
    code, out, err = run_cli(
        "--lang", "zh", "diagnose", str(log), "--config", str(config), "-m", "deepseek-v3", "-n", "256"
    )
    assert code == 1, err
    assert "证据：" in out and "补救阶梯" in out and "已排除" in out
    assert not _english_prose(out), _english_prose(out)
