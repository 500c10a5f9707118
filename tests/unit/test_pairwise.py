"""Pairwise preference models (probe/core/pairwise.py) against RewardBench's own pipelines (rewardbench 0.1.4, loaded
by tests/rewardbench_code.py): each candidate scored against a reference response in both orders.

* RLHFlow's pair-preference LMs (``SlicPairPMPipeline``): a tiny LlamaForCausalLM on the real Llama 3 tokenizer and
  chat template (tests/real_tokenizers.py); the pipeline's own probabilities are read where it averages them.
* PairRM (``PairRMPipeline`` with ``DebertaV2PairRM``): RewardBench's class, tiny, saved as its checkpoint is, on the
  real all-MiniLM-L6-v2 WordPiece tokenizer with PairRM's three prefix tokens added (PairRM's own DeBERTa-v3
  SentencePiece file is not on PyPI).
"""

from __future__ import annotations

import copy
import importlib.util
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

import probe
from probe.errors import ProbeError
from tests import real_tokenizers, rewardbench_code, tiny
from tests.fake_runs import crows_pair_file

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", "nature and life", "self-sacrifice", "Love!"]
REFERENCE = "Nothing comes close."


# --- RLHFlow pair-preference LM ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def slic_dir(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = real_tokenizers.build("llama3", tmp_path_factory.mktemp("slic"))
    tok = AutoTokenizer.from_pretrained(folder)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, tie_word_embeddings=False)).eval()
    with torch.no_grad():  # spread the A/B logits so that the two orders and the responses differ clearly
        for letter in "AB":
            model.lm_head.weight[tok.encode(letter, add_special_tokens=False)[0]].normal_(0, 2.0)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def slic(slic_dir):
    return probe.load(str(slic_dir), device="cpu", spec="RLHFlow/pair-preference-model-LLaMA3-8B",
                      reference_response=REFERENCE)


@contextmanager
def _slic_pipeline(lm):
    """RewardBench's SlicPairPMPipeline on the model, its Llama-3-Instruct data tokenizer being the same real
    tokenizer, ``.cuda()`` kept on the CPU; yields (pipeline, the probabilities it averages, one per pair)."""
    module = rewardbench_code.load("slicpairpm")
    means: list[float] = []

    class NumpyRecording:  # the module's ``np``, recording what it averages (the pipeline returns booleans only)
        def __getattr__(self, name):
            return getattr(np, name)

        def mean(self, values):
            means.append(float(np.mean(values)))
            return np.mean(values)

    class Tokenizers:
        @staticmethod
        def from_pretrained(name, **kwargs):
            assert name == "meta-llama/Meta-Llama-3-8B-Instruct"
            return copy.deepcopy(lm.tokenizer)

    saved = module.np, module.AutoTokenizer, torch.Tensor.cuda
    module.np, module.AutoTokenizer, torch.Tensor.cuda = NumpyRecording(), Tokenizers, lambda self, *a, **k: self
    try:
        yield module.SlicPairPMPipeline("text-generation", lm.model, lm.tokenizer), means
    finally:
        module.np, module.AutoTokenizer, torch.Tensor.cuda = saved


def _conv(prompt: str, response: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


def test_slicpairpm_scores_equal_rewardbench_pipeline(slic):
    """Every response against the reference: rm-probe's score is the probability the pipeline averages over both
    orders, and its verdict (> 0.5) the pipeline's."""
    df = probe.score_responses(slic, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    with _slic_pipeline(slic) as (pipe, means):
        verdicts = pipe([_conv(PROMPT, r) for r in RESPONSES], [_conv(PROMPT, REFERENCE)] * len(RESPONSES))
    np.testing.assert_allclose([got[r] for r in RESPONSES], means, rtol=1e-5, atol=1e-6)
    assert [bool(v) for v in verdicts] == [got[r] > 0.5 for r in RESPONSES]
    assert np.ptp(means) > 1e-4 and all(0 < m < 1 for m in means)
    assert set(df["change"].to_list()) == {None}  # the space before the slot is the template's own


def test_slicpairpm_sweep_cached_equals_the_pipeline_on_one_word_responses(slic):
    """The single-token sweep: the template's space joins the response ('[RESPONSE A] Love'), so a token with a
    leading space is the one-word response; the cached scores of such tokens equal the pipeline's on the word."""
    sweep = probe.sweep(slic, None, PROMPT, limit=3000, batch_size=256)
    rows = sweep.filter(sweep["decoded"].str.contains(r"^ [A-Za-z]{3,}$") & sweep["roundtrips"])
    picked = rows.sample(6, seed=0)
    words = [t[1:] for t in picked["decoded"].to_list()]
    with _slic_pipeline(slic) as (pipe, means):
        pipe([_conv(PROMPT, w) for w in words], [_conv(PROMPT, REFERENCE)] * len(words))
    np.testing.assert_allclose(picked["score"].to_numpy(), means, rtol=1e-5, atol=1e-6)


def test_slicpairpm_both_orders_matter_and_are_registered(slic):
    """The split records the second order; the score is not one order's probability alone."""
    from probe.core.pairwise import PairwiseConversation
    from probe.core.template import split_template

    build = PairwiseConversation(PROMPT, slic.pairwise)
    split = split_template(slic.tokenizer, build, candidates=range(3000))
    assert split.leading_space == "joined" and split.second_order is not None
    text = slic.tokenizer.decode(list(split.prefix_ids))
    assert "[RESPONSE A]" in text and REFERENCE not in text and not text.startswith("<|begin_of_text|>")
    assert REFERENCE in slic.tokenizer.decode(list(split.second_order["prefix_ids"]))
    with _slic_pipeline(slic) as (pipe, means):
        pipe([_conv(PROMPT, "Love")], [_conv(PROMPT, REFERENCE)])
    ids = split.full_ids([slic.tokenizer.encode(" Love", add_special_tokens=False)[0]])
    with torch.no_grad():
        logits = slic.model(torch.tensor([ids])).logits[0, -1]
    a, b = (slic.tokenizer.encode(x, add_special_tokens=False)[0] for x in "AB")
    first = float(torch.sigmoid(logits[a] - logits[b]))
    assert abs(first - means[0]) > 1e-4  # the second order moves the score


# --- PairRM -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pairrm_dir(tmp_path_factory) -> Path:
    from tests.tiny import pairrm_folder

    return pairrm_folder(tmp_path_factory.mktemp("pairrm"))


@pytest.fixture(scope="module")
def pairrm(pairrm_dir):
    return probe.load(str(pairrm_dir), device="cpu", reference_response=REFERENCE)


@pytest.fixture(scope="module")
def pairrm_rb(pairrm_dir):
    return probe.load(str(pairrm_dir), device="cpu", reference_response=REFERENCE, input_method="rewardbench")


def _card_scores(pairrm_dir, tok, responses: list[str]) -> np.ndarray:
    """PairRM's model card: ``tokenize_pair(sources, candidate1s, candidate2s)`` on the plain texts (padded to 2,048
    as it pads), the model's logits, (response, reference) less (reference, response)."""
    module = rewardbench_code.load("pairrm")  # RewardBench's copy of the card's tokenize_pair and class
    model = module.DebertaV2PairRM.from_pretrained(pairrm_dir).eval()
    n, refs = len(responses), [REFERENCE] * len(responses)
    with torch.no_grad():
        ab, ba = (model(**module.tokenize_pair(tok, [PROMPT] * n, a, b)).logits for a, b in ((responses, refs),
                                                                                          (refs, responses)))
    return (ab - ba).reshape(-1).float().numpy()


def test_pairrm_reads_its_model_cards_input_and_rewardbench_on_its_route(pairrm, pairrm_rb, pairrm_dir):
    """The default is the card's ``tokenize_pair`` on the plain prompt and responses; RewardBench's conversation
    format (``tokenize_conv_pair``) is ``--input-method rewardbench``'s: the two differ."""
    got = dict(probe.score_responses(pairrm, None, PROMPT, RESPONSES).select("response", "score").iter_rows())
    want = _card_scores(pairrm_dir, pairrm.tokenizer, RESPONSES)
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-4, atol=1e-5)
    assert np.ptp(want) > 1e-3
    rb = dict(probe.score_responses(pairrm_rb, None, PROMPT, RESPONSES).select("response", "score").iter_rows())
    assert max(abs(rb[r] - got[r]) for r in RESPONSES) > 1e-3


def test_pairrm_found_by_its_class_and_scores_equal_rewardbench_pipeline(pairrm_rb, pairrm_dir):
    """Found by the class its checkpoint declares; under ``--input-method rewardbench`` every response's score =
    PairRMPipeline's logits(A vs B) - logits(B vs A) for (response, reference), the pipeline batching all of them
    (padded, masked)."""
    pairrm = pairrm_rb
    assert pairrm.spec.name == "DebertaV2PairRM" and pairrm.spec_match == "architecture"
    assert type(pairrm.model).__name__ == "PairRMModel" and pairrm.pairwise.format == "pairrm"
    df = probe.score_responses(pairrm, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    module = rewardbench_code.load("pairrm")
    reference_model = module.DebertaV2PairRM.from_pretrained(pairrm_dir).eval()
    pipe = module.PairRMPipeline("text-classification", reference_model, pairrm.tokenizer)
    with rewardbench_code.on_cpu(), torch.no_grad():
        want = pipe([_conv(PROMPT, r) for r in RESPONSES], [_conv(PROMPT, REFERENCE)] * len(RESPONSES),
                    output_logits=True)
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-4, atol=1e-5)
    assert np.ptp(want) > 1e-3


@pytest.mark.parametrize("route", ["ids", "rewardbench"])
def test_pairrm_sweep_is_its_own_forward_on_both_orders(pairrm, pairrm_rb, pairrm_dir, route):
    """The sweep (full sequences, batched) equals RewardBench's class on inputs built here in both orders, the card's
    (plain texts) and RewardBench's (PairRM's conversation format); a response holding PairRM's own <|candidate2|>
    id is read at the input's structural positions (RewardBench's class fails)."""
    pairrm = pairrm if route == "ids" else pairrm_rb
    sweep = probe.sweep(pairrm, None, PROMPT, limit=200, batch_size=64)
    tok = pairrm.tokenizer
    reference_model = rewardbench_code.load("pairrm").DebertaV2PairRM.from_pretrained(pairrm_dir).eval()
    said = "" if route == "ids" else "<Response 1>:"
    src = tok.encode(f"<|source|>{PROMPT}" if route == "ids" else "<|source|>Finish the following coversation in "
                     f"each i-th turn by filling in <Response i> with your response.USER: {PROMPT}\nAssistant: "
                     "<Response 1>")
    ref_ids = tok.encode(REFERENCE, add_special_tokens=False)

    def cand(prefix: str, body: list[int]) -> list[int]:
        return tok.encode(f"{prefix}{said}")[:-1] + body + [tok.sep_token_id]

    def own(ids: list[int]) -> float:
        with torch.no_grad():
            x = torch.tensor([ids])
            return float(reference_model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0])

    ids = sweep["token_id"].to_list()[::25]
    want = [own(src + cand("<|candidate1|>", [t]) + cand("<|candidate2|>", ref_ids))
            - own(src + cand("<|candidate1|>", ref_ids) + cand("<|candidate2|>", [t])) for t in ids]
    got = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    np.testing.assert_allclose([got[t] for t in ids], want, rtol=1e-4, atol=1e-5)
    assert np.ptp(want) > 1e-3
    odd = probe.score_responses(pairrm, None, PROMPT, ["<|candidate2|>", "love"])
    assert np.isfinite(odd["score"].to_numpy()).all() and odd["score"].n_unique() == 2


# --- bad input ----------------------------------------------------------------------------------------------------
def test_pairwise_bad_input_is_one_line_before_weights(slic_dir, tiny_dirs, monkeypatch):
    """A reference response for a model that scores responses alone, an empty one, GCG on a pairwise model."""
    import probe.models.loading as loading

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded")

    with monkeypatch.context() as m:
        m.setattr(loading, "_from_pretrained", no_weights)
        with pytest.raises(ProbeError, match="not a pairwise preference model"):
            probe.load(tiny_dirs["rm"], device="cpu", reference_response="Nothing.")
    with pytest.raises((ProbeError, ValueError), match="--reference-response is empty"):
        probe.load(str(slic_dir), device="cpu", spec="RLHFlow/pair-preference-model-LLaMA3-8B", reference_response=" ")
    with pytest.raises(ProbeError, match="by --score reward only"):
        probe.load(str(slic_dir), device="cpu", spec="RLHFlow/pair-preference-model-LLaMA3-8B", score="judge",
                   reference_response="Nothing.")
    lm = probe.load(str(slic_dir), device="cpu", spec="RLHFlow/pair-preference-model-LLaMA3-8B")
    assert lm.pairwise.reference == "I don't know."  # the stated default
    with pytest.raises(ProbeError, match="pairwise preference model: GCG"):
        probe.gcg(lm, None, PROMPT, length=2, steps=1)


# --- InternLM2 reward (remote code under AutoModel, a reward token appended) ----------------------------------------
def test_internlm2_reward_appends_its_token_and_equals_rewardbench_pipeline(tmp_path):
    """Found by its class, loaded through AutoModel with --trust-remote-code (refused without it, before weights),
    every input ends with the config's reward token, and each response's score equals RewardBench's
    InternLMPipeline on the chat template's string (one conversation per call: it reads the last position of a
    right-padded batch)."""
    folder = tiny.internlm2_folder(tmp_path / "internlm2")
    with pytest.raises(ProbeError, match="--trust-remote-code"):
        probe.load(str(folder), device="cpu")
    lm = probe.load(str(folder), device="cpu", trust_remote_code=True)
    assert lm.spec.name == "InternLM2ForRewardModel" and lm.spec.reader == "forward"
    df = probe.score_responses(lm, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    pipe_tok = copy.deepcopy(lm.tokenizer)
    pipe_tok.pad_token = "<|reserved_special_token_1|>"  # InternLM2's tokenizer has one; the pipeline pads with it
    pipe = rewardbench_code.load("internlm").InternLMPipeline("text-classification", lm.model, pipe_tok)
    texts = [lm.tokenizer.apply_chat_template(_conv(PROMPT, r), tokenize=False, date_string="26 Jul 2024")
             for r in RESPONSES]
    want = [float(pipe([t])[0, 0]) for t in texts]
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-5, atol=1e-5)
    assert np.ptp(want) > 1e-3
    sweep = probe.sweep(lm, None, PROMPT, limit=64, batch_size=32)  # self-checked; every row ends with the token
    assert sweep.height == 64 and np.isfinite(sweep["score"].to_numpy()).all()


def test_social_benchmark_on_a_pairwise_model(slic_dir, slic, tmp_path):
    """The social command scores each option against the reference response (both orders, self-checked) and records
    the reference in the run; its scores equal the API's for the same prompt and options."""
    import json

    import polars as pl

    from probe.commands.social import main

    data, _ = crows_pair_file(tmp_path)
    args = ["--rm", str(slic_dir), "--spec", "RLHFlow/pair-preference-model-LLaMA3-8B", "--reference-response",
            REFERENCE, "--device", "cpu", "--output", str(tmp_path / "out"), "--dataset", "crows_pairs", "--data",
            str(data), "--no-progress"]
    assert main(args) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["settings"]["reference_response"] == REFERENCE and meta["settings"]["pairwise"] == "slicpairpm"
    scores = pl.read_parquet(run / "scores.parquet")
    assert scores.height == 2 and ((scores["score"] > 0) & (scores["score"] < 1)).all()
    from probe.social.loaders import NEUTRAL_PROMPT  # CrowS-Pairs' sentences answer a neutral request

    df = probe.score_responses(slic, None, NEUTRAL_PROMPT, ["Poor people are lazy.", "Rich people are lazy."])
    np.testing.assert_allclose(sorted(scores["score"].to_numpy()), sorted(df["score"].to_numpy()), rtol=1e-5, atol=1e-6)


def test_pairrm_long_responses_are_truncated_as_tokenize_pair_truncates(pairrm, pairrm_rb, pairrm_dir):
    """A response longer than 412 ids under a short prompt: tokenize_pair gives each candidate half of what the
    source leaves of 2,048 ids (here about 990), not a fixed 412; one longer than that half is cut there. Both
    equal the card's tokenize_pair, and PairRMPipeline's scores on RewardBench's route."""
    module = rewardbench_code.load("pairrm")
    tok = pairrm.tokenizer
    medium = " ".join(["peace", "and", "love"] * 200)
    long = " ".join(["the", "greatest", "thing"] * 500)
    card = dict(probe.score_responses(pairrm, None, PROMPT, [medium, long, "Love"]).select("response", "score")
                .iter_rows())
    np.testing.assert_allclose([card[r] for r in (medium, long, "Love")],
                               _card_scores(pairrm_dir, tok, [medium, long, "Love"]), rtol=1e-4, atol=1e-5)
    pairrm = pairrm_rb
    medium = " ".join(["peace", "and", "love"] * 200)  # ~600 ids: over 412, under the half
    long = " ".join(["the", "greatest", "thing"] * 500)  # ~1,500 ids: over the half
    responses = [medium, long, "Love"]
    n = len(tok.encode(medium, add_special_tokens=False))
    assert 412 < n < 900
    df = probe.score_responses(pairrm, None, PROMPT, responses)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    reference_model = module.DebertaV2PairRM.from_pretrained(pairrm_dir).eval()
    pipe = module.PairRMPipeline("text-classification", reference_model, tok)
    with rewardbench_code.on_cpu(), torch.no_grad():
        want = pipe([_conv(PROMPT, r) for r in responses], [_conv(PROMPT, REFERENCE)] * len(responses),
                    output_logits=True)
    np.testing.assert_allclose([got[r] for r in responses], want, rtol=1e-4, atol=1e-5)
    # the ids: the medium response whole, the long one cut at the candidate's half (well past 412 ids)
    from probe.core.pairwise import PairwiseConversation

    build = PairwiseConversation(PROMPT, pairrm.pairwise, None, 0)
    peace, greatest = (tok.encode(w, add_special_tokens=False)[0] for w in ("peace", "greatest"))
    assert build.render_ids(tok, medium).count(peace) == 200
    cut = build.render_ids(tok, long)
    assert 412 // 3 < cut.count(greatest) < 500 and len(cut) <= 2048
