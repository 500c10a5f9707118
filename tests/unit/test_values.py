"""Value dictionaries on the follow-up paper's released Big Two scores (../shared/data/values-release): rm-probe's
median ranks equal an independent computation, and the per-base-model summary equals the published numbers."""

from __future__ import annotations

import csv
import os
import statistics
from pathlib import Path

import polars as pl
import pytest

from probe.analysis import values as v

RELEASE = Path(os.environ.get("RM_PROBE_VALUES_RELEASE")
               or Path(__file__).resolve().parents[3] / "shared" / "data" / "values-release")


@pytest.fixture(scope="module")
def release():
    assert (RELEASE / "dict_big2_nouns.csv").is_file(), (
        f"the follow-up's data release is expected at {RELEASE}; set RM_PROBE_VALUES_RELEASE to its folder")
    return RELEASE


def _average_ranks(scores: list[float]) -> list[float]:
    """rank(-score) with average ties, as R computes it, written out."""
    out = []
    for s in scores:
        higher = sum(1 for t in scores if t > s)
        equal = sum(1 for t in scores if t == s)
        out.append(higher + (equal + 1) / 2)
    return out


def test_median_ranks_equal_an_independent_computation(release):
    with open(release / "dict_big2_nouns.csv", newline="") as fh:
        category = {row["token_decoded"]: row["Category"] for row in csv.DictReader(fh)}
    got = v.median_ranks(v.ranked(v.read_scores([release / "big2_nouns"]),
                                  v.read_dictionary(release / "dict_big2_nouns.csv")))
    got = {(r["model"], r["prompt"], r["category"]): r["median_rank"] for r in got.iter_rows(named=True)}
    n = 0
    for path in sorted((release / "big2_nouns").glob("*.csv")):
        model = path.stem.removeprefix("big2_rewards_")
        with open(path, newline="") as fh:
            rows = [r for r in csv.DictReader(fh) if r["response"] in category]
        for prompt in [c for c in rows[0] if c != "response"]:
            ranks = _average_ranks([float(r[prompt]) for r in rows])
            for cat in ("Agency", "Communion"):
                mine = statistics.median(rk for rk, r in zip(ranks, rows) if category[r["response"]] == cat)
                assert got[model, prompt, cat] == pytest.approx(mine), (model, prompt, cat)
                n += 1
    assert n == 10 * 54 * 2 == len(got)


def test_base_model_summary_equals_the_published_avg_ranks(release):
    ranks = v.ranked(v.read_scores([release / "big2_nouns"]), v.read_dictionary(release / "dict_big2_nouns.csv"))
    s = {(r["framing"], r["category"], r["base_model"]): r["mean_rank"]
         for r in v.base_model_summary(ranks).iter_rows(named=True)}
    # the follow-up's "avg ranks" block on these tables (positive framing): Agency 132.5 Gemma vs 128.29 Llama,
    # Communion 131.0 vs 135.58
    assert s["positive", "Agency", "Gemma"] == pytest.approx(132.5)
    assert s["positive", "Agency", "Llama"] == pytest.approx(128.29, abs=0.005)
    assert s["positive", "Communion", "Gemma"] == pytest.approx(131.0)
    assert s["positive", "Communion", "Llama"] == pytest.approx(135.58, abs=0.005)


def test_permutation_tests_and_the_figure(release, tmp_path):
    medians = v.median_ranks(v.ranked(v.read_scores([release / "big2_nouns"]),
                                      v.read_dictionary(release / "dict_big2_nouns.csv")))
    tests = v.permutation_tests(medians, n_perm=199)
    assert len(tests) == 4 and all(t.groups == ("Gemma", "Llama") for t in tests)
    assert all(t.p_bonferroni == pytest.approx(min(1.0, 4 * t.p)) for t in tests)
    # Holm by hand: the k-th smallest p times 4 - k + 1, each at least the one before it, at most 1
    holm, last = {}, 0.0
    for k, t in enumerate(sorted(tests, key=lambda t: t.p)):
        last = holm[t.category, t.framing] = min(1.0, max(last, (4 - k) * t.p))
    assert all(t.p_holm == pytest.approx(holm[t.category, t.framing]) and t.n_tests == 4 for t in tests)
    assert all(t.p <= 0.01 for t in tests)  # the follow-up's four panels all differ between base models
    shuffled = medians.with_columns(pl.col("base_model").shuffle(seed=1))
    assert max(t.p for t in v.permutation_tests(shuffled, n_perm=199)) > 0.05  # no signal, no star
    v.values_figure(medians, tests, tmp_path / "fig.png")
    assert (tmp_path / "fig.png").stat().st_size > 10_000


def test_mfd_dictionary_ten_columns_or_the_published_pivot(release, tmp_path):
    dicx = release / "moral-foundations-dictionary-20.dicx"
    full = v.read_dictionary(dicx)
    published = v.read_dictionary(dicx, published_pivot=True)
    assert full.height == 2040 and sorted(set(full["category"])) == sorted(v.FOUNDATIONS)
    dropped = full.join(published, on=["term", "category"], how="anti")
    assert dropped.height == 388 and set(dropped["category"]) == {"Sanctity"}  # the Sanctity_Vice terms
    (tmp_path / "bad.csv").write_text("word,score\nx,1\n")
    with pytest.raises(Exception, match="expected the Big Two nouns CSV"):
        v.read_dictionary(tmp_path / "bad.csv")
