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
    (ta, ba), (tb, bb) = ends(ra, kk), ends(rb, kk)
    top, bottom = len(ta & tb) / kk, len(ba & bb) / kk
    # the largest falls (rank_change > 0), then the largest rises (< 0): a string in at most one half, never one
    # that did not move (on 10 strings with n_moved 10, each half listed all 10)
    change = pl.col("rank_change")
    moved = pl.concat([j.filter(change > 0).sort("rank_change", descending=True, maintain_order=True).head(n_moved),
                       j.filter(change < 0).sort("rank_change", maintain_order=True).head(n_moved)])
    return Contrast(n, stats.kendall_tau_b(j[la], j[lb]), stats.spearman(j[la], j[lb]), top, bottom, kk, moved)


def ends(ranks: np.ndarray, k: int) -> tuple[set[int], set[int]]:
    """The positions of the ``k`` best and the ``k`` worst ``ranks`` (1 = best), both ends of one order (ties in
    position order), so disjoint for k <= n/2. Two stable sorts, of the ranks and of their negatives, keep tied strings
    in the same order, so their first k could be the same strings (every string tied: top k = bottom k)."""
    order = np.argsort(ranks, kind="stable")
    return set(order[:k].tolist()), set(order[::-1][:k].tolist())


def contrast_strings(a: pl.DataFrame, b: pl.DataFrame, mode: str = "exact", **kw) -> Contrast:
    """Different tokenizers: compare on the strings each has as exactly one id."""
    ua = unique_strings(a, mode).rename({"string": "decoded"})
    ub = unique_strings(b, mode).rename({"string": "decoded"})
    return contrast(ua, ub, on="decoded", **kw)
