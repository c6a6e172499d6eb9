"""The lcmoe command line. This module only wires commands; each verb lives in its own module.

Exit codes: 0 ok; 1 findings (no feasible plan, check warnings); 2 bad input or usage.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from lcmoe.cli.calibrate_cmd import calibrate
from lcmoe.cli.catalog_cmds import hardware, models
from lcmoe.cli.check_cmd import check
from lcmoe.cli.diagnose_cmd import diagnose
from lcmoe.cli.estimate_cmd import estimate
from lcmoe.cli.flops_cmd import flops
from lcmoe.cli.plan_cmd import plan, report, sweep
from lcmoe.cli.preflight_cmd import preflight
from lcmoe.cli.run_options import complete_one
from lcmoe.errors import clip

if TYPE_CHECKING:
    from lcmoe.i18n import Language

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
# The one line `lcmoe --help` lists per command: whole at 80 columns (click would cut the docstring
# to "…" there); each command's own --help keeps its full docstring.
SHORT_HELP = {
    "models": "the built-in models and their parameter counts",
    "hardware": "the built-in GPUs: memory, peak FLOP/s, links",
    "flops": "model FLOPs per token as Megatron Bridge counts them",
    "estimate": "memory by stage and step time of one layout",
    "plan": "search every legal layout and rank the ones that fit",
    "sweep": "the best plan at each sequence length",
    "report": "the plan as an HTML page with plots (and Markdown)",
    "check": "check a config you have: legality, memory, time, rules",
    "diagnose": "read a training log: OOM, slow steps, failures, regressions",
    "preflight": "check a node before the big job: versions, GPUs, packages",
    "calibrate": "fit the speed model to your measured runs",
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
    app.command(_name, short_help=SHORT_HELP[_name], epilog=f"\b\nExample:\n  {EXAMPLES[_name]}")(_command)


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
    lang: str = typer.Option(
        None,
        "--lang",
        metavar="[en|zh]",
        autocompletion=complete_one(("en", "zh")),
        help="language of the output for people: en | zh (also after a command; default from "
        "LC_ALL / LC_MESSAGES / LANG, zh_* gives zh); JSON stays English",
    ),
) -> None:
    """Plan, check and debug long-context MoE training on Megatron Bridge / Megatron-Core."""
    # --debug and --lang are read by main() before the command line reaches typer; declared here
    # for --help (and for a caller that runs `app` itself, which gets English).


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


def _stream_failure(exc: OSError, lang: Language | None = None) -> NoReturn:
    """A write to stdout failed (closed, full, a reader that went away): one sentence, exit 2
    (a broken pipe, whose reader has already left, exits 1 quietly)."""
    _silence_stdout()
    if isinstance(exc, BrokenPipeError):
        sys.exit(1)
    reason = exc.strerror or exc.__class__.__name__
    try:
        from lcmoe.i18n import Language, translate

        message = f"error: cannot write the output ({reason}); check the output file or terminal."
        sys.stderr.write(translate(message, lang or Language.EN) + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    sys.exit(2)


def split_language(args: list[str], environ: Mapping[str, str]) -> tuple[Language, list[str]]:
    """The output language and the arguments without ``--lang X`` / ``--lang=X`` (accepted before
    or after the command, like --debug). Without --lang, the locale decides (i18n.language_from_env),
    unless stdout or stderr cannot encode Chinese. A missing or unknown value is bad usage: one
    sentence, exit 2."""
    from lcmoe.i18n import Language, language_from_env, parse_language

    chosen: Language | None = None
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--lang" or arg.startswith("--lang="):
            value = arg.partition("=")[2] if "=" in arg else (args[i + 1] if i + 1 < len(args) else "")
            i += 1 if "=" in arg else 2
            chosen = parse_language(value)
            if chosen is None:
                sys.stderr.write(f"error: --lang = {clip(repr(value))}: must be en or zh; e.g. --lang zh.\n")
                sys.exit(2)
            continue
        rest.append(arg)
        i += 1
    if chosen is None:  # the locale's language, if the terminal can show it (LANG=zh_CN with an
        chosen = language_from_env(environ)  # ASCII stream would print only "?")
        chosen = chosen if _streams_can_show("中文") else Language.EN
    return chosen, rest


def _streams_can_show(text: str) -> bool:
    """Whether stdout and stderr can encode ``text`` (a stream without an encoding, such as a
    StringIO, takes any text)."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        if encoding:
            try:
                text.encode(encoding)
            except (UnicodeEncodeError, LookupError):
                return False
    return True


def main(argv: list[str] | None = None) -> None:
    """Console entry point: domain errors become one sentence and exit code 2; an output that
    cannot be written (closed or full stdout, an unwritable file) too, never a traceback.
    Words for people come out in the language of --lang / the locale (i18n); JSON in English."""
    raw = argv if argv is not None else sys.argv[1:]
    debug = "--debug" in raw or bool(os.environ.get("LCMOE_DEBUG"))
    if sys.stdout is None or sys.stderr is None:  # started with fd 1 or 2 closed
        if sys.stderr is not None:
            sys.stderr.write("error: standard output is closed; run lcmoe with its output going somewhere.\n")
        sys.stdout = sys.stdout or open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115
        sys.exit(2)
    lang, args = split_language([a for a in raw if a != "--debug"], os.environ)
    # rich turns a console quiet for good after a broken pipe (Console.on_broken_pipe); a later
    # call in the same process (tests, a caller using main() as a library) writes to a new stream.
    from lcmoe.cli.common import output_width
    from lcmoe.cli.common import stderr as err_console
    from lcmoe.cli.common import stdout as out_console
    from lcmoe.i18n import Language, render_hook

    out_console.quiet = err_console.quiet = False
    # The width is read again at each call, not only when lcmoe.cli was first imported: a caller's
    # COLUMNS may have changed since (a library caller, or the test suite's workers).
    out_console._width = output_width()
    _tolerant_streams()
    consoles = (out_console, err_console) if lang is not Language.EN else ()
    for console in consoles:  # translate what the commands print; popped when the call ends
        console.push_render_hook(render_hook(lang))
    try:
        _run(args, lang, debug)
    finally:
        for console in consoles:
            console.pop_render_hook()


def _say(text: str, lang: Language) -> None:
    """One of main's own messages on stderr, in ``lang``."""
    from lcmoe.i18n import translate

    sys.stderr.write(translate(text, lang) + "\n")


def _invoke(args: list[str], lang: Language) -> None:
    """The command line through typer. In English, typer's standalone mode does it all; in another
    language, a usage error (a missing option, a bad value typer checks) is said in that language:
    click's own text is taken and translated line by line (the usage line stays as it is)."""
    from lcmoe.i18n import Language, OutputContext, translate

    context = OutputContext(lang=lang)
    if lang is Language.EN:
        app(args=args, prog_name="lcmoe", standalone_mode=True, obj=context)
        return
    usage_errors, aborts = _click_exceptions("ClickException"), (typer.Abort, *_click_exceptions("Abort"))
    try:
        code = app(args=args, prog_name="lcmoe", standalone_mode=False, obj=context)
    except usage_errors as exc:
        shown = io.StringIO()
        exc.show(file=shown)
        sys.stderr.write(translate(shown.getvalue(), lang))
        sys.exit(exc.exit_code)
    except aborts:
        _say("Aborted!", lang)
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _click_exceptions(name: str) -> tuple[Any, ...]:
    """Exception ``name`` of the click that typer runs on (its own copy from typer 0.20, click
    itself before), and of click itself when installed."""
    import importlib

    found: list[Any] = []
    for module_name in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(getattr(importlib.import_module(module_name), name))
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _run(args: list[str], lang: Language, debug: bool) -> None:
    """Run the command line; map what escapes it to one sentence and an exit code."""
    from lcmoe.errors import LcmoeError
    from lcmoe.i18n import has_cjk, translate

    try:
        _invoke(args, lang)
        sys.stdout.flush()
    except LcmoeError as exc:
        if debug:
            raise
        from lcmoe.cli.common import stderr

        colon = "：" if has_cjk(translate("error", lang)) else ": "
        stderr.print(translate("error", lang) + colon + exc.sentence(lang), highlight=False, markup=False)
        _flush_or_fail()
        sys.exit(2)
    except KeyboardInterrupt:
        _say("interrupted; nothing was written", lang)
        sys.exit(130)
    except SystemExit as exc:
        if exc.code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into a silent exit 130
            _say("interrupted; nothing was written", lang)
        _flush_or_fail()
        raise
    except RecursionError:
        if debug:
            raise
        _say("error: an input nests too deeply to read; flatten it.", lang)
        sys.exit(2)
    except MemoryError:
        if debug:
            raise
        _silence_stdout()
        _say("error: an input needs more memory than lcmoe allows; check its sizes.", lang)
        sys.exit(2)
    except OSError as exc:
        if debug or exc.errno is None:  # not an OS call that failed (e.g. a TimeoutError raised by code)
            raise
        if exc.filename is None:  # a write to stdout (closed, full, a reader gone)
            _stream_failure(exc, lang)
        reason = exc.strerror or exc.__class__.__name__
        _say(f"error: {clip(str(exc.filename))}: {reason}; check the path.", lang)
        sys.exit(2)


def _flush_or_fail() -> None:
    try:
        sys.stdout.flush()
    except OSError as exc:
        _stream_failure(exc)
    except ValueError:  # stdout already closed by a handler above
        pass
