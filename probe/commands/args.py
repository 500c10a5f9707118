"""Build an argparse parser from a frozen config dataclass, with each field's help written once.

Field metadata: ``help`` (required), ``flag`` (default ``--field-name``), ``short`` (e.g. ``-p``),
``repeat`` (a tuple field filled by repeating the flag), ``choices``. Bools become ``--x/--no-x``.
``--config FILE`` reads a YAML mapping of field names; flags given on the command line win.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from probe.errors import DataFormatError
from probe.textfile import read_yaml

C = TypeVar("C")


def _base_type(tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and len(args) == 1:
        return _base_type(args[0])
    if typing.get_origin(tp) is typing.Literal:
        return str
    return tp


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        md = f.metadata
        if "help" not in md:
            continue
        flags = [md.get("flag", "--" + f.name.replace("_", "-"))] + ([md["short"]] if "short" in md else [])
        tp = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        quiet = default is None or default is False or default == ()  # not `in`: a default of 0 equals False
        help_ = md["help"] + ("" if quiet else f" (default: {default})")
        kw: dict[str, Any] = dict(dest=f.name, help=help_, default=argparse.SUPPRESS)
        literal = [a for a in typing.get_args(hints[f.name]) if typing.get_origin(a) is typing.Literal]
        choices = md.get("choices") or (typing.get_args(hints[f.name]) if typing.get_origin(hints[f.name]) is typing.Literal
                                        else (typing.get_args(literal[0]) if literal else None))
        if tp is bool:
            parser.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
        elif md.get("repeat"):
            parser.add_argument(*flags, action="append", metavar=md.get("metavar", "TEXT"), **kw)
        elif md.get("optional_value") is not None:
            parser.add_argument(*flags, nargs="?", const=md["optional_value"], metavar="DIR", **kw)
        else:
            item = tp if tp in (int, float) else str
            parser.add_argument(*flags, type=item, choices=choices, metavar=md.get("metavar"), **kw)
    parser.add_argument("--config", help="YAML file of settings (field names as keys); command-line flags win")


def config_from_args(cls: type[C], ns: argparse.Namespace) -> C:
    values: dict[str, Any] = {}
    if getattr(ns, "config", None):
        path = Path(ns.config)
        if not path.is_file():
            raise DataFormatError(f"--config {path}: no such file")
        data = read_yaml(path, "YAML settings") or {}
        if not isinstance(data, dict):
            raise DataFormatError(f"{path}: expected a mapping of setting: value")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise DataFormatError(f"{path}: unknown settings {unknown}; known: {sorted(names)}")
        values.update(data)
    for f in dataclasses.fields(cls):
        if hasattr(ns, f.name):
            values[f.name] = getattr(ns, f.name)
    for f in dataclasses.fields(cls):
        if f.metadata.get("repeat") and isinstance(values.get(f.name), list):
            values[f.name] = tuple(values[f.name])
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise DataFormatError(str(err)) from None
