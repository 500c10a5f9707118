"""Two rankings of the same tokens side by side: a reward model against a language model's log-probabilities,
or one model scored from raw ids against the paper's decode-and-re-tokenize inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from probe.analysis import stats
from probe.analysis.sweeps import unique_strings


@dataclass
class Contrast:
    n: int
    kendall: float
    spearman: float
    top_overlap: float  # |top-k(a) & top-k(b)| / k
    bottom_overlap: float
    k: int
    moved: pl.DataFrame  # tokens whose rank differs most, both ways

    def to_json(self) -> dict:
        return {"n": self.n, "kendall_tau_b": self.kendall, "spearman": self.spearman,
                "kendall_tau_b_interval": stats.rank_correlation_interval(self.kendall, self.n, "kendall"),
                "spearman_interval": stats.rank_correlation_interval(self.spearman, self.n, "spearman"),
                "interval": stats.INTERVAL_METHOD, "k": self.k,
                "top_k_overlap": self.top_overlap, "bottom_k_overlap": self.bottom_overlap,
                "moved": self.moved.to_dicts()}


def contrast(a: pl.DataFrame, b: pl.DataFrame, on: str = "token_id", k: int = 100, n_moved: int = 20,
             labels: tuple[str, str] = ("a", "b")) -> Contrast:
    """``a``, ``b``: one prompt's rows each (``on`` column, ``score``, ``decoded``). Joined on ``token_id`` (same
    tokenizer) or on ``string`` (use `unique_strings` first for different tokenizers)."""
    la, lb = labels
    keep = [on, "score"] + (["decoded"] if "decoded" in a.columns and on != "decoded" else [])
    j = a.select(keep).rename({"score": la}).join(b.select(on, pl.col("score").alias(lb)), on=on, how="inner")
    n = j.height
    ra = stats.descending_ranks(j[la].to_numpy())
    rb = stats.descending_ranks(j[lb].to_numpy())
    j = j.with_columns(pl.Series(f"{la}_rank", ra), pl.Series(f"{lb}_rank", rb), pl.Series("rank_change", rb - ra))
    kk = max(1, min(k, n // 2))  # the top and bottom k are disjoint: on 5 strings, k = 2, not the same 5 twice
    top = len(set(np.argsort(ra, kind="stable")[:kk]) & set(np.argsort(rb, kind="stable")[:kk])) / kk
    bottom = len(set(np.argsort(-ra, kind="stable")[:kk]) & set(np.argsort(-rb, kind="stable")[:kk])) / kk
    moved = pl.concat([j.sort("rank_change", descending=True).head(n_moved), j.sort("rank_change").head(n_moved)])
    return Contrast(n, stats.kendall_tau_b(j[la], j[lb]), stats.spearman(j[la], j[lb]), top, bottom, kk, moved)


def contrast_strings(a: pl.DataFrame, b: pl.DataFrame, mode: str = "exact", **kw) -> Contrast:
    """Different tokenizers: compare on the strings each has as exactly one id."""
    ua = unique_strings(a, mode).rename({"string": "decoded"})
    ub = unique_strings(b, mode).rename({"string": "decoded"})
    return contrast(ua, ub, on="decoded", **kw)
