"""GCG and the exact beam on tiny models: monotone, symmetric, reproducible, exact where it claims to be."""

import itertools

import numpy as np
import pytest
import torch

from probe.core.engine import FullSequenceScorer
from probe.config import GCGConfig
from probe.core.gcg import GCG, allowed_tokens, beam_search, run
from probe.core.scoring import ScoringOptions, make_head, prompt_split, sweep_rows
from probe.core.vocab import build_vocab_table
from tests.tiny import F32_FORWARD

PROMPT = "What, in one word, is the greatest thing ever?"


def _cfg(**kw):
    base = dict(prompt=PROMPT, score="reward", length=3, steps=10, search_width=64, topk=32, seed=3,
                progress=False, batch_size=64)
    return GCGConfig(**{**base, **kw})


def _gcg(lm, cfg, allowed=None):
    split = prompt_split(lm, cfg.mode, cfg.prompt, None, ScoringOptions(), len(lm.tokenizer))
    if allowed is None:
        allowed = allowed_tokens(build_vocab_table(lm.tokenizer), cfg.allowed, cfg.allow_special)
    return GCG(lm, make_head(lm, cfg.mode), split, cfg, allowed), split


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("armo-like", "reward"), ("gemma2-lm", "logprob")])
def test_max_raises_min_lowers_and_best_never_worsens(tiny_models, name, mode):
    lm = tiny_models[name]
    hi = run(lm, _cfg(score=mode, direction="max"))
    lo = run(lm, _cfg(score=mode, direction="min"))
    for res, sign in ((hi, 1), (lo, -1)):
        best = [row["best_objective"] for row in res.runs[0].trajectory]
        assert all(b2 >= b1 for b1, b2 in zip(best, best[1:]))  # best-so-far is monotone
        base = res.random_baseline
        # well beyond random responses of the same length: past the best (worst) of 256 random ones
        if sign > 0:
            assert res.best_score > base["max"] + 0.5 * base["std"]
        else:
            assert res.best_score < base["min"] - 0.5 * base["std"]
    assert hi.best_score > lo.best_score


@pytest.mark.parity
@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("armo-like", "reward"), ("llama-lm", "logprob")])
def test_reported_score_equals_an_independent_full_forward(tiny_models, name, mode):
    lm = tiny_models[name]
    res = run(lm, _cfg(score=mode, steps=4))
    split = prompt_split(lm, mode, PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    ids = torch.tensor([list(split.prefix_ids) + res.best_ids + list(split.suffix_ids)], device=lm.model.device)
    with torch.no_grad():
        out = lm.model(input_ids=ids)
    if mode == "reward":
        own = float(getattr(out, "score", out.logits).reshape(-1)[0])
    else:
        logp = torch.log_softmax(out.logits[0].float(), -1)
        p = len(split.prefix_ids)
        own = float(sum(logp[i - 1, ids[0, i]] for i in range(p, ids.shape[1])))
    assert res.best_score == pytest.approx(own, abs=1e-4)
    assert res.search_score == pytest.approx(own, abs=1e-4)


def test_fixed_seed_reproduces_the_run(tiny_models):
    lm = tiny_models["llama-rm"]
    a, b = run(lm, _cfg(steps=6)), run(lm, _cfg(steps=6))
    assert [r["best_ids"] for r in a.runs[0].trajectory] == [r["best_ids"] for r in b.runs[0].trajectory]
    assert a.best_score == b.best_score
    c = run(lm, _cfg(steps=6, seed=4))
    assert c.runs[0].init_ids != a.runs[0].init_ids


@pytest.mark.parity
@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-lm", "logprob"), ("armo-like", "reward")])
def test_gradient_matches_finite_differences_and_flips_with_direction(tiny_models, name, mode):
    lm = tiny_models[name]
    gcg, _ = _gcg(lm, _cfg(score=mode))
    ids = torch.tensor(lm.tokenizer.encode("Love and peace", add_special_tokens=False)[:3])
    grad = gcg.token_gradient(ids)
    base = gcg.onehot(ids)
    rng = np.random.default_rng(0)
    eps = 1e-2  # float32 objective: smaller steps drown in rounding (checked in float64: agrees to 3e-7)
    for _ in range(5):
        i, v = int(rng.integers(len(ids))), int(rng.integers(base.shape[1]))
        d = torch.zeros_like(base)
        d[i, v] += 1
        d[i, ids[i]] -= 1
        with torch.no_grad():
            f1 = gcg.relaxed_objective(base + eps * d, ids)
            f0 = gcg.relaxed_objective(base - eps * d, ids)
        fd = float(f1 - f0) / (2 * eps)
        assert fd == pytest.approx(float(grad[i, v] - grad[i, ids[i]]), rel=2e-2, abs=1e-3)
    with torch.no_grad():
        assert float(gcg.relaxed_objective(base, ids)) == pytest.approx(float(gcg.objective(ids[None])[0]), abs=1e-4)
    gmin, _ = _gcg(lm, _cfg(score=mode, direction="min"))
    torch.testing.assert_close(gmin.token_gradient(ids), -grad)
    torch.testing.assert_close(gmin.objective(ids[None]), -gcg.objective(ids[None]))


def test_allowed_and_filter_are_respected(tiny_models):
    lm = tiny_models["llama-rm"]
    res = run(lm, _cfg(allowed="words", filter_ids=True, steps=6))
    vocab = build_vocab_table(lm.tokenizer)
    words = set(vocab.filter(vocab["is_word"])["token_id"].to_list())
    for r in res.runs[0].trajectory:
        assert set(r["best_ids"]) <= words
    special = set(lm.tokenizer.all_special_ids)
    res2 = run(lm, _cfg(steps=6))
    assert not set(res2.best_ids) & special  # special tokens banned by default


def _brute_force(lm, mode, split, allowed_ids, depth, first=None):
    head = make_head(lm, mode)
    firsts = allowed_ids if first is None else first
    seqs = [list(s) for s in itertools.product(firsts, *([allowed_ids] * (depth - 1)))]
    scores = FullSequenceScorer(lm.model, head, split.prefix_ids, batch_size=256).score(
        [s + list(split.suffix_ids) for s in seqs])
    return seqs, scores.numpy()


@pytest.mark.parity
@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("llama-lm", "logprob")])
def test_beam_equals_brute_force_on_a_small_vocabulary(tiny_models, name, mode):
    lm = tiny_models[name]
    vocab = build_vocab_table(lm.tokenizer)
    words = vocab.filter(vocab["is_alpha"] & ~vocab["is_special"])["token_id"].to_list()[:12]  # no word list needed
    allowed = torch.zeros(len(lm.tokenizer), dtype=torch.bool)
    allowed[words] = True
    split = prompt_split(lm, mode, PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    # K = all 12: depth 2 is the exact optimum over all 144 two-token responses
    levels = beam_search(lm, _cfg(score=mode, beam=12, length=2), split, allowed)
    seqs, scores = _brute_force(lm, mode, split, words, 2)
    order = np.argsort(-scores, kind="stable")[:12]
    assert levels[1]["ids"].to_list()[0] == seqs[order[0]]
    np.testing.assert_allclose(levels[1]["score"].to_numpy(), scores[order], atol=1e-4)
    # K = 3, depth 3, minimising: the optimum over responses whose first two tokens survive the beam
    levels = beam_search(lm, _cfg(score=mode, beam=3, length=3, direction="min"), split, allowed)
    kept = [tuple(x) for x in levels[1]["ids"].to_list()]
    seqs, scores = _brute_force(lm, mode, split, words, 3)
    mask = np.array([tuple(s[:2]) in kept for s in seqs])
    want = np.sort(scores[mask])[:3]
    np.testing.assert_allclose(levels[2]["score"].to_numpy(), want, atol=1e-4)
    one = sweep_rows(words, split.suffix_ids)
    direct = FullSequenceScorer(lm.model, make_head(lm, mode), split.prefix_ids, batch_size=64).score(one).numpy()
    np.testing.assert_allclose(levels[0]["score"].to_numpy(), np.sort(direct)[:3], atol=1e-4)


def test_patience_stops_a_stalled_run_after_that_many_steps_without_gain(tiny_models):
    """Two allowed tokens and a one-token response: the search has nothing left to gain after a step or two; with
    --patience 3 it stops 3 steps after its last gain (the last 3 steps keep the best), without it runs all 20."""
    lm = tiny_models["llama-rm"]
    cfg = _cfg(length=1, steps=20, search_width=8, topk=4)
    allowed = torch.zeros(len(lm.tokenizer), dtype=torch.bool)
    allowed[[300, 301]] = True
    plain, _ = _gcg(lm, cfg, allowed)
    assert len(plain.run([300], seed=1).trajectory) == 20
    patient, _ = _gcg(lm, _cfg(length=1, steps=20, search_width=8, topk=4, patience=3), allowed)
    traj = patient.run([300], seed=1).trajectory
    best = [row["best_objective"] for row in traj]
    start = float(patient.objective(torch.tensor([[300]]))[0])
    assert best[0] > start  # the one gain there is (300 -> 301), at step 1
    assert len(traj) == 4 and len(set(best)) == 1  # then three steps without gain, and it stopped


def test_random_baseline_is_in_the_models_units_for_both_directions(tiny_models):
    """The baseline scores 256 random responses drawn with a fixed seed: the same responses for max and min, so the
    same numbers in the model's units (a min run must not report them negated), and equal to scoring those
    responses here."""
    lm = tiny_models["llama-rm"]
    hi = run(lm, _cfg(steps=1, direction="max"))
    lo = run(lm, _cfg(steps=1, direction="min"))
    for key in ("mean", "min", "max", "std"):
        assert lo.random_baseline[key] == pytest.approx(hi.random_baseline[key], **F32_FORWARD)
    cfg = _cfg(steps=1)
    gcg, split = _gcg(lm, cfg)
    allowed = allowed_tokens(build_vocab_table(lm.tokenizer), cfg.allowed, cfg.allow_special)
    pool = torch.nonzero(allowed).flatten()
    gen = torch.Generator().manual_seed(cfg.seed + 99)
    rand = pool[torch.randint(0, len(pool), (256, cfg.length), generator=gen)]
    scorer = FullSequenceScorer(lm.model, make_head(lm, "reward"), list(split.prefix_ids), batch_size=64)
    rows = torch.cat([rand, torch.tensor(split.suffix_ids).expand(len(rand), -1)], 1)
    own = scorer.score(rows, torch.full((rows.shape[0],), rows.shape[1])).numpy()
    assert hi.random_baseline["mean"] == pytest.approx(float(own.mean()), abs=1e-4)


def test_a_random_head_is_drawn_from_the_seed_and_trace_agrees(tiny_dirs, tmp_path):
    """probe gcg --allow-random-head seeds torch with --seed before loading: two runs with one seed (whatever
    the global random state before each) find the same responses and scores, the seed is recorded, and probe
    trace --gcg of the run (which draws the head from the run's seed) gives the run's own scores."""
    import json

    from probe.commands.gcg import main as gcg_main
    from probe.commands.trace import main as trace_main

    def gcg(out, seed, noise):
        torch.manual_seed(noise)
        torch.rand(3)  # the global state before the load differs from run to run
        args = ["--rm", tiny_dirs["lm"], "--score", "reward", "--allow-random-head", "--seed", str(seed),
                "--length", "2", "--steps", "2", "--search-width", "8", "--topk", "4", "--device", "cpu"]
        assert gcg_main([*args, "--no-progress", "--output", str(tmp_path / out)]) == 0
        (run,) = (tmp_path / out).glob("*/gcg_max_*")
        return run, json.loads((run / "result.json").read_text()), json.loads((run / "meta.json").read_text())

    (run, a, meta), (_, b, _) = gcg("a", 7, 1), gcg("b", 7, 2)
    assert meta["settings"]["seed"] == 7 and meta["config"]["allow_random_head"] is True
    assert a["best_ids"] == b["best_ids"] and a["best_score"] == b["best_score"]
    assert a["random_baseline"] == b["random_baseline"]  # 256 fixed random responses, scored by one head
    torch.manual_seed(3)
    assert trace_main(["--gcg", str(run), "--device", "cpu", "--out", str(tmp_path / "t")]) == 0
    traced = json.loads((tmp_path / "t" / "trace.json").read_text())["run_scores"]
    assert traced["n"] >= 1 and traced["equal_within_float32_tolerance"] is True, traced
