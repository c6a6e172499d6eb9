"""FLOPs per token: lcmoe vs what Megatron Bridge itself counted in published runs.

For every row of perf_summary.csv whose model is in the catalog, the published
``model_tflops_per_gpu × 1e12 / tokens_per_sec_per_gpu`` is the FLOPs per token Bridge counted;
lcmoe's ``flops_per_token`` must match it within 2%. Also reproduces the per-token reference
values of megatron-bridge-facts.md §4.6 (within 0.5%).

    python benchmarks/flops_consistency.py [--data PATH] [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.published import REFERENCE, as_float, as_int, catalog_model_for_row, read_rows, write_json
from lcmoe.catalog import load_model
from lcmoe.estimate.flops import flops_per_token

# megatron-bridge-facts.md §4.6: GFLOP per token at s = 4096 / 32768 / 131072, TP = 1.
FACTS_REFERENCE = {
    "deepseek-v3": (259.99, 478.43, 1227.37),
    "kimi-k2": (204.48, 311.94, 680.36),
    "qwen3-235b-a22b": (148.03, 280.51, 734.70),
    "qwen3-30b-a3b": (23.01, 56.83, 172.79),
    "qwen3-next-80b-a3b": (25.13, 34.29, 65.70),
    "gpt-oss-120b": (32.63, 45.32, 88.80),
}
# Packed-sequence fine-tuning: Bridge counts S2/S1 over the packed sub-sequences, which the
# summary table does not publish, and LoRA freezes the base weights. Not comparable per token.
NOT_COMPARABLE_TASKS = {"sft": "packed sequences (S2/S1 unpublished)", "lora": "LoRA + packed sequences"}


def facts_reference_errors() -> list[dict[str, object]]:
    out = []
    for name, values in FACTS_REFERENCE.items():
        spec = load_model(name)
        for seq_len, ref in zip((4096, 32768, 131072), values, strict=True):
            ours = flops_per_token(spec, seq_len).total / 1e9
            out.append(
                {"model": name, "seq_len": seq_len, "reference": ref, "lcmoe": ours, "err_pct": 100 * (ours / ref - 1)}
            )
    return out


def published_row_errors(rows: list[dict[str, str]]) -> tuple[list[dict[str, object]], list[dict[str, str]]]:
    compared, skipped = [], []
    for row in rows:
        spec = catalog_model_for_row(row)
        tflops, tokens = as_float(row.get("model_tflops_per_gpu")), as_float(row.get("tokens_per_sec_per_gpu"))
        label = f"{row.get('container')} {row.get('model')} {row.get('gpu')} x{row.get('num_gpus')} {row.get('task')}"
        if spec is None:
            skipped.append({"row": label, "reason": "model not in catalog"})
            continue
        if row.get("task") in NOT_COMPARABLE_TASKS:
            skipped.append({"row": label, "reason": NOT_COMPARABLE_TASKS[row["task"]]})
            continue
        if not tflops or not tokens:
            skipped.append({"row": label, "reason": "TFLOP/s or tokens/s not published"})
            continue
        seq_len, tp = as_int(row.get("seq_len")), as_int(row.get("tp"))
        published = tflops * 1e12 / tokens
        ours = flops_per_token(spec, seq_len, tp=tp).total
        compared.append(
            {
                "row": label,
                "seq_len": seq_len,
                "tp": tp,
                "published_gflop_per_token": published / 1e9,
                "lcmoe_gflop_per_token": ours / 1e9,
                "err_pct": 100 * (ours / published - 1),
            }
        )
    return compared, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REFERENCE / "perf_summary.csv"))
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)

    facts = facts_reference_errors()
    compared, skipped = published_row_errors(read_rows(args.data))
    print(f"{'row':70s} {'published':>10s} {'lcmoe':>10s} {'err%':>7s}")
    for item in compared:
        print(
            f"{item['row']:70s} {item['published_gflop_per_token']:10.2f} {item['lcmoe_gflop_per_token']:10.2f} "
            f"{item['err_pct']:+7.2f}"
        )
    worst_row = max((abs(float(c["err_pct"])) for c in compared), default=0.0)  # type: ignore[arg-type]
    worst_facts = max(abs(float(f["err_pct"])) for f in facts)  # type: ignore[arg-type]
    within = sum(abs(float(c["err_pct"])) <= 2.0 for c in compared)  # type: ignore[arg-type]
    print(f"\nskipped {len(skipped)} rows: " + ", ".join(sorted({s["reason"] for s in skipped})))
    print(f"published rows compared: {len(compared)}, within 2%: {within}, worst |err| {worst_row:.3f}%")
    print(f"facts §4.6 reference values: {len(facts)}, worst |err| {worst_facts:.4f}% (limit 0.5%)")
    if args.json_out:
        write_json(
            args.json_out,
            {
                "n": len(compared),
                "within_2pct": within,
                "worst_abs_pct_err": worst_row,
                "facts_worst_abs_pct_err": worst_facts,
                "rows": compared,
                "skipped": skipped,
                "facts": facts,
            },
        )
    return 0 if within == len(compared) and worst_facts <= 0.5 else 1


if __name__ == "__main__":
    sys.exit(main())
