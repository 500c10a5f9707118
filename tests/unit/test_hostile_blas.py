"""Batch invariance by construction (issue 70): every path's scores bitwise the same under a hostile BLAS.

tests/hostile_blas.py moves each product's and reduction's result by 0-3 units in the last place, by a hash of its
row count: a library that keeps only the promise "the same call on the same inputs gives the same bits". On the tree
before issue 70 every path here failed under it on any machine (the CPU's forwards were as large as the batch); now a
row's every call has a shape set by the row alone (probe/core/invariance.py), so the double moves a row's bits the
same way at every batch size, order, halving, resume, shard, world size and thread count. These tests check the
design, not the CPU they run on (tests/unit/test_batch_invariance.py checks the real BLAS of the machine at hand).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe.core.scoring import AdaptiveBatcher, PairScorer, make_head, reference_head, sweep_rows
from tests import tiny
from tests.hostile_blas import HostileBLAS, rows_of, ulps
from tests.unit.test_batch_invariance import PATHS, PROMPT, _at, _responses, _scorer, _setup, _tight

BATCHES = (64, 7, 5, 2)
CASES = [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("chatml-rm-padeot", "reward"), ("armo-like", "reward"),
         ("qwen3-rm", "reward"), ("gemma3-lm", "logprob"), ("llama-lm", "logprob"), ("llama-lm", "judge"),
         ("qwen3-lm", "rating")]
# every family and head on the shared-prefix path (sweeps' and responses' default); the other paths, whose forwards
# are the same tiles through other attention, on a reward head, the fused log-probability head and a judge
GRID = [(*case, "shared") for case in CASES] + [
    (*case, path) for case in (("llama-rm", "reward"), ("gemma3-lm", "logprob"), ("llama-lm", "judge"))
    for path in PATHS if path != "shared"]


def test_the_double_moves_a_row_by_its_row_count_and_keeps_the_same_call_the_same():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(300, 64, generator=gen), torch.randn(48, 64, generator=gen)
    with HostileBLAS() as mode:
        alone = {n: torch.nn.functional.linear(x[:n], w)[0] for n in range(1, 9)}
        again = {n: torch.nn.functional.linear(x[:n], w)[0] for n in range(1, 9)}
        soft = {n: torch.softmax(x[:n], -1)[0] for n in (1, 2, 3)}
    assert all(torch.equal(alone[n], again[n]) for n in alone)  # the one promise kept
    assert len({tuple(v.tolist()) for v in alone.values()}) > 1  # row counts 1-8 round a row otherwise
    assert len({tuple(v.tolist()) for v in soft.values()}) > 1 and mode.calls
    assert [ulps(n) for n in range(1, 9)] != [ulps(1)] * 8 and rows_of(torch.zeros(3, 4, 5)) == 12


def _sweep(lm, split, n: int = 90):
    """``n`` ids spread over the vocabulary, each with the template's closing ids."""
    return sweep_rows(np.linspace(0, len(lm.tokenizer) - 1, n).astype(np.int64), split.suffix_ids)


@pytest.mark.parametrize("name,mode,path", GRID)
def test_a_sweep_row_keeps_its_bits_at_every_batch_size_under_a_hostile_blas(tiny_models, name, mode, path, hostile):
    lm, head, split = _setup(tiny_models, name, mode)
    score = _scorer(lm, head, split, path).score
    rows = _sweep(lm, split)
    base = _at(score, rows, 256)
    assert base.std() > 1e-3
    for batch in BATCHES:
        assert torch.equal(_at(score, rows, batch), base), batch
    assert torch.equal(_at(score, rows[:6], 1), base[:6])
    assert torch.equal(_at(score, rows.flip(0), 256).flip(0), base)


@pytest.mark.parametrize("name,mode,path", GRID)
def test_a_whole_response_keeps_its_bits_whatever_rows_share_its_batch_under_a_hostile_blas(tiny_models, name, mode,
                                                                                          path, hostile):
    lm, head, split = _setup(tiny_models, name, mode)
    score = _scorer(lm, head, split, path).score
    rows = _responses(lm.tokenizer, split, 16, seed=3)
    base = _at(score, rows, 16)
    assert base.std() > 1e-3
    for batch in (5, 2):
        assert torch.equal(_at(score, rows, batch), base), batch
    assert torch.equal(_at(score, rows[:4], 1), base[:4])
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
    assert torch.equal(_at(score, [rows[i] for i in order], 8), base[order])


@pytest.mark.parametrize("path", ("shared", "cache", "uncached"))
@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma3-lm", "logprob"), ("armo-like", "reward")])
def test_a_trace_keeps_its_bits_however_its_responses_are_dealt_under_a_hostile_blas(tiny_models, name, mode, path,
                                                                                     hostile):
    lm, head, split = _setup(tiny_models, name, mode)
    responses = _responses(lm.tokenizer, split, 9, seed=5, longest=10)
    sc = _scorer(lm, head, split, path)
    together = sc.score_prefixes(responses)
    dealt = [sc.score_prefixes(responses[i::3]) for i in range(3)]  # torchrun's round robin over three ranks
    assert all(torch.equal(dealt[i % 3][i // 3], want) for i, want in enumerate(together))


def test_halving_resume_shard_world_size_and_threads_change_no_bit_under_a_hostile_blas(tiny_models, hostile):
    """The out-of-memory halving, a resume (the rows in two sessions), a shard and torchrun's ranks (the rows dealt),
    and the thread count: each a different batch of the same rows."""
    lm, head, split = _setup(tiny_models, "llama-lm", "logprob")
    from probe.core.engine import PrefixScorer

    sc = PrefixScorer(lm.model, head, split.prefix_ids)
    rows = _sweep(lm, split, n=120)
    want = AdaptiveBatcher(256).run(sc.score, rows)
    assert np.array_equal(AdaptiveBatcher(77).run(_tight(sc.score, 19, 2), rows), want)  # 77 -> 38 -> 19
    half = rows.shape[0] // 3
    resumed = np.concatenate([AdaptiveBatcher(13).run(sc.score, rows[:half]),
                              AdaptiveBatcher(256).run(sc.score, rows[half:])])
    assert np.array_equal(resumed, want)
    ranks = [AdaptiveBatcher(256).run(sc.score, rows[r::3]) for r in range(3)]
    dealt = np.empty_like(want)
    for r in range(3):
        dealt[r::3] = ranks[r]
    assert np.array_equal(dealt, want)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = AdaptiveBatcher(41).run(sc.score, rows)
    finally:
        torch.set_num_threads(threads)
    assert np.array_equal(one, want)


def test_the_implicit_reward_keeps_its_bits_under_a_hostile_blas(tiny_models, hostile):
    from dataclasses import replace

    from probe.core.engine import PrefixScorer
    from probe.core.scoring import conversation
    from probe.core.template import split_template
    from probe.config import ScoringOptions
    from tests.tiny import perturbed_copy

    lm = tiny_models["llama-lm"]
    ref = replace(lm, model=perturbed_copy(lm.model))
    lm = replace(lm, ref=ref, beta=0.5)
    head = make_head(lm, "logprob")
    split = split_template(lm.tokenizer, conversation("logprob", PROMPT, None, ScoringOptions(), lm), n_verify=0)
    pair = PairScorer(PrefixScorer(lm.model, head, split.prefix_ids),
                      PrefixScorer(ref.model, reference_head(lm, head), split.prefix_ids), 0.5)
    rows = _responses(lm.tokenizer, split, 12, seed=9)
    base = _at(pair.score, rows, 12)
    assert torch.equal(_at(pair.score, rows, 5), base) and torch.equal(_at(pair.score, rows, 1), base)


def test_gcg_and_the_beam_search_alike_at_any_batch_size_under_a_hostile_blas(tiny_models, hostile):
    import probe
    from probe.config import GCGConfig

    lm = tiny_models["llama-rm"]
    config = GCGConfig(length=2, steps=2, search_width=24, topk=8, seed=1, progress=False)
    a = probe.gcg(lm, None, PROMPT, config=config)
    b = probe.gcg(lm, None, PROMPT, config=config, batch_size=5)
    assert (a.best_ids, a.search_score) == (b.best_ids, b.search_score)


def test_social_items_keep_their_bits_at_every_batch_size_under_a_hostile_blas(tiny_models, hostile):
    from probe.social.scoring import score_items

    lm = tiny_models["gemma2-rm"]
    items = tiny.social_items(12)
    want = score_items(lm, "reward", items, batch_size=64, verify=0)["score"].to_list()
    assert len(set(want)) > 8
    for batch in (5, 1):
        assert score_items(lm, "reward", items, batch_size=batch, verify=0)["score"].to_list() == want


def test_a_device_whose_rows_round_by_their_place_is_reported_not_invariant(tiny_models):
    """The one property the construction cannot give (a row's bits the same wherever it sits in a call of one shape)
    is checked at run time: a double that rounds each row by its place makes the record say so, naming why."""
    from probe.core.invariance import describe

    lm = tiny_models["llama-rm"]
    model = _fresh(lm.model)  # a fresh object (the check is cached per model), the same modules
    with HostileBLAS(positions=True):
        record = describe("cpu", model)
    assert record["batch_invariant"] is False and not record["row_check"]["row_stable"]
    assert "place" in record["why_not"]
    with HostileBLAS():  # rounding by the row count only: every call the check makes has one shape
        fine = describe("cpu", model2 := _fresh(lm.model))
    assert fine["row_check"]["row_stable"] and len(fine["row_check"]["checked"]) >= 3, fine
    assert model2._rm_row_check[("cpu", fine["tile_rows"])] is fine["row_check"]  # once per model and device


def _fresh(model):
    out = type(model).__new__(type(model))
    out.__dict__.update(model.__dict__)
    out.__dict__.pop("_rm_row_check", None)
    return out


def test_an_explanation_keeps_its_bits_among_other_items_under_a_hostile_blas(tiny_models, hostile):
    """`probe explain`: every forward (the decomposition, patching on the prefix cache, AtP, integrated gradients)
    holds rows of one item only, in calls whose shape is set by the item and the run's settings: 'Love' explained
    alone and among other responses keeps its bits under a BLAS that rounds by the row count."""
    import probe

    lm = tiny_models["llama-lm"]
    kw = dict(score="logprob", baseline="the cat", heads=True, ig_steps=12, batch_size=5)
    alone = probe.explain(lm, None, PROMPT, ["Love"], **kw)["responses"][0]
    among = probe.explain(lm, None, PROMPT, ["freedom", "Love", "Love and peace"], **kw)["responses"][1]
    assert among["response"] == alone["response"] == "Love"
    for key in ("score", "components", "heads", "rest_items"):
        assert among[key] == alone[key], key
    for key in ("effects", "direct_difference", "atp"):
        assert among["patching"][key] == alone["patching"][key], key
    assert among["integrated_gradients"]["attributions"] == alone["integrated_gradients"]["attributions"]


def test_social_windows_fill_every_tile_but_the_last_and_keep_every_rows_bits(tiny_models, hostile, monkeypatch):
    """Windows of a few rows over tiles of 64 positions: the rows of a window's last tile, where it is not full, wait
    for the next window (probe/social/scoring.py), so every tile but the run's last holds more than 64 - s positions
    (s: the longest row; first fit opens a tile only for a row that fits in no other), and the scores are the bits of
    one window holding every row."""
    import probe.core.packing as packing
    from probe.social.scoring import score_items

    monkeypatch.setenv("RM_PROBE_TILE_ROWS", "64")
    lm = tiny_models["llama-rm"]
    items = tiny.social_items(30, prompts=5)
    want = score_items(lm, "reward", items, batch_size=10_000, verify=0)["score"].to_list()
    calls = []
    real = packing.layout

    def spy(n_in, *args, **kw):
        out = real(n_in, *args, **kw)
        calls.append((max(n_in), [(used, length) for used, length, *_ in out.tiles]))
        return out

    monkeypatch.setattr(packing, "layout", spy)
    got = score_items(lm, "reward", items, batch_size=20, verify=0)["score"].to_list()
    assert got == want and len(set(want)) > 20
    tiles = [(s, used) for s, call in calls for used, length in call if length == 64]
    assert len(calls) >= 4 and len(tiles) > len(calls)
    assert all(used > 64 - s for s, used in tiles[:-1]), tiles
