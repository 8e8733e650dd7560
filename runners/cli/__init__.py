"""The ``loopnas`` command line: a thin typer shell, one module per command.

Heavy libraries (torch, fla, ray) are imported inside the commands that need them, so
``validate``, ``show``, ``graph`` and ``cost`` start instantly.
"""
from __future__ import annotations

import sys

import typer

from nas.errors import LoopnasError

from .common import console_err

app = typer.Typer(
    name="loopnas",
    help="Declarative architecture search for looped and hybrid language models.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

# Every command module, registered in this order (a module is one command); a module that
# fails to import fails the CLI, rather than silently losing its command.
_COMMANDS = ("validate", "show", "graph", "cost", "train", "sweep", "calibrate", "transfer", "status", "report",
             "export", "import_", "bench", "diagnose", "doctor")  # import_.py: the `import` command


def _register() -> None:
    """Import each command module; each registers itself on ``app``. ``loopnas --help`` lists
    each command by the first sentence of its docstring, whatever its line breaks."""
    import importlib
    for name in _COMMANDS:
        importlib.import_module(f"{__name__}.{name}")
    for command in app.registered_commands:
        if command.short_help is None and command.callback is not None:
            command.short_help = first_sentence(command.callback.__doc__ or "")


def first_sentence(doc: str) -> str:
    """The docstring's first sentence on one line (up to the first '. ' or blank line)."""
    text = " ".join(doc.strip().split("\n\n")[0].split())
    head, dot, _ = text.partition(". ")
    return head + "." if dot else text


_register()


def main(argv: list[str] | None = None) -> int:
    """Entry point: a known error (:class:`nas.errors.LoopnasError`: a bad spec, flag, file or
    sweep) becomes one line per problem and exit code 2, never a traceback."""
    for stream in (sys.stdout, sys.stderr):  # a path may hold bytes that are not UTF-8
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    try:
        rc = app(args=argv, standalone_mode=False)
    except LoopnasError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            console_err.print(f"error: {line}", markup=False, highlight=False)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        console_err.print("aborted", markup=False)
        return 130
    except Exception as exc:
        # typer's (vendored) click usage errors: a bad value is one line naming the option;
        # a missing argument or unknown command shows the usage it needs
        if type(exc).__name__ == "BadParameter" and hasattr(exc, "format_message"):
            console_err.print(f"error: {exc.format_message()}", markup=False, highlight=False)
            return 2
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            return 2
        raise
    return rc if isinstance(rc, int) else 0


def _entry() -> None:
    rc = main()
    # The process ends here: no cyclic collection over what it is about to free anyway. The
    # interpreter's shutdown collects even with the collector disabled; frozen objects it skips
    # (after a report of 10,000 candidates, 1.1 s of a 5.8 s command; runners.nogc). atexit
    # handlers and module teardown still run. Not after triton was imported (train, sweep,
    # export): its nanobind bindings print every object left alive at exit as a leak.
    import gc
    gc.disable()
    if "triton" not in sys.modules:
        gc.freeze()
    sys.exit(rc)


__all__ = ["app", "main"]
