"""`lcmoe flops`: Megatron Bridge's model FLOPs per token and per step, with the term breakdown."""

from __future__ import annotations

import typer
from rich.table import Table

from lcmoe.cli.common import JSON, QUIET, print_json, resolve_model, stdout


def flops(
    model: str = typer.Option(..., "--model", "-m", help="catalog model, lcmoe YAML or HF config.json"),
    seq_len: str = typer.Option("4096", "--seq-len", "-s", help="tokens per sequence: 4096, 4k, 128K, 131072"),
    tp: int = typer.Option(1, "--tp", min=1, help="tensor parallel size (pads the vocabulary)"),
    gbs: int = typer.Option(1, "--gbs", min=1, help="global batch size (sequences per step)"),
    json_output: bool = JSON,
    quiet: bool = QUIET,
) -> None:
    """FLOPs per token exactly as Megatron Bridge counts them for TFLOP/s/GPU (fwd+bwd, no recompute)."""
    from lcmoe.estimate.flops import flops_per_token
    from lcmoe.units import format_tokens, parse_token_count

    spec = resolve_model(model)
    tokens = parse_token_count(seq_len)
    breakdown = flops_per_token(spec, tokens, tp=tp)
    total = breakdown.total
    if json_output:
        print_json(
            {
                "model": spec.name,
                "seq_len": tokens,
                "tp": tp,
                "global_batch_size": gbs,
                "flops_per_token": total,
                "flops_per_step": total * tokens * gbs,
                "padded_vocab_size": spec.padded_vocab_size(tp),
                "breakdown": breakdown.as_dict(),
                "source": "megatron/bridge/training/utils/flop_utils.py:947-1571",
            }
        )
        return
    if quiet:
        stdout.print(f"{total:.6g}", highlight=False, soft_wrap=True)
        return
    table = Table(title=f"{spec.name} @ {format_tokens(tokens)} tokens, TP={tp}: model FLOPs per token (fwd+bwd)")
    table.add_column("term")
    table.add_column("GFLOP/token", justify="right")
    table.add_column("share", justify="right")
    for term, value in breakdown.as_dict().items():
        if value:
            table.add_row(term, f"{value / 1e9:.2f}", f"{100 * value / total:.1f}%")
    table.add_row("[bold]total[/]", f"[bold]{total / 1e9:.2f}[/]", "100%")
    stdout.print(table)
    stdout.print(f"per step (GBS={gbs}): {total * tokens * gbs:.4g} FLOPs")
