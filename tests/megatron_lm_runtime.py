"""Run Megatron-LM's own argument validation (``megatron/training/arguments.py`` ``parse_args`` +
``validate_args``, as shipped beside megatron-core 0.19.2) on lcmoe's emitted flags, on a CPU.

Runs under the interpreter ``LCMOE_BRIDGE_PYTHON`` names (megatron-bridge 0.6.2 + megatron-core
0.19.2); imports neither lcmoe nor pytest. Reads ``{"cases": [{"name", "args"}]}`` on stdin and
writes one result per case (ok, the error, and the dynamic-CP fields Megatron-LM ended with).

CPU stand-ins: bridge_runtime.py's stubs (Transformer Engine, triton), ``get_device_arch_version``
and ``torch.cuda.get_device_capability`` answered as Hopper's (they query the GPU, arguments.py:1339,
1414), ``WORLD_SIZE`` from the case and
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (arguments.py asserts it with TP or CP on Hopper).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bridge_runtime import _install_cpu_stubs


def check_case(case: dict[str, Any]) -> dict[str, Any]:
    import megatron.training.arguments as arguments
    import torch

    arguments.get_device_arch_version = lambda: 9  # type: ignore[attr-defined]
    torch.cuda.get_device_capability = lambda *_: (9, 0)  # type: ignore[assignment]
    os.environ["WORLD_SIZE"] = str(case["world_size"])
    os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    sys.argv = ["pretrain_gpt.py", *case["args"]]
    out: dict[str, Any] = {"name": case["name"]}
    errors = io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
            args = arguments.parse_args()
            args.world_size, args.rank = case["world_size"], 0
            arguments.validate_args(args, {})
    except (AssertionError, ValueError, SystemExit) as exc:  # argparse exits with its message on stderr
        return {**out, "ok": False, "error": f"{type(exc).__name__}: {exc} {errors.getvalue()[-400:]}"}
    fields = ("hybrid_context_parallel", "max_seqlen_per_dp_cp_rank", "calculate_per_token_loss", "dataloader_type")
    return {**out, "ok": True, "args": {name: getattr(args, name, None) for name in fields}}


def main() -> None:
    request = json.load(sys.stdin)
    _install_cpu_stubs()
    json.dump({"results": [check_case(case) for case in request["cases"]]}, sys.stdout)


if __name__ == "__main__":
    main()
