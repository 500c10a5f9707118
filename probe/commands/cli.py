"""The ``probe`` (or ``rm-probe``) console script: ``probe score | gcg | social | trace | analyze | report | batch |
explain``.

Each subcommand is also runnable alone (``python -m probe.exhaustive``, ``python -m probe.gcg``, ...). User errors
print one line and exit with status 2; an interrupted run says how to resume.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys

from probe.errors import ProbeError

# name -> (module, one line for ``probe --help``); a module is imported only when its subcommand is named
SUBCOMMANDS = {
    "score": ("probe.commands.score", "score every token of the vocabulary, or a list of responses"),
    "gcg": ("probe.commands.gcg", "multi-token search: GCG or the exact beam"),
    "social": ("probe.commands.social", "social-preference benchmark on bias, safety, morality and ethics data"),
    "analyze": ("probe.commands.analyze", "analyses of saved runs (agreement, framing, exposure, misalignment, ...)"),
    "trace": ("probe.commands.trace", "per-token reward traces: the score of every prefix of a response"),
    "report": ("probe.commands.report", "the auditors' HTML report of one run or several side by side"),
    "batch": ("probe.commands.batch", "many sweeps from one job file: skip what is done, resume what is not"),
    "explain": ("probe.commands.explain", "why a token wins: the score decomposed, checked against patching"),
}


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # these libraries print through handlers of their own: passing their records to ours too printed each twice
    for name in ("huggingface_hub", "transformers"):
        logging.getLogger(name).propagate = False
    if not verbose:
        if "transformers" in sys.modules:
            import transformers

            transformers.logging.set_verbosity_error()
            transformers.logging.disable_progress_bar()
        else:  # the same, read by transformers when a command imports it (commands that load no model never do)
            os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
            os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def command_parser(subparsers, name: str, help_: str, prog: str, doc: str | None, config_cls=None, func=None,
                   positional: tuple[tuple[str, dict], ...] = (), verbose: bool = True,
                   interrupted: str | None = None) -> argparse.ArgumentParser:
    """A command's parser, standalone (``python -m ...``) or as a ``probe`` subcommand: its positional
    arguments, then one flag per field of its config dataclass (help written once, in the dataclass).
    ``interrupted``: advice beyond the run an interrupt stops (a batch's other jobs); what the run itself keeps
    is said from its checkpoints (probe/runs/rundir.py: interrupted_note)."""
    from probe.commands.args import add_dataclass_args

    kw = dict(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser = subparsers.add_parser(name, help=help_, **kw) if subparsers else argparse.ArgumentParser(prog=prog, **kw)
    for arg, opts in positional:
        parser.add_argument(arg, **opts)
    if config_cls is not None:
        add_dataclass_args(parser, config_cls)
    if verbose:
        parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    if func is not None:
        parser.set_defaults(func=func, interrupted=interrupted)
    return parser


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    from probe.runs.cpu import prepare

    ns = parser.parse_args(argv)
    setup_logging(getattr(ns, "verbose", False))
    prepare()  # threads from the usable CPUs, OpenMP that shares them: before any command imports torch
    previous = _on_sigterm()
    try:
        return ns.func(ns)
    except ProbeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated)
        from probe.runs.rundir import interrupted_note

        how = "terminated" if isinstance(err, Terminated) else "interrupted"
        _close_progress_bars()  # before the message, so that no bar is redrawn after it
        note = interrupted_note(how) or "nothing was saved: no run had started"
        print(f"\n{how}: {note}" + (f"\n{ns.interrupted}" if getattr(ns, "interrupted", None) else ""),
              file=sys.stderr)
        return 143 if how == "terminated" else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's stop, ``kill``): handled as Ctrl-C is, so the run says what it keeps."""


def _on_sigterm():
    """Route SIGTERM to `Terminated` (main thread only); the previous handler, to restore."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum, frame):
        raise Terminated()

    return signal.signal(signal.SIGTERM, handler)


def _close_progress_bars() -> None:
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", [])):
        bar.close()


def _versions() -> str:
    """From the installed packages' metadata (nothing imported): what a bug report needs first."""
    from importlib.metadata import PackageNotFoundError, version

    def of(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "not installed"

    return f"rm-probe {of('rm-probe')} (torch {of('torch')}, transformers {of('transformers')})"


def make_parser(argv: list[str] | None = None, prog: str = "probe") -> argparse.ArgumentParser:
    """The console script's parser. Only the subcommand named in ``argv`` gets its full parser (its module is
    imported); the others are listed by name and help line, so ``probe --help`` imports no library code.
    ``argv`` None: every subcommand's full parser."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="probe --list-models [WORD ...]: every reward-model family rm-probe reads "
                                            "(or refuses), how it reads it, and where each family's input comes "
                                            "from (with words: the entries whose id, family or reader contains "
                                            "each, e.g. probe --list-models skywork)")
    parser.add_argument("--version", action="version", version=_versions(),
                        help="rm-probe's version and the torch and transformers it runs with")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    named = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, (module, help_) in SUBCOMMANDS.items():
        if named is None or name == named:
            importlib.import_module(module).make_parser(sub)
        else:
            sub.add_parser(name, help=help_)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--list-models"]:
        from probe.commands.models import list_models

        try:
            list_models(words=tuple(argv[1:]))
        except ProbeError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `probe --list-models | head`: the reader had enough
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (nothing more is written; the interpreter closes it)
        return 0
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] and not sys.argv[0].endswith(".py") else "probe"
    return run_command(make_parser(argv, prog if prog in ("probe", "rm-probe") else "probe"), argv)


if __name__ == "__main__":
    sys.exit(main())


def forward_calls(module_name: str, api_name: str) -> None:
    """Make the command module ``module_name`` (probe/gcg.py, probe/trace.py) callable as the API function
    ``probe.<api_name>``: an ``import probe.gcg`` binds the module to the name the API's function has."""
    import types

    class CallableModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            import probe.api

            return getattr(probe.api, api_name)(*args, **kwargs)

    sys.modules[module_name].__class__ = CallableModule
