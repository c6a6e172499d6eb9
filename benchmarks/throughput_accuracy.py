"""Step-time model accuracy: predicted vs published model TFLOP/s/GPU.

Default: refit the efficiencies on the given data (as fit_time.py does), then report the fit
MAPE, the leave-one-model-out MAPE (refit without that model, predict it), Spearman rank
correlation within each (model, GPU, container) group of ≥ 3 rows, and the DSV3 H100
CP-scaling series of long_context.csv side by side. ``--evaluate`` predicts every row with the
coefficients shipped in the package and refits nothing (how anyone checks the shipped model on
new data). It reads exactly the files it is given (with none, every reference table), evaluates
every row it can express, and lists the others by reason with counts; per-model MAPE and the
leave-one-model-out MAPE per model are printed (and written with ``--json``).

    python benchmarks/throughput_accuracy.py [--data PATH [--recipes PATH]] [--long-context PATH]
                                             [--points PATH] [--evaluate] [--no-lomo] [--json OUT]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.perf_rows import (
    TIME_HOLDOUT,
    PerfCase,
    container_factor,
    long_context_cases,
    perf_cases,
    split_time_holdout,
)
from benchmarks.published import REFERENCE, as_float, read_rows, skip_summary, write_json
from lcmoe.estimate.time import TimeCoefficients, combine, shipped_time_coefficients, time_amounts


def spearman(xs: list[float], ys: list[float]) -> float:
    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        result = [0.0] * len(values)
        for rank, index in enumerate(order):
            result[index] = float(rank)
        return result

    rx, ry = ranks(xs), ranks(ys)
    n = len(xs)
    mean = (n - 1) / 2
    cov = sum((a - mean) * (b - mean) for a, b in zip(rx, ry, strict=True))
    var = sum((a - mean) ** 2 for a in rx)
    return cov / var if var else 0.0


def predictions(cases: list[PerfCase], coefficients: dict[str, TimeCoefficients]) -> list[float]:
    """Each row in its own container: the reference-container prediction × the fitted factor."""
    out = []
    for c in cases:
        family = coefficients[c.run.hardware.architecture]
        out.append(combine(time_amounts(c.run), family).model_tflops_per_gpu * container_factor(family, c.container))
    return out


def _report_skipped(title: str, skipped: list[dict[str, str]]) -> None:
    """Rows a reader could not express, counted by reason."""
    print(f"\n{title}: {len(skipped)} rows not evaluated")
    for reason, count in skip_summary(skipped):
        print(f"  {count:4d}  {reason}")


def _per_model(cases: list[PerfCase], predicted: list[float]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for name in sorted({c.model_name for c in cases}):
        signed = [p / c.published_tflops - 1 for c, p in zip(cases, predicted, strict=True) if c.model_name == name]
        out[name] = {
            "n": len(signed),
            "mape": 100 * statistics.mean(abs(e) for e in signed),
            "bias_pct": 100 * statistics.mean(signed),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="perf_summary.csv-style table (with --recipes)")
    parser.add_argument("--recipes", help="perf_recipes.csv beside --data (default: the reference one)")
    parser.add_argument("--long-context", help="long_context.csv-style table")
    parser.add_argument("--points", help="memory_points.csv-style table (runs with a measured throughput)")
    parser.add_argument("--evaluate", action="store_true", help="shipped coefficients, no refit")
    parser.add_argument("--no-lomo", action="store_true", help="skip the leave-one-model-out refits")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)
    # A benchmark reads exactly the files it is given; with none, every reference table.
    if not (args.data or args.long_context or args.points):
        args.data = str(REFERENCE / "perf_summary.csv")
        args.long_context = str(REFERENCE / "long_context.csv")
        args.points = str(REFERENCE / "memory_points.csv")
    if args.data and not args.recipes:
        args.recipes = str(REFERENCE / "perf_recipes.csv")
    print("reading:", ", ".join(f for f in (args.data, args.recipes, args.long_context, args.points) if f))

    all_cases, skipped = perf_cases(args.data, args.recipes) if args.data else ([], [])
    cases, held_out = split_time_holdout(all_cases)
    long_context, lc_skipped = long_context_cases(args.long_context) if args.long_context else ([], [])
    everything = cases + long_context
    if args.evaluate or not everything:
        coefficients = {family: shipped_time_coefficients(family) for family in ("hopper", "blackwell")}
    else:
        from benchmarks.fit_time import fit_families

        coefficients = fit_families(everything)
    predicted = predictions(everything, coefficients)
    errors = [100 * (p / c.published_tflops - 1) for p, c in zip(predicted, everything, strict=True)]
    moe = [abs(e) for e, c in zip(errors, everything, strict=True) if c.run.model.is_moe]
    print(f"{'row':70s} {'published':>9s} {'lcmoe':>9s} {'err%':>7s}")
    for c, p, e in zip(everything, predicted, errors, strict=True):
        print(f"{c.name[:70]:70s} {c.published_tflops:9.0f} {p:9.0f} {e:+7.1f}")

    groups: dict[str, list[tuple[float, float]]] = {}
    for c, p in zip(cases, predicted, strict=False):
        groups.setdefault(c.group, []).append((c.published_tflops, p))
    rhos = [spearman([a for a, _ in v], [b for _, b in v]) for v in groups.values() if len(v) >= 3]

    per_model = _per_model(everything, predicted) if everything else {}
    lomo = lomo_moe = None
    lomo_models: dict[str, dict[str, float]] = {}
    if not args.evaluate and not args.no_lomo and everything:
        from benchmarks.fit_time import leave_one_model_out

        print("\nleave-one-model-out (refit without the model, predict its rows):")
        lomo, lomo_moe, lomo_models = leave_one_model_out(everything, coefficients)
    print(
        f"\n{'model':32s} {'n':>4s} {'MAPE%':>7s} {'bias%':>7s}"
        + (f" {'LOMO%':>7s} {'bias%':>7s}" if lomo_models else "")
    )
    for name, m in per_model.items():
        line = f"{name:32s} {int(m['n']):4d} {m['mape']:7.2f} {m['bias_pct']:+7.2f}"
        if name in lomo_models:
            line += f" {lomo_models[name]['mape']:7.2f} {lomo_models[name]['bias_pct']:+7.2f}"
        print(line)

    lc_rows = [
        {
            "row": c.name,
            "seq_len": c.run.options.seq_len,
            "published": c.published_tflops,
            "predicted": p,
            "err_pct": 100 * (p / c.published_tflops - 1),
        }
        for c, p in zip(everything, predicted, strict=True)
        if c in long_context
    ]
    if lc_rows:
        print("\nlong-context series (model TFLOP/s/GPU):")
    for row in lc_rows:
        print(
            f"  {row['row']:42s} published {row['published']:6.0f}  lcmoe {row['predicted']:6.0f}  "
            f"{row['err_pct']:+6.1f}%"
        )
    mape = statistics.mean(abs(e) for e in errors) if errors else 0.0
    mape_moe = statistics.mean(moe) if moe else 0.0
    held_out_rows = []
    if held_out:
        print("\nmodels the time model is not fitted on (TIME_HOLDOUT), predicted with the fitted coefficients:")
        for c, p in zip(held_out, predictions(held_out, coefficients), strict=True):
            err = 100 * (p / c.published_tflops - 1)
            held_out_rows.append(
                {"row": c.name, "model": c.model_name, "published": c.published_tflops, "predicted": p, "err_pct": err}
            )
            print(f"  {c.name[:68]:68s} {c.published_tflops:6.0f} {p:6.0f} {err:+7.1f}")
        for name in sorted({c.model_name for c in held_out}):
            errs = [abs(float(r["err_pct"])) for r in held_out_rows if r["model"] == name]
            print(f"  {name}: n={len(errs)} MAPE {statistics.mean(errs):.1f}% ({TIME_HOLDOUT[name]})")
    finetune_rows, ft_skipped = finetune_accuracy(args.data, args.recipes, coefficients) if args.data else ([], [])
    card_rows, card_skipped = card_accuracy(args.points, coefficients) if args.points else ([], [])
    if args.data:
        _report_skipped(f"{args.data} (pretraining reader)", skipped)
        _report_skipped(f"{args.data} (finetuning reader)", ft_skipped)
    if args.long_context:
        _report_skipped(args.long_context, lc_skipped)
    if args.points:
        _report_skipped(f"{args.points} (runs with a measured throughput)", card_skipped)
    print(
        f"\nrows {len(everything)}: MAPE {mape:.2f}%  MoE MAPE {mape_moe:.2f}% "
        f"(n={len(moe)})"
        + (f"  leave-one-model-out MAPE {lomo:.2f}% (MoE rows {lomo_moe:.2f}%)" if lomo is not None else "")
        + f"  Spearman mean {statistics.mean(rhos) if rhos else float('nan'):.2f} over {len(rhos)} groups"
    )
    if args.json_out:
        write_json(
            args.json_out,
            {
                "files": [f for f in (args.data, args.recipes, args.long_context, args.points) if f],
                "n": len(everything),
                "mape": mape,
                "mape_moe": mape_moe,
                "per_model": per_model,
                "lomo_mape": lomo,
                "lomo_mape_moe": lomo_moe,
                "lomo_per_model": lomo_models,
                "spearman_mean": statistics.mean(rhos) if rhos else None,
                "long_context": lc_rows,
                "held_out": held_out_rows,
                "finetune": finetune_rows,
                "verification_cards": card_rows,
                "skipped": skipped + lc_skipped + ft_skipped + card_skipped,
                "skipped_by_reason": dict(skip_summary(skipped + lc_skipped + ft_skipped + card_skipped)),
                "mode": "evaluate" if args.evaluate else "refit",
            },
        )
    return 0


def finetune_accuracy(
    data: str, recipes: str, coefficients: dict[str, TimeCoefficients]
) -> tuple[list[dict[str, object]], list[dict[str, str]]]:
    """Published full-finetuning (sft) and LoRA runs, never fitted: tokens/s/GPU against the
    published figure. (Their TFLOP/s is not comparable: Bridge counts Llama3-70B LoRA on packed
    SQuAD from the dataset's mean sequence length, flop_utils.py.)"""
    cases, skipped = perf_cases(data, recipes, tasks=("sft", "lora"))
    skipped = [s for s in skipped if not s["reason"].startswith("task pretrain")]  # the pretraining reader's
    published = {
        f"{r['container']} {r['model']} {r['gpu']}x{r['num_gpus']} {r['precision']} {r['variant']} {r['task']}": r
        for r in read_rows(data)
        if r.get("status") == "current"
    }
    rows: list[dict[str, object]] = []
    if cases:
        print("\nfinetuning runs, not fitted (tokens/s/GPU):")
    for c in cases:
        task = "lora" if c.run.options.is_lora else "sft"
        measured = as_float(published[f"{c.name} {task}"].get("tokens_per_sec_per_gpu"))
        if not measured:
            skipped.append({"row": c.name, "reason": "no tokens/s published"})
            continue
        family = coefficients[c.run.hardware.architecture]
        speed = combine(time_amounts(c.run), family).tokens_per_sec_per_gpu
        predicted = speed * container_factor(family, c.container)
        err = 100 * (predicted / measured - 1)
        rows.append({"row": c.name, "task": task, "published": measured, "predicted": predicted, "err_pct": err})
        print(f"  {task:4s} {c.name[:62]:62s} {measured:7.0f} {predicted:7.0f} {err:+7.1f}")
    for task in ("sft", "lora"):
        errs = [abs(float(r["err_pct"])) for r in rows if r["task"] == task]  # type: ignore[arg-type]
        if errs:
            print(f"  {task}: n={len(errs)} MAPE {statistics.mean(errs):.1f}%")
    return rows, skipped


def card_accuracy(
    points: str, coefficients: dict[str, TimeCoefficients]
) -> tuple[list[dict[str, object]], list[dict[str, str]]]:
    """Pretraining runs of memory_points.csv that log a throughput (verification cards and skill
    measurements: model TFLOP/s, or a step time turned into it with lcmoe's FLOP count,
    ``perf_rows.measured_tflops``), never fitted: lcmoe's TFLOP/s for the configuration the row
    ran (``benchmarks.points.point_config``: its fields, then its recipe) at the newest
    container's rates. Each run once (a row per memory metric repeats it); finetuning rows are
    left out (Bridge counts packed sequences by their real lengths). Returns the rows and the
    rows not evaluated, each with its reason."""
    from benchmarks.perf_rows import measured_tflops
    from benchmarks.points import perf_recipes_beside, point_config
    from lcmoe.run import RunConfig

    recipes = perf_recipes_beside(points)
    rows: list[dict[str, object]] = []
    skipped: list[dict[str, str]] = []
    seen: set[tuple[str, str, str, str]] = set()
    for row in read_rows(points):
        label = f"{row.get('model', '')} {row.get('gpu', '')}x{row.get('num_gpus', '')} {row.get('config_detail', '')}"
        key = (
            row.get("model", ""),
            row.get("config_detail", ""),
            row.get("tflops_per_gpu", ""),
            row.get("step_time_ms", ""),
        )
        reason = None
        if not (row.get("tflops_per_gpu") or row.get("step_time_ms") or row.get("tokens_per_sec_per_gpu")):
            reason = "no measured throughput"
        elif row.get("outcome") != "fits":
            reason = f"outcome {row.get('outcome') or 'not stated'} (not a completed run)"
        elif "pretrain" not in row.get("task", ""):
            reason = "not a pretraining run (finetuning counts packed sequences by their real lengths)"
        elif key in seen:
            reason = "same run as an earlier row (another memory metric)"
        if reason:
            skipped.append({"row": label, "reason": reason})
            continue
        config = point_config(row, recipes)
        if isinstance(config, str):
            skipped.append({"row": label, "reason": config})
            continue
        seen.add(key)
        model, hardware, layout, options = config
        run = RunConfig(model, hardware, layout, options)
        measured = measured_tflops(row, run)
        if measured is None:
            skipped.append({"row": label, "reason": "step time without a GBS"})
            continue
        predicted = combine(time_amounts(run), coefficients[hardware.architecture]).model_tflops_per_gpu
        rows.append(
            {
                "row": label[:62],
                "model": model.name,
                "measured": measured,
                "predicted": predicted,
                "err_pct": 100 * (predicted / measured - 1),
            }
        )
    if rows:
        print("\nverification-card and skill pretraining runs, not fitted (model TFLOP/s/GPU):")
        for r in rows:
            print(f"  {r['row']:62s} {r['measured']:7.1f} {r['predicted']:7.1f} {r['err_pct']:+7.1f}")
        errs = [abs(float(r["err_pct"])) for r in rows]  # type: ignore[arg-type]
        print(f"  n={len(errs)} MAPE {statistics.mean(errs):.1f}%  median |err| {statistics.median(errs):.1f}%")
    return rows, skipped


if __name__ == "__main__":
    sys.exit(main())
