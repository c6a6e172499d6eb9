"""Legality for one plan search, judged with what the search already knows.

A search asks ``violations`` about every option set it tries (recompute rungs, offload fractions,
dispatcher / CUDA-graph / EP-overlap / CP-exchange variants): about 19 asks per layout. Most
rules read only the model, hardware and layout (``rules.legality.LAYOUT_RULE_IDS``), so their
verdict is the same for every option set of a layout: ``Judge`` judges them once per layout and
only the option rules per ask. The release filter of ``violations`` is applied once per search
(``active_rules``). A ``Judge`` lives for one ``search`` call: it is the memo the style allows
(no module state), and it gives the same verdict as ``violations(run) == []``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lcmoe.layout import ParallelLayout
from lcmoe.rules.legality import LAYOUT_RULE_IDS, LegalityRule, active_rules
from lcmoe.run import RunConfig


@dataclass(slots=True)
class Judge:
    """``legal(run)``: no active rule broken. ``layout_rules`` read no training option (verdict
    memoised per layout value); ``option_rules`` are checked on every ask."""

    layout_rules: tuple[LegalityRule, ...]
    option_rules: tuple[LegalityRule, ...]
    layouts: dict[ParallelLayout, bool] = field(default_factory=dict)

    def legal(self, run: RunConfig) -> bool:
        verdict = self.layouts.get(run.layout)
        if verdict is None:
            verdict = not any(rule.check(run) for rule in self.layout_rules)
            self.layouts[run.layout] = verdict
        return verdict and not any(rule.check(run) for rule in self.option_rules)


def judge_for(megatron_core_version: str) -> Judge:
    """A fresh judge for one search targeting ``megatron_core_version``."""
    rules = active_rules(megatron_core_version)
    return Judge(
        layout_rules=tuple(r for r in rules if r.id in LAYOUT_RULE_IDS),
        option_rules=tuple(r for r in rules if r.id not in LAYOUT_RULE_IDS),
    )
