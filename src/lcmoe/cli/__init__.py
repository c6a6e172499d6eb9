"""The lcmoe command line. This module only wires commands; each verb lives in its own module.

Exit codes: 0 ok; 1 findings (no feasible plan, check warnings); 2 bad input or usage.
"""

from __future__ import annotations

import os
import sys

import typer

from lcmoe.cli.catalog_cmds import hardware, models
from lcmoe.cli.check_cmd import check
from lcmoe.cli.diagnose_cmd import calibrate, diagnose, preflight
from lcmoe.cli.estimate_cmd import estimate
from lcmoe.cli.flops_cmd import flops
from lcmoe.cli.plan_cmd import plan, report, sweep

EXIT_INTERRUPTED = 130

app = typer.Typer(
    name="lcmoe",
    help="Plan, check and debug long-context MoE training on Megatron Bridge / Megatron-Core.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("models")(models)
app.command("hardware")(hardware)
app.command("flops")(flops)
app.command("estimate")(estimate)
app.command("plan")(plan)
app.command("sweep")(sweep)
app.command("report")(report)
app.command("check")(check)
app.command("diagnose")(diagnose)
app.command("preflight")(preflight)
app.command("calibrate")(calibrate)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: domain errors become one sentence and exit code 2."""
    from lcmoe.errors import LcmoeError

    debug = "--debug" in (argv if argv is not None else sys.argv[1:]) or bool(os.environ.get("LCMOE_DEBUG"))
    args = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--debug"]
    try:
        app(args=args, prog_name="lcmoe", standalone_mode=True)
    except LcmoeError as exc:
        if debug:
            raise
        from lcmoe.cli.common import stderr

        stderr.print(f"error: {exc}", highlight=False, markup=False)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; nothing was written\n")
        sys.exit(130)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into a silent exit 130
            sys.stderr.write("interrupted; nothing was written\n")
        raise
