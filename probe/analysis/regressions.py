"""Framing (score ~ valence, separately for positive and negative words) and mere exposure
(score ~ log frequency + valence), per model x prompt, on the tokens that match a human lexicon.

Tokens are matched to the lexicon by their word form (decoded text without leading space or sub-word
markers, lower-cased), one observation per token as the paper did: ``Love``, `` love`` and ``LOVE`` are
three observations of "love". ``per="word"`` averages a word's tokens first.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from probe.analysis import stats
from probe.analysis.lexicons import frequencies, valence
from probe.core.vocab import strip_markers


def lexicon_matches(df: pl.DataFrame, lexicon: pl.DataFrame, per: str = "token") -> pl.DataFrame:
    """One prompt's rows joined to ``word, valence``; columns ``word, token_id, score, valence``. The lexicon
    decides what a word is here: every alphabetic token whose form it lists (``is_alpha``; runs made before that
    column existed called it ``is_word``)."""
    alpha = "is_alpha" if "is_alpha" in df.columns else "is_word"
    words = df.filter(pl.col(alpha)).with_columns(
        pl.col("decoded").map_elements(lambda t: strip_markers(t).lower(), return_dtype=pl.String).alias("word"))
    keep = ["word", "token_id", "score", "valence"] + (["n_tokens"] if "n_tokens" in words.columns else [])
    out = words.join(lexicon, on="word", how="inner").select(keep)
    if per == "word":
        out = out.group_by("word").agg(pl.col("score").mean(), pl.col("valence").first(), pl.len().alias("n_tokens"))
    return out


def framing_slopes(frames: dict[tuple[str, str], pl.DataFrame], source: str = "afinn111", per: str = "token",
                   min_n: int = 5) -> pl.DataFrame:
    """``frames``: (model, prompt) -> that prompt's rows. One row per model x prompt x affect with the slope of
    score on valence, its standard error, 95% CI and n."""
    lex = valence(source)
    rows = []
    for (model, prompt), df in frames.items():
        m = lexicon_matches(df, lex, per)
        for affect, sub in (("positive", m.filter(pl.col("valence") > 0)), ("negative", m.filter(pl.col("valence") < 0))):
            if sub.height < min_n or sub["valence"].n_unique() < 2:
                continue
            fit = stats.ols(sub["score"].to_numpy(), {"valence": sub["valence"].to_numpy()}).row("valence")
            rows.append({"model": model, "prompt": prompt, "affect": affect, **fit})
    return pl.DataFrame(rows)


def exposure_slopes(frames: dict[tuple[str, str], pl.DataFrame], source: str = "afinn111", freq: str = "wordfreq",
                    bnc_path: str | None = None, per: str = "token", with_valence: bool = True) -> pl.DataFrame:
    """Slope of score on log word frequency (controlling for valence by default), per model x prompt; and beside
    it the same slope with the word's length in characters held fixed too (frequent words are short: Zipf's law of
    abbreviation), and for response runs also the response's length in tokens (a summed log-probability falls
    with every token). ``controls`` names what each row holds fixed."""
    lex = valence(source)
    rows = []
    for (model, prompt), df in frames.items():
        m = lexicon_matches(df, lex, per)
        f = frequencies(m["word"].unique().to_list(), freq, bnc_path)
        m = m.join(f, on="word", how="inner")
        if m.height < 5:
            continue
        cols = {"log_freq": m["log_freq"].to_numpy()}
        if with_valence:
            cols["valence"] = m["valence"].to_numpy()
        fit = stats.ols(m["score"].to_numpy(), cols).row("log_freq")
        rows.append({"model": model, "prompt": prompt, "controls": ", ".join(list(cols)[1:]) or "none", **fit})
        cols["length"] = m["word"].str.len_chars().to_numpy()
        if "n_tokens" in m.columns and per == "token" and m["n_tokens"].n_unique() > 1:
            cols["n_tokens"] = m["n_tokens"].to_numpy()
        if m.height > len(cols) + 1 and np.ptp(cols["length"]) > 0:
            fit = stats.ols(m["score"].to_numpy(), cols).row("log_freq")
            rows.append({"model": model, "prompt": prompt, "controls": ", ".join(list(cols)[1:]), **fit})
    return pl.DataFrame(rows)
