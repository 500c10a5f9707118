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


def setting_actions(cls: type) -> dict[str, argparse.Action]:
    """Each setting's command-line flag (its argparse action: type, choices, repeat), by field name."""
    parser = argparse.ArgumentParser(add_help=False)
    add_dataclass_args(parser, cls)
    return {a.dest: a for a in parser._actions if a.dest != "config"}


def _kind(value: Any) -> str:
    return {bool: "true or false", int: "a number", float: "a number", list: "a list", dict: "a mapping",
                                              type(None): "empty"}.get(
        type(value), type(value).__name__)


def _shown(value: Any) -> str:
    """A YAML value as the file wrote it: true, not Python's True."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value)


def setting_value(action: argparse.Action, name: str, value: Any, where: str) -> Any:
    """A setting read from a YAML file (``--config``, a batch job file, a social suite) as its command-line flag
    takes it: the flag's type and choices, a repeatable flag's texts (one text: one flag), true or false for a
    switch. A value of another type is refused in one line naming the file (``where``) and the setting, never
    coerced (``limit: 2.5``) or iterated (``prompt: "What is good?"`` is one prompt, as one --prompt is)."""
    import datetime

    flag = "/".join(action.option_strings[:1]) or name
    head = f"{where}: {name}: {_shown(value)}"
    if value is None:
        raise DataFormatError(f"{where}: {name} has no value (YAML reads an empty value as null): give one "
                              f"(\"\" for an empty text), or leave {name} out for its default")
    if isinstance(action, argparse.BooleanOptionalAction):
        if not isinstance(value, bool):
            raise DataFormatError(f"{head} is {_kind(value)}; {flag} is a switch: write true or false")
        return value
    if isinstance(action, argparse._AppendAction):  # a repeatable flag: a list of texts, or one text
        items = value if isinstance(value, list) else [value]
        if not items:
            raise DataFormatError(f"{where}: {name} is an empty list: give at least one text, or leave {name} out")
        return tuple(setting_value(argparse.Action([flag], name, type=str), f"{name}[{i + 1}]" if
                                   isinstance(value, list) else name, v, where) for i, v in enumerate(items))
    if isinstance(value, datetime.date):  # YAML reads 2024-07-26 as a date: the text the flag would get
        value = value.isoformat()
    typ = action.type or str
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise DataFormatError(f"{head} is not a whole number ({flag} N)"
                              + ("; write it without quotes" if isinstance(value, str) and
                                 value.strip().lstrip("-").isdigit() else ""))
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DataFormatError(f"{head} is not a number ({flag} X)")
        value = float(value)
    if typ is str and not isinstance(value, str):
        raise DataFormatError(f"{head} is {_kind(value)}; {flag} takes a text: write it in quotes"
                              if isinstance(value, (int, float)) else f"{head} is {_kind(value)}; {flag} takes a text")
    if action.choices is not None and value not in action.choices:
        raise DataFormatError(f"{head} is not one of {', '.join(map(str, action.choices))} ({flag})")
    return value


def checked_settings(cls: type, data: Any, where: str, extra: frozenset[str] = frozenset()) -> dict[str, Any]:
    """A YAML mapping of settings of ``cls`` checked as the command line checks its flags (`setting_value`); an
    unknown key is refused naming ``where``. Keys in ``extra`` pass through unchecked (the caller checks them)."""
    if not isinstance(data, dict):
        raise DataFormatError(f"{where}: expected a mapping of setting: value, not {_kind(data)}")
    actions = setting_actions(cls)
    unknown = sorted(set(map(str, data)) - set(actions) - extra)
    if unknown:
        raise DataFormatError(f"{where}: unknown settings {unknown}; known: {sorted(actions)}")
    return {k: v if k in extra else setting_value(actions[k], k, v, where) for k, v in data.items()}


def blame(err: Exception, sources: dict[str, set[str]], default: str | None = None) -> str:
    """``err``'s message (a dataclass's check, naming its flags: --limit) prefixed with where the setting it names
    was written (``sources``: where -> the settings written there), the first that holds one of them; else
    ``default`` (where the whole set was written), if given."""
    import re

    named = {m.replace("-", "_") for m in re.findall(r"--([a-z][a-z-]*)", str(err))}
    for where, names in sources.items():
        hit = sorted(named & names)
        if hit:
            return f"{where}: {', '.join(hit)}: {err}"
    return f"{default}: {err}" if default else str(err)


def config_from_args(cls: type[C], ns: argparse.Namespace) -> C:
    values: dict[str, Any] = {}
    sources: dict[str, set[str]] = {}
    if getattr(ns, "config", None):
        path = Path(ns.config)
        if not path.is_file():
            raise DataFormatError(f"--config {path}: no such file")
        data = read_yaml(path, "YAML settings")
        if data is None:
            raise DataFormatError(f"--config {path}: the file is empty: write setting: value lines (field names "
                                  "as keys), or leave --config out")
        given = {f.name for f in dataclasses.fields(cls) if hasattr(ns, f.name)}  # command-line flags win
        values.update(checked_settings(cls, data, str(path)))
        sources[str(path)] = set(data) - given
    for f in dataclasses.fields(cls):
        if hasattr(ns, f.name):
            values[f.name] = getattr(ns, f.name)
    for f in dataclasses.fields(cls):
        if f.metadata.get("repeat") and isinstance(values.get(f.name), list):
            values[f.name] = tuple(values[f.name])
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise DataFormatError(blame(err, sources)) from None
