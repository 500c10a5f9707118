"""Families users run that the shared-prefix kernel does not cover (Mistral, Phi-3, Cohere's ``logit_scale``,
Granite's ``logits_scaling``), Gemma 3 rows longer than its sliding window, a head read at column K, and the
mean log-probability: each against the model's own forward, read by the test itself (not by a head's reader).
"""

from __future__ import annotations

import random

import pytest
import torch

from probe.core.engine import PrefixScorer
from probe.core.heads import LinearRewardHead, LogprobHead
from probe.core.scoring import ScoringOptions, make_head, prompt_split
from probe.models.loading import LoadedModel
from probe.models.registry import DEFAULT
from tests import tiny

PROMPT = "What, in one word, is the greatest thing ever?"
TOL = dict(atol=2e-5, rtol=2e-5)


def _loaded(model, tok, kind):
    return LoadedModel(model, tok, DEFAULT, kind, "tiny", "tiny", None, "test")


def _family(name: str, tokenizers) -> LoadedModel:
    """Tiny random models of each family, built with transformers' own modelling code."""
    from transformers import (CohereConfig, CohereForCausalLM, GraniteConfig, GraniteForCausalLM, MistralConfig,
                              MistralForCausalLM, MistralForSequenceClassification, Phi3Config, Phi3ForCausalLM,
                              Phi3ForSequenceClassification)

    tok = tokenizers["chatml"]
    common = tiny._common(tok)
    if name == "mistral-rm":  # sliding window 8 < prompt length
        return _loaded(tiny.build(MistralForSequenceClassification, MistralConfig(**common, num_labels=1,
                                                                                 sliding_window=8)), tok, "reward")
    if name == "mistral-lm":
        return _loaded(tiny.build(MistralForCausalLM, MistralConfig(**common)), tok, "causal")
    if name == "phi3-rm":  # fused qkv and gate_up projections, partial rotary
        return _loaded(tiny.build(Phi3ForSequenceClassification, Phi3Config(**common, num_labels=1,
                                                                           partial_rotary_factor=0.5)), tok, "reward")
    if name == "phi3-lm":
        return _loaded(tiny.build(Phi3ForCausalLM, Phi3Config(**common)), tok, "causal")
    if name == "cohere-lm":  # logits multiplied by logit_scale, parallel attention + MLP, LayerNorm
        return _loaded(tiny.build(CohereForCausalLM, CohereConfig(**common, logit_scale=0.25)), tok, "causal")
    if name == "granite-lm":  # logits divided by logits_scaling; embedding, residual and attention multipliers
        return _loaded(tiny.build(GraniteForCausalLM, GraniteConfig(**common, logits_scaling=4.0,
                                                                   embedding_multiplier=2.0, residual_multiplier=0.5,
                                                                   attention_multiplier=0.2)), tok, "causal")
    raise KeyError(name)


@pytest.fixture(scope="module")
def families(tokenizers):
    return {n: _family(n, tokenizers)
            for n in ("mistral-rm", "mistral-lm", "phi3-rm", "phi3-lm", "cohere-lm", "granite-lm")}


def _rows(tok, suffix, n, max_len, seed):
    rng = random.Random(seed)
    return [[rng.randrange(len(tok)) for _ in range(rng.randint(1, max_len))] + list(suffix) for _ in range(n)]


def _own_score(model, kind, full_ids, n_prefix, reduce="sum", column=0):
    """The model's own forward over one whole sequence, read here: the classifier's logits at column ``column``
    (transformers pools the last non-pad token), or the sum/mean of log p(token) over the response tokens."""
    ids = torch.tensor([full_ids])
    with torch.no_grad():
        out = model(input_ids=ids).logits
    if kind == "reward":
        return float(out[0, column])
    logp = torch.log_softmax(out[0].double(), -1)
    terms = [float(logp[i - 1, full_ids[i]]) for i in range(n_prefix, len(full_ids))]
    return sum(terms) / len(terms) if reduce == "mean" else sum(terms)


@pytest.mark.parametrize("name,mode", [("mistral-rm", "reward"), ("mistral-lm", "logprob"), ("phi3-rm", "reward"),
                                       ("phi3-lm", "logprob"), ("cohere-lm", "logprob"), ("granite-lm", "logprob")])
def test_cached_scores_equal_the_models_own_forward(families, name, mode):
    lm = families[name]
    split = prompt_split(lm, mode, PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    scorer = PrefixScorer(lm.model, make_head(lm, mode), split.prefix_ids)
    # Mistral and Cohere take the plain cache path; Phi-3 and Granite the shared-prefix attention (issue 71)
    assert (scorer.shared is None) == (name.split("-")[0] in ("mistral", "cohere"))
    rows = _rows(lm.tokenizer, split.suffix_ids, 16, 4, seed=5)
    got = scorer.score(rows)
    want = torch.tensor([_own_score(lm.model, lm.kind, list(split.prefix_ids) + r, len(split.prefix_ids))
                         for r in rows], dtype=torch.float32)
    torch.testing.assert_close(got, want, **TOL)
    assert want.std() > 1e-3


@pytest.mark.parametrize("name", ["cohere-lm", "granite-lm"])
def test_the_logit_transform_matters(families, name):
    """Without Cohere's logit_scale or Granite's logits_scaling the log-probabilities differ: the parity above
    could not pass with the transform left out."""
    lm = families[name]
    split = prompt_split(lm, "logprob", PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    rows = _rows(lm.tokenizer, split.suffix_ids, 8, 3, seed=6)
    with_transform = PrefixScorer(lm.model, LogprobHead(lm.model), split.prefix_ids).score(rows)
    cfg = lm.model.config
    attr = "logit_scale" if name == "cohere-lm" else "logits_scaling"
    before = getattr(cfg, attr)
    setattr(cfg, attr, 1.0)  # the identity: as if the transform were left out
    try:
        without = PrefixScorer(lm.model, LogprobHead(lm.model), split.prefix_ids).score(rows)
    finally:
        setattr(cfg, attr, before)
    assert (with_transform - without).abs().max() > 0.1


@pytest.mark.parametrize("shared", [True, False])
def test_gemma3_rows_longer_than_the_sliding_window(tiny_models, shared):
    """12 and 20 new tokens on top of the prefix, the sliding window 8: the sliding layers must drop the prefix
    and the early new tokens as the model's own forward does."""
    lm = tiny_models["gemma3-rm"]
    split = prompt_split(lm, "reward", PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    rng = random.Random(9)
    rows = [[rng.randrange(len(lm.tokenizer)) for _ in range(n)] + list(split.suffix_ids) for n in (12, 12, 20, 3)]
    scorer = PrefixScorer(lm.model, make_head(lm, "reward"), split.prefix_ids, shared_attention=shared)
    assert (scorer.shared is not None) == shared
    got = scorer.score(rows).cpu()
    want = torch.tensor([_own_score(lm.model.cpu(), "reward", list(split.prefix_ids) + r, len(split.prefix_ids))
                         for r in rows], dtype=torch.float32)
    torch.testing.assert_close(got, want, **TOL)


def test_label_index_reads_column_k_of_a_three_output_head(tiny_dirs):
    """``--label-index K`` against the model's own logits read at column K by the test: each column's score is
    its own (a head that always read column 0 fails for K = 1, 2), through the API and the loader."""
    import probe

    rows_text = ["Love", "nature", "The Beatles"]
    per_column = []
    for k in range(3):
        lm = probe.load(tiny_dirs["rm3"], device="cpu", label_index=k)
        assert lm.spec.label_index == k
        df = probe.score_responses(lm, None, PROMPT, rows_text).sort("response")
        tok = lm.tokenizer
        want = []
        for response in df["response"]:
            conv = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": response}]
            ids = tok.apply_chat_template(conv, tokenize=True, return_dict=False)
            want.append(_own_score(lm.model, "reward", list(ids), 0, column=k))
        torch.testing.assert_close(torch.tensor(df["score"].to_list()), torch.tensor(want), **TOL)
        per_column.append(want)
    assert per_column[0] != per_column[1] != per_column[2]


def test_linear_head_at_column_k_on_the_engine(tiny_dirs):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(tiny_dirs["rm3"]).eval()
    tok = AutoTokenizer.from_pretrained(tiny_dirs["rm3"])
    lm = _loaded(model, tok, "reward")
    split = prompt_split(lm, "reward", PROMPT, None, ScoringOptions(), len(tok))
    rows = _rows(tok, split.suffix_ids, 10, 3, seed=8)
    for k in range(3):
        got = PrefixScorer(model, LinearRewardHead(model, label_index=k), split.prefix_ids).score(rows)
        want = [_own_score(model, "reward", list(split.prefix_ids) + r, 0, column=k) for r in rows]
        torch.testing.assert_close(got, torch.tensor(want), **TOL)


@pytest.mark.parametrize("name", ["llama-lm", "gemma2-lm"])
def test_mean_logprob_equals_the_mean_computed_from_logits(tiny_models, name):
    """``reduce="mean"`` (the social command's default for causal LMs): the mean of log p over the response
    and closing tokens, from the model's own logits, rows of different lengths in one padded batch."""
    lm = tiny_models[name]
    split = prompt_split(lm, "logprob", PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    rows = _rows(lm.tokenizer, split.suffix_ids, 12, 5, seed=4)
    assert len({len(r) for r in rows}) > 2
    model = lm.model.cpu()
    for reduce in ("mean", "sum"):
        got = PrefixScorer(model, LogprobHead(model, reduce), split.prefix_ids).score(rows)
        want = [_own_score(model, "causal", list(split.prefix_ids) + r, len(split.prefix_ids), reduce) for r in rows]
        torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float32), atol=2e-5, rtol=2e-5)
