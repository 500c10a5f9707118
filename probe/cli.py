"""The ``probe`` console script: ``probe score | gcg | social | analyze | report | batch``.

Each subcommand is also runnable alone (``python -m probe.exhaustive``, ...). User errors print one line and
exit with status 2; an interrupted run says how to resume.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from probe.errors import ProbeError

SUBCOMMANDS = {
    "score": "probe.exhaustive",
    "gcg": "probe.gcg",
    "analyze": "probe.analyze",
    "report": "probe.report",
    "social": "probe.social.__main__",
    "batch": "probe.batch",
}


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # these libraries print through handlers of their own: passing their records to ours too printed each twice
    for name in ("huggingface_hub", "transformers"):
        logging.getLogger(name).propagate = False
    if not verbose:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()


def command_parser(subparsers, name: str, help_: str, prog: str, doc: str | None, config_cls=None, func=None,
                   positional: tuple[tuple[str, dict], ...] = (), verbose: bool = True,
                   interrupted: str | None = None) -> argparse.ArgumentParser:
    """A command's parser, standalone (``python -m ...``) or as a ``probe`` subcommand: its positional
    arguments, then one flag per field of its config dataclass (help written once, in the dataclass).
    ``interrupted``: what Ctrl-C leaves behind and how to continue (the advice must be true)."""
    from probe.cliargs import add_dataclass_args

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
    ns = parser.parse_args(argv)
    setup_logging(getattr(ns, "verbose", False))
    try:
        return ns.func(ns)
    except ProbeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        _close_progress_bars()  # before the message, so that no bar is redrawn after it
        print(f"\ninterrupted: {getattr(ns, 'interrupted', None) or 'nothing was saved'}", file=sys.stderr)
        return 130


def _close_progress_bars() -> None:
    from tqdm import tqdm

    for bar in list(getattr(tqdm, "_instances", [])):
        bar.close()


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="probe", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in SUBCOMMANDS.values():
        importlib.import_module(module).make_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
