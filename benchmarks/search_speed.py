"""Planner search speed: DeepSeek-V3, 256K, 512 × H100, every knob (printed, not a timed test).

python benchmarks/search_speed.py [--json OUT]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.published import write_json
from lcmoe.catalog import load_hardware, load_model
from lcmoe.plan.search import PlanRequest, search


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)
    request = PlanRequest(model=load_model("deepseek-v3"), hardware=load_hardware("h100"), num_gpus=512, seq_len=262144)
    start = time.perf_counter()
    result = search(request)
    seconds = time.perf_counter() - start
    rate = result.searched / seconds
    print(
        f"DeepSeek-V3 256K on 512 x H100: {result.searched} candidates ({result.legal} legal, {result.fit} fit) "
        f"in {seconds:.2f} s = {rate:.0f} candidates/s (target: full search under 1 s on one core)"
    )
    if args.json_out:
        write_json(
            args.json_out,
            {
                "seconds": seconds,
                "searched": result.searched,
                "legal": result.legal,
                "fit": result.fit,
                "candidates_per_second": rate,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
