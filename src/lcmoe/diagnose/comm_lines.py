"""Which communication library a failure line in a training log blames (NCCL, DeepEP, HybridEP),
in time linear in the line's length: substring tests and one search per library, never a pattern
that backtracks over the line (issue #31)."""

from __future__ import annotations

import re

# Communication-library failures, matched in linear time (issue #31: ``deep[_ ]?ep.*(?:error|…)``
# backtracked quadratically over a long line of repeated "DeepEP", 258 s for a 1.3 MB log). A
# library is named by its first mention; a failure word must follow that mention on the line
# (the first mention leaves the longest tail, so this is what the ``.*`` search meant).
_LIBRARY_MENTIONS: tuple[tuple[str, re.Pattern[str], tuple[str, ...]], ...] = (
    ("hybridep", re.compile(r"hybrid[_ ]?ep", re.IGNORECASE), ("error", "fail", "assert", "out of memory", "exceed")),
    (
        "deepep",
        re.compile(r"deep[_ ]?ep", re.IGNORECASE),
        ("error", "fail", "assert", "out of memory", "exceed", "timeout"),
    ),
)
_NCCL_PLAIN = re.compile(r"NCCL (?:error|WARN)|ncclUnhandledCudaError|NCCL timeout|Watchdog caught")
_WORD = re.compile(r"\w+")


def _nccl_failure(line: str) -> bool:
    """``NCCL error|WARN``, ``NCCL timeout``, a watchdog, or a word ``nccl…Error`` (one \\w run
    holding "nccl" and a later "Error"), each found in one pass."""
    if _NCCL_PLAIN.search(line):
        return True
    if "nccl" not in line or "Error" not in line:
        return False
    for word in _WORD.finditer(line):
        token = word.group(0)
        at = token.find("nccl")
        if at >= 0 and "Error" in token[at + 4 :]:
            return True
    return False


def comm_library(line: str) -> str | None:
    """The communication library a failure line blames (hybridep, deepep, nccl), or None."""
    lower: str | None = None
    for library, mention, words in _LIBRARY_MENTIONS:
        found = mention.search(line)
        if found:
            lower = lower if lower is not None else line.lower()
            tail = lower[found.end() :]
            if any(word in tail for word in words):
                return library
    return "nccl" if _nccl_failure(line) else None


# Cheap pre-filter for the communication-failure patterns (most NCCL lines are INFO chatter).
FAILURE_WORDS = ("rror", "WARN", "ail", "ssert", "xceed", "imeout", "atchdog", "memory")
