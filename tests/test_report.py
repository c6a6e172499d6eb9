"""The HTML/Markdown plan report: numbers equal `lcmoe plan --json`, every plot present, and the
page renders offline in headless Chromium without console errors (acceptance of the report issue)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lcmoe.estimate.time import shipped_time_coefficients
from lcmoe.plan.format import plan_row
from lcmoe.report.content import plans_heading
from lcmoe.report.strings import say
from tests.conftest import run_cli

ARGS = ("-m", "deepseek-v3", "-g", "h100", "-n", "256", "-s", "128k")
EXPECTED_PLOTS = 3 * 2 + 2  # memory + time for plans 1–3, Pareto scatter, sequence sweep


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    out = tmp_path_factory.mktemp("report") / "report.html"
    code, _, err = run_cli("report", *ARGS, "--sweep", "32k,128k", "--out", str(out), "-q")
    assert code == 0, err
    code, plan_json, err = run_cli("plan", *ARGS, "--json")
    assert code == 0, err
    return out, json.loads(plan_json)


@pytest.fixture(scope="module")
def report_zh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same report in Chinese (its text is wider per character: checked at both widths too).
    Its sweep is the request's own length, so the plan search is the only search (the English
    report's 32k row would cost a second search for the same page layout)."""
    out = tmp_path_factory.mktemp("report_zh") / "report.html"
    code, _, err = run_cli("--lang", "zh", "report", *ARGS, "--sweep", "128k", "--out", str(out), "-q")
    assert code == 0, err
    assert 'lang="zh-CN"' in out.read_text(encoding="utf-8")
    return out


def _embedded_payload(page: str) -> dict[str, object]:
    match = re.search(r'<script type="application/json" id="lcmoe-payload">(.*?)</script>', page, re.S)
    assert match
    return json.loads(match.group(1).replace("<\\/", "</"))


def test_report_numbers_equal_plan_json(report: tuple[Path, dict[str, object]]) -> None:
    path, plan_json = report
    page = path.read_text(encoding="utf-8")
    embedded = _embedded_payload(page)
    for key in ("inputs", "plans", "fallback", "reference", "pareto", "searched", "legal", "fit"):
        assert embedded[key] == plan_json[key], key
    cells = page.replace("<wbr>", "").replace('<td class="wrap">', "<td>")
    for i, plan in enumerate(plan_json["plans"]):  # type: ignore[arg-type]
        row = plan_row(str(i + 1), plan)
        assert "".join(f"<td>{html.escape(v)}</td>" for v in row) in cells


def test_report_is_self_contained_with_every_plot(report: tuple[Path, dict[str, object]]) -> None:
    path, _ = report
    page = path.read_text(encoding="utf-8")
    assert page.count("<figure><svg") == EXPECTED_PLOTS
    assert not re.search(r'(?:src|href)\s*=\s*["\']https?://', page)  # nothing fetched from a network
    assert "@import" not in page and "<link" not in page
    markdown = path.with_suffix(".md").read_text(encoding="utf-8")
    linked = re.findall(r"\]\((report_plots/[\w.]+\.svg)\)", markdown)
    assert len(linked) == EXPECTED_PLOTS and all((path.parent / name).is_file() for name in linked)
    assert "| 1 | TP" in markdown


def test_report_text_is_plain_and_ranked_as_the_json_says(report: tuple[Path, dict[str, object]]) -> None:
    """Legends use words, not estimator keys; the plans heading names the ranking the JSON records;
    accuracy sentences quote the fit records (no typed-in error figures)."""
    path, plan_json = report
    page = path.read_text(encoding="utf-8")
    figures = "".join(re.findall(r"<figure>.*?</figure>", page, re.S))
    for key in ("weight_copies", "state_overhead", "dispatcher_buffers", "expert_gemm", "pipeline_bubble"):
        assert key not in figures, key
    assert "weight copies (FP8)" in figures and "optimizer state" in figures
    assert "Plans, fastest first</h2>" not in page
    assert plan_json["rank"]["mode"] == "conservative"  # type: ignore[index]
    assert say("plans_by_low_edge") in html.unescape(page)
    time_fit = shipped_time_coefficients("hopper").fit
    assert f"{float(time_fit['lomo_mape']):.1f}%" in page  # type: ignore[arg-type]
    assert '<meta name="viewport" content="width=device-width, initial-scale=1">' in page
    assert not re.search(r'<figure><svg[^>]* width="[\d.]+pt"', page)  # no fixed-size figure on the page


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _browser_flags() -> list[str]:
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    return [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=5000",
    ]


def test_report_renders_in_headless_chromium(report: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    flags = _browser_flags()
    path, plan_json = report
    dom = subprocess.run([*flags, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=180)
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stderr[-1000:]
    attributes = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    assert attributes == {"plots": str(EXPECTED_PLOTS), "plans": str(len(plan_json["plans"])), "errors": "0"}  # type: ignore[arg-type]
    console_errors = [line for line in dom.stderr.splitlines() if "CONSOLE" in line and "error" in line.lower()]
    assert console_errors == []
    shot = tmp_path / "report.png"
    subprocess.run(
        [*flags, "--hide-scrollbars", "--window-size=1300,2400", f"--screenshot={shot}", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
    )
    assert shot.is_file() and shot.stat().st_size > 20_000


# Headless Chromium will not make a window narrower than 500 px, so each width is an iframe of
# that width (srcdoc: same origin, so the harness can measure inside it). Per width: page-level
# horizontal overflow (scrollWidth beyond the viewport's clientWidth), table boxes whose content is
# wider than the box (they scroll), and the smallest SVG text as rendered (font size × the SVG's
# on-screen scale), plus the elements that stick out, for the failure message.
_MEASURE = """
function measure(frame) {
  var doc = frame.contentDocument, root = doc.documentElement, view = root.clientWidth;
  var minFont = 1e9;
  doc.querySelectorAll('figure svg text').forEach(function (t) {
    var m = t.getScreenCTM();
    var px = parseFloat(frame.contentWindow.getComputedStyle(t).fontSize) * Math.hypot(m.a, m.b);
    if (t.textContent.trim() && px < minFont) { minFont = px; }
  });
  var boxes = 0;
  doc.querySelectorAll('.scroll').forEach(function (b) { if (b.scrollWidth > b.clientWidth + 1) { boxes++; } });
  var wide = [];
  doc.body.querySelectorAll(':scope > *').forEach(function (e) {
    var r = e.getBoundingClientRect();
    if (r.right > view + 1) { wide.push(e.tagName + ':' + Math.round(r.right)); }
  });
  return [root.scrollWidth - view, minFont.toFixed(2), boxes, view, wide.join(' ')].join('|');
}
window.addEventListener('load', function () {
  document.querySelectorAll('iframe').forEach(function (f) {
    document.body.setAttribute('data-w' + f.width, measure(f));
  });
});
"""
WIDTHS_PX = (390, 1400)
MIN_PLOT_TEXT_PX = 9.0


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_report_fits_a_phone_and_a_desktop(
    lang: str, report: tuple[Path, dict[str, object]], report_zh: Path, tmp_path: Path
) -> None:
    """At 390 px and 1400 px, in both languages: the page never scrolls sideways, plot text is at
    least 9 px as rendered, and at 1400 px no table needs its scroll box (the plans table fits)."""
    flags = _browser_flags()
    path = report[0] if lang == "en" else report_zh
    page = html.escape(path.read_text(encoding="utf-8"), quote=True)
    frames = "".join(
        f'<iframe width="{w}" style="width:{w}px;height:900px;border:0;display:block" srcdoc="{page}"></iframe>'
        for w in WIDTHS_PX
    )
    harness = tmp_path / "harness.html"
    harness.write_text(f"<!DOCTYPE html><html><body>{frames}<script>{_MEASURE}</script></body></html>", "utf-8")
    dom = subprocess.run(
        [*flags, "--window-size=1500,1000", "--dump-dom", harness.as_uri()], capture_output=True, text=True, timeout=180
    )
    body = re.search(r"<body([^>]*)>", dom.stdout)
    assert body, dom.stderr[-1000:]
    measured = dict(re.findall(r'data-w(\d+)="([^"]*)"', body.group(1)))
    assert sorted(measured) == sorted(str(w) for w in WIDTHS_PX), body.group(1)
    for width, record in measured.items():
        overflow, min_font, boxes, view, wide = record.split("|")
        assert int(overflow) <= 0, f"{width} px: page {overflow} px wider than its {view} px viewport ({wide})"
        assert float(min_font) >= MIN_PLOT_TEXT_PX, f"{width} px: plot text {min_font} px"
        if width == "1400":
            assert boxes == "0", f"{boxes} table(s) scroll at 1400 px"


@pytest.mark.parametrize(
    ("rank", "key"),
    [
        ({"mode": "conservative", "by": "time.tokens_per_sec_per_gpu_low", "bands": True}, "plans_by_low_edge"),
        ({"mode": "expected", "by": "time.tokens_per_sec_per_gpu", "bands": True}, "plans_by_prediction"),
        ({"mode": "conservative", "by": "time.tokens_per_sec_per_gpu_low", "bands": False}, "plans_by_speed"),
        (None, "plans_by_speed"),
    ],
)
def test_plans_heading_follows_the_rank_record(rank: dict[str, object] | None, key: str) -> None:
    """The heading names what the plan JSON says the plans were ranked by (without bands the low
    edge is the prediction, so "fastest first" is true)."""
    assert plans_heading({"rank": rank}) == say(key)


def test_report_shows_every_setting_of_each_plan(report: tuple[Path, dict[str, object]]) -> None:
    """Besides the plans table, the report lists the settings it leaves out (optimizer, EP overlap,
    CP exchange, sequence parallel, pipeline layout, recompute spelled whole), as the CLI does."""
    from lcmoe.plan.format import settings_table_rows
    from lcmoe.report.content import SETTINGS_TABLE_COLUMNS
    from lcmoe.report.markdown import _md_table

    path, payload = report
    rows = settings_table_rows(payload)
    assert len(rows) >= 3 and all(len(row) == 7 for row in rows)
    markdown = path.with_suffix(".md").read_text(encoding="utf-8")
    page = path.read_text(encoding="utf-8")
    assert "the rest of each plan&#x27;s settings" in page or "the rest of each plan's settings" in page
    for row in rows:
        assert _md_table(SETTINGS_TABLE_COLUMNS, [row]).splitlines()[-1] in markdown, row  # as the twin escapes it
        assert html.escape(row[2]).replace(",", ",<wbr>") in page  # the optimizer cell, breakable after ","
