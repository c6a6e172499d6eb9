"""The planner's legality judge (plan/judge.py) against ``violations`` (layout rules read no option,
the verdict equals ``violations(run) == []``), and its stage-by-stage memory (plan/fitting.py
``probed_memory``) against ``estimate_memory``."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import pytest

from lcmoe.catalog import load_hardware, load_model
from lcmoe.plan.candidates import base_options, enumerate_layouts, precisions_for
from lcmoe.plan.judge import judge_for
from lcmoe.plan.plans import PlanRequest
from lcmoe.rules.legality import LAYOUT_RULE_IDS, RULE_IDS, RULES, violations
from lcmoe.run import RunConfig
from tests.helpers import make_run


@dataclass
class _Watched:
    """Stands in for the training options and records every attribute a rule reads."""

    read: list[str] = field(default_factory=list)

    def __getattr__(self, name: str) -> object:
        self.read.append(name)
        raise AttributeError(name)


def test_layout_rules_are_rule_ids() -> None:
    assert LAYOUT_RULE_IDS <= RULE_IDS


@pytest.mark.parametrize("rule", [r for r in RULES if r.id in LAYOUT_RULE_IDS], ids=lambda r: r.id)
def test_layout_rule_reads_no_option(rule) -> None:  # type: ignore[no-untyped-def]
    run = make_run()
    watched = _Watched()
    with contextlib.suppress(AttributeError):
        rule.check(RunConfig(run.model, run.hardware, run.layout, watched))  # type: ignore[arg-type]
    assert watched.read == []


@pytest.mark.parametrize(
    ("name", "gpu", "gpus", "seq"), [("deepseek-v3", "h100", 64, 32768), ("qwen3-30b-a3b", "gb200", 16, 8192)]
)
def test_judge_agrees_with_violations(name: str, gpu: str, gpus: int, seq: int) -> None:
    request = PlanRequest(model=load_model(name), hardware=load_hardware(gpu), num_gpus=gpus, seq_len=seq)
    judge = judge_for(request.megatron_core_version)
    for layout in enumerate_layouts(request):
        for precision in precisions_for(request):
            run = RunConfig(request.model, request.hardware, layout, base_options(request, precision))
            assert judge.legal(run) == (violations(run) == []), layout


@pytest.mark.parametrize("probe", [0, 1, 3])
def test_probed_memory_equals_estimate_memory(probe: int) -> None:
    """plan.fitting.probed_memory assembles the same stages as estimate_memory, whichever stage
    it estimates first, and gives up only when the probed stage is hopeless."""
    from lcmoe.estimate.memory import estimate_memory, shipped_coefficients, staged_layout
    from lcmoe.plan.fitting import probed_memory

    run = make_run()
    staged = staged_layout(run.model, run.layout)
    request = PlanRequest(
        model=run.model,
        hardware=run.hardware,
        num_gpus=run.layout.world_size,
        seq_len=run.options.seq_len,
        memory_coefficients=shipped_coefficients(),
    )
    probe = min(probe, len(staged.stages) - 1)
    probed = probed_memory(request, run, staged, probe, lambda stage: False)
    full = estimate_memory(run.model, run.hardware, run.layout, run.options, shipped_coefficients(), staged=staged)
    assert probed is not None and probed.as_dict() == full.as_dict()
    assert probed_memory(request, run, staged, probe, lambda stage: True) is None
