"""The English and Chinese READMEs show the same commands and the same figures, and every
`lcmoe <command>` the docs name exists.

Commands are the code spans and code-block lines that start with ``lcmoe `` or ``pip `` (comments
and line continuations joined). Figures are the numbers of the prose outside code: percentages,
multiples (``1.9×``), "N of M" counts (``N 条中 M 条`` in Chinese) and every other standalone
number; numbers that are part of a name (H100, Qwen3-235B, 128K) are not figures.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lcmoe.cli import app

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
README_ZH = REPO / "README.zh-CN.md"
DOCS = sorted((REPO / "docs").glob("*.md"))

CODE_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
COMMENT = re.compile(r"\s+#\s.*$")
# "276 of 277" / "277 条中 276 条" (also 个, 次, 项, 组, 行 as the counter word)
OF_EN = re.compile(r"(?<![\w.])(\d[\d,]*) of (?:the )?(\d[\d,]*)(?![\w.])")
OF_ZH = re.compile(r"(?<![\w.])(\d[\d,]*)\s*[条个次项组行]?\s*中(?:的)?\s*(\d[\d,]*)(?![\d.])")
# A standalone number: not glued to a name on either side (H100, Qwen3-235B, 128K, p90, v0.19).
NUMBER = re.compile(r"(?<![A-Za-z0-9_.\-/])[−+]?\d+(?:,\d{3})*(?:\.\d+)?(?:\s?%|×)?(?![A-Za-z0-9_]|\.\d)")


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _code_lines(text: str) -> list[str]:
    """The lines of every fenced block, continuation lines joined and comments dropped."""
    lines: list[str] = []
    for block in CODE_BLOCK.findall(text):
        joined = re.sub(r"\\\n\s*", " ", block)
        lines += [COMMENT.sub("", line).strip() for line in joined.splitlines()]
    return [line for line in lines if line]


def commands(text: str) -> set[str]:
    """`lcmoe …` and `pip …` commands, whitespace normalised."""
    spans = CODE_SPAN.findall(CODE_BLOCK.sub("", text))
    found = {" ".join(c.split()) for c in [*_code_lines(text), *spans]}
    return {c for c in found if c.startswith(("lcmoe ", "pip "))}


def prose(text: str) -> str:
    """The text without code blocks, code spans, link targets and HTML comments."""
    text = CODE_BLOCK.sub(" ", text)
    text = CODE_SPAN.sub(" ", text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.S)
    return re.sub(r"\]\([^)]*\)", "] ", text)


def figures(text: str) -> set[str]:
    """Percentages, multiples, "N of M" counts and standalone numbers of the prose."""
    body = prose(text)
    found = {f"{a} of {b}" for a, b in OF_EN.findall(body)}
    found |= {f"{a} of {b}" for b, a in OF_ZH.findall(body)}
    body = OF_ZH.sub(" ", OF_EN.sub(" ", body))
    found |= {n.replace(" ", "").replace("−", "-") for n in NUMBER.findall(body)}
    return found


def section(text: str, heading: str) -> str:
    """The body of the `## heading…` section."""
    match = re.search(rf"^## {re.escape(heading)}.*?$(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert match, f"no '## {heading}' section"
    return match.group(1)


def test_readme_starts_with_install_main_job_and_the_test_command() -> None:
    """CI and new users run these three, in this order."""
    first = _code_lines(_read(README))[:3]
    assert first == [
        "pip install .",
        "lcmoe plan --model deepseek-v3 --gpu h100 --gpus 256 --seq-len 128k",
        "pip install '.[test,validate]' && python -m pytest",
    ]
    assert _code_lines(_read(README_ZH))[:3] == first


def test_both_readmes_show_the_same_commands() -> None:
    en, zh = commands(_read(README)), commands(_read(README_ZH))
    assert en, "no commands found in README.md"
    assert en - zh == set(), f"in README.md only: {sorted(en - zh)}"
    assert zh - en == set(), f"in README.zh-CN.md only: {sorted(zh - en)}"


def test_both_readmes_show_the_same_figures() -> None:
    en, zh = figures(_read(README)), figures(_read(README_ZH))
    assert {"276 of 277", "8.2%"} <= en
    assert en - zh == set(), f"in README.md only: {sorted(en - zh)}"
    assert zh - en == set(), f"in README.zh-CN.md only: {sorted(zh - en)}"


def test_both_network_pages_show_the_same_commands() -> None:
    en, zh = _read(REPO / "docs" / "networks.md"), _read(REPO / "docs" / "networks.zh-CN.md")
    assert commands(en) == commands(zh)
    assert _code_lines(en) == _code_lines(zh)


def test_the_accuracy_figures_are_explained_in_the_docs() -> None:
    """Every figure of the README's Accuracy table appears in docs/how-numbers-are-made.md."""
    accuracy = figures(section(_read(README), "Accuracy"))
    assert accuracy, "the Accuracy section has no figures"
    missing = accuracy - figures(_read(REPO / "docs" / "how-numbers-are-made.md"))
    assert missing == set(), f"not in docs/how-numbers-are-made.md: {sorted(missing)}"


def test_readmes_fit_on_two_screens() -> None:
    for path in (README, README_ZH):
        assert len(_read(path).splitlines()) <= 113, path.name  # two screens; details live in docs/


def test_extraction_reads_both_languages() -> None:
    en = "Within 2% on 276 of 277 rows, 1.9× faster, H100 at 128K (Qwen3-235B), `lcmoe plan -n 8` # x"
    zh = "277 条中 276 条在 2% 以内，快 1.9×，H100 的 128K（Qwen3-235B），`lcmoe plan -n 8`"
    assert figures(en) == figures(zh) == {"276 of 277", "2%", "1.9×"}
    assert commands(en) == commands(zh) == {"lcmoe plan -n 8"}
    block = "```bash\nlcmoe plan -m x \\\n    -n 8   # comment\npip install .\n```\n"
    assert commands(block) == {"lcmoe plan -m x -n 8", "pip install ."}


def _named_commands() -> set[str]:
    names: set[str] = set()
    for path in (README, README_ZH, *DOCS):
        for command in commands(_read(path)):
            words = command.split()
            # `lcmoe COMMAND --help` is a placeholder, `lcmoe --version` an option
            if words[0] == "lcmoe" and len(words) > 1 and words[1][0].isalpha() and not words[1].isupper():
                names.add(words[1])
    return names


def test_the_docs_name_commands() -> None:
    assert {"plan", "estimate", "check", "diagnose"} <= _named_commands()


@pytest.mark.parametrize("name", sorted(_named_commands()))
def test_every_documented_command_exists(name: str) -> None:
    result = CliRunner().invoke(app, [name, "--help"])
    assert result.exit_code == 0, f"`lcmoe {name} --help` exited {result.exit_code}: {result.output[-300:]}"
