"""`lcmoe models` and `lcmoe hardware`: what the built-in catalogs hold."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from lcmoe.cli.common import JSON, QUIET, print_json, stdout


def _model_row(name: str) -> dict[str, Any]:
    """One catalog model as `lcmoe models --json` lists it (counts in parameters)."""
    from lcmoe.catalog import load_model
    from lcmoe.estimate.params import active_as_published, count_params

    spec = load_model(name)
    main = count_params(spec, include_mtp=False)
    with_mtp = count_params(spec, include_mtp=True)
    pub = spec.published
    return {
        "name": name,
        "family": spec.family,
        "layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "attention": spec.attention_label,
        "experts": spec.num_moe_experts or 0,
        "topk": spec.moe_router_topk,
        "mtp_layers": spec.mtp_num_layers,
        "total_params": main.total,
        "total_params_with_mtp": with_mtp.total,
        "active_params": main.active,
        "active_params_as_published": active_as_published(spec, main),
        "published_total_billions": pub.total_billions if pub else None,
        "published_active_billions": pub.active_billions if pub else None,
        "published_source": pub.source if pub else None,
    }


def _models_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(title="lcmoe model catalog (parameters in billions)")
    for col in ("model", "attn", "L", "experts", "MTP", "total", "published", "active", "published "):
        table.add_column(col, justify="left" if col in ("model", "attn") else "right", no_wrap=True)
    for r in rows:
        total = f"{r['total_params'] / 1e9:.1f}"
        if r["mtp_layers"]:
            total += f" +{(r['total_params_with_mtp'] - r['total_params']) / 1e9:.1f} MTP"
        pub_total = f"{r['published_total_billions']:g}" if r["published_total_billions"] else "–"
        pub_active = f"{r['published_active_billions']:g}" if r["published_active_billions"] else "–"
        experts = f"{r['experts']}/top{r['topk']}" if r["experts"] else "dense"
        table.add_row(
            r["name"],
            r["attention"],
            str(r["layers"]),
            experts,
            str(r["mtp_layers"]),
            total,
            pub_total,
            f"{r['active_params_as_published'] / 1e9:.2f}",
            pub_active,
        )
    return table


def models(json_output: bool = JSON, quiet: bool = QUIET) -> None:
    """List the built-in models with their parameter counts (total and active, in billions)."""
    from lcmoe.catalog import model_names

    rows = [_model_row(name) for name in model_names()]
    if json_output:
        print_json({"models": rows})
    elif quiet:
        stdout.print("\n".join(r["name"] for r in rows), highlight=False, soft_wrap=True)
    else:
        stdout.print(_models_table(rows))


def hardware(json_output: bool = JSON, quiet: bool = QUIET) -> None:
    """List the built-in GPUs and systems (memory, dense peaks, links)."""
    from lcmoe.catalog import hardware_names, load_hardware

    specs = [load_hardware(name) for name in hardware_names()]
    if json_output:
        print_json({"hardware": [s.model_dump() for s in specs]})
        return
    if quiet:
        stdout.print("\n".join(s.name for s in specs), highlight=False, soft_wrap=True)
        return
    table = Table(title="lcmoe hardware catalog (dense peaks; bandwidths one-way per GPU)")
    for col in (
        "gpu",
        "HBM GiB",
        "BF16 TF",
        "FP8 TF",
        "NVFP4 TF",
        "HBM TB/s",
        "NVLink GB/s",
        "NVL domain",
        "scale-out GB/s",
        "host link GB/s",
        "host GB/GPU",
    ):
        table.add_column(col, justify="left" if col == "gpu" else "right")
    for s in specs:
        peak = s.peak_flops
        table.add_row(
            s.name,
            f"{s.hbm_bytes / 1024**3:.1f}",
            f"{peak['bf16'] / 1e12:.0f}",
            f"{peak['fp8'] / 1e12:.0f}" if "fp8" in peak else "–",
            f"{peak['nvfp4'] / 1e12:.0f}" if "nvfp4" in peak else "–",
            f"{s.hbm_bandwidth / 1e12:.2f}",
            f"{s.nvlink_bandwidth / 1e9:.0f}",
            str(s.nvlink_domain_size),
            f"{s.scaleout_bandwidth / 1e9:.0f}",
            f"{s.host_link_bandwidth / 1e9:.0f} ({s.host_link_kind})",
            f"{s.host_memory_bytes / 1e9:.0f}",
        )
    stdout.print(table)
