"""Framing (score ~ valence, separately for positive and negative words) and mere exposure
(score ~ log frequency + valence), per model x prompt, on the tokens that match a human lexicon.

Tokens are matched to the lexicon by their word form (decoded text without leading space or sub-word
markers, lower-cased), one observation per token as the paper did: ``Love``, `` love`` and ``LOVE`` are
three observations of "love". ``per="word"`` averages a word's tokens first.
"""

from __future__ import annotations

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
    out = words.join(lexicon, on="word", how="inner").select("word", "token_id", "score", "valence")
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
    """Slope of score on log word frequency (controlling for valence by default), per model x prompt."""
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
        rows.append({"model": model, "prompt": prompt, **fit})
    return pl.DataFrame(rows)
