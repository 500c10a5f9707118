"""Plain-text tables of the best and worst tokens, raw and words-only side by side, and how every page and table
shows a token's text (byte fragments as their bytes)."""

from __future__ import annotations

import re
from functools import lru_cache

import polars as pl

LEGEND = ("flags: S special (control), A added, W English word, L letters only, _ leading space, R round-trips, "
          "! not valid UTF-8")


def model_label(meta: dict) -> str:
    """The model's id, and for a packaged GGUF model what was really run (its quantization)."""
    model = meta.get("model", {})
    source = model.get("source") or {}
    if source.get("quantization"):
        return f"{model['id']} ({source['quantization']} GGUF, dequantized to {source.get('dequantized_to')})"
    return model.get("id", "?")


def run_label(model: str, meta: dict) -> str:
    """A run's label on a page of several: the model, its score mode and, where not the family's own, its input route
    (two runs that differ only by ``--input-method`` are told apart)."""
    from probe.analysis.sweeps import mode_name

    route = {"rewardbench": "RewardBench's inputs", "paper": "the paper's inputs"}.get(
        (meta.get("settings") or {}).get("input_method", "ids"))
    return f"{model} [{mode_name(meta)}{', ' + route if route else ''}]"


def plural(n: int, noun: str) -> str:
    """``1 response``, ``6 responses``, ``1,000 responses``."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def plain_table(data, digits: int = 3) -> str:
    """A table as a person reads it in a terminal: a header, a rule, one line per row, every column shown (no
    polars "shape: (1, 17)", dtype row or hidden columns), numbers right-aligned, floats to ``digits`` places
    (in scientific notation where that would show nothing, e.g. a p-value of 2e-05), empty cells as "-".
    ``data``: a polars DataFrame or a list of dicts."""
    import math

    rows = data.to_dicts() if isinstance(data, pl.DataFrame) else [dict(r) for r in data]
    columns = list(data.columns) if isinstance(data, pl.DataFrame) else list(dict.fromkeys(k for r in rows for k in r))

    def cell(v) -> str:
        if v is None:
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "no"
        if isinstance(v, float):
            if math.isnan(v):
                return "nan"
            return f"{v:.{digits}f}" if v == 0 or abs(v) >= 10 ** -digits else f"{v:.{digits - 1}e}"
        if isinstance(v, int):
            return f"{v:,}"
        if isinstance(v, (list, tuple)):
            return ", ".join(cell(x) for x in v)
        return str(v).replace("\n", " ")

    cells = [[cell(r.get(c)) for c in columns] for r in rows]
    numeric = [all(isinstance(r.get(c), (int, float)) and not isinstance(r.get(c), bool) or r.get(c) is None
                   for r in rows) and any(r.get(c) is not None for r in rows) for c in columns]
    widths = [max([len(c)] + [len(line[i]) for line in cells]) for i, c in enumerate(columns)]
    fit = lambda text, i: text.rjust(widths[i]) if numeric[i] else text.ljust(widths[i])  # noqa: E731
    lines = ["  ".join(fit(c, i) for i, c in enumerate(columns)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(fit(v, i) for i, v in enumerate(line)).rstrip() for line in cells]
    return "\n".join(lines)


def flags(row: dict) -> str:
    return "".join([
        "S" if row["is_special"] else ".",
        "A" if row["is_added"] else ".",
        "W" if row["is_word"] else ".",
        "L" if row.get("is_alpha") else ".",
        "_" if row["leading_space"] else ".",
        "R" if row["roundtrips"] else ".",
        "." if row["valid_utf8"] else "!",
    ])


def score_decimal(x) -> float:
    """A float32 score as the shortest decimal that reads back as the same float32 (-55.790047, not
    -55.79004669189453): the HTML report stores this and both it and the terminal round it once, to 4 places."""
    import numpy as np

    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


# --- token text ----------------------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet (Llama 3, Qwen, SmolLM2 pieces): printable stand-in character -> byte."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a vocabulary piece stands for: SentencePiece byte pieces (``<0xE2>``, ``▁`` for a space) or
    GPT-2 byte-level pieces; None when the piece is neither."""
    if re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", piece):
        return bytes([int(piece[3:5], 16)])
    table = _byte_of_char()
    if all(c in table for c in piece):
        return bytes(table[c] for c in piece)
    if "\ufffd" not in piece:
        return piece.replace("▁", " ").encode("utf-8")
    return None


def shown_text(decoded: str, piece: str, valid_utf8: bool) -> str:
    """The token as the page shows it: its text, and where it is not valid UTF-8 on its own, its bytes, with each
    byte that does not form a character written ``<0xE2>`` (never the replacement character)."""
    if valid_utf8:
        return decoded
    raw = piece_bytes(piece)
    if raw is None:
        return decoded
    return _bytes_shown(raw)


def _bytes_shown(raw: bytes) -> str:
    text = raw.decode("utf-8", errors="surrogateescape")
    return "".join(f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else c for c in text)


def shown_ids(tokenizer, ids: list[int]) -> str:
    """A sequence of ids as text, shown as the tables show a token: where the decoded text holds bytes that form no
    character (U+FFFD), the sequence's bytes with each such byte written ``<0x88>``."""
    decoded = tokenizer.decode(ids)
    if "\ufffd" not in decoded:
        return decoded
    parts = [piece_bytes(p) for p in tokenizer.convert_ids_to_tokens(ids)]
    if any(p is None for p in parts):
        return decoded
    return _bytes_shown(b"".join(parts))


def _lines(df: pl.DataFrame, rank_col: str) -> list[str]:
    out = []
    for r in df.iter_rows(named=True):
        text = repr(shown_text(r["decoded"], r.get("piece") or "", r.get("valid_utf8", True)))
        text = text if len(text) <= 22 else text[:21] + "…"
        out.append(f"{r[rank_col]:>7} {score_decimal(r['score']):>10.4f} {r['token_id']:>7} {flags(r)} {text:<22}")
    return out


def _side_by_side(left: list[str], right: list[str], titles: tuple[str, str]) -> str:
    width = 62
    head = f"{titles[0]:<{width}}  {titles[1]}"
    sub = f"{'rank':>7} {'score':>10} {'id':>7} flags  token"
    rows = [head, f"{sub:<{width}}  {sub}"]
    for i in range(max(len(left), len(right))):
        a = left[i] if i < len(left) else ""
        b = right[i] if i < len(right) else ""
        rows.append(f"{a:<{width}}  {b}".rstrip())
    return "\n".join(rows)


def format_top_bottom(df: pl.DataFrame, key: str, text: str, meta: dict, n: int) -> str:
    """``df``: one prompt's rows of scores.parquet."""
    words = df.filter(pl.col("is_word")).with_columns(  # the rank among words, ties as the run ranks them (min)
        pl.col("score").rank("min", descending=True).cast(pl.UInt32).alias("word_rank")).sort("score", descending=True)
    raw = df.sort("score", descending=True).with_columns(pl.col("rank").alias("r"))
    from probe.analysis.sweeps import mode_name

    mode = mode_name(meta)
    parts = [f"\n== {key}: {text!r}  [{model_label(meta)}, {mode}, {df.height:,} tokens] ==", LEGEND]
    # where there are fewer than 2n, each side shows half of them: best and worst never list one token twice
    k_raw, k_words = min(n, raw.height // 2), min(n, words.height // 2)
    of = lambda k, h: f"{k}" if k == n else f"{k} of {h:,}"  # noqa: E731
    parts.append(_side_by_side(_lines(raw.head(k_raw), "r"), _lines(words.head(k_words), "word_rank"),
                               (f"best {of(k_raw, raw.height)} (all tokens)",
                                f"best {of(k_words, words.height)} (words only)")))
    parts.append(_side_by_side(_lines(raw.tail(k_raw).reverse(), "r"), _lines(words.tail(k_words).reverse(), "word_rank"),
                               (f"worst {of(k_raw, raw.height)} (all tokens)",
                                f"worst {of(k_words, words.height)} (words only)")))
    return "\n".join(parts)
