"""Cached, batched scores equal the model's own full-sequence forward, one sequence at a time (float32)."""

import random

import pytest
import torch

from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.heads import pool_positions
from probe.core.scoring import ScoringOptions, make_head
from probe.core.template import judge_conversation, response_conversation, split_template

pytestmark = pytest.mark.parity

PROMPT = "What, in one word, is the greatest thing ever?"
CASES = [
    ("llama-rm", "reward"), ("gemma2-rm", "reward"), ("chatml-rm-padeot", "reward"),
    ("armo-like", "reward"), ("qrm-like", "reward"),
    ("llama-lm", "logprob"), ("gemma2-lm", "logprob"), ("llama-lm", "judge"), ("gemma2-lm", "judge"),
    ("qwen2-rm", "reward"), ("qwen3-rm", "reward"), ("gemma3-rm", "reward"), ("qwen3-lm", "logprob"),
    ("gemma3-lm", "logprob"),
]
TOL = dict(atol=2e-5, rtol=2e-5)


def _setup(tiny_models, name, mode):
    lm = tiny_models[name]
    head = make_head(lm, mode, ScoringOptions())
    build = judge_conversation(PROMPT) if mode == "judge" else response_conversation(PROMPT)
    split = split_template(lm.tokenizer, build)
    return lm, head, split


def _random_rows(tok, split, n, max_len, seed):
    rng = random.Random(seed)
    specials = list(tok.all_special_ids)
    rows = []
    for i in range(n):
        length = rng.randint(1, max_len)
        resp = [rng.choice(specials) if rng.random() < 0.15 else rng.randrange(len(tok)) for _ in range(length)]
        rows.append(resp + list(split.suffix_ids))
    return rows


@pytest.mark.parametrize("name,mode", CASES)
def test_single_tokens_cached_equals_full_sequence(tiny_models, name, mode):
    lm, head, split = _setup(tiny_models, name, mode)
    ids = list(range(0, len(lm.tokenizer), 37)) + list(lm.tokenizer.all_special_ids)
    rows = [[t, *split.suffix_ids] for t in ids]
    fast = PrefixScorer(lm.model, head, split.prefix_ids).score(rows).cpu()
    ref = FullSequenceScorer(lm.model, head, split.prefix_ids, batch_size=1).score(rows)
    torch.testing.assert_close(fast, ref, **TOL)
    assert ref.std() > 1e-3  # the scores really vary: the comparison is not between constants


@pytest.mark.parametrize("name,mode", CASES)
def test_variable_length_padded_batch_equals_full_sequence(tiny_models, name, mode):
    lm, head, split = _setup(tiny_models, name, mode)
    rows = _random_rows(lm.tokenizer, split, 24, 5, seed=7)
    assert len({len(r) for r in rows}) > 2
    fast = PrefixScorer(lm.model, head, split.prefix_ids).score(rows).cpu()
    ref = FullSequenceScorer(lm.model, head, split.prefix_ids, batch_size=1).score(rows)
    torch.testing.assert_close(fast, ref, **TOL)


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-lm", "logprob"), ("armo-like", "reward")])
def test_batched_equals_one_by_one_and_uncached(tiny_models, name, mode):
    lm, head, split = _setup(tiny_models, name, mode)
    rows = _random_rows(lm.tokenizer, split, 12, 3, seed=11)
    scorer = PrefixScorer(lm.model, head, split.prefix_ids)
    batched = scorer.score(rows).cpu()
    singles = torch.cat([scorer.score([r]).cpu() for r in rows])
    torch.testing.assert_close(batched, singles, **TOL)
    uncached = PrefixScorer(lm.model, head, split.prefix_ids, use_cache=False).score(rows).cpu()
    torch.testing.assert_close(batched, uncached, **TOL)


@pytest.mark.parametrize("shared", [False, True])
def test_prefix_cache_is_not_mutated_by_scoring(tiny_models, shared):
    lm, head, split = _setup(tiny_models, "gemma2-rm", "reward")
    scorer = PrefixScorer(lm.model, head, split.prefix_ids, shared_attention=shared)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in scorer.cache.layers]
    lengths = [layer.get_seq_length() for layer in scorer.cache.layers]
    rows = _random_rows(lm.tokenizer, split, 8, 4, seed=1)
    first = scorer.score(rows)
    second = scorer.score(rows)
    torch.testing.assert_close(first, second, atol=0, rtol=0)
    for (k, v), layer, n in zip(before, scorer.cache.layers, lengths):
        assert torch.equal(k, layer.keys) and torch.equal(v, layer.values)
        assert layer.get_seq_length() == n


def test_gradients_flow_through_embeddings(tiny_models):
    lm, head, split = _setup(tiny_models, "armo-like", "reward")
    scorer = PrefixScorer(lm.model, head, split.prefix_ids)
    love = lm.tokenizer.encode("Love", add_special_tokens=False)
    rows = torch.tensor([love + list(split.suffix_ids)] * 3, device=lm.model.device)
    emb = lm.model.get_input_embeddings()(rows).detach().requires_grad_(True)
    out = scorer.score_embeds(emb, rows)
    out.sum().backward()
    assert emb.grad is not None and emb.grad.abs().sum() > 0
    torch.testing.assert_close(out.detach(), scorer.score(rows), **TOL)


def _pool_brute(ids, pad, rule):
    if pad is None:
        return len(ids) - 1
    if rule == "last_non_pad":
        return max((i for i, t in enumerate(ids) if t != pad), default=0)
    first = next((i for i, t in enumerate(ids) if t == pad), None)
    return len(ids) - 1 if first is None else (first - 1) % len(ids)


@pytest.mark.parametrize("rule", ["last_non_pad", "before_first_pad"])
@pytest.mark.parametrize("pad_in_prefix", [False, True])
def test_pool_positions_match_brute_force(rule, pad_in_prefix):
    rng = random.Random(0)
    pad = 3
    prefix = [5, 6, pad if pad_in_prefix else 7, 8]
    rows, lengths = [], []
    for _ in range(200):
        n = rng.randint(1, 5)
        rows.append([rng.choice([pad, 1, 2, 9]) for _ in range(n)] + [0] * (5 - n))
        lengths.append(n)
    got = pool_positions(prefix, torch.tensor(rows), torch.tensor(lengths), pad, rule).tolist()
    want = [_pool_brute(prefix + r[:n], pad, rule) for r, n in zip(rows, lengths)]
    assert got == want
