"""megatron_golden.csv rows → lcmoe configurations (shared by the memory accuracy and fit scripts).

The measured value is ``mem_max_allocated_bytes_first``: torch's peak allocated bytes after the
first logged step on the **last rank** (last pipeline stage), megatron_golden.md "Caveats".
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from benchmarks.published import as_int
from lcmoe.catalog import load_hardware
from lcmoe.config_io.megatron_args import ParsedRun, parse_megatron_args
from lcmoe.errors import LcmoeError
from lcmoe.estimate.memory import MemoryCoefficients, estimate_memory
from lcmoe.specs.hardware import HardwareSpec

TARGET = "mem_max_allocated_bytes_first"

# Containers whose image has no flash-attn >= 2.4.1, so TE's deterministic Ampere path falls back
# to unfused attention (lcmoe.estimate.memory.attention_kernel). Evidence in megatron_golden.csv:
# every A100 `lts` row with --deterministic-mode, CP 1 and the default attention backend measures
# the unfused softmax on top of its `dev` twin (+0.8–0.9 GiB at h 512, s 1024, 12 layers), while
# the same configs with CP > 1 (always flash/fused) or full recompute agree between containers.
CONTAINERS_WITHOUT_FLASH_ATTN = frozenset({"lts"})


@dataclass(frozen=True, slots=True)
class GoldenCase:
    name: str
    run: ParsedRun
    measured: float
    row: dict[str, str]


def row_label(row: dict[str, str]) -> str:
    resumed = "/2nd" if row.get("resume_second_run") == "yes" else ""
    return f"{row['test_case'].split('/')[-1]} [{row.get('platform', '')}{resumed}]"


def build_case(row: dict[str, str]) -> GoldenCase | str:
    """The case for a row, or the reason it cannot be modelled."""
    measured = row.get(TARGET, "").strip()
    if not measured:
        return "no mem-max-allocated-bytes measurement"
    if not row.get("world_size", "").strip():
        return "world size not stated"
    vocab = as_int(row.get("base_vocab_size"), 0) or None
    if vocab is None and not row.get("padded_vocab_size_derived"):
        return "vocabulary size unknown (tokenizer file not in the repository)"
    try:
        run = parse_megatron_args(row["args_raw"], world_size=as_int(row["world_size"]), vocab_size=vocab)
    except LcmoeError as exc:
        return str(exc)
    if row.get("environment") in CONTAINERS_WITHOUT_FLASH_ATTN:
        run = replace(run, options=replace(run.options, flash_attn_installed=False))
    return GoldenCase(row_label(row), run, float(measured), row)


def platform_hardware(row: dict[str, str]) -> HardwareSpec:
    """The row's GPU; goldens without a platform suffix ran on H100 or GB200 recipes (both Hopper+)."""
    platform = row.get("platform", "")
    return load_hardware(platform if platform in ("a100", "h100", "gb200") else "h100")


def predict_last_rank(case: GoldenCase, coefficients: MemoryCoefficients) -> float:
    # A resumed run (``_2nd`` golden file) loads the optimizer moments before its first step.
    first_step = case.row.get("resume_second_run") != "yes"
    estimate = estimate_memory(
        case.run.model,
        platform_hardware(case.row),
        case.run.layout,
        case.run.options,
        coefficients,
        first_step=first_step,
    )
    return estimate.stages[-1].peak_allocated
