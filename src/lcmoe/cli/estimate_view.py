"""`lcmoe estimate --explain`: every step-time term of one stage as amount / rate = seconds."""

from __future__ import annotations

from typing import Any

from lcmoe.cli.common import stdout


def _term_line(term: Any) -> str:
    """``name: amount unit / rate unit [× factor] = seconds s [(why the factor)]``, 4 significant
    digits each, so that amount / rate × factor can be redone by hand."""
    line = f"  {term.name}: {term.amount:.4g} {term.amount_unit} / {term.rate:.4g} {term.rate_unit}"
    if term.factor != 1.0:
        line += f" × {term.factor:.4g}"
    line += f" = {term.seconds:.4g} s"
    return line + (f"  ({term.factor_note})" if term.factor_note and term.factor != 1.0 else "")


def render_explanation(explanation: Any) -> None:
    """The terms of one stage's microbatch and the step they make (``estimate --explain``)."""
    e = explanation
    which = "the slowest" if e.stage == e.critical_stage else f"the slowest is stage {e.critical_stage}"
    stdout.print(f"step-time terms of stage {e.stage} ({which}), one microbatch on one GPU:", highlight=False)
    for term in e.terms:
        stdout.print(_term_line(term), highlight=False, markup=False)
    stdout.print(f"  microbatch of stage {e.stage} = sum of the terms = {e.microbatch_seconds:.4g} s", highlight=False)
    stdout.print("step terms beside the microbatches:", highlight=False)
    for term in e.step_terms:
        stdout.print(_term_line(term), highlight=False, markup=False)
    extra = sum(t.seconds for t in e.step_terms)
    stdout.print(
        f"step = {e.critical_microbatch_seconds:.4g} s (stage {e.critical_stage} microbatch) × ({e.num_microbatches} "
        f"microbatches + {e.bubble_factor:.4g} bubble) + {extra:.4g} s (step terms) = {e.step_seconds:.4g} s",
        highlight=False,
    )
