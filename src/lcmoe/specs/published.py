"""Parameter counts as a model's publisher states them (a catalog entry's ``published:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from lcmoe.specs._validate import StrictSpec


class PublishedParams(StrictSpec):
    """Parameter counts as their publisher states them, to check lcmoe's own count against."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_billions: float = Field(gt=0)
    active_billions: float | None = Field(default=None, gt=0)
    stated_unit_billions: float = Field(
        default=0.01, gt=0, description="unit of the last stated digit: 1 for '37B', 0.01 for '116.83B'"
    )
    includes_mtp: bool = False
    active_convention: Literal["all", "no_input_embedding", "no_embeddings"] = Field(
        default="all", description="which embedding matrices the publisher leaves out of 'active'"
    )
    source: str

    def tolerance(self, value_billions: float) -> float:
        """Allowed |ours − published| in billions: 1%, or one stated unit if that is larger.

        A figure stated as "3.3B" may be 3.25–3.35 rounded or 3.30–3.39 truncated; publishers do
        not say which, so one whole unit is the honest bound.
        """
        return max(0.01 * value_billions, self.stated_unit_billions)
