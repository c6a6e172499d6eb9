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

from lcmoe.plan.format import plan_row
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
    for i, plan in enumerate(plan_json["plans"]):  # type: ignore[arg-type]
        row = plan_row(str(i + 1), plan)
        assert "".join(f"<td>{html.escape(v)}</td>" for v in row) in page


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


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_report_renders_in_headless_chromium(report: tuple[Path, dict[str, object]], tmp_path: Path) -> None:
    browser = _chromium()
    if browser is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    path, plan_json = report
    flags = [
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
