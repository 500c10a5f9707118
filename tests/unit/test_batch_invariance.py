"""Scores that depend only on what was asked (issue 62): every path, bitwise, whatever batch a row shared.

RewardBench's users see scores move with the batch size (its issue #137); so did rm-probe's: a tiny reward model's
sweep of 3,200 ids moved in 1,122 rows between batches of 256 and 7 (MKL's matrix-vector product under the reward
head), whole responses moved with the rows padded beside them, the fused log-probability head with the number of
positions. probe/core/invariance.py makes every call's shape a function of the row alone (fixed tiles); these tests
hold the machine at hand to what its records claim, bitwise (``torch.equal``, never a tolerance): wherever meta.json
would say ``batch_invariant: true`` (its row check found a product's row independent of its place and of the thread
count), the bits must not move. Nothing here assumes a property of the BLAS (MKL's strict mode does not promise that
a row's sum is independent of the rows beside it, and on an AVX2-only EPYC it is not): where the check finds a row
moving, the record says not invariant and the case is skipped; tests/unit/test_hostile_blas.py proves the design under
a BLAS double that keeps only the promise of the same bits for the same call. On a GPU (``--device cuda``, the kit)
the same tests run with its tiles.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from experiments.gpu_common import batch_invariance, invariance_batches
from probe.config import ScoringOptions
from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.scoring import AdaptiveBatcher, PairScorer, conversation, make_head, reference_head, sweep_rows
from probe.core.template import split_template
from tests import tiny

pytestmark = pytest.mark.parity
PROMPT = "What, in one word, is the greatest thing ever?"
CASES = [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("chatml-rm-padeot", "reward"), ("armo-like", "reward"),
         ("qrm-like", "reward"), ("qwen3-rm", "reward"), ("gemma3-rm", "reward"), ("llama-lm", "logprob"),
         ("gemma2-lm", "logprob"), ("gemma3-lm", "logprob"), ("llama-lm", "judge"), ("qwen3-lm", "rating")]
PATHS = ("shared", "cache", "uncached", "full")
# every family and head on the shared-prefix path (sweeps' and responses' default on these); the other paths, whose
# forwards are the same tiles through other attention, on a reward head, a gated head, the fused log-probability head
# and a judge (the GPU kit runs this file within its share of a 15-minute lease)
GRID = [(*case, "shared") for case in CASES] + [
    (*case, path) for case in (("llama-rm", "reward"), ("armo-like", "reward"), ("gemma3-lm", "logprob"),
                               ("llama-lm", "judge"))
    for path in PATHS if path != "shared"]


# the gated families' own forward is the tests' stand-in of their remote class (tests/gated_reference.py), whose sums
# are its own: rm-probe reads them by their cached head, and their own forward only checks it (within tolerance)
OWN_CODE = ("armo-like", "qrm-like")


def _setup(tiny_models, name: str, mode: str, claimed: bool = False):
    lm = tiny_models[name]
    if claimed:
        _claimed(lm)
    opts = ScoringOptions()
    head = make_head(lm, mode, opts)
    split = split_template(lm.tokenizer, conversation(mode, PROMPT, None, opts, lm), n_verify=0)
    return lm, head, split


def _scorer(lm, head, split, path: str):
    if path == "full":  # the model's own forward, rows of one length together (encoders and PairRM run it)
        return FullSequenceScorer(lm.model, head, split.prefix_ids, batch_size=None)
    return PrefixScorer(lm.model, head, split.prefix_ids, use_cache=path != "uncached",
                        shared_attention=path == "shared")


def _claimed(lm) -> None:
    """These tests hold the machine at hand to what its run records claim: bitwise equality wherever meta.json would
    say ``batch_invariant: true``. Where this device's own row check finds a product's row moving with its place (a
    BLAS may: it promises only the same bits for the same call), the record says so and the claim is not made, so
    there is nothing to hold it to here: tests/unit/test_hostile_blas.py proves the design under a double instead."""
    from probe.core.invariance import describe

    record = describe(next(lm.model.parameters()).device, lm.model)
    if not record["batch_invariant"]:
        pytest.skip(f"not claimed on this device: {record.get('why_not')}")


def _case(tiny_models, name: str, mode: str, path: str, device):
    """(model, split, score function) of a case; skipped where the path is not rm-probe's own arithmetic."""
    if path == "full" and name in OWN_CODE and device.type != "cpu":
        pytest.skip("the test's own stand-in of a remote class sums in its own way (OWN_CODE)")
    lm, head, split = _setup(tiny_models, name, mode, claimed=True)
    return lm, split, _scorer(lm, head, split, path).score


def _at(score, rows, batch: int) -> torch.Tensor:
    return torch.cat([score(rows[i : i + batch]).cpu() for i in range(0, len(rows), batch)])


def _tight(score, most: int, from_call: int):
    """``score`` that runs out of memory on a part of more than ``most`` rows from its ``from_call``-th call on (as a
    GPU does once the batch outgrows it): the batcher halves and scores the same rows again, smaller."""
    calls = {"n": 0}

    def tight(part):
        calls["n"] += 1
        if len(part) > most and calls["n"] >= from_call:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return score(part)

    return tight


def _responses(tok, split, n: int, seed: int, longest: int = 20) -> list[list[int]]:
    """``n`` responses of 1 to ``longest`` ids (some of them special tokens), each with the template's closing ids."""
    rng = random.Random(seed)
    specials = list(tok.all_special_ids)
    return [[rng.choice(specials) if rng.random() < 0.1 else rng.randrange(len(tok))
             for _ in range(rng.randint(1, longest))] + list(split.suffix_ids) for _ in range(n)]


@pytest.mark.parametrize("name,mode,path", GRID)
def test_a_sweep_row_has_the_same_bits_at_every_batch_size_and_position(tiny_models, name, mode, path, device):
    lm, split, score = _case(tiny_models, name, mode, path, device)
    rows = sweep_rows(np.arange(0, len(lm.tokenizer), 9), split.suffix_ids)
    base = _at(score, rows, 256)
    assert base.std() > 1e-3  # scores that vary: the comparison is not between constants
    for batch in (85, 7):
        assert torch.equal(_at(score, rows, batch), base), batch
    assert torch.equal(_at(score, rows[:12], 1), base[:12])
    assert torch.equal(_at(score, rows.flip(0), 256).flip(0), base)  # each row at another position of its batch


@pytest.mark.parametrize("name,mode,path", GRID)
def test_a_whole_response_has_the_same_bits_whatever_rows_are_padded_beside_it(tiny_models, name, mode, path, device):
    lm, split, score = _case(tiny_models, name, mode, path, device)
    rows = _responses(lm.tokenizer, split, 24, seed=3)
    assert len({len(r) for r in rows}) > 8  # rows of many lengths, padded beside each other
    base = _at(score, rows, 24)
    assert torch.equal(_at(score, rows, 5), base)
    assert torch.equal(_at(score, rows[:8], 1), base[:8])
    order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))  # the longest first: every batch padded otherwise
    assert torch.equal(_at(score, [rows[i] for i in order], 8), base[order])


@pytest.mark.parametrize("path", ("shared", "cache", "uncached"))
@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("llama-lm", "logprob"),
                                       ("gemma3-lm", "logprob"), ("armo-like", "reward")])
def test_a_trace_has_the_same_bits_however_its_responses_are_dealt(tiny_models, name, mode, path):
    """``probe trace`` scores every prefix of a response from one forward over a chunk of responses (64 a process;
    under torchrun round robin over the ranks): a response's trace must not depend on its chunk."""
    lm, head, split = _setup(tiny_models, name, mode, claimed=True)
    responses = _responses(lm.tokenizer, split, 12, seed=5, longest=12)
    sc = _scorer(lm, head, split, path)
    together = sc.score_prefixes(responses)
    dealt = [sc.score_prefixes(responses[i::3]) for i in range(3)]  # three ranks, round robin
    for i, want in enumerate(together):
        assert torch.equal(dealt[i % 3][i // 3], want), i
    alone = [sc.score_prefixes([r])[0] for r in responses]
    assert all(torch.equal(a, b) for a, b in zip(alone, together))


def test_the_implicit_reward_and_its_reference_are_batch_invariant(tiny_models):
    """``--ref``: beta x (log p under the model - log p under the reference), each model on its own shared prefix."""
    from dataclasses import replace

    from tests.tiny import perturbed_copy

    lm = tiny_models["llama-lm"]
    _claimed(lm)
    ref = replace(lm, model=perturbed_copy(lm.model))
    lm = replace(lm, ref=ref, beta=0.5)
    head = make_head(lm, "logprob")
    split = split_template(lm.tokenizer, conversation("logprob", PROMPT, None, ScoringOptions(), lm), n_verify=0)
    pair = PairScorer(PrefixScorer(lm.model, head, split.prefix_ids),
                      PrefixScorer(ref.model, reference_head(lm, head), split.prefix_ids), 0.5)
    rows = _responses(lm.tokenizer, split, 30, seed=9)
    base = _at(pair.score, rows, 30)
    assert base.std() > 1e-3
    assert torch.equal(_at(pair.score, rows, 4), base) and torch.equal(_at(pair.score, rows, 1), base)


def test_an_out_of_memory_halving_changes_no_bit(tiny_models):
    """The batcher halves the batch after an out-of-memory error and scores the same rows again, smaller."""
    lm, head, split = _setup(tiny_models, "llama-rm", "reward", claimed=True)
    rows = sweep_rows(np.arange(len(lm.tokenizer)), split.suffix_ids)
    sc = PrefixScorer(lm.model, head, split.prefix_ids)
    want = AdaptiveBatcher(256).run(sc.score, rows)
    batcher = AdaptiveBatcher(256)
    got = batcher.run(_tight(sc.score, 37, 3), rows)
    assert batcher.batch_size == 32 and np.array_equal(got, want)


def test_gcg_reports_the_score_its_result_has_alone_and_searches_alike_at_any_batch_size(tiny_models):
    """GCG scores its candidates in batches; the score it reports for the best (``search_score``) is the bits that
    sequence gets alone, and another batch size walks the same trajectory to the same bits."""
    import probe
    from probe.config import GCGConfig

    lm, head, split = _setup(tiny_models, "llama-rm", "reward", claimed=True)
    config = GCGConfig(length=3, steps=3, search_width=48, topk=16, seed=1, progress=False)
    result = probe.gcg(lm, None, PROMPT, config=config)
    alone = PrefixScorer(lm.model, head, split.prefix_ids).score([list(result.best_ids) + list(split.suffix_ids)])
    assert result.search_score == float(alone[0])
    other = probe.gcg(lm, None, PROMPT, config=config, batch_size=7)
    assert other.best_ids == result.best_ids and other.search_score == result.search_score
    def walk(res):  # every step's scores and ids (not its seconds)
        return [{k: v for k, v in step.items() if k != "seconds"} for r in res.runs for step in r.trajectory]

    assert walk(other) == walk(result)


def test_social_items_have_the_same_bits_at_every_batch_size(tiny_models):
    from probe.social.scoring import score_items

    lm = tiny_models["llama-rm"]
    _claimed(lm)
    items = tiny.social_items(18)
    want = score_items(lm, "reward", items, batch_size=64, verify=0)["score"].to_list()
    assert len(set(want)) > 10
    for batch in (5, 1):
        assert score_items(lm, "reward", items, batch_size=batch, verify=0)["score"].to_list() == want


# ------------------------------------------------------------------------------------------ the kit's measurement
def test_batch_invariance_counts_what_moves():
    """A scorer whose row 5 gains 1.5 in odd-sized batches: the odd size moves it above row 4 (two rank changes,
    the best 20 change, the worst do not); the even sizes change nothing."""
    def score(x: torch.Tensor) -> torch.Tensor:
        return -x[:, 0].float() + 1.5 * (x.shape[0] % 2) * (x[:, 0] == 5).float()

    rows = torch.arange(100).reshape(-1, 1)
    r = batch_invariance(score, rows, [40, 13, 10])
    odd, even = r["against"]
    assert (odd["batch"], odd["max_abs_diff"], odd["rank_changes"]) == (13, 1.5, 2)
    assert not odd["top_same"] and odd["bottom_same"] and not odd["bitwise"]
    assert (even["max_abs_diff"], even["rank_changes"], even["top_same"], even["bitwise"]) == (0.0, 0, True, True)
    assert (r["max_abs_diff"], r["rank_changes"], r["bitwise"]) == (1.5, 2, False)
    assert r["reversed"]["bitwise"]  # the same batches, rows in reverse order: row 5 never in an odd batch here

    def by_position(x: torch.Tensor) -> torch.Tensor:  # a kernel whose rows round by their place in the batch
        return -x[:, 0].float() + 1e-3 * torch.arange(x.shape[0]).float()

    assert not batch_invariance(by_position, rows, [40])["reversed"]["bitwise"]


def test_invariance_batches():
    assert invariance_batches(256, 4096) == [256, 85, 64, 16]
    assert invariance_batches(8192, 4096) == [4096, 1365, 1024, 256]  # never above the rows compared
    assert invariance_batches(4, 4096) == [4, 3, 1]
    # a batch halved to 1 or 2 by memory: nothing larger is tried (before: a batch of 3 compared against)
    assert invariance_batches(2, 4096) == [2, 1] and invariance_batches(1, 4096) == [1]
    assert all(invariance_batches(r, 4096)[0] == r == max(invariance_batches(r, 4096)) for r in range(1, 40))


@pytest.mark.parametrize("name,mode", [("gemma3-lm", "logprob"), ("llama-lm", "logprob"), ("gemma2-rm", "reward")])
def test_a_trace_has_the_same_bits_at_every_thread_count(tiny_models, name, mode):
    """torchrun sets ``OMP_NUM_THREADS=1``: a trace under it must be one process's. ATen splits an activation (GELU's
    tanh form, SiLU) over threads at element counts that follow the thread count, and rounds the split's scalar
    tails otherwise than its vector loop; 3 threads split 41 responses of one length (one forward: a CPU runs each
    length alone) off the vector width."""
    lm, head, split = _setup(tiny_models, name, mode, claimed=True)
    rng = random.Random(11)
    sc = PrefixScorer(lm.model, head, split.prefix_ids)
    threads = torch.get_num_threads()
    for length in (19, 20, 21):
        responses = [[rng.randrange(len(lm.tokenizer)) for _ in range(length)] + list(split.suffix_ids)
                     for _ in range(41)]
        try:
            got = {}
            for n in (1, 3):
                torch.set_num_threads(n)
                got[n] = torch.cat(sc.score_prefixes(responses))
        finally:
            torch.set_num_threads(threads)
        assert got[1].std() > 1e-3 and torch.equal(got[1], got[3]), length
