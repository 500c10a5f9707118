"""Statistics against scipy and hand computations on data made for the test."""

import itertools

import numpy as np
import pytest
from scipy import stats as sps

from probe.analysis import stats


def test_kendall_tau_b_with_ties_by_hand():
    x = [1, 2, 2, 3]
    y = [1, 3, 2, 2]
    # pairs: (0,1) C, (0,2) C, (0,3) C, (1,2) tie in x, (1,3) D, (2,3) tie in y -> C=3, D=1
    # n0 = 6, ties x: 1 pair, ties y: 1 pair -> tau_b = (3-1)/sqrt((6-1)(6-1)) = 0.4
    assert stats.kendall_tau_b(x, y) == pytest.approx(0.4)
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 5, 200), rng.integers(0, 5, 200)
    assert stats.kendall_tau_b(a, b) == pytest.approx(sps.kendalltau(a, b).statistic)
    assert stats.spearman(a, b) == pytest.approx(sps.spearmanr(a, b).statistic)


def _rbo_brute(a, b, p, bottom=False):
    order = (lambda s: np.argsort(s, kind="stable")) if bottom else (lambda s: np.argsort(-s, kind="stable"))
    ra, rb = list(order(np.asarray(a, float))), list(order(np.asarray(b, float)))
    k = len(ra)
    total = 0.0
    for d in range(1, k + 1):
        x = len(set(ra[:d]) & set(rb[:d]))
        total += x / d * p**d
    x_k = len(set(ra) & set(rb))
    return x_k / k * p**k + (1 - p) / p * total


def test_rbo_by_hand_and_brute_force():
    # items A, B, C scored so that ranking a = A B C and b = A C B: X = 1, 1, 3
    a, b = [3, 2, 1], [3, 1, 2]
    want = 0.729 + (0.1 / 0.9) * (0.9 + 0.81 / 2 + 0.729)
    assert stats.rbo(a, b, 0.9) == pytest.approx(want)
    assert stats.rbo(a, a, 0.9) == pytest.approx(1.0)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x, y = rng.normal(size=60), rng.normal(size=60)
        assert stats.rbo(x, y, 0.9) == pytest.approx(_rbo_brute(x, y, 0.9))
        assert stats.rbo(x, y, 0.8, bottom=True) == pytest.approx(_rbo_brute(x, y, 0.8, bottom=True))
    assert stats.rbo(x, -x, 0.9) < 0.2


def test_classical_mds_recovers_planar_distances():
    rng = np.random.default_rng(2)
    pts = rng.normal(size=(7, 2))
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    emb = stats.classical_mds(d, 2)
    d2 = np.linalg.norm(emb[:, None] - emb[None], axis=-1)
    np.testing.assert_allclose(d2, d, atol=1e-8)


def test_group_permutation_test_exact_by_hand():
    # 4 models, groups A A B B; same-group pairs (0,1), (2,3); sim high within groups
    sim = np.array([[1, .9, .1, .2], [.9, 1, .3, .1], [.1, .3, 1, .8], [.2, .1, .8, 1]])
    res = stats.group_permutation_test(sim, ["A", "A", "B", "B"])
    same, diff = (0.9 + 0.8) / 2, (0.1 + 0.2 + 0.3 + 0.1) / 4
    assert res.statistic == pytest.approx(same - diff)
    # 6 distinct labelings: AABB and BBAA give the observed split (the best one); p = 2/6
    assert res.exact and res.n_permutations == 6
    assert res.p_value == pytest.approx(2 / 6)
    arr = list(stats._arrangements(["x", "y", "x", "z"]))
    assert len(arr) == len(set(arr)) == 12 and set(arr) == set(itertools.permutations(["x", "y", "x", "z"]))


def test_ols_matches_scipy_and_known_coefficients():
    rng = np.random.default_rng(3)
    x = rng.normal(size=100)
    y = 2.0 + 0.5 * x + rng.normal(scale=0.3, size=100)
    fit = stats.ols(y, {"x": x})
    ref = sps.linregress(x, y)
    row = fit.row("x")
    assert row["estimate"] == pytest.approx(ref.slope)
    assert row["se"] == pytest.approx(ref.stderr)
    assert row["p"] == pytest.approx(ref.pvalue)
    t = sps.t.ppf(0.975, 98)
    assert row["ci_low"] == pytest.approx(ref.slope - t * ref.stderr)
    assert fit.r2 == pytest.approx(ref.rvalue**2)
    z = rng.normal(size=100)
    exact = stats.ols(1 + 3 * x - 2 * z, {"x": x, "z": z})
    np.testing.assert_allclose(exact.coef, [1, 3, -2], atol=1e-10)


def test_rsa_detects_a_matching_hypothesis():
    # 5 + 5 models: the smallest attainable permutation p is 5!5!2/10! = 0.008 (3 + 3 would give 0.1)
    groups = np.array([0] * 5 + [1] * 5)
    hyp = (groups[:, None] == groups[None]).astype(float)
    obs = hyp * 0.6 + 0.2 + np.random.default_rng(4).normal(scale=0.05, size=(10, 10))
    obs = (obs + obs.T) / 2
    tau, p = stats.rsa(obs, hyp, n_perm=500)
    assert tau > 0.5 and p < 0.05


def test_welch_t_equals_scipy_unequal_variances_and_by_hand():
    a, b = [1.0, 2.0, 4.0, 7.0], [3.0, 3.5, 4.0, 4.5, 5.0, 9.0, 10.0]
    # by hand: means 3.5 and 5.571428..., sample variances (n - 1) 7.0 and 7.452380...
    se = np.sqrt(7.0 / 4 + np.var(b, ddof=1) / 7)
    assert stats.welch_t(a, b) == pytest.approx((3.5 - np.mean(b)) / se)
    assert stats.welch_t(a, b) == pytest.approx(sps.ttest_ind(a, b, equal_var=False).statistic)
    # the data tell Welch from a pooled (Student) t and from population variances
    assert stats.welch_t(a, b) != pytest.approx(sps.ttest_ind(a, b, equal_var=True).statistic, rel=1e-3)
    pop = (3.5 - np.mean(b)) / np.sqrt(np.var(a) / 4 + np.var(b) / 7)
    assert stats.welch_t(a, b) != pytest.approx(pop, rel=1e-3)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x, y = rng.normal(0, 1, rng.integers(3, 30)), rng.normal(0.5, 3, rng.integers(3, 30))
        assert stats.welch_t(x, y) == pytest.approx(sps.ttest_ind(x, y, equal_var=False).statistic)


def test_descending_ranks_share_the_average_rank_of_a_tie():
    # 3, 3, 3 hold ranks 1-3 (average 2), then 2 (rank 4), then 1 (rank 5); min ties would give 1, 1, 1
    np.testing.assert_array_equal(stats.descending_ranks([3, 1, 3, 2, 3]), [2, 5, 2, 4, 2])
    np.testing.assert_array_equal(stats.descending_ranks([0.5, 0.9, 0.5, -1.0]), [2.5, 1, 2.5, 4])


def test_holm_by_hand():
    """Holm's step-down on four p-values, worked by hand: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 =
    0.02, 0.03, 0.06, 0.04, made monotone: 0.02, 0.03, 0.06, 0.06; back in the input's order; capped at 1."""
    from probe.analysis.stats import holm

    assert holm([0.01, 0.04, 0.03, 0.005]).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]).tolist() == pytest.approx([1.0, 1.0])
    assert holm([]).size == 0
