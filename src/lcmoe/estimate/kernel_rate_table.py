"""The kernel-rate table: frozen records and the loader for ``lcmoe/data/kernel_rates.yaml``.

Each YAML series is shared fields + ``columns`` + ``points``; a point becomes one
:class:`KernelRow` whose rate is computed from its value columns (tflops; time_ms with the
benchmark's flop or token_heads count; tokens_per_s × heads). Lookups are in
``lcmoe.estimate.kernel_rates``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from lcmoe.catalog import read_yaml_file, read_yaml_text
from lcmoe.errors import LcmoeError

Scalar = str | int | float | bool

# kernel → (categorical keys matched exactly, numeric axes interpolated in this order).
# Attention's "window" axis applies to kind "swa" only.
KERNEL_KEYS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "attention": (("kind", "pass", "causal"), ("head_dim_qk", "window", "seq")),
    "dsa_indexer": (("pass", "key_ranges"), ("seq_kv",)),
    "dsa_sparse": (("pass",), ("head_dim_qk", "topk")),
    "gdn": (("pass", "chunk"), ("head_dim", "token_heads")),
    "mamba2": (("pass",), ("d_state", "headdim", "seq")),
    "grouped_gemm": ((), ("tokens_per_expert", "k_in", "n_out")),
    "gemm": ((), ("m", "n", "k")),
}
BOOKKEEPING = frozenset({"id", "source", "impl", "note", "derived", "lookup", "sku_note", "columns", "points"})
VALUE_FIELDS = frozenset({"tflops", "time_ms", "flop", "tokens_per_s"})
PEAK_DTYPE = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "mxfp8": "fp8", "fp8_blockwise": "fp8"}


@dataclass(frozen=True, kw_only=True)
class KernelRow:
    """One measured point. ``value`` is in ``unit``: "flop/s" or "token_head/s" (tokens × heads
    processed per second, for chunked scans whose time does not follow a FLOP count)."""

    row_id: str
    gpu: str
    kernel: str
    dtype: str
    shape: tuple[tuple[str, Scalar], ...]
    value: float
    unit: str
    source: str
    impl: str = ""
    note: str = ""
    sku_note: str = ""
    derived: bool = False
    lookup: bool = True

    def get(self, name: str) -> Scalar | None:
        """The shape key ``name`` (None when the row does not have it)."""
        return dict(self.shape).get(name)


@dataclass(frozen=True, kw_only=True)
class GpuFamily:
    """A GPU with measured rows: dense peak TFLOP/s per dtype class and its fallback siblings."""

    name: str
    peak_tflops: tuple[tuple[str, float], ...]
    siblings: tuple[str, ...]

    def peak(self, dtype: str) -> float:
        return dict(self.peak_tflops)[PEAK_DTYPE.get(dtype, "bf16")]


@dataclass(frozen=True, kw_only=True)
class KernelRates:
    """The loaded table (see ``load_kernel_rates``)."""

    gpus: tuple[GpuFamily, ...]
    kind_fallback: tuple[tuple[str, tuple[str, ...]], ...]
    rows: tuple[KernelRow, ...]

    def gpu(self, name: str) -> GpuFamily:
        return {g.name: g for g in self.gpus}[name]


# ----------------------------------------------------------------------------- loading


def load_kernel_rates(path: str | Path | None = None) -> KernelRates:
    """The kernel-rate table from ``path`` (None = the one shipped in ``lcmoe/data``); a missing
    or malformed file is one LcmoeError naming the file, the series and the rule."""
    if path is None:
        text = resources.files("lcmoe.data").joinpath("kernel_rates.yaml").read_text(encoding="utf-8")
        return kernel_rates_from_dict(read_yaml_text(text, origin="kernel_rates.yaml"), origin="kernel_rates.yaml")
    data = read_yaml_file(path, field="kernel rates")
    return kernel_rates_from_dict(data, origin=str(path))


def kernel_rates_from_dict(data: Mapping[str, Any], *, origin: str) -> KernelRates:
    """``KernelRates`` from the parsed YAML mapping (validated; duplicate lookup keys refused so
    every measured point is reproduced exactly)."""
    gpus = tuple(_gpu_family(origin, name, spec) for name, spec in _mapping(origin, "gpus", data.get("gpus")).items())
    known = {g.name for g in gpus}
    for g in gpus:
        for s in g.siblings:
            if s not in known:
                raise LcmoeError(f"{origin}: gpus.{g.name}.siblings", s, "is not a GPU listed under gpus", "add it")
    fallback = _mapping(origin, "attention_kind_fallback", data.get("attention_kind_fallback", {}))
    kinds = tuple((str(k), tuple(str(x) for x in v)) for k, v in fallback.items())
    series = data.get("series")
    if not isinstance(series, list) or not series:
        raise LcmoeError(
            f"{origin}: series", series, "must be a non-empty list of measured series", "see the shipped file"
        )
    rows = tuple(row for i, entry in enumerate(series) for row in _series_rows(origin, i, entry, known))
    _check_unique(origin, rows)
    return KernelRates(gpus=gpus, kind_fallback=kinds, rows=rows)


def _mapping(origin: str, field: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or not value:
        raise LcmoeError(
            f"{origin}: {field}", value, "must be a non-empty mapping", "see the shipped kernel_rates.yaml"
        )
    return value


def _gpu_family(origin: str, name: object, spec: object) -> GpuFamily:
    where = f"{origin}: gpus.{name}"
    spec = _mapping(origin, f"gpus.{name}", spec)
    peaks = _mapping(origin, f"gpus.{name}.peak_tflops", spec.get("peak_tflops"))
    if set(peaks) != {"bf16", "fp8"} or not all(is_number(v) and v > 0 for v in peaks.values()):
        raise LcmoeError(
            where, peaks, "peak_tflops must give positive bf16 and fp8 numbers", "copy NVIDIA's dense peaks"
        )
    siblings = spec.get("siblings", [])
    if not isinstance(siblings, list):
        raise LcmoeError(f"{where}.siblings", siblings, "must be a list of GPU names", "e.g. [h100, h800]")
    return GpuFamily(
        name=str(name), peak_tflops=tuple((k, float(v)) for k, v in peaks.items()), siblings=tuple(map(str, siblings))
    )


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _series_rows(origin: str, index: int, entry: object, gpus: set[str]) -> list[KernelRow]:
    """The rows of one series: its shared fields merged with each point's columns."""
    where = f"{origin}: series[{index}]"
    if not isinstance(entry, dict):
        raise LcmoeError(where, entry, "must be a mapping", "see the shipped kernel_rates.yaml")
    sid, source = entry.get("id"), entry.get("source")
    if not isinstance(sid, str) or not isinstance(source, str) or not source.strip():
        raise LcmoeError(where, sid, "needs a string id and a non-empty source", "cite the paper or file:line")
    columns, points = entry.get("columns"), entry.get("points")
    if not isinstance(columns, list) or not isinstance(points, list) or not points:
        raise LcmoeError(f"{where} ({sid})", columns, "needs columns (a list) and points (a non-empty list)", "")
    shared = {k: v for k, v in entry.items() if k not in BOOKKEEPING}
    rows = []
    for j, point in enumerate(points):
        if not isinstance(point, list) or len(point) != len(columns):
            raise LcmoeError(f"{where} ({sid}) point {j}", point, f"must list {len(columns)} values", f"{columns}")
        fields = {**shared, **dict(zip(map(str, columns), point, strict=True))}
        label = ",".join(f"{c}={v}" for c, v in zip(columns, point, strict=True) if c not in VALUE_FIELDS)
        rows.append(_row(f"{where} ({sid}) point {j}", f"{sid}[{label}]", entry, fields, gpus))
    return rows


def _row(where: str, row_id: str, entry: Mapping[str, Any], fields: dict[str, Any], gpus: set[str]) -> KernelRow:
    kernel, gpu, dtype = fields.pop("kernel", None), fields.pop("gpu", None), fields.pop("dtype", None)
    if kernel not in KERNEL_KEYS:
        raise LcmoeError(f"{where}.kernel", kernel, f"must be one of {sorted(KERNEL_KEYS)}", "")
    if gpu not in gpus or not isinstance(dtype, str) or dtype not in PEAK_DTYPE:
        raise LcmoeError(
            where, (gpu, dtype), f"gpu must be one of {sorted(gpus)}, dtype one of {sorted(PEAK_DTYPE)}", ""
        )
    value, unit = _value(where, fields)
    categorical, axes = KERNEL_KEYS[kernel]
    needed = [*categorical, *(a for a in axes if a != "window" or fields.get("kind") == "swa")]
    missing = [k for k in needed if k not in fields]
    if missing:
        raise LcmoeError(where, row_id, f"lacks the shape keys {missing}", "add them to the series or its points")
    if not all(is_number(fields[a]) and fields[a] > 0 for a in needed[len(categorical) :]):
        raise LcmoeError(where, row_id, f"axes {list(axes)} must be positive numbers", "")
    shape = tuple(sorted((k, v) for k, v in fields.items() if k not in VALUE_FIELDS))
    return KernelRow(
        row_id=row_id, gpu=str(gpu), kernel=str(kernel), dtype=dtype, shape=shape, value=value, unit=unit,
        source=str(entry["source"]), impl=str(entry.get("impl", "")), note=str(entry.get("note", "")),
        sku_note=str(entry.get("sku_note", "")), derived=entry.get("derived") is True,
        lookup=entry.get("lookup", True) is not False,
    )  # fmt: skip


def _value(where: str, fields: Mapping[str, Any]) -> tuple[float, str]:
    """The rate from the value columns: tflops·1e12; flop / time; token_heads / time; or
    tokens_per_s · heads (token·head/s)."""
    tflops, time_ms = positive_float(fields.get("tflops")), positive_float(fields.get("time_ms"))
    flop, token_heads = positive_float(fields.get("flop")), positive_float(fields.get("token_heads"))
    tokens_per_s, heads = positive_float(fields.get("tokens_per_s")), positive_float(fields.get("heads"))
    if tflops:
        return tflops * 1e12, "flop/s"
    if time_ms and (flop or token_heads):
        return (flop or token_heads or 0.0) / (time_ms * 1e-3), "flop/s" if flop else "token_head/s"
    if tokens_per_s and heads:
        return tokens_per_s * heads, "token_head/s"
    raise LcmoeError(
        where, dict(fields), "needs tflops, time_ms with flop or token_heads, or tokens_per_s with heads", ""
    )


def positive_float(value: object) -> float | None:
    """``value`` as a float when it is a finite positive number, else None."""
    return float(value) if is_number(value) and float(value) > 0 else None  # type: ignore[arg-type]


def _check_unique(origin: str, rows: Sequence[KernelRow]) -> None:
    seen: dict[tuple[object, ...], str] = {}
    for r in rows:
        if not r.lookup:
            continue
        categorical, axes = KERNEL_KEYS[r.kernel]
        key = (r.gpu, r.kernel, r.dtype, *(r.get(k) for k in (*categorical, *axes)))
        if key in seen:
            raise LcmoeError(origin, r.row_id, f"has the same lookup key as {seen[key]}", "mark one `lookup: false`")
        seen[key] = r.row_id
