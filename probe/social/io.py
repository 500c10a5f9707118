"""Reading data set files so that every problem names the file and the physical line (or byte) where it is.

* Text must be UTF-8 (a UTF-8 byte-order mark is accepted); anything else names the line and byte of the
  first undecodable byte and says how to convert the file.
* JSON: the decoder's line and column; a document cut off before its end says that it looks truncated.
* JSONL: one object per line.
* CSV: records are numbered by the physical line where they start (a quoted field may span lines, as ETHICS
  texts do), and a record with more or fewer fields than the header is an error at that line.
* A config x split of a Hub data set (`Part`, read by probe/social/hub.py) is a source of rows too: its rows are
  numbered from 1 and messages name the copy, config and split.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from probe.errors import DataFormatError
from probe.textfile import parse_json, read_text  # noqa: F401  (re-exported for the loaders)

Row = tuple[int, dict]  # (physical line where the record starts, the record)


@dataclass(frozen=True)
class Part:
    """One config x split of a Hub data set: its rows and the class-label names of its columns."""

    origin: str  # the Hub id (with the revision read) or the folder
    config: str
    split: str
    rows: tuple = field(repr=False)
    class_names: dict = field(default_factory=dict, repr=False)  # "col" or "col.sub" -> [name of 0, name of 1, ...]

    @property
    def name(self) -> str:  # the items' source
        return f"{self.origin} {self.config}/{self.split}"

    @property
    def stem(self) -> str:  # in item ids
        return self.split if self.config == "default" else f"{self.config}-{self.split}"

    def __str__(self) -> str:  # messages then say "<this> line N": N is the row's number in the part, from 1
        return f"{self.origin} ({self.config}/{self.split})"

    def numbered(self):
        """(row number from 1, row) as the file readers yield (physical line, record)."""
        return enumerate(self.rows, start=1)

    def label_name(self, column: str, value: object) -> object:
        """A class label's name: an integer through this part's class names for ``column``; anything else (a name
        already) as it is."""
        if isinstance(value, bool) or not isinstance(value, int):
            return value
        names = self.class_names.get(column)
        if not names or not 0 <= value < len(names):
            raise DataFormatError(f"{self}: {column} is the class label {value}, but the copy names no class for it")
        return names[value]


def json_rows(path: Path) -> Iterator[Row]:
    """A JSON list of objects (numbered by position, with the line each starts on) or JSON Lines."""
    text = read_text(path)
    if path.suffix == ".json":
        data = parse_json(path, text)
        if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
            raise DataFormatError(f"{path}: expected a JSON list of records (objects), found {_shape(data)}"
                                  + _other_format(data))
        return iter(_with_lines(text, data))
    return _jsonl(path, text)


def _shape(data) -> str:
    if isinstance(data, dict):
        return f"one JSON object with the keys {', '.join(list(data)[:8])}"
    return f"a JSON {type(data).__name__}" if not isinstance(data, list) else "a list with other things than objects"


def _other_format(data) -> str:
    """Which data set's file a JSON document is, where it is not a list of records (StereoSet's dev.json)."""
    inner = data.get("data") if isinstance(data, dict) else None
    if isinstance(inner, dict) and {"intrasentence", "intersentence"} & set(inner):
        return "; this is StereoSet's dev.json: give it as --dataset stereoset"
    return ""


def _with_lines(text: str, data: list[dict]) -> list[Row]:
    """The line of each top-level object of a JSON list (its opening brace), for error messages."""
    starts, depth, in_string, escape, line = [], 0, False, False, 1
    for ch in text:
        if ch == "\n":
            line += 1
        if in_string:
            escape = not escape and ch == "\\"
            if ch == '"' and not escape:
                in_string = False
            continue
        if ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if ch == "{" and depth == 2:
                starts.append(line)
        elif ch in "]}":
            depth -= 1
    if len(starts) != len(data):
        starts = list(range(1, len(data) + 1))
    return list(zip(starts, data))


def _jsonl(path: Path, text: str) -> Iterator[Row]:
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataFormatError(f"{path} line {n}, column {err.colno}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataFormatError(f"{path} line {n}: expected a JSON object per line")
        yield n, row


def csv_rows(path: Path) -> Iterator[Row]:
    text = read_text(path)
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)  # strict: a quote left open is an error
    try:
        header = next(reader)
    except StopIteration:
        raise DataFormatError(f"{path}: empty CSV file") from None
    except csv.Error as err:
        raise DataFormatError(f"{path} line 1: not a CSV header ({err})") from None
    header = [h.strip() for h in header]
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            hint = "; a quoted field is not closed" if "end of data" in str(err) else ""
            raise DataFormatError(f"{path} line {start}: bad CSV record ({err}){hint}") from None
        if not fields or all(not f.strip() for f in fields):
            continue
        if len(fields) != len(header):
            raise DataFormatError(f"{path} line {start}: {len(fields)} fields, but the header has {len(header)}")
        yield start, dict(zip(header, fields))


def rows(path: Path) -> Iterator[Row]:
    """Records of a CSV, JSON or JSONL file, each with the physical line where it starts."""
    return csv_rows(path) if path.suffix == ".csv" else json_rows(path)


# the columns each published format has, to say which data set a file belongs to when it is passed as another
SIGNATURES: dict[str, frozenset[str]] = {
    "bbq": frozenset({"context", "question", "ans0", "ans1", "ans2", "label"}),
    "crows_pairs": frozenset({"sent_more", "sent_less"}),
    "stereoset": frozenset({"context", "stereotype", "anti-stereotype", "unrelated"}),
    "xstest prompts": frozenset({"prompt", "type", "label", "focus"}),
    "xstest completions": frozenset({"prompt", "type", "completion", "final_label"}),
    "rewardbench": frozenset({"prompt", "chosen", "rejected"}),
    "moral_stories": frozenset({"norm", "situation", "intention", "moral_action", "immoral_action"}),
    "ethics_cm": frozenset({"label", "input"}),
    "moralchoice": frozenset({"scenario_id", "context", "action1", "action2"}),
}


def looks_like(columns) -> str | None:
    cols = set(columns)
    matches = [name for name, sig in SIGNATURES.items() if sig <= cols]
    return max(matches, key=lambda m: len(SIGNATURES[m])) if matches else None


def need(path: Path | Part, line: int, row: dict, dataset: str, *keys: str) -> list:
    """The values of ``keys``; a missing or empty one is an error naming the line, and where the record has
    another data set's columns, that data set."""
    missing = [k for k in keys if row.get(k) is None or (isinstance(row[k], str) and not row[k].strip())]
    if missing:
        other = looks_like(row)
        hint = f"; it looks like a {other} file, not {dataset}" if other and not other.startswith(dataset) else ""
        raise DataFormatError(f"{path} line {line}: missing or empty {', '.join(missing)} "
                              f"(has {', '.join(sorted(row)[:10])}){hint}")
    return [row[k] for k in keys]
