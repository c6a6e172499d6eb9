"""Streaming parser for Megatron Bridge and Megatron-LM training logs.

Line formats (megatron-bridge-facts.md §7, with the Bridge/Megatron-LM sources it cites):
- iteration line, ``training_log`` (Bridge ``train_utils.py:1088-1140``; Megatron-LM
  ``training.py`` prints the same fields): ``iteration N/ M | … | elapsed time per iteration
  (ms): X | [throughput per GPU (TFLOP/s/GPU): X |] … | global batch size: N | lm loss: X | …
  | number of nan iterations: N |``;
- Bridge rank-0 summary (``train_utils.py:1050``): ``Step Time : Xs GPU utilization: XMODEL_TFLOP/s/GPU``;
- memory report, Bridge (``train_utils.py:1142-1211``, decimal GB): ``[Rank R] (after N iterations)
  memory (GB) | mem-max-allocated-gigabytes: X | …``; Megatron-LM ``report_memory`` (MiB):
  ``[Rank R] (after N iterations) memory (MB) | allocated: X | max allocated: X | reserved: X |
  max reserved: X``;
- theoretical memory (``theoretical_memory_utils.py:305-352``, MiB): ``Theoretical memory
  footprints: weight and optimizer=X MB[, activation=X MB, total=X MB]``;
- timers (``mcore/timers.py:338-355``): ``name ....: (min, max)`` under ``(min, max) time across ranks (ms):``;
- the Megatron-LM argument dump between ``-- arguments --`` and ``-- end of arguments --``
  (``arguments.py`` ``_print_args``: ``  name ..... value``);
- PyTorch OOM: ``CUDA out of memory. Tried to allocate X GiB. GPU i has a total capacity of X GiB
  of which X MiB is free. … this process has X GiB memory in use. Of the allocated memory X GiB is
  allocated by PyTorch, and X MiB is reserved by PyTorch but unallocated.``;
- communication-library failures (NCCL errors, DeepEP / HybridEP buffer or assertion failures),
  which surface as other RuntimeErrors;
- the failures users report (DeepEP timeouts, a dispatcher replaced, CUDA-graph and A2A-overlap
  hangs, CP divisibility): the table in ``diagnose/failure_patterns.py``, matched by the same linear-time
  means (substring tests, then one anchored match), each with its explanation, fix, rule and source.

Logs can be gigabytes, with ranks interleaved and lines cut. The reader streams bytes, caps a
line at ``MAX_LINE_BYTES`` (the rest of an over-long line is skipped), decodes with replacement,
keeps at most ``MAX_ITERATIONS`` iteration records (the latest) and small fixed caps for every
other kind, and never raises on content: a line that looks like a record but does not parse is
counted as garbage."""

from __future__ import annotations

import gzip
import math
import re
import sys
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, cast

from lcmoe.diagnose.comm_lines import FAILURE_WORDS, comm_library
from lcmoe.diagnose.failures import FailureCollector
from lcmoe.diagnose.log_records import (
    CommFailure,
    IterationRecord,
    MemoryReport,
    OomEvent,
    TheoreticalMemory,
)
from lcmoe.diagnose.log_records import LogSummary as LogSummary  # cli/log_progress.py reads it here
from lcmoe.errors import LcmoeError
from lcmoe.safe_io import check_regular_file, os_reason

MAX_LINE_BYTES = 64 * 1024
MAX_ITERATIONS = 50_000
MAX_EVENTS = 64
MAX_MEMORY_REPORTS = 4096
MAX_CONFIG_KEYS = 5000

# Launcher prefixes: torchrun ``[rank3]:``, srun --label ``3:``, mpirun ``[1,3]<stdout>:``, host:rank.
_PREFIX = re.compile(r"^\s*(?:\[rank(\d+)\]:|(\d+):\s|\[\d+,(\d+)\]<std(?:out|err)>:|\[[\w.-]+:(\d+)\]:)")
_ITERATION = re.compile(r"iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
_ELAPSED = re.compile(r"elapsed time per iteration \(ms\):\s*([\d.]+)")
_THROUGHPUT = re.compile(r"throughput per GPU \(TFLOP/s/GPU\):\s*([\d.]+)")
_GBS = re.compile(r"global batch size:\s*(\d+)")
_LOSS = re.compile(r"lm loss:\s*([-+\d.eEnaifNAIF]+)")
_NAN_ITERS = re.compile(r"number of nan iterations:\s*(\d+)")
_SKIPPED_ITERS = re.compile(r"number of skipped iterations:\s*(\d+)")
_STEP_TIME = re.compile(r"Step Time : ([\d.]+)s GPU utilization: ([\d.]+)\s*MODEL_TFLOP/s/GPU")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \((GB|MB)\)(.*)")
_MEMORY_FIELD = re.compile(r"\|\s*([\w -]+?):\s*([\d.]+(?:[eE][-+]?\d+)?)")
_THEORETICAL = re.compile(
    r"Theoretical memory footprints: weight and optimizer=([\d.]+) MB(?:, activation=([\d.]+) MB, total=([\d.]+) MB)?"
)
_TIMER = re.compile(r"^\s*([\w-]+(?: [\w-]+)*) \.+: \(([\d.]+), ([\d.]+)\)")
_ARGS_START = re.compile(r"-{3,} arguments -{3,}")
_ARGS_END = re.compile(r"-{3,} end of arguments -{3,}")
# Greedy tail, stripped in Python: a lazy ``(.*?)\s*$`` rescans the trailing blanks at every
# position, quadratic on a long line of spaces.
_ARG_LINE = re.compile(r"^\s*([A-Za-z_]\w*) (?:\.+ )?(.*)$")
_SIZE = r"([\d.]+) ?([KMGT]i?B|bytes)"
_OOM = re.compile(
    r"CUDA out of memory\. Tried to allocate "
    + _SIZE
    + r"\. GPU (\d+) has a total capacity of "
    + _SIZE
    + r" of which "
    + _SIZE
    + r" is free"
)
_OOM_IN_USE = re.compile(r"this process has " + _SIZE + r" memory in use")
_OOM_BY_PYTORCH = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, and " + _SIZE)

_UNITS = {
    "B": 1,
    "bytes": 1,
    "KB": 1e3,
    "MB": 1e6,
    "GB": 1e9,
    "TB": 1e12,
    "KiB": 1024,
    "MiB": 1024**2,
    "GiB": 1024**3,
    "TiB": 1024**4,
}


def _bytes(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit]


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(slots=True)
class _Builder:
    lines: int = 0
    bytes_read: int = 0
    overlong: int = 0
    garbage: int = 0
    iteration_lines: int = 0
    iterations: deque[IterationRecord] = field(default_factory=lambda: deque(maxlen=MAX_ITERATIONS))
    steps: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=MAX_ITERATIONS))
    memory: dict[tuple[int, int], MemoryReport] = field(default_factory=dict)
    theoretical: TheoreticalMemory | None = None
    timers: dict[str, tuple[float, float]] = field(default_factory=dict)
    arguments: dict[str, str] = field(default_factory=dict)
    in_arguments: bool = False
    ooms: list[OomEvent] = field(default_factory=list)
    comm: list[CommFailure] = field(default_factory=list)
    known: FailureCollector = field(default_factory=FailureCollector)
    config_summary: bool = False
    summary_section: str = ""
    bridge_model_values: dict[str, str] = field(default_factory=dict)

    def feed(self, raw: str) -> None:
        self.lines += 1
        rank, line = _split_prefix(raw)
        if self.in_arguments:
            if _ARGS_END.search(line):
                self.in_arguments = False
                return
            match = _ARG_LINE.match(line)
            if match and len(self.arguments) < MAX_CONFIG_KEYS:
                self.arguments.setdefault(match.group(1), match.group(2).rstrip())
                return
        if "iteration" in line and "|" in line:
            if "memory (" in line:
                self._memory(line)
            else:
                self._iteration(line)
        elif "Step Time :" in line:
            self._step(line)
        elif "out of memory" in line:
            self._oom(line, rank)
        elif "Theoretical memory footprints" in line:
            self._theoretical(line)
        elif ": (" in line and "..." in line:
            self._timer(line)
        elif "arguments" in line and _ARGS_START.search(line) and not _ARGS_END.search(line):
            self.in_arguments = True
            self.arguments.clear()
        elif "Configuration Summary" in line:
            self.config_summary = True
        elif self.config_summary and "(Mcore default: " in line:
            self._summary_value(line)
        elif self.config_summary and line.lstrip().startswith("[") and "]" in line[:48]:
            header = line.strip()
            self.summary_section = header[1 : header.index("]")]
        if self.known.feed(self.lines, rank, line):
            return  # a known failure without conditions explains the line better than its library
        if (
            len(self.comm) < MAX_EVENTS
            and ("NCCL" in line or "nccl" in line or "EP" in line or "_ep" in line)
            and any(word in line for word in FAILURE_WORDS)
        ):
            library = comm_library(line)
            if library is not None:
                self.comm.append(CommFailure(self.lines, rank, library, line.strip()[:300]))

    def _summary_value(self, line: str) -> None:
        """``  name: repr  (Mcore default: repr)`` under ``[model] Non-default values``."""
        name, sep, rest = line.strip().partition(": ")
        if self.summary_section != "model" or not sep or not name.isidentifier():
            return
        if name in self.bridge_model_values or len(self.bridge_model_values) < MAX_CONFIG_KEYS:
            self.bridge_model_values[name] = rest[: rest.rfind("  (Mcore default: ")].strip().strip("'\"")

    def _iteration(self, line: str) -> None:
        head, elapsed = _ITERATION.search(line), _ELAPSED.search(line)
        if not head or not elapsed:
            self.garbage += 1
            return
        elapsed_ms = _finite(elapsed.group(1))
        if elapsed_ms is None or elapsed_ms <= 0:
            self.garbage += 1
            return
        tflops = _THROUGHPUT.search(line)
        gbs = _GBS.search(line)
        loss = _LOSS.search(line)
        nan = _NAN_ITERS.search(line)
        skipped = _SKIPPED_ITERS.search(line)
        self.iteration_lines += 1
        self.iterations.append(
            IterationRecord(
                iteration=int(head.group(1)),
                train_iters=int(head.group(2)),
                elapsed_ms=elapsed_ms,
                tflops_per_gpu=_finite(tflops.group(1)) if tflops else None,
                global_batch_size=int(gbs.group(1)) if gbs else None,
                lm_loss=_finite(loss.group(1)) if loss else None,
                nan_iterations=int(nan.group(1)) if nan else None,
                skipped_iterations=int(skipped.group(1)) if skipped else None,
            )
        )

    def _step(self, line: str) -> None:
        match = _STEP_TIME.search(line)
        step = _finite(match.group(1)) if match else None
        tflops = _finite(match.group(2)) if match else None
        if step is None or tflops is None or step <= 0:
            self.garbage += 1
            return
        self.steps.append((step, tflops))

    def _memory(self, line: str) -> None:
        match = _MEMORY.search(line)
        if not match:
            self.garbage += 1
            return
        unit = 1e9 if match.group(3) == "GB" else 1024.0**2
        values: dict[str, float] = {}
        for key, value in _MEMORY_FIELD.findall(match.group(4)):
            number = _finite(value)
            if number is not None and number >= 0:
                values[key.strip()] = number
        if not values:
            self.garbage += 1
            return

        def pick(*names: str) -> float | None:
            for name in names:
                if name in values:
                    return values[name] * unit
            return None

        retries = values.get("mem-alloc-retires")
        report = MemoryReport(
            rank=int(match.group(1)),
            iteration=int(match.group(2)),
            source="bridge" if match.group(3) == "GB" else "megatron-lm",
            allocated=pick("mem-allocated-gigabytes", "allocated"),
            max_allocated=pick("mem-max-allocated-gigabytes", "max allocated"),
            reserved=pick("mem-reserved-gigabytes", "reserved"),
            max_reserved=pick("mem-max-reserved-gigabytes", "max reserved"),
            alloc_retries=int(retries) if retries is not None else None,
        )
        key = (report.rank, report.iteration)
        if key in self.memory or len(self.memory) < MAX_MEMORY_REPORTS:
            self.memory[key] = report

    def _theoretical(self, line: str) -> None:
        match = _THEORETICAL.search(line)
        if not match:
            self.garbage += 1
            return
        mib = 1024.0**2
        self.theoretical = TheoreticalMemory(
            weight_and_optimizer_bytes=float(match.group(1)) * mib,
            activation_bytes=float(match.group(2)) * mib if match.group(2) else None,
            total_bytes=float(match.group(3)) * mib if match.group(3) else None,
        )

    def _timer(self, line: str) -> None:
        match = _TIMER.match(line)
        if match and (match.group(1) in self.timers or len(self.timers) < MAX_EVENTS):
            low, high = _finite(match.group(2)), _finite(match.group(3))
            if low is not None and high is not None:
                self.timers[match.group(1)] = (low, high)

    def _oom(self, line: str, rank: int | None) -> None:
        match = _OOM.search(line)
        if not match:
            if "CUDA out of memory" in line:
                self.garbage += 1
            return
        if len(self.ooms) >= MAX_EVENTS:
            return
        in_use = _OOM_IN_USE.search(line)
        by_torch = _OOM_BY_PYTORCH.search(line)
        self.ooms.append(
            OomEvent(
                line_number=self.lines,
                rank=rank,
                gpu_index=int(match.group(3)),
                tried_bytes=_bytes(match.group(1), match.group(2)),
                capacity_bytes=_bytes(match.group(4), match.group(5)),
                free_bytes=_bytes(match.group(6), match.group(7)),
                process_in_use_bytes=_bytes(in_use.group(1), in_use.group(2)) if in_use else None,
                allocated_by_pytorch_bytes=_bytes(by_torch.group(1), by_torch.group(2)) if by_torch else None,
                reserved_unallocated_bytes=_bytes(by_torch.group(3), by_torch.group(4)) if by_torch else None,
            )
        )

    def build(self) -> LogSummary:
        return LogSummary(
            lines=self.lines,
            bytes_read=self.bytes_read,
            overlong_lines=self.overlong,
            garbage_lines=self.garbage,
            iterations=tuple(self.iterations),
            iteration_lines=self.iteration_lines,
            step_summaries=tuple(self.steps),
            memory_reports=tuple(self.memory.values()),
            theoretical_memory=self.theoretical,
            timers=dict(self.timers),
            arguments=dict(self.arguments),
            ooms=tuple(self.ooms),
            comm_failures=tuple(self.comm),
            config_summary_seen=self.config_summary,
            failures=self.known.findings(),
            bridge_model_values=dict(self.bridge_model_values),
        )


def _split_prefix(line: str) -> tuple[int | None, str]:
    match = _PREFIX.match(line)
    if not match:
        return None, line
    rank = next((int(g) for g in match.groups() if g is not None), None)
    return rank, line[match.end() :]


def parse_log_lines(lines: Iterable[str]) -> LogSummary:
    """Parse already-decoded lines (tests, stdin)."""
    builder = _Builder()
    for line in lines:
        builder.bytes_read += len(line)
        builder.feed(line[:MAX_LINE_BYTES])
    return builder.build()


def _bounded_lines(stream: BinaryIO, builder: _Builder) -> Iterator[str]:
    """Lines of at most MAX_LINE_BYTES; the tail of a longer line is read and dropped."""
    while True:
        chunk = stream.readline(MAX_LINE_BYTES)
        if not chunk:
            return
        builder.bytes_read += len(chunk)
        if len(chunk) == MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            builder.overlong += 1
            while True:
                rest = stream.readline(MAX_LINE_BYTES)
                builder.bytes_read += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
        yield chunk.decode("utf-8", errors="replace").rstrip("\r\n")


def _open_binary(path: Path) -> BinaryIO:
    if path.suffix == ".gz":
        return cast(BinaryIO, gzip.open(path, "rb"))
    return path.open("rb")


def read_log(source: str | Path) -> LogSummary:
    """Stream a log file (plain or .gz; ``-`` = standard input) in bounded memory. Only a regular
    file is opened (a FIFO would block, /dev/zero never ends); a corrupt or truncated .gz is
    read up to the damage, or refused when nothing before it could be read."""
    builder = _Builder()
    if str(source) == "-":
        for line in _bounded_lines(sys.stdin.buffer, builder):
            builder.feed(line)
        return builder.build()
    path = Path(source)
    check_regular_file(path, field="LOG")
    try:
        with _open_binary(path) as stream:
            for line in _bounded_lines(stream, builder):
                builder.feed(line)
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        if builder.lines == 0:
            reason = os_reason(exc) if isinstance(exc, OSError) and not isinstance(exc, gzip.BadGzipFile) else None
            raise LcmoeError(
                "LOG",
                str(source),
                f"cannot be read ({reason or 'a corrupt or truncated gzip stream'})",
                "check the path, or gunzip -t the file",
            ) from None
    return builder.build()
