"""Reading a user's list of responses: a text file (one per line), or a CSV / Parquet file with a named column."""

from __future__ import annotations

import logging
from pathlib import Path

from probe.errors import DataFormatError
from probe.textfile import read_text

log = logging.getLogger(__name__)


def read_responses(path: str | Path, column: str = "response") -> list[str]:
    """The responses, in file order, each once (a repeated response is scored once; the count is logged).

    Text: one response per line, the line without its newline (``\\n`` or ``\\r\\n``) and nothing else stripped;
    an empty line is an error naming it. CSV and Parquet: the column ``column``; empty or missing cells are errors
    naming their row."""
    path = Path(path)
    if not path.exists():
        raise DataFormatError(f"--responses {path}: no such file")
    if path.suffix.lower() in (".csv", ".parquet", ".pq"):
        import polars as pl

        try:
            df = pl.read_parquet(path) if path.suffix.lower() != ".csv" else pl.read_csv(
                read_text(path).encode(), infer_schema_length=0)
        except (pl.exceptions.ComputeError, pl.exceptions.NoDataError, OSError) as err:
            raise DataFormatError(f"--responses {path}: not a readable {path.suffix[1:]} table "
                                  f"({str(err).splitlines()[0]})") from None
        if column not in df.columns:
            raise DataFormatError(f"--responses {path}: no column {column!r} (--response-column); it has "
                                  f"{', '.join(df.columns[:12])}")
        values = df[column].cast(pl.String).to_list()
        where = "row"
        first = 2 if path.suffix.lower() == ".csv" else 1  # a CSV's data starts on line 2
    else:
        text = read_text(path)
        values = text.split("\n")
        if values and values[-1] == "":
            values.pop()  # the file's final newline ends the last line; it does not start an empty one
        values = [v[:-1] if v.endswith("\r") else v for v in values]
        where, first = "line", 1
    for n, v in enumerate(values):
        if v is None or v == "":
            raise DataFormatError(f"--responses {path} {where} {n + first}: empty response; every response needs text")
    seen: dict[str, None] = dict.fromkeys(values)
    if len(seen) < len(values):
        log.warning("--responses %s: %d repeated responses are scored once", path, len(values) - len(seen))
    if not seen:
        raise DataFormatError(f"--responses {path}: no responses")
    return list(seen)


def responses_digest(responses: list[str]) -> str:
    """The responses' identity in a run's settings (``responses_sha256``): the SHA-256 of the list as JSON."""
    import hashlib
    import json

    return hashlib.sha256(json.dumps(responses, ensure_ascii=False).encode()).hexdigest()
