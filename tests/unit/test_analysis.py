"""Analyses on fake sweeps with planted effects: the statistics must recover what was planted."""

import json
import math

import numpy as np
import polars as pl
import pytest
from wordfreq import word_frequency

from probe.analysis.contrast import contrast
from probe.analysis.lexicons import read_bnc, valence
from probe.analysis.misalignment import identity_ranks, identity_terms, misalignment
from probe.analysis.regressions import exposure_slopes, framing_slopes
from probe.analysis.sweeps import load_sweep, shared_vocabulary, unique_strings
from probe.commands.analyze import main as analyze_main
from tests.fake_runs import fake_vocab, hashed_score, write_fake_run

PROMPTS = {"greatest": "What, in one word, is the greatest thing ever?", "worst": "What, in one word, is the worst thing ever?"}


@pytest.fixture(scope="module")
def lexicon_words():
    afinn = valence("afinn111")
    words = afinn.filter(pl.col("word").str.contains(r"^[a-z]+$")).sort("word")
    pos = words.filter(pl.col("valence") > 0).head(40)
    neg = words.filter(pl.col("valence") < 0).head(40)
    return dict(zip(pl.concat([pos, neg])["word"], pl.concat([pos, neg])["valence"]))


def test_framing_recovers_planted_slopes(tmp_path, lexicon_words):
    tokens = list(lexicon_words) + [" " + w for w in list(lexicon_words)[:10]] + ["zzq", "<s>"]

    def score(key, t):
        v = lexicon_words.get(t.strip().lower(), 0.0)
        if key == "greatest":
            return 2.0 * v if v > 0 else -1.0 * v
        return 0.5 * v if v > 0 else 3.0 * v

    run = write_fake_run(tmp_path, "org/fake", tokens, PROMPTS, score, special=["<s>"])
    sw = load_sweep(run.path)
    frames = {("fake", k): sw.prompt(k) for k in PROMPTS}
    df = framing_slopes(frames, "afinn111")
    got = {(r["prompt"], r["affect"]): r for r in df.iter_rows(named=True)}
    assert got[("greatest", "positive")]["estimate"] == pytest.approx(2.0)
    assert got[("greatest", "negative")]["estimate"] == pytest.approx(-1.0)
    assert got[("worst", "positive")]["estimate"] == pytest.approx(0.5)
    assert got[("worst", "negative")]["estimate"] == pytest.approx(3.0)
    n_pos = sum(v > 0 for v in lexicon_words.values())
    assert got[("greatest", "positive")]["n"] == n_pos + sum(lexicon_words[t.strip()] > 0 for t in tokens[80:90])
    per_word = framing_slopes(frames, "afinn111", per="word")
    assert per_word.filter((pl.col("prompt") == "greatest") & (pl.col("affect") == "positive"))["n"][0] == n_pos


def test_exposure_recovers_planted_frequency_slope(tmp_path, lexicon_words):
    words = [w for w in lexicon_words if word_frequency(w, "en") > 0]

    def score(key, t):
        return 0.7 * math.log(word_frequency(t, "en")) + 0.2 * lexicon_words[t]

    run = write_fake_run(tmp_path, "org/fake", words, {"greatest": PROMPTS["greatest"]}, score)
    df = exposure_slopes({("fake", "greatest"): load_sweep(run.path).prompt("greatest")}, "afinn111")
    assert df["estimate"][0] == pytest.approx(0.7, abs=1e-6)
    assert df["n"][0] == len(words)


def test_bnc_reader_forms_lemmas_and_flags(tmp_path):
    text = ("\tWord\tPoS\t\tFreq\tRa\tDisp\n"
            "\tlove\tVerb\t%\t300\t100\t0.9\n\t@\t@\tlove\t200\t100\t0.9\n\t@\t@\tloved\t100#\t99\t0.9\n"
            "\tlove\tNoC\t:\t150\t100\t0.9\n\tbase\tNoC\t%\t98#\t100\t0.95#\n\t@\t@\tbase\t86\t100\t0.95\n")
    path = tmp_path / "bnc.txt"
    path.write_text(text, encoding="latin-1")
    form = dict(read_bnc(path).iter_rows())
    assert form == {"love": 350.0, "loved": 100.0, "base": 86.0}
    lemma = dict(read_bnc(path, unit="lemma").iter_rows())
    assert lemma == {"love": 450.0, "base": 98.0}


def test_misalignment_by_hand():
    df = pl.DataFrame({"name": ["a", "b", "c", "d"], "human": [4.0, 3, 2, 1], "m1": [1.0, 2, 3, 4], "m2": [4.0, 3, 2, 1]})
    res = misalignment(df, "human", ["m1", "m2"])
    assert res.items["human_rank"].to_list() == [1, 2, 3, 4]
    assert res.items["center_rank"].to_list() == [2.5, 2.5, 2.5, 2.5]
    assert res.items["rank_diff"].to_list() == [1.5, 0.5, -0.5, -1.5]
    assert res.most_undervalued(2) == ["a", "b"] and res.most_overvalued(1) == ["d"]
    assert res.tau_human == {"m1": pytest.approx(-1.0), "m2": pytest.approx(1.0)}
    terms = pl.DataFrame({"term": ["A", "zz"], "category": ["x", "y"]})
    assert identity_ranks(res, terms)["name"].to_list() == ["a"]  # case-insensitive, unmatched terms dropped


def test_shipped_identity_terms():
    terms = identity_terms()
    assert terms.height > 40 and {"race/ethnicity", "religion", "gender", "sexuality"} <= set(terms["category"])


def test_shared_vocabulary_drops_ambiguous_strings():
    a = fake_vocab(["Love", " Love", "peace", "x"]).with_columns(pl.Series("score", [1.0, 2, 3, 4]))
    b = fake_vocab(["peace", "Love", "joy"]).with_columns(pl.Series("score", [5.0, 6, 7]))
    assert set(unique_strings(a, "exact")["string"]) == {"Love", " Love", "peace", "x"}
    assert set(unique_strings(a, "strip")["string"]) == {"peace", "x"}  # "Love" and " Love" collide
    wide = shared_vocabulary({"a": a, "b": b}, "exact")
    assert wide.sort("string").rows() == [("Love", 1.0, 6.0), ("peace", 3.0, 5.0)]


def test_contrast_identical_and_reversed():
    v = fake_vocab([f"w{i}" for i in range(300)])
    a = v.with_columns(pl.Series("score", np.arange(300.0)))
    same = contrast(a, a, k=100)
    assert same.kendall == pytest.approx(1) and same.top_overlap == 1 and same.bottom_overlap == 1
    rev = contrast(a, a.with_columns(-pl.col("score")), k=100)
    assert rev.kendall == pytest.approx(-1) and rev.top_overlap == 0 and rev.bottom_overlap == 0
    assert rev.moved["rank_change"].abs().max() == 299


def test_contrast_by_hand_top_k_and_the_sign_of_rank_change():
    """Ten tokens; a ranks them 0..9 in order, b ranks them 0 3 2 1 5 6 8 7 4 9. Top-3 sets {0,1,2} and {0,3,2}:
    2 of 3, and each side's third token counts (either side cut to 2, or grown to 4, gives 1/3 or 3/3).
    Bottom-3 {9,8,7} and {7,4,9}: 2 of 3, likewise. rank_change = rank in b - rank in a: token 4 falls from 5th
    to 9th (+4), token 3 rises from 4th to 2nd (-2)."""
    from scipy import stats as sps

    v = fake_vocab([f"w{i}" for i in range(10)])
    a = v.with_columns(pl.Series("score", [10.0 - i for i in range(10)]))
    order_b = [0, 3, 2, 1, 5, 6, 8, 7, 4, 9]
    score_b = np.empty(10)
    score_b[order_b] = np.arange(10, 0, -1)
    b = v.with_columns(pl.Series("score", score_b))
    res = contrast(a, b, k=3, n_moved=10)
    assert res.k == 3 and res.top_overlap == pytest.approx(2 / 3) and res.bottom_overlap == pytest.approx(2 / 3)
    assert res.kendall == pytest.approx(sps.kendalltau(a["score"], b["score"]).statistic)
    assert res.spearman == pytest.approx(sps.spearmanr(a["score"], b["score"]).statistic)
    change = dict(zip(res.moved["token_id"], res.moved["rank_change"]))
    # the strings that moved, each once: falls first (largest first), then rises (largest first); the four that
    # kept their rank (0, 2, 7, 9) are in neither half
    assert change == {1: 2, 3: -2, 4: 4, 5: -1, 6: -1, 8: -2}
    assert res.moved["rank_change"].to_list() == [4, 2, -2, -2, -1, -1]
    assert res.moved.head(1)["token_id"][0] == 4  # the biggest fall first, then (second half) the biggest rise
    assert res.moved.height == res.moved["token_id"].n_unique()


def test_analyze_cli_on_fake_runs(tmp_path, lexicon_words, capsys):
    tokens = list(lexicon_words) + ["zzq", "Black", "Islam"]
    runs = [str(write_fake_run(tmp_path / "runs", f"org{i}/m{i}", tokens, PROMPTS,
                               lambda k, t, i=i: hashed_score(f"{k}{i}", t), family=fam).path)
            for i, fam in enumerate(["Llama 3", "Llama 3", "Gemma 2"])]
    lm = str(write_fake_run(tmp_path / "runs", "org0/m0-base", tokens, PROMPTS, mode="logprob").path)
    paper = str(write_fake_run(tmp_path / "runs", "org0/m0", tokens, PROMPTS, input_method="paper").path)
    for analysis, extra in (("top", []), ("agreement", []), ("framing", []), ("exposure", []),
                            ("contrast", [lm, runs[0]]), ("input-method", [paper, runs[0]]),
                            ("misalignment", runs[:1])):
        args = [analysis, *(extra or runs), "--out", str(tmp_path / analysis), "--permutations", "50"]
        assert analyze_main(args) == 0, analysis
        assert json.loads((tmp_path / analysis / "summary.json").read_text())["summary"] is not None
    agree = json.loads((tmp_path / "agreement" / "agreement.json").read_text())
    assert set(agree) == {"greatest", "worst"}
    assert agree["greatest"]["n_strings"] == len(tokens)
    assert agree["greatest"]["kendall_tau_b"]["m0"]["m0"] == 1.0


def test_runs_of_one_model_under_two_score_modes_are_named_by_mode(tmp_path):
    """A model's logprob and judge sweeps: the analyses name them by mode, not by a bare position."""
    from probe.analysis.sweeps import load_sweep, run_labels

    runs = [write_fake_run(tmp_path, "org/m", ["a", "b", "c"], PROMPTS) for _ in range(3)]
    for run, mode in zip(runs, ("logprob", "judge", "judge")):
        meta = run.read_meta()
        meta["score"]["mode"] = mode
        run.write_meta(meta)
    other = write_fake_run(tmp_path, "org/n", ["a", "b", "c"], PROMPTS)
    sweeps = [load_sweep(r.path) for r in (*runs, other)]
    assert run_labels(sweeps, with_mode=False) == ["m [logprob]", "m [judge] #2", "m [judge] #3", "n"]
    assert run_labels(sweeps)[-1] == "n [reward]"


def test_runs_that_differ_only_by_input_method_are_named_by_it(tmp_path):
    """Runs of one model and mode, some through --input-method rewardbench: named by the route, not by
    position."""
    from probe.analysis.sweeps import load_sweep, run_labels

    runs = [write_fake_run(tmp_path, "org/m", ["a", "b", "c"], PROMPTS, input_method=m)
            for m in ("ids", "rewardbench", "rewardbench")]
    runs.append(write_fake_run(tmp_path, "org/n", ["a", "b", "c"], PROMPTS))
    sweeps = [load_sweep(r.path) for r in runs]
    assert run_labels(sweeps, with_mode=False) == [
        "m [reward, ids input]", "m [reward, rewardbench input] #2", "m [reward, rewardbench input] #3", "n"]
    assert run_labels(sweeps[2:]) == ["m [reward]", "n [reward]"]  # no route where nothing differs by it


def test_two_score_runs_by_input_route_are_labelled_by_it(tiny_dirs, tmp_path, capsys):
    """probe score with and without --input-method rewardbench on one reward model: probe analyze names each
    run by its route (from what the run recorded), in its labels and its output."""
    from probe.analysis.sweeps import run_labels
    from probe.commands.score import main as score_main

    base = ["--rm", tiny_dirs["rm"], "--allow-random-head", "--prompt", PROMPTS["greatest"], "--limit", "40",
            "--device", "cpu", "--no-progress", "--verify", "0"]
    assert score_main([*base, "--output", str(tmp_path / "a")]) == 0
    assert score_main([*base, "--input-method", "rewardbench", "--output", str(tmp_path / "b")]) == 0
    (a,), (b,) = (list((tmp_path / x).glob("*/exhaustive_*")) for x in "ab")
    sweeps = [load_sweep(a), load_sweep(b)]
    labels = run_labels(sweeps, with_mode=False)
    assert labels == ["tiny-rm [reward, ids input]", "tiny-rm [reward, rewardbench input]"]
    capsys.readouterr()
    assert analyze_main(["agreement", str(a), str(b), "--out", str(tmp_path / "agree")]) == 0
    agree = json.loads((tmp_path / "agree" / "agreement.json").read_text())
    assert set(agree["greatest"]["kendall_tau_b"]) == set(labels)
    # a run whose settings lack the key: its model record's input convention says which route it took
    from probe.analysis.sweeps import input_route

    assert [input_route({"model": s.meta["model"]}) for s in sweeps] == ["ids", "rewardbench"]


def test_models_the_registry_does_not_know_are_not_one_family():
    """Two unknown models (the packaged SmolLM2 and Gemma 3) must not count as 'same base model' in RSA."""
    from probe.analysis.agreement import base_architecture_of, developer_of, family_of

    a, b = "HuggingFaceTB/SmolLM2-135M-Instruct", "google/gemma-3-270m"
    assert family_of(a) != family_of(b) and base_architecture_of(a) != base_architecture_of(b)
    assert family_of(a) == family_of(a)
    known = "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2"
    assert base_architecture_of(known) == family_of(known).split(" ")[0] and developer_of(known) == "Skywork"


def test_pair_analyses_refuse_runs_they_cannot_label(tmp_path):
    """contrast needs a reward (or judge) run and a logprob run; input-method two runs of one model, one with
    --input-method paper. Anything else is one line, not a table labelled as if it were."""
    from probe.errors import ProbeError

    tokens = ["a", "b", "c", "d"]
    rm = str(write_fake_run(tmp_path, "org/rm", tokens, PROMPTS).path)
    rm2 = str(write_fake_run(tmp_path, "org/rm2", tokens, PROMPTS).path)
    paper_other = str(write_fake_run(tmp_path, "org/other", tokens, PROMPTS, input_method="paper").path)
    for args, message in ((["contrast", rm, rm2], "these are reward and reward runs"),
                          (["input-method", rm, rm2], "these are ids and ids runs"),
                          (["input-method", rm, paper_other], "runs of org/rm and org/other")):
        with pytest.raises(ProbeError, match=message):
            from probe.commands.analyze import AnalysisConfig, run

            run(AnalysisConfig(analysis=args[0], runs=tuple(args[1:]), out=str(tmp_path / "out")))
        assert not (tmp_path / "out").exists()


def _afinn111() -> dict[str, float]:
    """AFINN-111 read here from the afinn package's file, not through probe's lexicon reader."""
    import importlib.util
    from pathlib import Path

    folder = Path(importlib.util.find_spec("afinn").submodule_search_locations[0])
    out = {}
    for line in (folder / "data" / "AFINN-111.txt").read_text(encoding="utf-8").splitlines():
        if line.strip():
            word, _, value = line.rpartition("\t")
            out[word.strip().lower()] = float(value)
    return out


def test_every_analyze_output_recomputed_from_scores_parquet(tmp_path, lexicon_words):
    """Each `probe analyze` output is recomputed here from the runs' scores.parquet with scipy and numpy: top
    tables, Kendall/Spearman/RBO matrices, framing and exposure slopes, the contrast's correlations, top/bottom-100
    overlaps and rank changes, and the misalignment's tau."""
    from scipy import stats as sps
    from wordfreq import word_frequency

    from tests.unit.test_stats import _rbo_brute

    tokens = list(lexicon_words) + [f"zq{i}" for i in range(60)]  # 140 tokens: k = 100 is not everything
    runs = [str(write_fake_run(tmp_path / "runs", f"org{i}/m{i}", tokens, PROMPTS,
                               lambda k, t, i=i: hashed_score(f"{k}{i}", t)).path) for i in range(3)]
    lm = str(write_fake_run(tmp_path / "runs", "org0/m0-base", tokens, PROMPTS, mode="logprob",
                            score_fn=lambda k, t: hashed_score(f"{k}lm", t)).path)
    paper = str(write_fake_run(tmp_path / "runs", "org0/m0", tokens, PROMPTS, input_method="paper",
                               score_fn=lambda k, t: hashed_score(f"{k}paper", t)).path)
    for analysis, args in (("top", runs), ("agreement", runs), ("framing", runs[:1]), ("exposure", runs[:1]),
                           ("contrast", [lm, runs[0]]), ("input-method", [paper, runs[0]]),
                           ("misalignment", runs[:1])):
        assert analyze_main([analysis, *args, "--out", str(tmp_path / analysis), "--top", "5",
                             "--permutations", "20", "--prompt", "greatest"]) == 0, analysis

    def scores(run):
        df = pl.read_parquet(f"{run}/scores.parquet").filter(pl.col("prompt_key") == "greatest")
        return df.sort("token_id")

    s = [scores(r) for r in runs]
    by_text = [dict(zip(d["decoded"], d["score"])) for d in s]
    # top: best, worst and words-only tables
    best = pl.read_csv(tmp_path / "top" / "m0__greatest__best.csv")
    assert best["token_id"].to_list() == s[0].sort("score", descending=True)["token_id"].head(5).to_list()
    worst = pl.read_csv(tmp_path / "top" / "m0__greatest__worst.csv")
    assert worst["token_id"].to_list() == s[0].sort("score")["token_id"].head(5).to_list()
    words = pl.read_csv(tmp_path / "top" / "m1__greatest__best_words.csv")
    assert words["token_id"].to_list() == (s[1].filter(pl.col("is_word")).sort("score", descending=True)
                                           ["token_id"].head(5).to_list())
    # agreement: every off-diagonal cell
    agree = json.loads((tmp_path / "agreement" / "agreement.json").read_text())["greatest"]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        x = [by_text[i][t] for t in tokens]
        y = [by_text[j][t] for t in tokens]
        assert agree["kendall_tau_b"][f"m{i}"][f"m{j}"] == pytest.approx(sps.kendalltau(x, y).statistic, abs=1e-6)
        assert agree["spearman"][f"m{i}"][f"m{j}"] == pytest.approx(sps.spearmanr(x, y).statistic, abs=1e-6)
        strings = sorted(tokens)  # the shared vocabulary's order
        assert agree["rbo_top_p0.9"][f"m{i}"][f"m{j}"] == pytest.approx(
            _rbo_brute([by_text[i][t] for t in strings], [by_text[j][t] for t in strings], 0.9), abs=1e-6)
        assert agree["rbo_bottom_p0.9"][f"m{i}"][f"m{j}"] == pytest.approx(
            _rbo_brute([by_text[i][t] for t in strings], [by_text[j][t] for t in strings], 0.9, bottom=True), abs=1e-6)
        # each pair on its own shared vocabulary: one tokenizer, so matched on token ids; no ties, so any row order
        (pair,) = [r for r in agree["pairwise"] if (r["a"], r["b"]) == (f"m{i}", f"m{j}")]
        assert pair["matched_on"] == "token ids" and pair["n"] == len(tokens)
        assert pair["kendall_tau_b"] == pytest.approx(sps.kendalltau(x, y).statistic, abs=1e-9)
        assert pair["spearman"] == pytest.approx(sps.spearmanr(x, y).statistic, abs=1e-9)
        for side, bottom in (("top", False), ("bottom", True)):
            assert pair[f"rbo_{side}_p0.9"] == pytest.approx(_rbo_brute(x, y, 0.9, bottom=bottom), abs=1e-9)
        assert pair["rbo_top_p0.9"] != pytest.approx(pair["rbo_bottom_p0.9"], abs=1e-3)
    # framing: positive and negative AFINN-111 words fitted separately (one token per word here)
    afinn = _afinn111()
    framing = pl.read_csv(tmp_path / "framing" / "framing.csv").filter(pl.col("prompt") == "greatest")
    matched = [(afinn[t], by_text[0][t]) for t in tokens if t in afinn]
    for affect, keep in (("positive", lambda v: v > 0), ("negative", lambda v: v < 0)):
        v, y = np.array([m for m in matched if keep(m[0])]).T
        row = framing.filter(pl.col("affect") == affect)
        assert row["estimate"][0] == pytest.approx(np.polyfit(v, y, 1)[0], rel=1e-6)
        assert row["n"][0] == len(v)
    # exposure: score ~ ln frequency + valence
    exposure = pl.read_csv(tmp_path / "exposure" / "exposure.csv").filter(pl.col("prompt") == "greatest")
    rows = [(math.log(word_frequency(t, "en")), afinn[t], by_text[0][t]) for t in tokens
            if t in afinn and word_frequency(t, "en") > 0]
    x = np.array([[1.0, f, v] for f, v, _ in rows])
    coef = np.linalg.lstsq(x, np.array([y for *_, y in rows]), rcond=None)[0]
    assert exposure["estimate"][0] == pytest.approx(coef[1], rel=1e-6) and exposure["n"][0] == len(rows)
    # contrast and input-method: correlations, overlaps at k = 100 (half the strings where fewer), rank changes
    # (rank in the second minus the first)
    for analysis, other, first in (("contrast", lm, runs[0]), ("input-method", paper, runs[0])):
        res = json.loads((tmp_path / analysis / f"{analysis}.json").read_text())["greatest"]
        a, b = scores(first), scores(other)  # the reward (raw-id) run first, the logprob (paper) run second
        ra = sps.rankdata(-a["score"].to_numpy(), method="average")
        rb = sps.rankdata(-b["score"].to_numpy(), method="average")
        assert res["kendall_tau_b"] == pytest.approx(sps.kendalltau(a["score"], b["score"]).statistic, abs=1e-9)
        assert res["spearman"] == pytest.approx(sps.spearmanr(a["score"], b["score"]).statistic, abs=1e-9)
        k = min(100, len(ra) // 2)  # the top and bottom k never share a string
        assert res["k"] == k
        top_a, top_b = set(np.argsort(ra)[:k]), set(np.argsort(rb)[:k])
        assert res["top_k_overlap"] == pytest.approx(len(top_a & top_b) / k)
        bottom_a, bottom_b = set(np.argsort(-ra)[:k]), set(np.argsort(-rb)[:k])
        assert res["bottom_k_overlap"] == pytest.approx(len(bottom_a & bottom_b) / k)
        moved = pl.read_csv(tmp_path / analysis / "moved__greatest.csv")
        change = dict(zip(a["token_id"].to_list(), (rb - ra).tolist()))
        for tid, rc in zip(moved["token_id"], moved["rank_change"]):
            assert rc == pytest.approx(change[tid])
        assert moved["rank_change"].max() == pytest.approx(max(change.values()))
    # misalignment against human valence: Kendall tau between the words' valence and the model's scores
    mis = json.loads((tmp_path / "misalignment" / "misalignment.json").read_text())
    v, y = np.array([(afinn[t], by_text[0][t]) for t in tokens if t in afinn]).T
    assert mis["n_items"] == len(v)
    assert list(mis["kendall_tau_human"].values())[0] == pytest.approx(sps.kendalltau(v, y).statistic, abs=1e-9)


def test_exposure_slope_with_length_held_fixed_is_the_partial_regression(tmp_path, lexicon_words):
    """Beside the plain frequency slope (valence held fixed), the one with the word's length in characters held
    fixed too: its coefficient equals the slope of the score's residual on the frequency's residual, both
    residualised on the other covariates (Frisch-Waugh-Lovell, computed here with numpy). The planted score
    depends on length only, so the plain slope picks up frequency through length and the held-fixed slope is 0."""
    words = [w for w in lexicon_words if word_frequency(w, "en") > 0]
    run = write_fake_run(tmp_path, "org/fake", words, {"greatest": PROMPTS["greatest"]}, lambda k, t: -0.5 * len(t))
    df = exposure_slopes({("fake", "greatest"): load_sweep(run.path).prompt("greatest")}, "afinn111")
    assert df["controls"].to_list() == ["valence", "valence, length"]
    freq = np.array([math.log(word_frequency(w, "en")) for w in words])
    val = np.array([lexicon_words[w] for w in words], dtype=float)
    length = np.array([len(w) for w in words], dtype=float)
    y = -0.5 * length
    z = np.column_stack([np.ones_like(y), val, length])
    ry = y - z @ np.linalg.lstsq(z, y, rcond=None)[0]
    rx = freq - z @ np.linalg.lstsq(z, freq, rcond=None)[0]
    held = df.filter(pl.col("controls") == "valence, length")
    assert held["estimate"][0] == pytest.approx(float(rx @ ry / (rx @ rx)), abs=1e-9)
    assert abs(held["estimate"][0]) < 1e-9  # the score is length alone
    plain = df.filter(pl.col("controls") == "valence")["estimate"][0]
    assert plain > 0.05  # frequent words are short: the plain slope is length's, through frequency


def test_agreement_group_tests_are_exact_and_holm_adjusted_by_hand():
    """Two groupings tested together (family, developer): each p-value is the share of the distinct relabellings (of
    the 720 label orders) whose same-minus-different mean tau reaches the observed one (scipy's tau), and each
    p_holm is Holm's by hand: the smaller p times 2, the larger the larger of that and itself, capped at 1."""
    import itertools

    from scipy import stats as sps

    from probe.analysis.agreement import agreement

    rng = np.random.default_rng(0)
    base = rng.normal(size=(3, 200))
    models = [f"m{i}" for i in range(6)]
    wide = pl.DataFrame({m: base[i // 2] + rng.normal(size=200) for i, m in enumerate(models)})
    groupings = {"family": list("aabbcc"), "developer": list("xyxyxx")}
    res = agreement(wide, models, groupings=groupings, n_perm=1000)
    tau = np.array([[sps.kendalltau(wide[a], wide[b]).statistic for b in models] for a in models])

    def stat(labels):
        same = [labels[i] == labels[j] for i, j in itertools.combinations(range(6), 2)]
        vals = [tau[i, j] for i, j in itertools.combinations(range(6), 2)]
        return np.mean([v for v, s in zip(vals, same) if s]) - np.mean([v for v, s in zip(vals, same) if not s])

    p = {}
    for name, labels in groupings.items():
        null = [stat(order) for order in set(itertools.permutations(labels))]
        p[name] = np.mean(np.array(null) >= stat(labels) - 1e-12)
        assert res.groups[name]["p_value"] == pytest.approx(p[name], abs=1e-12) and res.groups[name]["exact"]
    # the smallest p there is: the observed labels and the 5 that only rename the three families
    assert p["family"] == pytest.approx(6 / 90) and p["developer"] > 2 * p["family"]
    assert res.groups["family"]["p_holm"] == pytest.approx(2 * 6 / 90, abs=1e-12)
    assert res.groups["developer"]["p_holm"] == pytest.approx(min(1.0, p["developer"]), abs=1e-12)
    assert all(g["n_tests"] == 2 for g in res.groups.values())


def test_an_out_folder_holding_another_analysis_is_refused(tmp_path, capsys):
    """`probe analyze X --out DIR` into a folder where another analysis (another kind, or other settings) wrote its
    files would mix them and replace its summary.json: one line, exit 2, the other analysis untouched. The same
    analysis again rewrites its own files."""
    tokens = [f"w{i}" for i in range(30)]
    run = str(write_fake_run(tmp_path / "runs", "org/m", tokens, PROMPTS).path)
    out = tmp_path / "out"
    assert analyze_main(["top", run, "--out", str(out), "--top", "5"]) == 0
    summary = (out / "summary.json").read_text()
    assert analyze_main(["top", run, "--out", str(out), "--top", "5"]) == 0  # the same analysis: rewritten
    for other in (["top", run, "--out", str(out), "--top", "7"], ["exposure", run, "--out", str(out)]):
        capsys.readouterr()
        assert analyze_main(other) == 2
        err = capsys.readouterr().err
        assert "holds another analysis (top of 1 run(s)" in err and len(err.strip().splitlines()) == 1
    assert json.loads((out / "summary.json").read_text()) == json.loads(summary)
