"""The shapes of the main ``--json`` documents as pydantic models: the source of truth of the
JSON Schema files in docs/schema/ (tools/gen_json_schema.py writes them; tests/test_cli_conventions.py
validates real output against them).

The models name the keys scripts rely on and their types; every object also allows keys they do
not name, because keys are only ever added within a schema version (docs/json-schema.md)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from lcmoe.cli.common import SCHEMA_VERSION


class _Open(BaseModel):
    """An object that may carry keys beyond those named (added in later releases)."""

    model_config = ConfigDict(extra="allow")


class Layout(_Open):
    tp: int
    cp: int
    ep: int
    etp: int
    pp: int
    vpp: int
    dp: int
    edp: int
    mbs: int
    gbs: int
    ga: int
    cp_comm_type: str
    hierarchical_context_parallel_sizes: list[int] | None = Field(
        None, description="a2a+p2p only: [a2a group size, p2p group size], product = cp; absent otherwise"
    )
    sequence_parallel: bool
    pipeline_layout: str | None = Field(description="Megatron layout string; null: the even split")


class Stage(_Open):
    stage: int
    layers: int
    inflight_microbatches: int
    peak_allocated_bytes: float
    peak_reserved_bytes: float
    components: dict[str, float]


class Memory(_Open):
    peak_allocated_bytes: float
    peak_reserved_bytes: float = Field(description="what nvidia-smi shows, worst stage")
    peak_torch_reserved_bytes: float
    capacity_bytes: float
    headroom_bytes: float
    fits: bool
    oom_risk: bool
    error_band_pct: float
    worst_stage: int
    host_bytes_per_gpu: float
    stages: list[Stage]


class Time(_Open):
    step_seconds: float | None
    tokens_per_sec_per_gpu: float | None
    model_tflops_per_gpu: float | None
    mfu: float | None = Field(description="0-1 of the GPU's dense BF16 peak")
    breakdown: dict[str, float | None]
    band_pct: float | None = None
    tokens_per_sec_per_gpu_low: float | None = None
    tokens_per_sec_per_gpu_high: float | None = None


class Recompute(_Open):
    granularity: Literal["none", "selective", "full"]
    modules: list[str]
    method: Literal["uniform", "block"] | None
    num_layers: int | None


class Peft(_Open):
    scheme: str
    rank: int
    targets: list[str]


class ActivationOffload(_Open):
    """Fine-grained activation offloading (Megatron-Core offload_modules, activation_offload_fraction)."""

    modules: list[str]
    fraction: float


class PagedStash(_Open):
    """Sync-free experts and the MoE paged stash (Megatron-Core moe_expert_rank_capacity_factor,
    moe_paged_stash and its buffer factors)."""

    rank_capacity_factor: float
    stash: bool
    cuda_factor: float
    cpu_factor: float


class DocLengths(_Open):
    """The packed documents' histogram (``--doc-lengths``) and its expectations at seq_len."""

    name: str = Field(description="preset name, file name, or 'unknown' (a packing config read without lengths)")
    source: str
    lengths: list[int] = Field(description="document lengths, tokens, ascending")
    token_shares: list[float] = Field(description="share of all tokens in documents of each length; sums to 1")
    attention_length: float = Field(description="ŝ = E[Σ dᵢ²]/seq_len, documents longer than seq_len split")
    attention_share_of_fixed: float = Field(description="ŝ / seq_len: core attention against fixed length")
    docs_per_pack: float


class Packing(_Open):
    """What the packed documents change for one plan's layout (per pack token)."""

    pad_multiple: int = Field(description="each document padded to a multiple of this: 2·CP under CP, else 1")
    real_token_share: float = Field(description="real tokens per pack slot after that padding")
    docs_per_pack: float
    attention_length: float = Field(description="what the attention kernels run: ŝ · real_token_share")
    bridge_attention_length: float = Field(
        description="Bridge's ŝ = S2/S1 behind the TFLOP/s: the documents' at CP 1, seq_len at CP > 1"
    )
    attention_share_of_fixed: float
    counted_over_real_flops: float = Field(
        description="Bridge's model FLOPs over the real documents' (1 at CP 1; > 1 at CP > 1)"
    )
    caveats: list[str]


class DynamicCpSettings(_Open):
    """Dynamic context parallelism's settings (mcore 0.19.2 hybrid_context_parallel)."""

    max_seqlen_per_dp_cp_rank: int | None = Field(description="tokens one rank holds; null: seq_len / CP")
    min_dynamic_context_parallel_size: int = Field(description="smallest group (Megatron-LM dev only above 1)")


class DynamicCpClass(_Open):
    group: int = Field(description="ranks the documents of this class run on: 2^⌈log₂(ℓ/M)⌉")
    length: float = Field(description="their token-weighted mean padded length, tokens")
    slot_share: float = Field(description="their share of the step's pack slots")


class DynamicCp(_Open):
    """Where the documents run under dynamic CP (estimate.dynamic_cp)."""

    max_seqlen_per_dp_cp_rank: int
    min_dynamic_context_parallel_size: int
    pool: int = Field(description="DP·CP, the ranks regrouped")
    pad_multiple: int = Field(description="each document padded to a multiple of this: 2·DP·CP (·TP with SP)")
    padding_per_token: float
    classes: list[DynamicCpClass]
    caveats: list[str]


class Reason(_Open):
    rule: str
    text: str


class Plan(_Open):
    """One plan: every setting it uses (what `lcmoe estimate --from-plan` rebuilds) and its numbers."""

    layout: Layout
    recompute: Recompute
    precision: str
    dispatcher: str
    cuda_graph_scope: list[str]
    overlap_moe_expert_parallel_comm: bool
    optimizer_offload_fraction: float
    precision_aware_optimizer: bool
    main_grads_dtype: Literal["fp32", "bf16"]
    peft: Peft | None
    memory: Memory
    time: Time
    reasons: list[Reason]
    packing: Packing | None = Field(default=None, description="only with --doc-lengths")
    activation_offload: ActivationOffload | None = Field(
        default=None, description="only with fine-grained activation offloading"
    )
    dynamic_cp: DynamicCpSettings | None = Field(default=None, description="only with dynamic context parallelism")
    paged_stash: PagedStash | None = Field(default=None, description="only with a rank capacity factor")
    optimizer: Literal["muon"] | None = Field(default=None, description="only with --optimizer muon")
    muon_num_ns_steps: int | None = Field(default=None, description="only with --optimizer muon")
    muon_tp_mode: Literal["blockwise", "duplicated", "distributed"] | None = Field(
        default=None, description="only with --optimizer muon"
    )


class PlanInputs(_Open):
    model: str
    attention: str
    gpu: str
    num_gpus: int
    seq_len: int
    gbs: int | None
    memory_margin: float
    megatron_core_version: str
    peft: Peft | None
    doc_lengths: DocLengths | None = Field(default=None, description="only with --doc-lengths")
    # The full specs, so `--plan`/`--from-plan` work without the files they came from (newer plans).
    model_spec: dict[str, Any] | None = None
    hardware_spec: dict[str, Any] | None = None


class ParetoPoint(_Open):
    peak_reserved_bytes: float
    tokens_per_sec_per_gpu: float | None
    layout: Layout


class PlanDocument(_Open):
    """`lcmoe plan --json` (and `report --json`)."""

    schema_version: Literal["2"]
    lcmoe_version: str
    inputs: PlanInputs
    plans: list[Plan]
    fallback: Plan | None
    pareto: list[ParetoPoint]
    searched: int
    legal: int
    fit: int
    # Legal candidates within the model-state bound that the search skipped because their
    # throughput ceiling shows they cannot change the output (lcmoe.plan.bound); not in ``fit``.
    pruned: int
    closest: Plan | None = None
    min_gpus_needed: int | None = None
    fewer_gpus_that_fit: int | None = None


class EstimateInputs(_Open):
    model: str
    gpu: str
    num_gpus: int
    seq_len: int
    precision: str
    recompute: str
    dispatcher: str
    cuda_graph_scope: list[str]
    optimizer_offload_fraction: float
    peft: Peft | None
    precision_aware_optimizer: bool
    main_grads_dtype: Literal["fp32", "bf16"]
    overlap_moe_expert_parallel_comm: bool
    delay_wgrad_compute: bool = False
    optimizer: Literal["adam", "muon", "sgd"] = "adam"
    muon_num_ns_steps: int | None = Field(default=None, description="only with --optimizer muon")
    muon_tp_mode: Literal["blockwise", "duplicated", "distributed"] | None = Field(
        default=None, description="only with --optimizer muon"
    )
    doc_lengths: DocLengths | None = Field(default=None, description="only with --doc-lengths")
    activation_offload: ActivationOffload | None = Field(default=None, description="only with --offload-modules")
    dynamic_context_parallel: bool = False
    dynamic_cp: DynamicCpSettings | None = Field(default=None, description="only with --dynamic-cp")
    paged_stash: PagedStash | None = Field(default=None, description="only with --moe-rank-capacity-factor")


class EstimateDocument(_Open):
    """`lcmoe estimate --json`."""

    schema_version: Literal["2"]
    inputs: EstimateInputs
    layout: Layout
    memory: Memory
    time: Time
    packing: Packing | None = Field(default=None, description="only with --doc-lengths")
    dynamic_cp: DynamicCp | None = Field(default=None, description="only with --dynamic-cp")


class Violation(_Open):
    rule: str
    message: str
    fix: str
    source: str


class Advice(_Open):
    rule: str
    severity: str
    text: str


class CheckDocument(_Open):
    """`lcmoe check --json`: the estimate keys only when the config is legal."""

    schema_version: Literal["2"]
    format: str
    errors: list[Violation]
    advice: list[Advice]
    exit_code: int
    inputs: dict[str, Any] | None = None
    layout: Layout | None = None
    memory: Memory | None = None
    time: Time | None = None
    packing: Packing | None = None
    dynamic_cp: DynamicCp | None = None


class SweepRow(_Open):
    seq_len: int
    plan: Plan | None = Field(description="the best plan at this length; null when nothing fits")


class SweepDocument(_Open):
    """`lcmoe sweep --json`."""

    schema_version: Literal["2"]
    model: str
    gpu: str
    num_gpus: int
    sweep: list[SweepRow]


class ModelRow(_Open):
    name: str
    family: str
    layers: int
    attention: str
    experts: int | None
    total_params: float
    active_params: float


class ModelsDocument(_Open):
    """`lcmoe models --json`."""

    schema_version: Literal["2"]
    models: list[ModelRow]


class HardwareRow(_Open):
    name: str
    architecture: str
    hbm_bytes: float
    peak_flops: dict[str, float]
    nvlink_domain_size: int
    gpus_per_node: int


class HardwareDocument(_Open):
    """`lcmoe hardware --json`."""

    schema_version: Literal["2"]
    hardware: list[HardwareRow]


class FlopsDocument(_Open):
    """`lcmoe flops --json`."""

    schema_version: Literal["2"]
    model: str
    seq_len: int
    tp: int
    global_batch_size: int
    flops_per_token: float
    flops_per_step: float
    padded_vocab_size: int
    breakdown: dict[str, float]
    source: str


class LadderRung(_Open):
    kind: str
    change: str
    legal: bool
    fits: bool | None


class Oom(_Open):
    predicted_peak_reserved_bytes: float
    capacity_bytes: float
    predicted_fits: bool
    evidence: list[str]
    ladder: list[LadderRung]


class DiagnoseDocument(_Open):
    """`lcmoe diagnose LOG --json`: the analyses present are those the log and config allow."""

    schema_version: Literal["2"]
    log: dict[str, Any]
    config_source: str | None
    comm_failures: list[dict[str, Any]]
    exit_code: int
    memory: dict[str, Any] | None = None
    oom: Oom | None = None
    steps: dict[str, Any] | None = None
    speed: dict[str, Any] | None = None
    failures: list[dict[str, Any]] | None = None


class RegressionDocument(_Open):
    """`lcmoe diagnose NEW --baseline OLD --json`."""

    schema_version: Literal["2"]
    baseline: dict[str, Any] | None
    candidate: dict[str, Any] | None
    step_time_change: float | None
    step_time_verdict: str
    memory_verdict: str
    config_diff: dict[str, dict[str, Any]]
    causes: list[dict[str, Any]]
    exit_code: int


class PreflightCheck(_Open):
    check: str
    status: Literal["pass", "warn", "fail"]
    detail: str
    fix: str | None


class PreflightDocument(_Open):
    """`lcmoe preflight --json`."""

    schema_version: Literal["2"]
    checks: list[PreflightCheck]
    exit_code: int


class CalibrationRun(_Open):
    source: str
    measured_step_seconds: float
    predicted_before_seconds: float
    predicted_after_seconds: float


class CalibrateDocument(_Open):
    """`lcmoe calibrate --json` (the document --out holds)."""

    schema_version: Literal["2"]
    format: str
    architecture: str
    hardware: str
    scales: dict[str, float]
    coefficients: dict[str, Any]
    runs: list[CalibrationRun]
    fit: dict[str, Any]


class AnyDocument(_Open):
    """Any `lcmoe … --json` document: an object that starts with schema_version."""

    schema_version: Literal["2"]


# file name in docs/schema/ → model
DOCUMENTS: dict[str, type[BaseModel]] = {
    "plan.schema.json": PlanDocument,
    "estimate.schema.json": EstimateDocument,
    "check.schema.json": CheckDocument,
    "sweep.schema.json": SweepDocument,
    "models.schema.json": ModelsDocument,
    "hardware.schema.json": HardwareDocument,
    "flops.schema.json": FlopsDocument,
    "diagnose.schema.json": DiagnoseDocument,
    "regression.schema.json": RegressionDocument,
    "preflight.schema.json": PreflightDocument,
    "calibrate.schema.json": CalibrateDocument,
    "document.schema.json": AnyDocument,
}


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of ``model``, with its id and schema version."""
    schema = model.model_json_schema(mode="serialization")
    name = next(k for k, v in DOCUMENTS.items() if v is model)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"docs/schema/{name}, written by tools/gen_json_schema.py from lcmoe.cli.json_models",
        "x-schema-version": SCHEMA_VERSION,
        **schema,
    }
