"""Each coefficient and interval rm-probe reports against its textbook value (issue 74): a published worked example
or scipy, at small n, with ties and with missing cells, and which variance each interval uses. The expected values
are computed here from the formulas, written out, never from the code under test."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
from scipy import stats as sps

from probe.analysis import stats

Z975 = 1.959963984540054  # the standard normal's 97.5% point


def fisher_z(r: float, n: int, c: float, d: int, z: float = Z975) -> list[float]:
    """tanh(atanh(r) -+ z sqrt(c / (n - d))): Fieller, Hartley & Pearson (1957) give c/d = 0.437/4 for Kendall's
    tau and 1.06/3 for Spearman's rho (Pearson's r would be 1/3)."""
    half = z * math.sqrt(c / (n - d))
    return [math.tanh(math.atanh(r) - half), math.tanh(math.atanh(r) + half)]


def test_tau_b_and_spearman_equal_scipys_worked_examples_with_ties():
    """scipy.stats.kendalltau's and spearmanr's documented examples (both with ties), and a tau-b by hand: 5 items,
    x tied in one pair and y in another (n0 = 10, n1 = n2 = 1), 2 concordant and 6 discordant pairs."""
    assert stats.kendall_tau_b([12, 2, 1, 12, 2], [1, 4, 7, 1, 0]) == pytest.approx(-0.47140452079103173, abs=1e-15)
    assert stats.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(0.8207826816681233, abs=1e-15)
    # by hand: pairs (12,1) (2,4) (1,7) (12,1) (2,0): C = 2, D = 6, a tie in x (2, 2) and one in both (12, 12)
    x, y = [12, 2, 1, 12, 2], [1, 4, 7, 1, 0]
    c = d = 0
    tx = ty = 0
    for i in range(5):
        for j in range(i + 1, 5):
            s = np.sign(x[i] - x[j]) * np.sign(y[i] - y[j])
            c, d = c + (s > 0), d + (s < 0)
            tx, ty = tx + (x[i] == x[j]), ty + (y[i] == y[j])
    assert (c, d, tx, ty) == (2, 6, 2, 1)
    assert stats.kendall_tau_b(x, y) == pytest.approx((c - d) / math.sqrt((10 - tx) * (10 - ty)), abs=1e-15)
    # Spearman with ties is Pearson's r of the average ranks
    rx, ry = sps.rankdata([1, 2, 3, 4, 5]), sps.rankdata([5, 6, 7, 8, 7])
    assert stats.spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(np.corrcoef(rx, ry)[0, 1], abs=1e-15)


@pytest.mark.parametrize("kind, c, d", [("kendall", 0.437, 4), ("spearman", 1.06, 3)])
def test_fisher_z_intervals_use_fieller_hartley_and_pearsons_variance(kind, c, d):
    """The interval of each coefficient at a small n, at another level, at the smallest n that has one, and none
    below it; not Pearson's variance 1 / (n - 3), and the two-sided point of the normal (1.96 at 95%)."""
    for r, n in ((0.5, 20), (-0.31, 7), (0.9, d + 1)):
        got = stats.rank_correlation_interval(r, n, kind)
        assert got == pytest.approx(fisher_z(r, n, c, d), abs=1e-12), (r, n)
        assert got != pytest.approx(fisher_z(r, n, 1.0, 3), abs=1e-3)  # Pearson's variance
        assert got != pytest.approx(fisher_z(r, n, c, d, sps.norm.ppf(0.95)), abs=1e-3)  # a one-sided point
    assert stats.rank_correlation_interval(0.5, 20, kind, level=0.9) == pytest.approx(
        fisher_z(0.5, 20, c, d, sps.norm.ppf(0.95)), abs=1e-12)
    assert stats.rank_correlation_interval(0.5, d, kind) is None  # n - d = 0: no variance
    assert stats.rank_correlation_interval(float("nan"), 50, kind) is None
    assert stats.rank_correlation_interval(1.0, 8, kind) == [1.0, 1.0]
    assert stats.rank_correlation_interval(-1.0, 8, kind) == [-1.0, -1.0]
    assert "0.437 / (n - 4)" in stats.INTERVAL_METHOD and "1.06 / (n - 3)" in stats.INTERVAL_METHOD


TABLE = """elo_rank,elo_score,name,elo_matches,m1,m2
1,2000,a,5,3.0,1.0
2,1990,b,5,,2.0
3,1980,c,5,2.0,
4,1970,d,5,1.0,0.5
5,1960,e,5,0.5,3.0
6,1950,f,5,0.2,0.1
7,1940,g,5,0.1,0.2
8,1930,h,5,0.15,0.2
9,1920,i,5,0.15,-1.0
"""


def test_misalignment_over_a_table_with_empty_cells_counts_the_complete_items(tmp_path, capsys):
    """Two empty cells (b's m1, c's m2): the 7 items every column scores are the items; each tau-b is scipy's over
    them (ties included: h and i share m1, g and h share m2), and its interval is over n = 7, not the 9 rows."""
    from probe.analysis.misalignment import misalignment
    from probe.commands.analyze import main as analyze

    (tmp_path / "t.csv").write_text(TABLE)
    full = pl.read_csv(tmp_path / "t.csv")
    complete = full.drop_nulls(["elo_score", "m1", "m2"])
    assert complete.height == 7
    res = misalignment(full, "elo_score", ["m1", "m2"])
    assert res.items["name"].to_list() == complete["name"].to_list()
    for m in ("m1", "m2"):
        want = sps.kendalltau(complete["elo_score"], complete[m], variant="b").statistic
        assert res.tau_human[m] == pytest.approx(want, abs=1e-15)
    # the centre rank: the median of the two models' average ranks, minus the human rank
    rank = lambda v: sps.rankdata(-np.asarray(v, float))  # noqa: E731
    mid = np.median([rank(complete["m1"]), rank(complete["m2"])], axis=0)
    np.testing.assert_allclose(res.items["rank_diff"].to_numpy(), mid - rank(complete["elo_score"]))
    assert analyze(["misalignment", "--table", str(tmp_path / "t.csv"), "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    summary = json.loads((tmp_path / "o" / "misalignment.json").read_text())
    assert summary["n_items"] == 7
    for m in ("m1", "m2"):
        tau = summary["kendall_tau_human"][m]
        assert tau == pytest.approx(res.tau_human[m], abs=1e-15)
        assert summary["kendall_tau_human_interval"][m] == pytest.approx(fisher_z(tau, 7, 0.437, 4), abs=1e-12), m


def test_contrast_gives_each_coefficient_its_own_interval_over_the_strings_both_rank():
    """12 strings in a, 10 of them in b (joined on the token), with ties: tau-b's interval has Kendall's variance
    and rho's Spearman's, both over n = 10."""
    from probe.analysis.contrast import contrast
    from tests.fake_runs import fake_vocab

    va, vb = fake_vocab([f"w{i}" for i in range(12)]), fake_vocab([f"w{i}" for i in range(10)])
    sa = [5.0, 4.0, 4.0, 3.0, 2.5, 2.0, 1.0, 0.5, 0.0, -1.0, 9.0, -9.0]
    sb = [3.0, 5.0, 4.0, 4.0, 0.0, 2.0, 1.0, -1.0, 0.5, 0.5]
    res = contrast(va.with_columns(pl.Series("score", sa)), vb.with_columns(pl.Series("score", sb)), k=3)
    tau = sps.kendalltau(sa[:10], sb).statistic
    rho = sps.spearmanr(sa[:10], sb).statistic
    assert res.n == 10
    assert res.kendall == pytest.approx(tau, abs=1e-15) and res.spearman == pytest.approx(rho, abs=1e-15)
    js = res.to_json()
    assert js["kendall_tau_b_interval"] == pytest.approx(fisher_z(tau, 10, 0.437, 4), abs=1e-12)
    assert js["spearman_interval"] == pytest.approx(fisher_z(rho, 10, 1.06, 3), abs=1e-12)


def test_the_response_findings_spearman_interval_over_ties_in_length():
    """Score against length over 12 responses whose lengths tie (1 to 4 tokens, three each): scipy's rho and its
    interval with Spearman's variance over n = 12, as the page's sentence prints them."""
    from probe.report.audit import response_findings

    n_tokens = [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    score = [-1.0, -3.0, 0.5, -2.0, -2.5, -6.0, -4.0, -3.5, -7.0, -5.0, -8.0, 1.0]
    df = pl.DataFrame({"prompt_key": ["p"] * 12, "response": [f"r{i}" for i in range(12)], "n_tokens": n_tokens,
                       "score": score}).with_columns(
        pl.col("score").rank("min", descending=True).cast(pl.Int64).alias("rank"))
    rho = sps.spearmanr(n_tokens, score).statistic
    lo, hi = fisher_z(rho, 12, 1.06, 3)
    line = response_findings(df, {"score": {"mode": "reward"}})[1]
    assert f"Spearman {rho:+.2f} (95% interval {lo:+.2f} to {hi:+.2f}, Fisher z) over 12 responses" in line, line
    assert fisher_z(rho, 12, 0.437, 4) != pytest.approx([lo, hi], abs=0.01)  # the printed digits tell them apart


def test_exactly_two_responses_have_no_length_correlation():
    """Over two responses of different lengths rho is -1 or +1 whatever the model does: no sentence claims it."""
    from probe.report.audit import response_findings

    df = pl.DataFrame({"prompt_key": ["p", "p"], "response": ["yes", "no thanks"], "n_tokens": [1, 2],
                       "score": [1.0, 0.0], "rank": [1, 2]})
    lines = response_findings(df, {"score": {"mode": "reward"}})
    assert not any("Spearman" in x for x in lines), lines
    assert lines[0].startswith("All 2 responses, best first: 'yes', 'no thanks'")


def test_bootstrap_interval_is_the_percentile_bootstrap_of_the_mean():
    """The social metrics' interval: resample the n items with replacement, take each resample's mean, and the
    2.5th and 97.5th percentiles of those means; written out here as a loop over the same generator. Where one
    item of 20 is a 1, a resample holds it with probability 1 - 0.95^20 = 0.64: the upper end is at least 1/20
    (an interval that never draws the last item would be [0, 0])."""
    from probe.social.metrics import bootstrap_ci

    values = np.array([1.0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1])
    for n, level, seed in ((1000, 0.95, 0), (400, 0.9, 7)):
        rng = np.random.default_rng(seed)
        means = []
        for _ in range(n):
            idx = rng.integers(0, values.size, size=values.size)
            means.append(values[idx].mean())
        want = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
        assert bootstrap_ci(values, n=n, level=level, seed=seed) == pytest.approx(tuple(want), abs=1e-15)
    lo, hi = bootstrap_ci(np.array([0.0] * 19 + [1.0]))
    assert lo == 0.0 and hi >= 1 / 20
    assert all(math.isnan(x) for x in bootstrap_ci(np.array([])))
    # against the exact bootstrap distribution: 13 draws of a 0/1 item with p = 8/13 (a binomial), whose 2.5% and
    # 97.5% points the 1,000 resamples' percentiles fall within one lattice step (1/13) of
    exact = sps.binom(13, 8 / 13)
    lo, hi = bootstrap_ci(values)
    assert abs(lo - exact.ppf(0.025) / 13) <= 1 / 13 and abs(hi - exact.ppf(0.975) / 13) <= 1 / 13


def test_ols_on_the_textbook_five_points():
    """y = 2, 4, 5, 4, 5 on x = 1..5: slope 0.6, intercept 2.2, SSE 2.4 on 3 degrees of freedom (sigma^2 0.8),
    Sxx 10, se(slope) = sqrt(0.08), the t interval with 3 degrees of freedom, R^2 = 1 - 2.4 / 6."""
    fit = stats.ols(np.array([2.0, 4, 5, 4, 5]), {"x": np.arange(1.0, 6.0)})
    row = fit.row("x")
    se = math.sqrt(0.8 / 10)
    t3 = 3.182446305284263  # t(0.975, 3)
    assert row["estimate"] == pytest.approx(0.6, abs=1e-12) and fit.row("intercept")["estimate"] == pytest.approx(2.2)
    assert row["se"] == pytest.approx(se, abs=1e-12)
    assert row["ci_low"] == pytest.approx(0.6 - t3 * se, abs=1e-9) and row["ci_high"] == pytest.approx(0.6 + t3 * se,
                                                                                                          abs=1e-9)
    assert row["p"] == pytest.approx(2 * sps.t.sf(0.6 / se, 3), abs=1e-12)
    assert row["r2"] == pytest.approx(0.6, abs=1e-12) and row["n"] == 5
    # intercept: se = sqrt(sigma^2 (1/n + xbar^2 / Sxx)) = sqrt(0.8 (0.2 + 0.9))
    assert fit.row("intercept")["se"] == pytest.approx(math.sqrt(0.8 * 1.1), abs=1e-12)
    with pytest.raises(ValueError):
        stats.ols(np.array([1.0, 2.0]), {"x": np.array([0.0, 1.0])})  # 2 points, 2 coefficients: no residual
