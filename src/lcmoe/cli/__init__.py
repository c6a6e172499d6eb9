"""The lcmoe command line. This module only wires commands; each verb lives in its own module.

Exit codes: 0 ok; 1 findings (no feasible plan, check warnings); 2 bad input or usage.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

import typer

from lcmoe.cli.catalog_cmds import hardware, models
from lcmoe.cli.check_cmd import check
from lcmoe.cli.diagnose_cmd import calibrate, diagnose, preflight
from lcmoe.cli.estimate_cmd import estimate
from lcmoe.cli.flops_cmd import flops
from lcmoe.cli.plan_cmd import plan, report, sweep

EXIT_INTERRUPTED = 130

# One worked example per command, shown at the end of its --help ("\b": click keeps the lines as written).
EXAMPLES = {
    "models": "lcmoe models --json",
    "hardware": "lcmoe hardware -q",
    "flops": "lcmoe flops -m deepseek-v3 -s 4k",
    "estimate": "lcmoe estimate -m qwen3-30b-a3b -n 16 -s 16k --ep 8 --recompute moe_act\n"
    "  lcmoe estimate --from-plan plan.json --rank 2",
    "plan": "lcmoe plan -m qwen3-30b-a3b -g h100 -n 16 -s 16k --top 3",
    "sweep": "lcmoe sweep -m qwen3-30b-a3b -n 16 --seq-lens 4k,16k,64k",
    "report": "lcmoe report -m qwen3-30b-a3b -n 16 -s 16k --out report.html",
    "check": "lcmoe check args.txt -m qwen3-30b-a3b -n 16 -s 16k",
    "diagnose": "lcmoe diagnose train.log --config args.txt -m qwen3-30b-a3b -n 16",
    "preflight": "lcmoe preflight --plan plans/qwen3/plan.json",
    "calibrate": "lcmoe calibrate run1.log run2.log --plan plan.json --out cluster.yaml",
}
COMMANDS: dict[str, Callable[..., None]] = {
    "models": models,
    "hardware": hardware,
    "flops": flops,
    "estimate": estimate,
    "plan": plan,
    "sweep": sweep,
    "report": report,
    "check": check,
    "diagnose": diagnose,
    "preflight": preflight,
    "calibrate": calibrate,
}

app = typer.Typer(
    name="lcmoe",
    help="Plan, check and debug long-context MoE training on Megatron Bridge / Megatron-Core.\n\n"
    "Exit codes: 0 ok; 1 findings (no plan fits, a check warns); 2 bad input or usage.",
    epilog="\b\nExample:\n  lcmoe plan -m qwen3-30b-a3b -n 16 -s 16k\n  lcmoe COMMAND --help",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    # Plain click help: Rich's option panel cuts long option names (--optimizer-of…) at 80 columns.
    rich_markup_mode=None,
)
for _name, _command in COMMANDS.items():
    app.command(_name, epilog=f"\b\nExample:\n  {EXAMPLES[_name]}")(_command)


def _print_version(value: bool) -> None:
    if value:
        from lcmoe import __version__

        typer.echo(f"lcmoe {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print lcmoe's version and exit"
    ),
    debug: bool = typer.Option(
        False,
        "--debug",
        help="on an error, show the full traceback instead of one sentence (also after a command, "
        "or env LCMOE_DEBUG=1)",
    ),
) -> None:
    """Plan, check and debug long-context MoE training on Megatron Bridge / Megatron-Core."""
    # --debug is read by main() before the command line reaches typer; declared here for --help.


def _tolerant_streams() -> None:
    """Make stdout/stderr fall back instead of raising: a character the terminal's encoding
    cannot show (``PYTHONIOENCODING=ascii``, ``LANG=C``) becomes ``?`` / ``\\uXXXX``."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(OSError, ValueError):  # a closed stream: handled on write
                reconfigure(errors="backslashreplace" if stream is sys.stderr else "replace")


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail a second time
    (only the process's own stdout: a caller's redirected stream is left to the caller)."""
    if sys.stdout is not sys.__stdout__:
        sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives until exit
        return
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    sys.stdout = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - lives until exit


def _stream_failure(exc: OSError) -> NoReturn:
    """A write to stdout failed (closed, full, a reader that went away): one sentence, exit 2
    (a broken pipe, whose reader has already left, exits 1 quietly)."""
    _silence_stdout()
    if isinstance(exc, BrokenPipeError):
        sys.exit(1)
    reason = exc.strerror or exc.__class__.__name__
    try:
        sys.stderr.write(f"error: cannot write the output ({reason}); check the output file or terminal.\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(2)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: domain errors become one sentence and exit code 2; an output that
    cannot be written (closed or full stdout, an unwritable file) too, never a traceback."""
    from lcmoe.errors import LcmoeError

    debug = "--debug" in (argv if argv is not None else sys.argv[1:]) or bool(os.environ.get("LCMOE_DEBUG"))
    args = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--debug"]
    if sys.stdout is None or sys.stderr is None:  # started with fd 1 or 2 closed
        if sys.stderr is not None:
            sys.stderr.write("error: standard output is closed; run lcmoe with its output going somewhere.\n")
        sys.stdout = sys.stdout or open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
        sys.exit(2)
    # rich turns a console quiet for good after a broken pipe (Console.on_broken_pipe); a later
    # call in the same process (tests, a caller using main() as a library) writes to a new stream.
    from lcmoe.cli.common import stderr as err_console
    from lcmoe.cli.common import stdout as out_console

    out_console.quiet = err_console.quiet = False
    _tolerant_streams()
    try:
        app(args=args, prog_name="lcmoe", standalone_mode=True)
        sys.stdout.flush()
    except LcmoeError as exc:
        if debug:
            raise
        from lcmoe.cli.common import stderr

        stderr.print(f"error: {exc}", highlight=False, markup=False)
        _flush_or_fail()
        sys.exit(2)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; nothing was written\n")
        sys.exit(130)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into a silent exit 130
            sys.stderr.write("interrupted; nothing was written\n")
        _flush_or_fail()
        raise
    except RecursionError:
        if debug:
            raise
        sys.stderr.write("error: an input nests too deeply to read; flatten it.\n")
        sys.exit(2)
    except MemoryError:
        if debug:
            raise
        _silence_stdout()
        sys.stderr.write("error: an input needs more memory than lcmoe allows; check its sizes.\n")
        sys.exit(2)
    except OSError as exc:
        if debug or exc.errno is None:  # not an OS call that failed (e.g. a TimeoutError raised by code)
            raise
        if exc.filename is None:  # a write to stdout (closed, full, a reader gone)
            _stream_failure(exc)
        from lcmoe.errors import clip

        reason = exc.strerror or exc.__class__.__name__
        sys.stderr.write(f"error: {clip(str(exc.filename))}: {reason}; check the path.\n")
        sys.exit(2)


def _flush_or_fail() -> None:
    try:
        sys.stdout.flush()
    except OSError as exc:
        _stream_failure(exc)
    except ValueError:  # stdout already closed by a handler above
        pass
