"""Gemma 2's attention logit soft-cap on every path, with attention logits at the cap (as real checkpoints' reach).

transformers 5.17 builds and loads Gemma 2 with SDPA, which ignores ``attn_logit_softcapping``; 5.24 picks eager
attention. The tiny models of the other tests never reach the cap (attention logits about 0.01), so here the query
and key projections are scaled x12: the capped and uncapped forwards then differ by whole reward units. Every path
(prefix cache + shared-prefix kernel, plain cache, uncached, the full-sequence reference, GCG's gradient twin, the
API and `probe.load`) must give the eager forward's numbers, whichever implementation the model arrived with. SDPA
is set on the config directly, as 5.17 sets it (5.24 would refuse to be asked for it).
"""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.scoring import ScoringOptions, make_head
from probe.core.template import response_conversation, split_template
from probe.errors import ProbeError
from probe.models.loading import LoadedModel
from probe.models.registry import DEFAULT
from tests import tiny

pytestmark = pytest.mark.parity

PROMPT = "What, in one word, is the greatest thing ever?"
# float32 through 3 layers of capped attention: scores of about 1-5, a few float32 steps apart
TOL = dict(atol=5e-5, rtol=1e-5)


def at_the_cap(cls):
    tok = tiny.make_tokenizer("gemma")
    model = tiny.build(cls, tiny.gemma2_config(tok))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                param.mul_(12)
    return model, tok


def _sdpa(model):
    """The model as transformers 5.17 builds it: SDPA on the config (no soft-cap)."""
    model = copy.deepcopy(model)
    model.config._attn_implementation = "sdpa"
    for module in model.modules():
        if hasattr(module, "config") and module.config is not model.config:
            module.config._attn_implementation = "sdpa"
    return model


@pytest.fixture(scope="module", params=["reward", "logprob"])
def capped(request):
    from transformers import Gemma2ForCausalLM, Gemma2ForSequenceClassification

    mode = request.param
    model, tok = at_the_cap(Gemma2ForSequenceClassification if mode == "reward" else Gemma2ForCausalLM)
    lm = LoadedModel(model, tok, DEFAULT, "reward" if mode == "reward" else "causal", "tiny", "tiny", None, "test")
    split = split_template(tok, response_conversation(PROMPT))
    rows = [[t, *split.suffix_ids] for t in range(0, len(tok), 23)]
    rows += [[t, t + 1, *split.suffix_ids] for t in range(5, len(tok) - 1, 97)]  # two-token responses, padded
    return lm, mode, split, rows


def _uncapped(model, head, prefix, rows):
    """The scores without the cap (SDPA's forward, where transformers runs it without refusing: 5.17), else None."""
    sdpa = _sdpa(model)  # the head's own forward directly: the engine refuses such a model
    try:
        with torch.inference_mode():
            return torch.cat([head.own_forward(sdpa, torch.tensor([[*prefix, *r]]), len(prefix)).float()
                              for r in rows])
    except ValueError:  # transformers 5.24's SDPA refuses a soft-cap
        return None


def test_the_cap_matters_here(capped):
    """The premise: uncapped, the scores are far from the capped ones (else nothing below could fail)."""
    lm, mode, split, rows = capped
    head = make_head(lm, mode, ScoringOptions())
    truth = FullSequenceScorer(lm.model, head, split.prefix_ids).score(rows)
    assert lm.model.config._attn_implementation == "eager"
    assert truth.std() > 0.1
    # the capped/uncapped difference by hand: eager attention with the cap removed
    uncapped = copy.deepcopy(lm.model)
    uncapped.config.get_text_config().attn_logit_softcapping = None
    for layer in uncapped.model.layers if hasattr(uncapped, "model") else ():
        layer.self_attn.attn_logit_softcapping = None
    free = FullSequenceScorer(uncapped, head, split.prefix_ids).score(rows)
    assert (free - truth).abs().max() > 0.1  # 2,000 times the tolerance below


@pytest.mark.parametrize("path", ["shared", "cache", "uncached"])
def test_every_engine_path_applies_the_cap(capped, path):
    lm, mode, split, rows = capped
    head = make_head(lm, mode, ScoringOptions())
    truth = FullSequenceScorer(lm.model, head, split.prefix_ids).score(rows)
    scorer = PrefixScorer(lm.model, head, split.prefix_ids, use_cache=path != "uncached",
                          shared_attention=path == "shared")
    assert (scorer.shared is not None) == (path == "shared")
    torch.testing.assert_close(scorer.score(rows).cpu(), truth, **TOL)


def test_gcg_gradient_twin_applies_the_cap(capped):
    """`score_embeds` (GCG's differentiable forward) gives the scores `score` gives, at the cap."""
    lm, mode, split, rows = capped
    head = make_head(lm, mode, ScoringOptions())
    scorer = PrefixScorer(lm.model, head, split.prefix_ids)
    cont = torch.tensor([r for r in rows if len(r) == len(rows[0])][:6])
    emb = lm.model.get_input_embeddings()(cont)
    got = scorer.score_embeds(emb, cont).detach()
    torch.testing.assert_close(got, FullSequenceScorer(lm.model, head, split.prefix_ids).score(cont), **TOL)


def test_the_engine_refuses_a_model_whose_attention_ignores_the_cap(capped):
    lm, mode, split, rows = capped
    sdpa = _sdpa(lm.model)
    head = make_head(lm, mode, ScoringOptions())
    for build in (lambda: PrefixScorer(sdpa, head, split.prefix_ids),
                  lambda: FullSequenceScorer(sdpa, head, split.prefix_ids)):
        with pytest.raises(ProbeError, match="soft-cap"):
            build()


def test_the_api_switches_an_sdpa_model_to_the_trained_attention(capped, caplog):
    """A user's Gemma 2 loaded by transformers 5.17 (SDPA) through `probe.score_responses` and `probe.sweep`: the
    eager numbers, one warning, and the model left on eager attention."""
    import probe

    lm, mode, split, rows = capped
    head = make_head(lm, mode, ScoringOptions())
    responses = ["Love", "Peace", "War", "Time Light", "Water"]
    truth = probe.score_responses(lm.model, lm.tokenizer, PROMPT, responses, score=mode)
    sdpa = _sdpa(lm.model)
    with caplog.at_level(logging.WARNING, logger="probe.models.attention"):
        got = probe.score_responses(sdpa, lm.tokenizer, PROMPT, responses, score=mode)
    assert sdpa.config._attn_implementation == "eager"
    assert sum("soft-cap" in r.getMessage() for r in caplog.records) == 1
    torch.testing.assert_close(torch.tensor(got["score"].to_list()), torch.tensor(truth["score"].to_list()), **TOL)
    swept = probe.sweep(_sdpa(lm.model), lm.tokenizer, PROMPT, score=mode, limit=64).sort("token_id")
    rows64 = [[t, *split.suffix_ids] for t in range(64)]
    torch.testing.assert_close(torch.tensor(swept["score"].to_list()),
                               FullSequenceScorer(lm.model, head, split.prefix_ids).score(rows64), **TOL)
    uncapped = _uncapped(lm.model, head, split.prefix_ids, rows64[:8])
    if uncapped is not None:  # transformers 5.17: SDPA ran uncapped, far from what the switched model gave
        assert (uncapped - torch.tensor(swept["score"].to_list()[:8])).abs().max() > 0.1


def test_probe_load_chooses_and_records_the_trained_attention(tmp_path):
    """A saved Gemma 2 reward model through `probe.load`: eager attention whatever this transformers would pick,
    meta.json's model.attention says which ran, with the cap, and that rm-probe chose it; its scores are the eager
    forward's."""
    from transformers import Gemma2ForSequenceClassification

    import probe
    from probe.runs.meta import model_record

    model, tok = at_the_cap(Gemma2ForSequenceClassification)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lm = probe.load(str(tmp_path), device="cpu")
    record = model_record(lm)["attention"]
    assert record["implementation"] == "eager" and record["softcap"] == 2.0
    assert record["chosen_by"] == "rm-probe" and "caps its attention logits" in record["why"]
    split = split_template(tok, response_conversation(PROMPT))
    rows = [[t, *split.suffix_ids] for t in range(0, len(tok), 61)]
    head = make_head(lm, "reward", ScoringOptions())
    ref_lm = LoadedModel(model, tok, DEFAULT, "reward", "t", "t", None, "t")
    truth = FullSequenceScorer(model, make_head(ref_lm, "reward", ScoringOptions()), split.prefix_ids).score(rows)
    torch.testing.assert_close(PrefixScorer(lm.model, head, split.prefix_ids).score(rows).cpu(), truth, **TOL)


def test_models_without_a_cap_keep_what_transformers_chose(tiny_models):
    from probe.models.attention import record, use_trained_attention

    model = tiny_models["llama-rm"].model
    before = model.config._attn_implementation
    assert use_trained_attention(model) == {"implementation": before, "softcap": None, "chosen_by": "transformers"}
    assert model.config._attn_implementation == before == record(model)["implementation"]
