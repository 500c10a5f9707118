"""POLAR (``internlm/POLAR-*``): a candidate scored against a reference response, in its card's own text format, read
as its card reads it.

The card (the Hub README, the same text as the GitHub README of InternLM/POLAR) encodes each (prompt, reference,
output) with ``RewardModelClient.encode`` (src/polar/reward_func.py; xtuner.utils.RewardModelClient's is the same),
tokenizes the texts with ``tokenizer(texts, return_tensors='pt', padding=True)`` and reads ``model(**batch)[0]``.
That code is written out below (`card_encode`, `card_rewards`) and run on the same tiny model as rm-probe:

* the model: tests/remote_code/modeling_internlm2_polar.py (POLAR's ``InternLM2ForRewardModel`` read as xtuner's
  class reads it: ``v_head`` at the last id the attention mask covers; a Llama backbone stands in for InternLM2's
  remote one), config shrunk from InternLM2.5-1.8B's (hidden 2048, 16 heads / 8 key-value heads, MLP 4x, RMSNorm eps
  1e-5: its published config as InternVL2.5 embeds it; POLAR-1_8B's own is not readable offline; its rope theta 1e6
  is left at the default, whose spelling differs across transformers 5.x),
  saved as ``.../internlm/POLAR-1_8B`` with its remote code under ``auto_map`` AutoModel;
* the tokenizer: InternLM2's own SentencePiece file is on no PyPI package; Mistral 7B v0.1's (mistral-common, the
  same kind: SentencePiece BPE with byte fallback, ``<s>`` added, no EOS; ``legacy`` true: each run of text between
  added tokens encoded on its own, as a slow SentencePiece tokenizer of InternLM2Tokenizer's kind does) stands in,
  with ``<|reward|>`` and ``[UNUSED_TOKEN_130]`` added as one token each (the client counts "one <|reward|> token";
  POLAR's fine-tuning configs name ``[UNUSED_TOKEN_130]`` id 92527 the reward token), and InternLM2's pad ``</s>``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import probe
from probe.errors import ProbeError
from tests import real_tokenizers
from tests.tiny import F32_FORWARD
from tests.fake_runs import crows_pair_file

PROMPT = "What is the capital of China?"
REFERENCE = "Beijing."
RESPONSES = ["Beijing.", "Shanghai.", "The capital of China is Beijing.", "I don't know.", "Love",
             " Beijing.", "Beijing.<|reward|>"]  # the last two: the card's decode drops a leading space, special text
REMOTE = Path(__file__).resolve().parents[1] / "remote_code" / "modeling_internlm2_polar.py"
IDS = ("internlm/POLAR-7B", "internlm/POLAR-1_8B", "internlm/POLAR-7B-Base", "internlm/POLAR-1_8B-Base")


def _remote():
    spec = importlib.util.spec_from_file_location("modeling_internlm2_polar", REMOTE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def polar_dir(tmp_path_factory) -> Path:
    from transformers import AutoTokenizer, LlamaConfig

    folder = tmp_path_factory.mktemp("hub") / "internlm" / "POLAR-1_8B"
    real_tokenizers.mistral_v1(folder, legacy=True)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": ["<|reward|>", "[UNUSED_TOKEN_130]"]})
    tok.pad_token = "</s>"
    tok.save_pretrained(folder)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                      max_position_embeddings=512, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, tie_word_embeddings=False)
    cfg.reward_token_id = tok.convert_tokens_to_ids("[UNUSED_TOKEN_130]")
    torch.manual_seed(0)
    model = _remote().InternLM2ForRewardModel(cfg).eval()
    with torch.no_grad():
        model.v_head.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    shutil.copy(REMOTE, folder / REMOTE.name)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["InternLM2ForRewardModel"]
    config["auto_map"] = {"AutoModel": "modeling_internlm2_polar.InternLM2ForRewardModel"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


@pytest.fixture(scope="module")
def polar(polar_dir):
    return probe.load(str(polar_dir), device="cpu", trust_remote_code=True, reference_response=REFERENCE)


# --- the card's code, written out as the card writes it ----------------------------------------------------------
def card_encode(tokenizer, prompt, reference, output, wrapper="sft", max_length=16384, max_response_length=4096):
    """``RewardModelClient._encode`` (InternLM/POLAR src/polar/reward_func.py, response_cut_side "right")."""
    max_length = max_length - 4
    p = "\n".join(e["content"] for e in prompt) if isinstance(prompt, list) else prompt
    r1 = "\n".join(e["content"] for e in reference) if isinstance(reference, list) else reference
    r2 = "\n".join(e["content"] for e in output) if isinstance(output, list) else output
    p_ids = tokenizer.encode(p, add_special_tokens=True)
    r1_ids = tokenizer.encode(r1, add_special_tokens=True)
    r2_ids = tokenizer.encode(r2, add_special_tokens=True)
    if len(r1_ids) > max_response_length:
        r1_ids = r1_ids[:max_response_length]
    if len(r2_ids) > max_response_length:
        r2_ids = r2_ids[:max_response_length]
    max_prompt_length = (max_length - len(r1_ids) - len(r2_ids)) // 2
    if len(p_ids) > max_prompt_length:
        p_ids = p_ids[-max_prompt_length:]
    p = tokenizer.decode(p_ids, skip_special_tokens=True)
    r1 = tokenizer.decode(r1_ids, skip_special_tokens=True)
    r2 = tokenizer.decode(r2_ids, skip_special_tokens=True)
    _reference_cat = p + r1 if wrapper == "pretrain" or len(r1) == "" else p + "\n" + r1
    _output_cat = p + r2 if wrapper == "pretrain" or len(r2) == "" else p + "\n" + r2
    return _reference_cat + "<|reward|>" + _output_cat + "[UNUSED_TOKEN_130]"


def card_rewards(model_dir, data) -> list[float]:
    """The card's "Inference with transformers" block (device "cpu", float32 as rm-probe runs on a CPU)."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(model_dir, trust_remote_code=True, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=True)
    encoded_data = [card_encode(tokenizer, **item) for item in data]
    batch = tokenizer(encoded_data, return_tensors="pt", padding=True)
    with torch.no_grad():
        outputs = model(**batch)
    return outputs[0].squeeze(-1).cpu().tolist()


def _close(got, want):
    np.testing.assert_allclose(got, want, rtol=F32_FORWARD["rel"], atol=F32_FORWARD["abs"])


# --- tests ---------------------------------------------------------------------------------------------------------
def test_every_polar_id_resolves_to_its_reader():
    from probe.models.registry import lookup

    for name in IDS:
        spec, how = lookup(name)
        assert (spec.name, how, spec.reader, spec.pairwise) == (name, "id", "pairwise", "polar")
        assert spec.trust_remote_code and spec.auto_class == "AutoModel" and "RewardModelClient" in spec.input_source
    assert lookup("/models/internlm/POLAR-7B")[0].pairwise == "polar"  # a local copy under its Hub name


def test_responses_equal_the_cards_code(polar, polar_dir):
    """Each response's score equals the card's batch (right-padded, several lengths) on the same model; the run
    records the reference and POLAR's one-order rule."""
    assert polar.spec.name == "internlm/POLAR-1_8B" and polar.pairwise.format == "polar"
    df = probe.score_responses(polar, None, PROMPT, RESPONSES)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = card_rewards(polar_dir, [{"prompt": [{"role": "user", "content": PROMPT}],
                                     "reference": [{"role": "assistant", "content": REFERENCE}],
                                     "output": [{"role": "assistant", "content": r}]} for r in RESPONSES])
    _close([got[r] for r in RESPONSES], want)
    assert np.ptp(want) > 1e-3
    described = polar.pairwise.describe()
    assert described["reference_response"] == REFERENCE and "one order" in described["score"]


def test_another_reference_and_a_system_text_follow_the_card(polar_dir):
    """--reference-response changes every score as the card's reference does; a system text is joined before the
    prompt with a newline, as the card's client joins a prompt's messages."""
    other = "Beijing is the capital of China."
    lm = probe.load(str(polar_dir), device="cpu", trust_remote_code=True, reference_response=other)
    system = "Answer briefly."
    df = probe.score_responses(lm, None, PROMPT, RESPONSES, system=system)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = card_rewards(polar_dir, [{"prompt": [{"role": "system", "content": system},
                                                {"role": "user", "content": PROMPT}],
                                     "reference": other, "output": r} for r in RESPONSES])
    _close([got[r] for r in RESPONSES], want)


def test_sweep_equals_the_cards_code_on_one_piece_responses(polar, polar_dir):
    """The sweep (self-checked against the model's own forward) scores each id in the candidate's slot; for ids that
    are one piece of text glued to the newline before the slot, the card's code on that text gives the same score."""
    from probe.core.template import piece_text

    sweep = probe.sweep(polar, None, PROMPT, limit=400, batch_size=64)
    tok = polar.tokenizer
    scores = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    words = [(t, piece_text(tok, t)) for t in sorted(scores)]
    words = [(t, w) for t, w in words if w.isascii() and w.isalpha() and len(w) > 2][:12]
    assert len(words) >= 8
    want = card_rewards(polar_dir, [{"prompt": PROMPT, "reference": REFERENCE, "output": w} for _, w in words])
    _close([scores[t] for t, _ in words], want)
    assert np.ptp(want) > 1e-3


def test_social_benchmark_on_polar(polar, polar_dir, tmp_path):
    """`probe social` scores each option against the reference (recorded in the run, named in the report) as the
    card's code does."""
    import polars as pl

    from probe.commands.social import main
    from probe.social.loaders import NEUTRAL_PROMPT  # CrowS-Pairs' sentences answer a neutral request

    data, sentences = crows_pair_file(tmp_path)
    args = ["--rm", str(polar_dir), "--trust-remote-code", "--reference-response", REFERENCE, "--device", "cpu",
            "--output", str(tmp_path / "out"), "--dataset", "crows_pairs", "--data", str(data), "--no-progress"]
    assert main(args) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["settings"]["reference_response"] == REFERENCE and meta["settings"]["pairwise"] == "polar"
    assert meta["model"]["input"]["call"] == "tokenizer(text)" and "RewardModelClient" in meta["model"]["input"][
        "convention"]
    from probe.report.audit import judge_rows

    assert "in one order, the reference first" in dict(judge_rows(meta))["reference response"]  # the report's line
    scores = pl.read_parquet(run / "scores.parquet")
    want = card_rewards(polar_dir, [{"prompt": NEUTRAL_PROMPT, "reference": REFERENCE, "output": s}
                                    for s in sentences])
    _close(sorted(scores["score"].to_numpy()), sorted(want))


def test_bad_input_is_one_line_before_weights(polar_dir, monkeypatch):
    """No reference (the card suggests no default), no --trust-remote-code, RewardBench's route (it has no POLAR
    pipeline): each refused in one line, before any weights load."""
    import probe.models.loading as loading

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded")

    monkeypatch.setattr(loading, "_from_pretrained", no_weights)
    with pytest.raises(ProbeError, match="pass --reference-response"):
        probe.load(str(polar_dir), device="cpu", trust_remote_code=True)
    with pytest.raises(ProbeError, match="--trust-remote-code"):
        probe.load(str(polar_dir), device="cpu", reference_response=REFERENCE)
    with pytest.raises(ProbeError, match="no pipeline for"):
        probe.load(str(polar_dir), device="cpu", trust_remote_code=True, reference_response=REFERENCE,
                   input_method="rewardbench")


def test_gcg_is_refused_in_one_line(polar):
    with pytest.raises(ProbeError, match="POLAR's is read through its remote class's own forward"):
        probe.gcg(polar, None, PROMPT, length=2, steps=1)


def test_memory_plan_counts_one_full_sequence_model(polar):
    """POLAR runs whole sequences through one model (no second order): the plan has one part on its device."""
    from probe.core.scoring import batch_parts, make_head, scoring_path

    head = make_head(polar, "reward")
    assert scoring_path(polar) == scoring_path(polar, head) == "full"
    parts = batch_parts(polar, 48, 3, "reward", head)
    assert [len(v) for v in parts.values()] == [1]


def test_long_inputs_are_cut_as_the_cards_client_cuts_them(polar_dir):
    """A response over 4,096 ids is cut to its first 4,096 (BOS included), and a prompt longer than half of what the
    responses leave of 16,380 ids to its last ids (the third case): the ids equal the card's encode, then
    tokenizer(text)."""
    from transformers import AutoTokenizer

    from probe.core.pairwise import Pairwise, PairwiseConversation

    tok = AutoTokenizer.from_pretrained(polar_dir)
    words = [w for w in (Path(__file__).resolve().parents[1] / "testdata" / "top3000_en.txt").read_text().split()
             if w.isalpha()]
    long_response = " ".join(words[:2500] * 2)
    long_prompt = "Summarise this. " + " ".join(words[500:3000] * 3) + " What is the capital of China?"
    for prompt, response in ((PROMPT, long_response), (long_prompt, "Beijing."), (long_prompt, long_response)):
        ours = PairwiseConversation(prompt, Pairwise("polar", REFERENCE)).render_ids(tok, response)
        card = tok(card_encode(tok, prompt, REFERENCE, response))["input_ids"]
        assert ours == card
    room = (16384 - 4 - 4096 - len(tok.encode(REFERENCE))) // 2  # the client's prompt room beside a cut response
    assert len(tok.encode(long_response)) > 4096 and len(tok.encode(long_prompt)) > room


def test_a_tokenizer_that_splits_the_reward_token_is_refused(polar):
    """The card reads the score at its text '[UNUSED_TOKEN_130]', trained as the config's reward_token_id: a tokenizer
    giving other ids is refused in one line; the tiny checkpoint's passes."""
    from types import SimpleNamespace

    from probe.models.loading import check_polar_reward_token

    check_polar_reward_token("polar", polar.tokenizer, polar.model.config)
    with pytest.raises(ProbeError, match="not as the config's reward_token_id 7"):
        check_polar_reward_token("polar", polar.tokenizer, SimpleNamespace(reward_token_id=7))
