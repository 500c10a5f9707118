"""The families rm-probe refused before (registry block of RewardBench's families it did not read), each read as its
reference reads it, on a tiny model of the family's architecture, against the reference's own code (RewardBench
0.1.4's classes and pipelines, loaded by tests/rewardbench_code.py):

* Better-PairRM (``BetterPairRMPipeline`` with ``DebertaV2PairRM``): RewardBench's class, tiny, with DeBERTa-v3's
  relative-position layout (no absolute positions: the pipeline pads to 3,370 ids), on the real all-MiniLM-L6-v2
  WordPiece tokenizer with PairRM's prefix tokens (Better-PairRM's DeBERTa-v3 SentencePiece file is not on PyPI).
* Starling-RM-7B-alpha (its card's ``GPTRewardModel``, as RewardBench's starling.py copies it, and
  ``StarlingPipeline``): a tiny Llama-2-7b-chat (its config.json shrunk) as the base, the reward model's state dict
  saved to one ``model.pt`` as the card loads it, on Mistral v1's real SentencePiece vocabulary in Llama-2-chat's
  tokenizer.json layout (tests/real_tokenizers.py; Llama-2's own file is not on PyPI).
* SteamSHP (``SHPPipeline``'s input text, the card's ``generate(max_new_tokens=1)``): a tiny
  T5ForConditionalGeneration (flan-t5-large's config.json shrunk) on a T5-layout tokenizer (Unigram, ``</s>``
  appended, T5's normalizer) whose pieces are Mistral v1's real SentencePiece pieces: no T5 ``spiece.model`` is in
  any PyPI package at hand.
* WorldPM (its card's ``get_score``, from the QwenLM/WorldPM README; RewardBench's ``WorldPMPipeline``): a stand-in
  for its remote reward class (tests/remote_code/modeling_worldpm_stand_in.py: its modelling file is not readable
  offline) on a tiny Qwen2 (WorldPM-72B's Qwen2.5-72B config shrunk) with the real Qwen 2.5 tokenizer and template.
* allenai's RewardBench 2 reward models: a tiny LlamaForSequenceClassification (Llama-3.1-8B's config shrunk) on the
  real Llama 3.1 tokenizer and template, against the card's AutoModelForSequenceClassification on the template's ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import probe
from probe.models.registry import REGISTRY, lookup
from tests import rewardbench_code
from tests.fake_runs import crows_pair_file

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", "nature and life", "self-sacrifice", "Love!"]
REFERENCE = "Nothing comes close."
# a PairRM score is the difference of two logits of order 10 (each float32, summed over up to 3,370 padded
# positions by the pipeline and over the batch's own length here): 1e-5 of that scale
PAIR_ATOL = 1e-4


def _conv(prompt: str, response: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


# --- Better-PairRM ------------------------------------------------------------------------------------------------
BETTER = "mightbe/Better-PairRM"


@pytest.fixture(scope="module")
def better_dir(tmp_path_factory) -> Path:
    from tests.tiny import pairrm_folder

    # DeBERTa-v3's layout (Better-PairRM's config.json: relative attention only, shared keys, layer-normed
    # relative embeddings), shrunk
    return pairrm_folder(tmp_path_factory.mktemp("better_pairrm"), position_biased_input=False,
                         max_position_embeddings=512, share_att_key=True, norm_rel_ebd="layer_norm")


@pytest.fixture(scope="module")
def better(better_dir):
    return probe.load(str(better_dir), device="cpu", spec=BETTER, reference_response=REFERENCE)


def _better_pipeline(better_dir, prompt: str, responses: list[str]) -> np.ndarray:
    """RewardBench's BetterPairRMPipeline on (prompt, response) against (prompt, reference): its logits(A vs B) -
    logits(B vs A), on its own copy of the tokenizer (the pipeline sets ``truncation_side`` on it)."""
    from transformers import AutoTokenizer

    module = rewardbench_code.load("betterpairrm")
    model = rewardbench_code.load("pairrm").DebertaV2PairRM.from_pretrained(better_dir).eval()
    pipe = module.BetterPairRMPipeline("text-classification", model, AutoTokenizer.from_pretrained(better_dir))
    with rewardbench_code.on_cpu(), torch.no_grad():
        out = pipe([_conv(prompt, r) for r in responses], [_conv(prompt, REFERENCE)] * len(responses),
                   output_logits=True)
    return np.asarray(out, dtype=np.float64).reshape(-1)


def test_better_pairrm_id_resolves_to_its_pairwise_reader():
    for name in (BETTER, "maywell/Better-PairRM", "/models/mightbe/Better-PairRM"):
        spec, _ = lookup(name)
        assert spec.unsupported is None and spec.reader == "pairwise" and spec.pairwise == "betterpairrm"
        assert spec.layout == "pairrm" and spec.rewardbench_pipeline == "BetterPairRMPipeline"
    assert REGISTRY[BETTER].input_source.startswith("RewardBench 0.1.4's BetterPairRMPipeline")


def test_better_pairrm_scores_equal_its_pipeline(better, better_dir):
    """Every response's score = BetterPairRMPipeline's delta, short and long (a response over its 670 ids and a
    prompt over its 2,030, cut as the pipeline cuts them: the prompt from the left, the responses from the right),
    on both input methods (RewardBench's pipeline is the only published input past the card's cut-off copy)."""
    assert type(better.model).__name__ == "PairRMModel" and better.pairwise.format == "betterpairrm"
    long = " ".join(["the", "greatest", "thing"] * 300)
    responses = RESPONSES + [long]
    # the ids: the pipeline's own tokenize_conv_pair (its padding dropped), both orders
    from transformers import AutoTokenizer

    from probe.core.pairwise import PairwiseConversation

    tok = AutoTokenizer.from_pretrained(better_dir)
    module = rewardbench_code.load("betterpairrm")
    for response in ("Love", long):
        for order, (a, b) in enumerate(((response, REFERENCE), (REFERENCE, response))):
            enc = module.tokenize_conv_pair(tok, [_conv(PROMPT, a)], [_conv(PROMPT, b)])
            want_ids = enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist()
            assert PairwiseConversation(PROMPT, better.pairwise, None, order).render_ids(
                better.tokenizer, response) == want_ids
    df = probe.score_responses(better, None, PROMPT, responses)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = _better_pipeline(better_dir, PROMPT, responses)
    np.testing.assert_allclose([got[r] for r in responses], want, rtol=1e-4, atol=PAIR_ATOL)
    assert np.ptp(want) > 5 * PAIR_ATOL
    long_prompt = "Tell me, " + " ".join(["what", "is", "the", "greatest", "thing"] * 450) + "?"
    df = probe.score_responses(better, None, long_prompt, RESPONSES[:3])
    got = dict(zip(df["response"], df["score"].to_numpy()))
    np.testing.assert_allclose([got[r] for r in RESPONSES[:3]], _better_pipeline(better_dir, long_prompt, RESPONSES[:3]),
                               rtol=1e-4, atol=PAIR_ATOL)
    rb = probe.load(str(better_dir), device="cpu", spec=BETTER, reference_response=REFERENCE,
                    input_method="rewardbench")
    df = probe.score_responses(rb, None, PROMPT, RESPONSES)
    np.testing.assert_allclose(df.sort("response")["score"].to_numpy(),
                               probe.score_responses(better, None, PROMPT, RESPONSES).sort("response")["score"]
                               .to_numpy(), rtol=1e-6, atol=1e-7)


def test_better_pairrm_sweep_is_its_class_on_both_orders(better, better_dir):
    """The sweep (full sequences, batched) equals RewardBench's class on the pipeline's ids for each token in the
    candidate's slot, in both orders."""
    sweep = probe.sweep(better, None, PROMPT, limit=200, batch_size=64)
    tok = better.tokenizer
    model = rewardbench_code.load("pairrm").DebertaV2PairRM.from_pretrained(better_dir).eval()
    source = tok.decode(tok.encode(f"USER: {PROMPT}\n    \n    ASSISTANT: ", add_special_tokens=False))
    src = tok.encode("<|source|>") + tok.encode(source)
    ref = tok.encode(REFERENCE, add_special_tokens=False)

    def cand(prefix: str, body: list[int]) -> list[int]:
        return tok.encode(prefix)[:-1] + body + [tok.sep_token_id]

    def own(ids: list[int]) -> float:
        with torch.no_grad():
            x = torch.tensor([ids])
            return float(model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0])

    ids = sweep["token_id"].to_list()[::25]
    want = [own(src + cand("<|candidate1|>", [t]) + cand("<|candidate2|>", ref))
            - own(src + cand("<|candidate1|>", ref) + cand("<|candidate2|>", [t])) for t in ids]
    got = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    np.testing.assert_allclose([got[t] for t in ids], want, rtol=1e-4, atol=PAIR_ATOL)
    assert np.ptp(want) > 5 * PAIR_ATOL


def test_better_pairrm_social_equals_its_pipeline(better_dir, tmp_path):
    """``probe social`` scores each sentence against the reference as the pipeline does, and records the format."""
    import json

    import polars as pl

    from probe.commands.social import main
    from probe.social.loaders import NEUTRAL_PROMPT

    data, sentences = crows_pair_file(tmp_path)
    args = ["--rm", str(better_dir), "--spec", BETTER, "--reference-response", REFERENCE, "--device", "cpu",
            "--output", str(tmp_path / "out"), "--dataset", "crows_pairs", "--data", str(data), "--no-progress"]
    assert main(args) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["settings"]["reference_response"] == REFERENCE and meta["settings"]["pairwise"] == "betterpairrm"
    scores = pl.read_parquet(run / "scores.parquet")
    np.testing.assert_allclose(sorted(scores["score"].to_numpy()),
                               sorted(_better_pipeline(better_dir, NEUTRAL_PROMPT, sentences)), rtol=1e-4, atol=PAIR_ATOL)


# --- Starling-RM-7B-alpha -----------------------------------------------------------------------------------------
STARLING7B = "berkeley-nest/Starling-RM-7B-alpha"


@pytest.fixture(scope="module")
def starling7b_dirs(tmp_path_factory):
    """(the base folder: a tiny Llama-2-7b-chat causal LM and its tokenizer; the reward model's folder: the card's
    GPTRewardModel state dict in model.pt beside the base's config.json and tokenizer files)."""
    import shutil

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from tests.real_tokenizers import mistral_v1_json

    root = tmp_path_factory.mktemp("starling7b")
    base = mistral_v1_json(root / "base", legacy=False)
    tok = AutoTokenizer.from_pretrained(base)
    # meta-llama/Llama-2-7b-chat-hf's config.json, shrunk (4096 -> 64 wide, 32 -> 2 layers and heads 32 -> 4)
    config = LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                         rms_norm_eps=1e-5, hidden_act="silu", bos_token_id=1, eos_token_id=2, pad_token_id=None,
                         tie_word_embeddings=False, rope_theta=10000.0, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(base)
    module = rewardbench_code.load("starling")
    reward = module.GPTRewardModel(str(base))
    with torch.no_grad():
        reward.v_head.weight.normal_(0, 1.0)
    rm = root / "Starling-RM-7B-alpha"
    rm.mkdir()
    torch.save(reward.state_dict(), rm / "model.pt")
    for f in base.iterdir():
        if f.name.startswith("tokenizer") or f.name == "config.json":
            shutil.copyfile(f, rm / f.name)
    assert tok.bos_token_id == 1
    return base, rm


def _starling7b_reference(base, rm, texts: list[str]) -> list[float]:
    """The card's code: GPTRewardModel on the base, ``load_state_dict(torch.load(checkpoint), strict=False)``, each
    text through its tokenizer, unpadded (a batch of one), its ``scores``."""
    module = rewardbench_code.load("starling")
    model = module.GPTRewardModel(str(base))
    model.load_state_dict(torch.load(rm / "model.pt"), strict=False)
    model.eval().requires_grad_(False)
    out = []
    for text in texts:
        enc = model.tokenizer([text], return_tensors="pt")
        with torch.no_grad():
            out.append(float(model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])[0]))
    return out


def _card_text(prompt: str, response: str) -> str:
    return f"<s>[INST] {prompt} </s> [/INST] {response}</s>"


def test_starling7b_id_resolves_to_its_reader():
    spec, match = lookup(STARLING7B)
    assert match == "id" and spec.unsupported is None and spec.reader == "module" and spec.layout == "starling7b"
    assert spec.chat_template == "starling7b-card" and spec.rewardbench_pipeline == "StarlingPipeline"
    assert lookup("/models/berkeley-nest/Starling-RM-7B-alpha")[0] is spec


@pytest.mark.parametrize("layout", ["json", "model"])
@pytest.mark.parametrize("legacy", [True, False, None])
def test_starling7b_card_ids_on_every_llama2_era_tokenizer(tmp_path, layout, legacy):
    """The card's dialogue renders as the card's ``reward_tokenizer(text)`` on both Llama-2-era layouts and every
    ``legacy`` setting; a response holding '</s>' keeps it as text."""
    from transformers import AutoTokenizer

    from probe.core.template import render, response_conversation
    from probe.models.chat_templates import chat_template_text
    from tests.real_tokenizers import mistral_v1, mistral_v1_json

    tok = AutoTokenizer.from_pretrained((mistral_v1_json if layout == "json" else mistral_v1)(tmp_path, legacy))
    tok.chat_template = chat_template_text("starling7b-card")
    tok.rm_probe_input_call = "tokenizer(text)"
    build = response_conversation(PROMPT, None)
    for response in ("Love", "The Beatles, surely"):
        assert render(tok, build, response) == tok(_card_text(PROMPT, response))["input_ids"]
    assert render(tok, build, "a</s>b").count(tok.eos_token_id) == 2  # the template's two, none from the response


def test_starling7b_scores_equal_the_cards_code(starling7b_dirs):
    """score_responses = the card's GPTRewardModel on the card's text (its '<s>[INST] .. </s> [/INST] ..</s>', the
    tokenizer's own BOS before it) read at the last token; the weights come from model.pt (a head of zeros or the
    base's own backbone would differ)."""
    base, rm = starling7b_dirs
    lm = probe.load(str(rm), device="cpu", spec=STARLING7B)
    assert type(lm.model).__name__ == "Starling7bRewardModel"
    df = probe.score_responses(lm, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = _starling7b_reference(base, rm, [_card_text(PROMPT, r) for r in RESPONSES])
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-4, atol=1e-4)
    assert np.ptp(want) > 1e-2
    # the ids: the card's tokenizer call on its text, two BOS
    from probe.core.template import render
    from probe.core.scoring import conversation
    from probe.config import ScoringOptions

    ids = render(lm.tokenizer, conversation("reward", PROMPT, None, ScoringOptions(), lm), "Love")
    assert ids == lm.tokenizer(_card_text(PROMPT, "Love"))["input_ids"] and ids[:2] == [1, 1]


def test_starling7b_pipeline_on_a_batch_of_one(starling7b_dirs):
    """RewardBench's StarlingPipeline (its build_starling_rm's model: the base + model.pt) on one text at a time
    gives the same score as the card's code, and rm-probe's."""
    base, rm = starling7b_dirs
    module = rewardbench_code.load("starling")
    model = module.GPTRewardModel(str(base))
    model.load_state_dict(torch.load(rm / "model.pt"), strict=False)
    model.eval().requires_grad_(False)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base)
    tok.pad_token_id = tok.eos_token_id  # as run_rm.py sets it for a tokenizer without a pad token
    pipe = module.StarlingPipeline("text-classification", model, tok)
    lm = probe.load(str(rm), device="cpu", spec=STARLING7B)
    df = probe.score_responses(lm, None, PROMPT, RESPONSES[:3])
    got = dict(zip(df["response"], df["score"].to_numpy()))
    with rewardbench_code.on_cpu():
        want = [float(pipe([_card_text(PROMPT, r)])[0]) for r in RESPONSES[:3]]
    np.testing.assert_allclose([got[r] for r in RESPONSES[:3]], want, rtol=1e-4, atol=1e-4)


def test_starling7b_sweep_and_social(starling7b_dirs, tmp_path):
    """The sweep (shared-prefix cache, self-checked against the model's own forward) equals the card's code on the
    card's ids with each token in the response slot; ``probe social`` equals score_responses."""
    import polars as pl

    from probe.commands.social import main
    from probe.social.loaders import NEUTRAL_PROMPT

    base, rm = starling7b_dirs
    lm = probe.load(str(rm), device="cpu", spec=STARLING7B)
    sweep = probe.sweep(lm, None, PROMPT, limit=300, batch_size=64)
    module = rewardbench_code.load("starling")
    model = module.GPTRewardModel(str(base))
    model.load_state_dict(torch.load(rm / "model.pt"), strict=False)
    model.eval().requires_grad_(False)
    tok = model.tokenizer
    head = tok(f"<s>[INST] {PROMPT} </s> [/INST]")["input_ids"]
    tail = [2]  # the card's closing '</s>'
    ids = sweep["token_id"].to_list()[::30]
    with torch.no_grad():
        want = [float(model(input_ids=torch.tensor([head + [t] + tail]))[0]) for t in ids]
    got = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    np.testing.assert_allclose([got[t] for t in ids], want, rtol=1e-4, atol=1e-4)
    assert np.ptp(want) > 1e-2
    data, sentences = crows_pair_file(tmp_path)
    assert main(["--rm", str(rm), "--spec", STARLING7B, "--device", "cpu", "--output", str(tmp_path / "out"),
                 "--dataset", "crows_pairs", "--data", str(data), "--no-progress"]) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    scores = pl.read_parquet(run / "scores.parquet")
    want = _starling7b_reference(base, rm, [_card_text(NEUTRAL_PROMPT, s) for s in sentences])
    np.testing.assert_allclose(sorted(scores["score"].to_numpy()), sorted(want), rtol=1e-4, atol=1e-4)


def test_starling7b_folder_without_its_weights_file_is_one_line(starling7b_dirs, tmp_path):
    import shutil

    from probe.errors import ModelLoadError

    _, rm = starling7b_dirs
    bare = tmp_path / "bare"
    shutil.copytree(rm, bare)
    (bare / "model.pt").unlink()
    with pytest.raises(ModelLoadError, match="one file ending in .pt or model.bin"):
        probe.load(str(bare), device="cpu", spec=STARLING7B)
    with pytest.raises(ModelLoadError, match="Llama-2-7b-chat-hf's config.json and tokenizer") as err:
        probe.load(STARLING7B, device="cpu")  # the Hub id: its repository has no config to build the model from
    assert "\n" not in str(err.value)


# --- SteamSHP -----------------------------------------------------------------------------------------------------
SHP = "stanfordnlp/SteamSHP-flan-t5-large"


@pytest.fixture(scope="module")
def shp_dir(tmp_path_factory) -> Path:
    from sentencepiece import sentencepiece_model_pb2
    from transformers import T5Config, T5ForConditionalGeneration, T5Tokenizer

    from tests.real_tokenizers import package_dir

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((package_dir("mistral_common") / "data" / "tokenizer.model.v1").read_bytes())
    pieces = [(p.piece, p.score) for p in proto.pieces if p.type == 1]  # the normal pieces, with their scores
    tok = T5Tokenizer(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + pieces, extra_ids=0)
    # stanfordnlp/SteamSHP-flan-t5-large's config.json (flan-t5-large), shrunk: 1024 -> 64 wide, 24 -> 2 layers
    config = T5Config(vocab_size=len(tok), d_model=64, d_ff=128, d_kv=16, num_heads=4, num_layers=2,
                      num_decoder_layers=2, feed_forward_proj="gated-gelu", relative_attention_num_buckets=32,
                      relative_attention_max_distance=128, layer_norm_epsilon=1e-6, tie_word_embeddings=False,
                      decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, architectures=["T5ForConditionalGeneration"])
    torch.manual_seed(0)
    model = T5ForConditionalGeneration(config).eval()
    folder = tmp_path_factory.mktemp("steamshp")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _shp_reference(shp_dir, prompt: str, responses: list[str]) -> np.ndarray:
    """Per response: SHPPipeline's text for (response, reference) in each order (its _format_input, its random order
    drawn until both came), each through the card's ``generate(x, max_new_tokens=1)``, whose first-step scores give
    P(A) = softmax over the 'A'/'B' logits; the mean of P(response chosen) over the two orders."""
    import random

    from transformers import AutoTokenizer, T5ForConditionalGeneration

    pipe_cls = rewardbench_code.load("shp").SHPPipeline
    tok = AutoTokenizer.from_pretrained(shp_dir)
    model = T5ForConditionalGeneration.from_pretrained(shp_dir).eval()
    pipe = pipe_cls("text2text-generation", model, tok)
    a, b = (tok.encode(x, add_special_tokens=False)[0] for x in ("A", "B"))
    random.seed(0)
    out = []
    for response in responses:
        conv_a, conv_b = _conv(prompt, response), _conv(prompt, REFERENCE)
        post = pipe._extract_conversation(conv_a, conv_b)
        texts = {}
        while len(texts) < 2:
            text, order = pipe._format_input(post, response, REFERENCE)
            texts[order] = text
        p = []
        for order in ("AB", "BA"):
            x = tok([texts[order]], return_tensors="pt").input_ids
            with torch.no_grad():
                gen = model.generate(x, max_new_tokens=1, output_scores=True, return_dict_in_generate=True,
                                     do_sample=False)
            logits = gen.scores[0][0].double()
            p_a = torch.softmax(logits[[a, b]], 0)[0].item()
            p.append(p_a if order == "AB" else 1 - p_a)
        out.append(sum(p) / 2)
    return np.asarray(out)


def test_steamshp_id_resolves_to_its_reader():
    for name in (SHP, "stanfordnlp/SteamSHP-flan-t5-xl"):
        spec, _ = lookup(name)
        assert spec.unsupported is None and spec.reader == "pairwise" and spec.pairwise == "shp"
        assert spec.auto_class == "AutoModelForSeq2SeqLM" and spec.rewardbench_pipeline == "SHPPipeline"


def test_steamshp_scores_sweep_and_social_equal_the_cards_generate(shp_dir, tmp_path):
    import polars as pl

    from probe.commands.social import main
    from probe.social.loaders import NEUTRAL_PROMPT

    lm = probe.load(str(shp_dir), device="cpu", spec=SHP, reference_response=REFERENCE)
    assert lm.pairwise.format == "shp"
    # the ids: SHPPipeline's text (its _format_input, written out) through the tokenizer, both orders
    from probe.core.pairwise import PairwiseConversation

    for order, (a, b) in enumerate((("Love", REFERENCE), (REFERENCE, "Love"))):
        text = (f"POST: {PROMPT}\n\n RESPONSE A: {a}\n\n RESPONSE B: {b}\n\n Which response is better? "
                "RESPONSE")
        assert PairwiseConversation(PROMPT, lm.pairwise, None, order).render_ids(lm.tokenizer, "Love") == \
            lm.tokenizer(text)["input_ids"]
    df = probe.score_responses(lm, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = _shp_reference(shp_dir, PROMPT, RESPONSES)
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-5, atol=1e-6)
    assert np.ptp(want) > 1e-4
    # the sweep: each token in the candidate's slot (the first order's A, the second order's B), full sequences
    sweep = probe.sweep(lm, None, PROMPT, limit=120, batch_size=32)
    tok = lm.tokenizer
    from transformers import T5ForConditionalGeneration

    model = T5ForConditionalGeneration.from_pretrained(shp_dir).eval()
    a, b = (tok.encode(x, add_special_tokens=False)[0] for x in ("A", "B"))
    head = tok.encode(f"POST: {PROMPT}\n\n RESPONSE A:", add_special_tokens=False)
    mid = tok.encode("\n\n RESPONSE B:", add_special_tokens=False)
    tail = tok.encode("\n\n Which response is better? RESPONSE")
    ref = tok.encode(REFERENCE, add_special_tokens=False)

    def p_a(ids: list[int]) -> float:
        with torch.no_grad():
            gen = model.generate(torch.tensor([ids]), max_new_tokens=1, output_scores=True,
                                 return_dict_in_generate=True, do_sample=False)
        return torch.softmax(gen.scores[0][0].double()[[a, b]], 0)[0].item()

    ids = sweep["token_id"].to_list()[::15]
    want = [0.5 * (p_a(head + [t] + mid + ref + tail) + 1 - p_a(head + ref + mid + [t] + tail)) for t in ids]
    got = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    np.testing.assert_allclose([got[t] for t in ids], want, rtol=1e-5, atol=1e-6)
    assert np.ptp(want) > 1e-4
    # probe social
    data, sentences = crows_pair_file(tmp_path)
    assert main(["--rm", str(shp_dir), "--spec", SHP, "--reference-response", REFERENCE, "--device", "cpu",
                 "--output", str(tmp_path / "out"), "--dataset", "crows_pairs", "--data", str(data),
                 "--no-progress"]) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    scores = pl.read_parquet(run / "scores.parquet")
    np.testing.assert_allclose(sorted(scores["score"].to_numpy()),
                               sorted(_shp_reference(shp_dir, NEUTRAL_PROMPT, sentences)), rtol=1e-5, atol=1e-6)


# --- WorldPM ------------------------------------------------------------------------------------------------------
WORLDPM = "Qwen/WorldPM-72B"


@pytest.fixture(scope="module")
def worldpm_dir(tmp_path_factory) -> Path:
    import json
    import shutil

    from transformers import Qwen2Config

    from tests import real_tokenizers
    from tests.remote_code import modeling_worldpm_stand_in as stand_in

    folder = tmp_path_factory.mktemp("worldpm")
    tok = real_tokenizers.load("qwen2.5", folder / "tok")
    # Qwen2.5-72B's config.json (WorldPM-72B's base), shrunk: 8192 -> 64 wide, 80 -> 2 layers, 64/8 -> 4/2 heads
    config = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                         bos_token_id=151643, eos_token_id=151645)
    torch.manual_seed(0)
    model = stand_in.WorldPMStandInForRewardModel(config).eval()
    with torch.no_grad():
        model.score[2].weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    shutil.copyfile(stand_in.__file__, folder / "modeling_worldpm_stand_in.py")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["WorldPMStandInForRewardModel"]
    cfg["auto_map"] = {"AutoModel": "modeling_worldpm_stand_in.WorldPMStandInForRewardModel"}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _worldpm_card(worldpm_dir, conversations: list[list[dict]]) -> list[float]:
    """The card's get_score: the template's text (no generation prompt) encoded without special tokens,
    ``model(input_ids=...)[0].item()``."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(worldpm_dir, trust_remote_code=True)
    model = AutoModel.from_pretrained(worldpm_dir, trust_remote_code=True).eval()
    out = []
    for conversation in conversations:
        text = tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=False)
        ids = tok.encode(text, return_tensors="pt", add_special_tokens=False)
        with torch.no_grad():
            out.append(model(input_ids=ids)[0].cpu().item())
    return out


def _with_empty_system(prompt: str, response: str) -> list[dict]:
    return [{"role": "system", "content": ""}] + _conv(prompt, response)


def test_worldpm_ids_resolve_to_its_reader():
    for name in (WORLDPM, "Qwen/WorldPM-72B-HelpSteer2", "Qwen/WorldPM-72B-RLHFLow", "Qwen/WorldPM-72B-UltraFeedback",
                 "/nowhere/models/WorldPM-72B-UltraFeedback"):
        spec, _ = lookup(name)
        assert spec.unsupported is None and spec.reader == "forward" and spec.output == "[0]"
        assert spec.trust_remote_code and spec.auto_class == "AutoModel" and spec.system_prompt == ""


def test_worldpm_scores_equal_the_cards_get_score(worldpm_dir):
    """The card's empty system turn (not Qwen's default system prompt) by default, --system in its place when given;
    --input-method rewardbench: WorldPMPipeline's input, no system turn (the template's default one)."""
    lm = probe.load(str(worldpm_dir), device="cpu", spec=WORLDPM, trust_remote_code=True)
    df = probe.score_responses(lm, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = _worldpm_card(worldpm_dir, [_with_empty_system(PROMPT, r) for r in RESPONSES])
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-4, atol=1e-4)
    assert np.ptp(want) > 1e-2
    default_system = _worldpm_card(worldpm_dir, [_conv(PROMPT, r) for r in RESPONSES])
    assert max(abs(a - b) for a, b in zip(want, default_system)) > 1e-3  # the empty system turn matters
    df = probe.score_responses(lm, None, PROMPT, RESPONSES[:2], system="Be brief.")
    sys_want = _worldpm_card(worldpm_dir, [[{"role": "system", "content": "Be brief."}] + _conv(PROMPT, r)
                                           for r in RESPONSES[:2]])
    np.testing.assert_allclose(df.sort("response")["score"].to_numpy(),
                               [w for _, w in sorted(zip(RESPONSES[:2], sys_want))], rtol=1e-4, atol=1e-4)
    # RewardBench's route: run_rm.py's template text (no system turn) through WorldPMPipeline, one sample at a time
    from transformers import AutoModel, AutoTokenizer

    rb = probe.load(str(worldpm_dir), device="cpu", spec=WORLDPM, trust_remote_code=True, input_method="rewardbench")
    df = probe.score_responses(rb, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    tok = AutoTokenizer.from_pretrained(worldpm_dir)
    pipe = rewardbench_code.load("worldpm").WorldPMPipeline(
        "text-classification", AutoModel.from_pretrained(worldpm_dir, trust_remote_code=True), tok)
    texts = [tok.apply_chat_template(_conv(PROMPT, r), tokenize=False) for r in RESPONSES]
    want = [float(pipe([t])[0]) for t in texts]
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(want, default_system, rtol=1e-4, atol=1e-4)


def test_worldpm_sweep_and_social(worldpm_dir, tmp_path):
    import polars as pl
    from transformers import AutoModel, AutoTokenizer

    from probe.commands.social import main
    from probe.social.loaders import NEUTRAL_PROMPT

    lm = probe.load(str(worldpm_dir), device="cpu", spec=WORLDPM, trust_remote_code=True)
    sweep = probe.sweep(lm, None, PROMPT, limit=80, batch_size=40)
    tok = AutoTokenizer.from_pretrained(worldpm_dir)
    model = AutoModel.from_pretrained(worldpm_dir, trust_remote_code=True).eval()
    text = tok.apply_chat_template(_with_empty_system(PROMPT, "XYZ"), tokenize=False)
    head_text, tail_text = text.split("XYZ")
    head, tail = (tok.encode(t, add_special_tokens=False) for t in (head_text, tail_text))
    ids = sweep["token_id"].to_list()[::10]
    with torch.no_grad():
        want = [model(input_ids=torch.tensor([head + [t] + tail]))[0].item() for t in ids]
    got = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    np.testing.assert_allclose([got[t] for t in ids], want, rtol=1e-4, atol=1e-4)
    assert np.ptp(want) > 1e-2
    data, sentences = crows_pair_file(tmp_path)
    assert main(["--rm", str(worldpm_dir), "--spec", WORLDPM, "--trust-remote-code", "--device", "cpu",
                 "--output", str(tmp_path / "out"), "--dataset", "crows_pairs", "--data", str(data),
                 "--no-progress"]) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    scores = pl.read_parquet(run / "scores.parquet")
    want = _worldpm_card(worldpm_dir, [_with_empty_system(NEUTRAL_PROMPT, s) for s in sentences])
    np.testing.assert_allclose(sorted(scores["score"].to_numpy()), sorted(want), rtol=1e-4, atol=1e-4)


# --- allenai's RewardBench 2 reward models ------------------------------------------------------------------------
RB2 = "allenai/Llama-3.1-8B-Instruct-RM-RB2"


def test_allenai_rb2_ids_and_open_instruct_runs_resolve_to_the_classifier_spec():
    for name in (RB2, "allenai/Llama-3.1-70B-Instruct-RM-RB2", "allenai/Llama-3.1-Tulu-3-8B-SFT-RM-RB2",
                 "allenai/open_instruct_dev-rm_llama_3e-6_1__1743929424",
                 "/data/allenai/open_instruct_dev-rm_qwen_2e-5_1"):
        spec, match = lookup(name)
        assert match in ("id", "id prefix") and spec.name != "default" and spec.reader == "linear"
        assert spec.input_source.startswith("model card (allenai/*-RM-RB2") and spec.unsupported is None
    assert lookup("allenai/some-other-model")[1] == "default"


def test_nvidia_qwen_nemotron_ids_resolve_to_their_classifier_specs():
    """nvidia/Qwen-2.5- and Qwen-3-Nemotron-32B-Reward: sequence classifiers by their cards, not the Llama Nemotron
    logit reader; each names what its input is read from."""
    for name in ("nvidia/Qwen-2.5-Nemotron-32B-Reward", "nvidia/Qwen-3-Nemotron-32B-Reward"):
        spec, match = lookup(name)
        assert match == "id" and spec.name == name and spec.reader == "linear" and spec.unsupported is None
        assert "AutoModelForSequenceClassification" in spec.input_source


# (spec, base tokenizer, tiny config, its pad id): the classifiers read as their cards' AutoModelForSequenceClassification
CLASSIFIERS = {RB2: ("llama3.1", "llama_config", 128004),
               "nvidia/Qwen-2.5-Nemotron-32B-Reward": ("qwen2.5", "qwen2_config", None),
               "nvidia/Qwen-3-Nemotron-32B-Reward": ("qwen3-latest", "qwen3_config", None)}


@pytest.mark.parametrize("spec_name", [name if name == RB2 else pytest.param(name, marks=pytest.mark.slow)
                                       for name in CLASSIFIERS])  # the Qwen ones in `make test-all` (the quick loop's time)
def test_classifier_scores_sweep_and_social_equal_the_cards_classifier(tmp_path, spec_name):
    """A tiny classifier of the family's architecture on its base's real tokenizer, read with the spec: whole
    responses, a sweep and `probe social` equal ``AutoModelForSequenceClassification`` on the card's ids (the
    checkpoint's template as ids, ``logits[0][0]``)."""
    import polars as pl
    from transformers import AutoModelForSequenceClassification

    from probe.commands.social import main
    from probe.social.loaders import NEUTRAL_PROMPT
    from tests import real_tokenizers, tiny

    base, config, pad = CLASSIFIERS[spec_name]
    folder = tmp_path / "rm"
    tok = real_tokenizers.load(base, tmp_path / "tok")
    torch.manual_seed(0)
    cfg = getattr(tiny, config)(tok, pad_token_id=pad if pad is not None else tok.pad_token_id)
    cfg.num_labels = 1
    model = AutoModelForSequenceClassification.from_config(cfg).eval()
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    lm = probe.load(str(folder), device="cpu", spec=spec_name)
    card = AutoModelForSequenceClassification.from_pretrained(folder).eval()

    def card_score(prompt: str, response: str) -> float:
        ids = tok.apply_chat_template(_conv(prompt, response), tokenize=True, return_tensors="pt", return_dict=False)
        ids = ids if isinstance(ids, torch.Tensor) else torch.tensor([ids])
        with torch.no_grad():
            return card(input_ids=ids).logits[0][0].item()

    df = probe.score_responses(lm, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = [card_score(PROMPT, r) for r in RESPONSES]
    np.testing.assert_allclose([got[r] for r in RESPONSES], want, rtol=1e-4, atol=1e-4)
    assert np.ptp(want) > 1e-2
    sweep = probe.sweep(lm, None, PROMPT, limit=200, batch_size=100)  # cached reader, self-checked
    head = tok.apply_chat_template(_conv(PROMPT, "XYZ"), tokenize=False).split("XYZ")
    pre, post = (tok.encode(t, add_special_tokens=False) for t in head)
    ids = sweep["token_id"].to_list()[::20]
    with torch.no_grad():
        want = [card(input_ids=torch.tensor([pre + [t] + post])).logits[0][0].item() for t in ids]
    got = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    np.testing.assert_allclose([got[t] for t in ids], want, rtol=1e-4, atol=1e-4)
    data, sentences = crows_pair_file(tmp_path)
    assert main(["--rm", str(folder), "--spec", spec_name, "--device", "cpu", "--output", str(tmp_path / "out"),
                 "--dataset", "crows_pairs", "--data", str(data), "--no-progress"]) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    scores = pl.read_parquet(run / "scores.parquet")
    np.testing.assert_allclose(sorted(scores["score"].to_numpy()),
                               sorted(card_score(NEUTRAL_PROMPT, s) for s in sentences), rtol=1e-4, atol=1e-4)


def test_worldpm_paper_route_keeps_the_cards_empty_system_turn(worldpm_dir, tmp_path):
    """``--input-method paper`` renders WorldPM's own conversation (its card's empty system turn) before re-tokenizing:
    each token's row equals the card's get_score on the decoded token's text. Old code rendered the paper's texts
    without the model, so Qwen's default system prompt stood in the card's empty turn."""
    from probe.commands.score import main

    assert main(["--rm", str(worldpm_dir), "--spec", WORLDPM, "--trust-remote-code", "--prompt", PROMPT,
                 "--input-method", "paper", "--limit", "12", "--device", "cpu", "--output", str(tmp_path),
                 "--no-progress"]) == 0
    import polars as pl
    from transformers import AutoTokenizer

    (scores,) = list(tmp_path.glob("*/*/scores.parquet"))
    rows = pl.read_parquet(scores).head(4)

    tok = AutoTokenizer.from_pretrained(worldpm_dir)
    want = _worldpm_card(worldpm_dir, [_with_empty_system(PROMPT, tok.decode([t])) for t in rows["token_id"]])
    np.testing.assert_allclose(rows["score"].to_numpy(), want, rtol=1e-4, atol=1e-4)
