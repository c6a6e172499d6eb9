"""Run under an interpreter with the real nemo-run (``LCMOE_NEMO_RUN_PYTHON``): load an emitted
``nemo_run_launch.py``, dry-run its job with NeMo-Run's own Slurm executor and print the sbatch
script NeMo-Run would submit (``SlurmBatchRequest.materialize``). Used by tests/test_emit_safety.py."""

from __future__ import annotations

import runpy
import sys

from nemo_run.core.execution import slurm

scripts: list[str] = []
_materialize = slurm.SlurmBatchRequest.materialize


def _capture(self: slurm.SlurmBatchRequest) -> str:
    text = _materialize(self)
    scripts.append(text)
    return text


slurm.SlurmBatchRequest.materialize = _capture  # type: ignore[method-assign]

import nemo_run as run  # noqa: E402

namespace = runpy.run_path(sys.argv[1], run_name="lcmoe_launch")
run.run(namespace["script"], executor=namespace["executor"], name="lcmoe-dry", dryrun=True)
sys.stdout = sys.__stdout__
print("=====SBATCH=====")
print(scripts[-1])
