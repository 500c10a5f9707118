"""Rank agreement, embedding, permutation tests and least squares, each small and checked against scipy or a
hand computation in tests/unit/test_stats.py."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy import stats


def descending_ranks(values) -> np.ndarray:
    """Rank 1 = the highest value; tied values share the average of their ranks (as Kendall's tau-b and
    Spearman treat ties, and as the follow-up paper's ``rank(-score)`` in R does). The one rank rule of the
    analyses and reports."""
    from scipy.stats import rankdata

    return rankdata(-np.asarray(values, dtype=float), method="average")


def _constant(x, y) -> bool:
    """A constant ranking agrees with nothing: its correlations are undefined (NaN, without scipy's warning)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return bool(a.size < 2 or b.size < 2 or np.ptp(a) == 0 or np.ptp(b) == 0)


def kendall_tau_b(x, y) -> float:
    return float("nan") if _constant(x, y) else float(stats.kendalltau(x, y, variant="b").statistic)


def spearman(x, y) -> float:
    return float("nan") if _constant(x, y) else float(stats.spearmanr(x, y).statistic)


# Fisher's z of a rank correlation has variance c / (n - d) (Fieller, Hartley & Pearson 1957): Kendall's tau
# 0.437 / (n - 4), Spearman's rho 1.06 / (n - 3)
FISHER_Z = {"kendall": (0.437, 4), "spearman": (1.06, 3)}
INTERVAL_METHOD = ("95% Fisher-z interval: atanh(r) +- 1.96 sd, sd = sqrt(0.437 / (n - 4)) for Kendall's tau-b, "
                   "sqrt(1.06 / (n - 3)) for Spearman (Fieller, Hartley & Pearson 1957)")


def rank_correlation_interval(r: float, n: int, kind: str = "kendall", level: float = 0.95) -> list[float] | None:
    """The Fisher-z confidence interval of a rank correlation ``r`` over ``n`` items (see ``FISHER_Z``); None where
    n is too small for one (n <= 4 for tau, n <= 3 for rho) or r is undefined. At |r| = 1 the interval is the point
    itself: only n says how little a perfect agreement of a few items means."""
    c, d = FISHER_Z[kind]
    if n <= d or not np.isfinite(r):
        return None
    if abs(r) >= 1.0:
        return [float(r), float(r)]
    half = stats.norm.ppf(0.5 + level / 2) * np.sqrt(c / (n - d))
    z = np.arctanh(r)
    return [float(np.tanh(z - half)), float(np.tanh(z + half))]


def rbo(scores_a, scores_b, p: float = 0.9, bottom: bool = False) -> float:
    """Extrapolated rank-biased overlap (Webber, Moffat & Zobel 2010, eq. 32) of two rankings of the same items,
    given as score arrays aligned by item (higher = better; ``bottom=True`` ranks from the worst end).

    RBO_ext = (X_k / k) p^k + (1 - p) / p * sum_{d=1..k} (X_d / d) p^d, with X_d the overlap of the top-d sets
    and k the number of items. Ties are broken by item order (stable sort).
    """
    a, b = np.asarray(scores_a, dtype=float), np.asarray(scores_b, dtype=float)
    if a.shape != b.shape or a.ndim != 1 or a.size == 0:
        raise ValueError("rbo needs two non-empty score arrays of the same length")
    if not 0 < p < 1:
        raise ValueError("p must be in (0, 1)")
    sign = 1.0 if bottom else -1.0
    rank_a = np.empty(a.size, dtype=np.int64)
    rank_b = np.empty(a.size, dtype=np.int64)
    rank_a[np.argsort(sign * a, kind="stable")] = np.arange(1, a.size + 1)
    rank_b[np.argsort(sign * b, kind="stable")] = np.arange(1, b.size + 1)
    # an item is in both top-d sets from depth max(rank_a, rank_b) on
    k = a.size
    overlap = np.cumsum(np.bincount(np.maximum(rank_a, rank_b), minlength=k + 1)[1:])  # X_1..X_k
    d = np.arange(1, k + 1)
    weights = p ** d
    return float(overlap[-1] / k * p**k + (1 - p) / p * np.sum(overlap / d * weights))


def matrix(columns: list[np.ndarray], fn) -> np.ndarray:
    n = len(columns)
    out = np.eye(n)
    for i, j in itertools.combinations(range(n), 2):
        out[i, j] = out[j, i] = fn(columns[i], columns[j])
    return out


def classical_mds(dist: np.ndarray, k: int = 2) -> np.ndarray:
    """Torgerson's classical multidimensional scaling of a symmetric distance matrix."""
    d2 = np.asarray(dist, dtype=float) ** 2
    n = d2.shape[0]
    j = np.eye(n) - np.ones((n, n)) / n
    b = -0.5 * j @ d2 @ j
    vals, vecs = np.linalg.eigh(b)
    order = np.argsort(vals)[::-1][:k]
    return vecs[:, order] * np.sqrt(np.clip(vals[order], 0, None))


@dataclass(frozen=True)
class GroupTest:
    statistic: float  # mean similarity of same-group pairs minus mean of different-group pairs
    p_value: float  # one-sided: same-group pairs agree more
    n_permutations: int
    exact: bool


def group_permutation_test(sim: np.ndarray, groups: list[str], n_perm: int = 10_000, seed: int = 0) -> GroupTest:
    """Do pairs of models in the same group agree more than pairs in different groups? Permutes the group labels
    over models (all distinct relabellings when there are at most ``n_perm`` of them, else random ones)."""
    groups = list(groups)
    n = len(groups)
    iu = np.triu_indices(n, 1)
    vals = np.asarray(sim)[iu]

    def stat(labels) -> float:
        lab = np.asarray(labels)
        same = lab[iu[0]] == lab[iu[1]]
        if same.all() or not same.any():
            return np.nan
        return float(vals[same].mean() - vals[~same].mean())

    observed = stat(groups)
    if _n_arrangements(groups) <= n_perm:
        null = np.array([stat(p) for p in _arrangements(groups)])
        exact = True
    else:
        rng = np.random.default_rng(seed)
        null = np.array([stat(rng.permutation(groups)) for _ in range(n_perm)])
        exact = False
    null = null[~np.isnan(null)]
    p = float((np.sum(null >= observed - 1e-12) + (0 if exact else 1)) / (len(null) + (0 if exact else 1)))
    return GroupTest(observed, p, len(null), exact)


def _arrangements(groups: list[str]):
    """Every distinct relabelling of ``groups`` (multiset permutations), without generating n! tuples."""
    labels = sorted(set(groups))
    counts = [groups.count(lab) for lab in labels]

    def fill(slots: tuple[int, ...], i: int, out: list):
        if i == len(labels) - 1:
            for pos in slots:
                out[pos] = labels[i]
            yield tuple(out)
            return
        for chosen in itertools.combinations(slots, counts[i]):
            for pos in chosen:
                out[pos] = labels[i]
            rest = tuple(s for s in slots if s not in chosen)
            yield from fill(rest, i + 1, out)

    yield from fill(tuple(range(len(groups))), 0, [None] * len(groups))


def _n_arrangements(groups: list[str]) -> int:
    from collections import Counter
    from math import factorial

    out = factorial(len(groups))
    for c in Counter(groups).values():
        out //= factorial(c)
    return out


def rsa(observed: np.ndarray, hypothesis: np.ndarray, n_perm: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """Representational similarity: Kendall tau-b between the upper triangles of two model-by-model matrices,
    with a permutation p-value (models relabelled in the hypothesis matrix)."""
    n = observed.shape[0]
    iu = np.triu_indices(n, 1)
    tau = kendall_tau_b(observed[iu], hypothesis[iu])
    rng = np.random.default_rng(seed)
    null = []
    for _ in range(n_perm):
        perm = rng.permutation(n)
        null.append(kendall_tau_b(observed[iu], hypothesis[np.ix_(perm, perm)][iu]))
    null = np.nan_to_num(np.array(null), nan=0.0)
    return tau, float((np.sum(null >= tau - 1e-12) + 1) / (n_perm + 1))


@dataclass(frozen=True)
class OLS:
    names: tuple[str, ...]
    coef: np.ndarray
    se: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    p: np.ndarray
    r2: float
    n: int

    def row(self, name: str) -> dict:
        i = self.names.index(name)
        return {"estimate": float(self.coef[i]), "se": float(self.se[i]), "ci_low": float(self.ci_low[i]),
                "ci_high": float(self.ci_high[i]), "p": float(self.p[i]), "r2": self.r2, "n": self.n}


def ols(y, columns: dict[str, np.ndarray], level: float = 0.95) -> OLS:
    """Ordinary least squares with an intercept; classical standard errors and t-based confidence intervals."""
    y = np.asarray(y, dtype=float)
    names = ("intercept", *columns)
    x = np.column_stack([np.ones_like(y), *[np.asarray(c, dtype=float) for c in columns.values()]])
    n, k = x.shape
    if n <= k:
        raise ValueError(f"ols needs more observations ({n}) than coefficients ({k})")
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    dof = n - k
    sigma2 = resid @ resid / dof
    cov = sigma2 * np.linalg.pinv(x.T @ x)
    se = np.sqrt(np.diag(cov))
    t = stats.t.ppf(0.5 + level / 2, dof)
    with np.errstate(divide="ignore", invalid="ignore"):
        pvals = 2 * stats.t.sf(np.abs(coef / se), dof)
    tss = np.sum((y - y.mean()) ** 2)
    r2 = float(1 - resid @ resid / tss) if tss > 0 else float("nan")
    return OLS(names, coef, se, coef - t * se, coef + t * se, pvals, r2, n)


def welch_t(a, b) -> float:
    """Welch's t statistic of two samples (unequal variances; the default of R's t.test and MKinfer's
    perm.t.test)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    se = np.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)
    return float((a.mean() - b.mean()) / se) if se > 0 else 0.0


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjustment of ``pvalues`` (one family of tests): the k-th smallest p times (m - k + 1),
    made monotone, capped at 1; in the input's order. Controls the family-wise error rate as Bonferroni does,
    never less powerful."""
    p = np.asarray(pvalues, dtype=np.float64)
    m = p.size
    if m == 0:
        return p
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = adjusted
    return out
