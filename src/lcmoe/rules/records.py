"""The records of the hard rules: a rule (id, source, fix, check) and a broken rule (Violation).
``rules.legality`` holds the table of rules and re-exports both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lcmoe.run import RunConfig


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    message: str
    fix: str
    source: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "message": self.message, "fix": self.fix, "source": self.source}


@dataclass(frozen=True, slots=True)
class LegalityRule:
    id: str
    source: str
    fix: str
    check: Callable[[RunConfig], str | None]
    min_megatron_core: str | None = None  # rule applies to releases below this version only
