"""What a plan search takes and gives: the request (PlanRequest), one ranked plan (Plan, its JSON)
and the search's result (SearchResult). ``plan.search`` re-exports every name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from lcmoe.estimate.band import TimeBand, TimeEvidence
from lcmoe.estimate.memory import MemoryCoefficients, MemoryEstimate
from lcmoe.estimate.time import TimeCoefficients, TimeEstimate
from lcmoe.rules.advice import Advice
from lcmoe.run import RunConfig
from lcmoe.specs.doc_lengths import DocLengths
from lcmoe.specs.hardware import HardwareSpec
from lcmoe.specs.model import ModelSpec
from lcmoe.workload import LORA_TARGETS, Peft

RankMode = Literal["conservative", "expected"]
RANK_MODES: tuple[RankMode, ...] = ("conservative", "expected")


@dataclass(frozen=True, slots=True)
class PlanRequest:
    model: ModelSpec
    hardware: HardwareSpec
    num_gpus: int
    seq_len: int
    gbs: int | None = None
    precisions: tuple[str, ...] | None = None
    dispatchers: tuple[str, ...] | None = None
    memory_margin: float = 0.05
    top_k: int = 5
    megatron_core_version: str = "0.19.2"
    allow_offload: bool = True
    allow_cuda_graphs: bool = True
    time_coefficients: TimeCoefficients | None = None  # a user calibration; None = shipped
    # The fitted memory coefficients (memory_coefficients.yaml, loaded once by the caller); None:
    # the shipped ones, loaded once by ``search``.
    memory_coefficients: MemoryCoefficients | None = None
    # The measured runs behind the time bands (data/time_evidence.yaml, loaded by the CLI); None:
    # no bands, plans rank by the predicted tokens/s.
    time_evidence: TimeEvidence | None = None
    # conservative: rank by the band's lower edge of tokens/s/GPU; expected: by the prediction.
    rank: RankMode = "conservative"
    # Parameter-efficient finetuning: TrainingOptions' peft / lora_* fields, as run_options.peft_options gives them.
    peft: Peft = "none"
    lora_rank: int = 32
    lora_targets: frozenset[str] = LORA_TARGETS
    lora_input_regather: bool = False
    # Document lengths packed into each seq_len sample (TrainingOptions.doc_lengths); None: fixed length.
    doc_lengths: DocLengths | None = None
    # Skip the candidates whose throughput ceiling shows they cannot change the output
    # (plan.bound; the same plans, Pareto front and fallback); False: climb every candidate, so
    # that ``fit`` and ``fitting_points`` cover all of them.
    prune: bool = True
    # The optimizer the user chose (not searched): TrainingOptions.muon_summary's fields, or {} for Adam.
    optimizer: tuple[tuple[str, object], ...] = ()

    @property
    def allow_optimizer_offload(self) -> bool:
        """Whether the search may offload optimizer state: not under Muon (L-MUON-OFFLOAD)."""
        return self.allow_offload and dict(self.optimizer).get("optimizer") != "muon"


@dataclass(frozen=True, slots=True)
class Plan:
    run: RunConfig
    memory: MemoryEstimate
    time: TimeEstimate
    reasons: tuple[Advice, ...] = ()
    band: TimeBand | None = None  # the time prediction's uncertainty (estimate.band)

    @property
    def tokens_per_sec_per_gpu(self) -> float:
        return self.time.tokens_per_sec_per_gpu

    @property
    def tokens_per_sec_per_gpu_low(self) -> float:
        """The band's lower edge of tokens/s/GPU (the prediction itself without a band)."""
        if self.band is None:
            return self.tokens_per_sec_per_gpu
        return self.tokens_per_sec_per_gpu * max(0.0, 1 - self.band.pct / 100)

    def rank_value(self, mode: RankMode) -> float:
        """What plans are ranked by: the lower edge (conservative) or the prediction (expected)."""
        return self.tokens_per_sec_per_gpu_low if mode == "conservative" else self.tokens_per_sec_per_gpu

    def time_dict(self) -> dict[str, object]:
        """The time estimate's JSON plus its band: ``band_pct`` (± percent of tokens/s/GPU),
        ``tokens_per_sec_per_gpu_low`` / ``_high`` and ``evidence`` (the nearest measured run and
        the distance to it); null band and evidence when the request carried no evidence."""
        out = self.time.as_dict()
        band = self.band
        out["band_pct"] = band.pct if band else None
        out["tokens_per_sec_per_gpu_low"] = self.tokens_per_sec_per_gpu_low if band else None
        out["tokens_per_sec_per_gpu_high"] = self.tokens_per_sec_per_gpu * (1 + band.pct / 100) if band else None
        out["evidence"] = band.as_dict() if band else None
        return out

    def as_dict(self) -> dict[str, object]:
        out = self._as_dict()
        if self.run.options.doc_lengths is not None:
            from lcmoe.estimate.packing import packing_summary

            out["packing"] = packing_summary(self.run.model, self.run.layout, self.run.options)
        return out

    def _as_dict(self) -> dict[str, object]:
        lay, opt = self.run.layout, self.run.options
        return {
            "layout": {
                "tp": lay.tp,
                "cp": lay.cp,
                "ep": lay.ep,
                "etp": lay.etp,
                "pp": lay.pp,
                "vpp": lay.vpp,
                "dp": lay.dp,
                "edp": lay.edp,
                "mbs": lay.mbs,
                "gbs": lay.gbs,
                "ga": lay.num_microbatches,
                "cp_comm_type": lay.cp_comm_type,
                **lay.hierarchical_cp_dict(),
                "sequence_parallel": lay.sequence_parallel,
                "pipeline_layout": lay.pipeline_layout,
            },
            "recompute": {
                "granularity": opt.recompute_granularity,
                "modules": sorted(opt.recompute_modules),
                "method": opt.recompute_method if opt.recompute_granularity == "full" else None,
                "num_layers": opt.recompute_num_layers if opt.recompute_granularity == "full" else None,
            },
            "precision": opt.precision,
            "dispatcher": opt.dispatcher,
            "cuda_graph_scope": sorted(opt.cuda_graph_scope),
            "overlap_moe_expert_parallel_comm": opt.overlap_moe_expert_parallel_comm,
            "optimizer_offload_fraction": opt.optimizer_offload_fraction,
            "precision_aware_optimizer": opt.precision_aware_optimizer,
            "main_grads_dtype": opt.main_grads_dtype,
            "peft": opt.peft_summary(),
            **opt.activation_offload_summary(),
            **opt.dynamic_cp_summary(),
            **opt.paged_stash_summary(),
            **opt.muon_summary(),
            "memory": self.memory.as_dict(),
            "time": self.time_dict(),
            "reasons": [{"rule": a.rule, "text": a.text} for a in self.reasons],
        }


@dataclass(slots=True)
class SearchResult:
    plans: list[Plan]
    fallback: Plan | None
    pareto: list[Plan]
    searched: int
    legal: int
    fit: int
    # Legal candidates skipped by their throughput ceiling (plan.bound): neither climbed nor
    # counted in ``fit``; ``fit`` + ``pruned`` ≤ ``legal``.
    pruned: int = 0
    closest: Plan | None = None
    min_gpus_needed: int | None = None
    notes: list[str] = field(default_factory=list)
    # (peak reserved bytes, tokens/s/GPU) of every fitting candidate: the report's Pareto scatter.
    fitting_points: list[tuple[float, float]] = field(default_factory=list)
    # The GBS every candidate runs (None: the user's --gbs, rounded per candidate) and why.
    gbs: int | None = None
    gbs_reason: str = ""
    rank: RankMode = "conservative"
