"""The ``probe`` console script: ``probe score | gcg | social | analyze | report | figures``.

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
}


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if not verbose:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()


def run_command(parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    ns = parser.parse_args(argv)
    setup_logging(getattr(ns, "verbose", False))
    try:
        return ns.func(ns)
    except ProbeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: finished shards are saved; add --resume to continue", file=sys.stderr)
        return 130


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
