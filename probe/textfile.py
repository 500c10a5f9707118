"""Reading the user's text files (prompts, configs, data sets) so that a problem names the file and its line.

Text must be UTF-8; a UTF-8 byte-order mark is accepted and removed. Anything else names the line, column and
byte of the first undecodable byte and says how to convert the file; JSON errors name the line and column.
"""

from __future__ import annotations

import json
from pathlib import Path

from probe.errors import DataFormatError


def read_text(path: Path) -> str:
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
    data = path.read_bytes()
    if b"\x00" in data:
        line = data[: data.index(b"\x00")].count(b"\n") + 1
        raise DataFormatError(f"{path} line {line}: a NUL byte: this is a binary file, not text")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        col = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataFormatError(
            f"{path} line {line}, column {col} (byte {err.start}): not UTF-8 text (byte 0x{data[err.start]:02x}); "
            "convert the file to UTF-8, e.g. iconv -f latin1 -t utf-8") from None


def parse_json(path: Path, text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        hint = "; the file looks truncated" if err.pos >= len(text.rstrip()) - 1 else ""
        raise DataFormatError(f"{path} line {err.lineno}, column {err.colno}: not valid JSON ({err.msg}){hint}") \
            from None


def read_yaml(path: Path, what: str = "YAML"):
    """The parsed YAML document; an error names the line, or says the file is not YAML (a binary file, say). A key
    written twice in one mapping is refused (YAML would keep the last one silently)."""
    import yaml

    text = read_text(path)
    try:
        return yaml.load(text, Loader=_unique_keys_loader())
    except _DuplicateKey as err:
        raise DataFormatError(f"{path} line {err.line}: the key {err.key!r} is written twice (first on line "
                              f"{err.first}), and only the last would be kept: remove or rename one") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise DataFormatError(f"{path}{where}: not valid {what} ({getattr(err, 'problem', None) or err})") from None


class _DuplicateKey(Exception):
    def __init__(self, key, line: int, first: int):
        self.key, self.line, self.first = key, line, first


# YAML 1.1 (PyYAML) reads a number in exponent form without a dot or without a signed exponent (1e-3, 1E5, 1.5e3)
# as a string, so a setting written `beta: 1e-3` was refused as "not a number" while `--beta 1e-3` was taken; these
# read as YAML 1.2 and Python's float read them. A quoted "1e-3" stays a string.
EXPONENT_FLOAT = r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"


def _unique_keys_loader():
    """yaml's safe loader, refusing a mapping that holds one key twice, with YAML 1.2's numbers in exponent form."""
    import re

    import yaml

    class UniqueKeys(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # "<<": merged keys may be overridden
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    if key in seen:
                        raise _DuplicateKey(key, key_node.start_mark.line + 1, seen[key])
                    seen[key] = key_node.start_mark.line + 1
                except TypeError:  # an unhashable key: the safe loader's own error follows
                    continue
            return super().construct_mapping(node, deep)

    UniqueKeys.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(EXPONENT_FLOAT), list("-+0123456789."))
    return UniqueKeys
