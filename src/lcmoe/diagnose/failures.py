"""Known failures in a log: matching the table (``diagnose/failure_patterns.py``) and deciding
which findings apply to the run.

Matching is linear in the line: a line is first screened for a handful of ``TRIGGERS`` (plain
substring tests), then for each pattern's needles (``str.find``); ``detail`` is matched with
``re.match`` at the needle's position, so no regex ever scans the line from every offset.

Some lines mean a known failure only with a setting on: an NCCL watchdog timeout is the A2A-overlap
deadlock when ``overlap_moe_expert_parallel_comm`` is on, and the CUDA-graph hang when CUDA graphs
are on. Such patterns carry ``requires`` (setting, token); ``resolve`` keeps them when the run's
settings (the log's argument dump, or the ``--plan`` / ``--config`` given to diagnose) show the
setting, and keeps the ones marked ``when_unknown`` as unconfirmed when the settings are not known."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lcmoe.diagnose.failure_patterns import CONTEXT_NEEDLES, PATTERNS, TRIGGERS, FailurePattern

if TYPE_CHECKING:
    from lcmoe.run import RunConfig

# How far after a traceback frame a ``after`` pattern's error line may come.
CONTEXT_LINES = 40

_FALSY = frozenset({"", "none", "null", "false", "0", "[]", "()", "set()", "frozenset()"})


@dataclass(frozen=True, slots=True)
class Finding:
    """A pattern seen in a log: its first occurrence and how often it appeared."""

    pattern: FailurePattern
    line_number: int
    rank: int | None
    text: str
    count: int = 1
    confirmed: bool = True
    detail: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, object]:
        p = self.pattern
        return {
            "class": p.failure_class,
            "pattern": p.id,
            "rule": p.rule,
            "line": self.line_number,
            "rank": self.rank,
            "count": self.count,
            "text": self.text,
            "detail": list(self.detail),
            "confirmed": self.confirmed,
            "requires": [f"{name} {'has ' + token if token else 'on'}" for name, token in p.requires],
            "explanation": p.explanation,
            "fix": p.fix,
            "sources": list(p.sources),
        }


def match_line(line: str) -> list[tuple[FailurePattern, tuple[str, ...]]]:
    """The patterns whose needle is in ``line``, with the groups their ``detail`` read (linear:
    substring tests and one anchored match per hit). ``after`` is checked by the caller."""
    if not any(trigger in line for trigger in TRIGGERS):
        return []
    hits: list[tuple[FailurePattern, tuple[str, ...]]] = []
    for pattern in PATTERNS:
        for needle in pattern.needles:
            at = line.find(needle)
            if at < 0:
                continue
            groups: tuple[str, ...] = ()
            if pattern.detail is not None:
                found = pattern.detail.match(line, at)
                groups = tuple(g for g in found.groups() if g is not None) if found else ()
            hits.append((pattern, groups))
            break
    return hits


def settings_from_arguments(arguments: Mapping[str, str]) -> dict[str, str]:
    """The settings ``requires`` reads, from a Megatron-LM argument dump (``name -> value``).
    CUDA graphs count as on only when ``cuda_graph_impl`` (or the older ``enable_cuda_graph`` /
    ``external_cuda_graph``) says so."""
    out: dict[str, str] = {}
    if "overlap_moe_expert_parallel_comm" in arguments:
        out["overlap_moe_expert_parallel_comm"] = arguments["overlap_moe_expert_parallel_comm"]
    impl = arguments.get("cuda_graph_impl")
    graphs_on = (impl is not None and impl.strip().lower() not in _FALSY) or any(
        _truthy(arguments.get(name, "")) for name in ("enable_cuda_graph", "external_cuda_graph")
    )
    if impl is not None or "cuda_graph_scope" in arguments:
        out["cuda_graph_scope"] = arguments.get("cuda_graph_scope", "full") if graphs_on else ""
    return out


def settings_from_bridge_summary(values: Mapping[str, str], *, seen: bool) -> dict[str, str]:
    """The settings ``requires`` reads, from Bridge's start-up Configuration Summary, which lists
    the model fields that differ from Megatron-Core's defaults (so a field it leaves out holds the
    default: no A2A overlap, ``cuda_graph_impl='none'``). Nothing when the log has no summary."""
    if not seen:
        return {}
    impl = values.get("cuda_graph_impl", "none")
    graphs_on = _truthy(impl) or any(_truthy(values.get(n, "")) for n in ("enable_cuda_graph", "external_cuda_graph"))
    scope = values.get("cuda_graph_modules") or values.get("cuda_graph_scope") or "full"
    return {
        "overlap_moe_expert_parallel_comm": values.get("overlap_moe_expert_parallel_comm", "False"),
        "cuda_graph_scope": scope if graphs_on else "",
    }


def settings_from_run(run: RunConfig) -> dict[str, str]:
    """The settings ``requires`` reads, from the run diagnose was given (``--plan`` / ``--config``)."""
    return {
        "cuda_graph_scope": ",".join(sorted(run.options.cuda_graph_scope)),
        "overlap_moe_expert_parallel_comm": str(run.options.overlap_moe_expert_parallel_comm),
    }


def _truthy(value: str) -> bool:
    return value.strip().lower() not in _FALSY


def _holds(pattern: FailurePattern, settings: Mapping[str, str]) -> bool | None:
    """Whether the pattern's settings hold: True, False, or None when a setting is unknown."""
    unknown = False
    for name, token in pattern.requires:
        if name not in settings:
            unknown = True
            continue
        value = settings[name].strip().lower()
        if not _truthy(value) or (token and token not in value):
            return False
    return None if unknown else True


@dataclass(slots=True)
class FailureCollector:
    """Per-log state for the failure table: the first occurrence and count of each pattern, and
    the last line each ``after`` context text was seen on. Bounded: one entry per pattern."""

    first: dict[str, Finding] = field(default_factory=dict)
    context_seen: dict[str, int] = field(default_factory=dict)

    def feed(self, line_number: int, rank: int | None, line: str) -> bool:
        """Record the patterns ``line`` shows; True if one without ``requires`` claimed the line
        (the generic communication-failure path then skips it)."""
        for text in CONTEXT_NEEDLES:
            if text in line:
                self.context_seen[text] = line_number
        claimed = False
        for pattern, groups in match_line(line):
            if pattern.after is not None:
                seen = self.context_seen.get(pattern.after)
                if seen is None or line_number - seen > CONTEXT_LINES:
                    continue
            claimed = claimed or not pattern.requires
            known = self.first.get(pattern.id)
            if known is None:
                self.first[pattern.id] = Finding(pattern, line_number, rank, line.strip()[:300], detail=groups)
            else:
                self.first[pattern.id] = Finding(
                    pattern, known.line_number, known.rank, known.text, known.count + 1, detail=known.detail
                )
        return claimed

    def findings(self) -> tuple[Finding, ...]:
        return tuple(sorted(self.first.values(), key=lambda f: f.line_number))


def resolve(findings: Iterable[Finding], settings: Mapping[str, str]) -> list[Finding]:
    """The findings that apply to a run with ``settings``: those whose ``requires`` hold, plus the
    ``when_unknown`` ones (marked unconfirmed) whose settings are not known."""
    out = []
    for finding in findings:
        holds = _holds(finding.pattern, settings) if finding.pattern.requires else True
        if holds:
            out.append(finding)
        elif holds is None and finding.pattern.when_unknown:
            out.append(
                Finding(
                    finding.pattern,
                    finding.line_number,
                    finding.rank,
                    finding.text,
                    finding.count,
                    confirmed=False,
                    detail=finding.detail,
                )
            )
    return out
