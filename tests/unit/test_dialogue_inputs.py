"""The dialogue formats (UltraRM, Eurus-era Llama-2/Mistral reward models, Beaver, Ziya) on a real SentencePiece
tokenizer: the ids are the model card's ``tokenizer(text)``, whatever the tokenizer's ``legacy`` flag says.

Mistral 7B v0.1's tokenizer.model (mistral-common 1.13.1) with ``legacy`` true, false and unset: with BOS written as
text and encoded without special tokens (the old route), a non-legacy tokenizer drops the ``▁`` of the first word
(``<s> User`` instead of ``<s> ▁User``), so the model saw another input than its card feeds it."""

from __future__ import annotations

import pytest

from probe.core.template import input_call, render, response_conversation, split_template
from probe.errors import ModelLoadError
from probe.models.chat_templates import chat_template_text
from probe.models.registry import REGISTRY
from tests.real_tokenizers import mistral_v1

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSE = "Love, of course </s> and <s> peace"
# the strings RewardBench's fastchat templates render (tests/unit/test_rewardbench_families.py checks them)
TEXTS = {
    "openbmb": "User: {p}\n\nAssistant: {r}\n\n",
    "pku-align": "BEGINNING OF CONVERSATION: USER: {p} ASSISTANT: {r} ",
    "ziya": "\n\nHuman: {p}\n\nAssistant: {r}\n\n",
}
LEGACY = {"true": True, "false": False, "unset": None}


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("mistral")
    return {k: AutoTokenizer.from_pretrained(mistral_v1(root / k, v)) for k, v in LEGACY.items()}


def _with(tok, template: str):
    import copy

    tok = copy.deepcopy(tok)
    tok.chat_template = chat_template_text(template)
    return tok


def test_the_old_route_really_differs_on_a_non_legacy_tokenizer(mistral):
    """The defect, shown on the real file: BOS as text and add_special_tokens=False loses the first word's ▁ unless
    legacy is true."""
    for key, tok in mistral.items():
        card = tok("User: hello")["input_ids"]
        old = tok("<s>User: hello", add_special_tokens=False)["input_ids"]
        assert tok.convert_ids_to_tokens(card)[:2] == ["<s>", "▁User"]
        assert (old == card) == (key == "true")


@pytest.mark.parametrize("template", sorted(TEXTS))
@pytest.mark.parametrize("legacy", sorted(LEGACY))
def test_dialogue_formats_give_the_model_cards_ids(mistral, template, legacy):
    tok = _with(mistral[legacy], template)
    assert input_call(tok) == "tokenizer(text)"
    build = response_conversation(PROMPT, None)
    plain = "Love and peace"  # exactly the card's tokenizer(text)
    assert render(tok, build, plain) == tok(TEXTS[template].format(p=PROMPT, r=plain))["input_ids"]
    # control tokens inside a response stay text (as for every template: sanitize_control_tokens), BOS once
    got = render(tok, build, RESPONSE)
    assert got[0] == tok.bos_token_id and got.count(tok.bos_token_id) == 1 and tok.eos_token_id not in got
    assert tok.decode(got[1:]).strip() == TEXTS[template].format(p=PROMPT, r=RESPONSE).strip()


@pytest.mark.parametrize("template", sorted(TEXTS))
def test_the_template_split_does_not_depend_on_legacy(mistral, template):
    """One split for all three settings; every verified token's row equals the card's ids of its text."""
    splits = {k: split_template(_with(t, template), response_conversation(PROMPT, None), n_verify=16)
              for k, t in mistral.items()}
    first = splits["true"]
    assert all((s.prefix_ids, s.suffix_ids, s.leading_space) == (first.prefix_ids, first.suffix_ids, first.leading_space)
               for s in splits.values())
    assert first.bos_count == 1 and first.verified_tokens >= 16
    tok = _with(mistral["unset"], template)
    love = tok.convert_tokens_to_ids("▁Love")
    card = tok(TEXTS[template].format(p=PROMPT, r="Love"))["input_ids"]
    assert first.full_ids([love]) == card


def test_chat_models_keep_the_chat_template_call(tokenizers):
    """A chat template without the mark (Llama 3, Gemma, Qwen) is encoded as apply_chat_template(tokenize=True)."""
    tok = tokenizers["llama3"]
    assert input_call(tok) == "chat_template"
    build = response_conversation(PROMPT, None)
    messages, gen = build("Love")
    want = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=gen, return_dict=False,
                                   date_string=build.date_string)
    assert render(tok, build, "Love") == list(want)


def test_the_registry_records_each_familys_input_convention():
    for name in ("openbmb/UltraRM-13b", "PKU-Alignment/beaver-7b-v1.0-reward", "IDEA-CCNL/Ziya-LLaMA-7B-Reward",
                 "LlamaRewardModel", "LlamaForScore"):
        spec = REGISTRY[name]
        assert spec.input_source.startswith("model card: tokenizer(text)")
        # the card's dialogue by default; RewardBench's fastchat string (named in the source) on its route
        assert spec.chat_template.endswith("-card") and spec.rewardbench_chat_template in TEXTS
        assert f"--input-method rewardbench: RewardBench's" in spec.input_source
    assert REGISTRY["IDEA-CCNL/Ziya-LLaMA-7B-Reward"].input_eos and "add_eos_token=True" in REGISTRY[
        "IDEA-CCNL/Ziya-LLaMA-7B-Reward"].input_source
    assert "apply_chat_template" in REGISTRY["default"].input_source
    grm = REGISTRY["Ray2333/GRM-llama3-8B-sftreg"]
    assert "BOS twice" in grm.input_source and grm.input_call == "tokenizer(text)"
    assert REGISTRY["GRewardModel"].input_call == "tokenizer(text)" and REGISTRY["default"].input_call is None
    for spec in REGISTRY.values():
        assert spec.input_source and "\n" not in spec.input_source


def test_a_sentencepiece_tokenizer_without_sentencepiece_is_one_line(tmp_path, monkeypatch):
    import importlib.util

    from probe.models.loading import load_tokenizer

    folder = mistral_v1(tmp_path / "m", None)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sentencepiece" else real(name, *a))
    with pytest.raises(ModelLoadError, match=r"SentencePiece tokenizer.model .* needs sentencepiece: pip install "
                                             r"sentencepiece$"):
        load_tokenizer(str(folder), None, False, chat_template="openbmb")


# ---------------------------------------------------------------- GRM: the template's text through tokenizer(text)


@pytest.fixture(scope="module")
def grm_llama31(tmp_path_factory):
    """A tiny GRM (RewardBench's GRewardModel, MLP v_head) on the real Llama 3.1 tokenizer and template, saved as a
    checkpoint folder; the tokenizer's post-processor adds <|begin_of_text|>, and so does the template."""
    from transformers import AutoTokenizer

    from tests import rewardbench_code as rb
    from tests import real_tokenizers, tiny

    folder = real_tokenizers.build("llama3.1", tmp_path_factory.mktemp("grm31") / "m")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.pad_token = "<|finetune_right_pad_id|>"  # RewardBench's pipeline pads its batch
    config = tiny.llama_config(tok, vocab_size=len(tok), pad_token_id=tok.pad_token_id)
    model = tiny.family_model(rb.load("grm").GRewardModel, config,
                              dict(vhead_layer_type="mlp", vhead_num_neurons=32, vhead_num_layers=2))
    model.save_pretrained(folder)
    return folder, model, tok


def test_grm_reads_the_templates_text_as_its_training_code_does(grm_llama31):
    """GRM's training code and cards encode the chat template's text with tokenizer(text): two BOS on Llama 3.1. The
    default route gives exactly those ids, the split keeps both, and the scores equal RewardBench's GRMPipeline."""
    import numpy as np
    import torch

    import probe
    from probe.core.scoring import ScoringOptions, prompt_split
    from tests import rewardbench_code as rb

    folder, model, tok = grm_llama31
    lm = probe.load(str(folder), device="cpu", spec="Ray2333/GRM-llama3-8B-sftreg")
    assert input_call(lm.tokenizer) == "tokenizer(text)"
    split = prompt_split(lm, "reward", PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    bos = tok.bos_token_id
    assert split.bos_count == 2 and list(split.prefix_ids[:2]) == [bos, bos]
    msgs = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Love"}]
    text = tok.apply_chat_template(msgs, tokenize=False, date_string="26 Jul 2024")
    love = tok.encode("Love", add_special_tokens=False)
    assert split.full_ids(love) == tok(text)["input_ids"]
    responses = ["Love", "Black people", "The Beatles", "peace"]
    ours = probe.score_responses(lm, None, PROMPT, responses)
    got = dict(zip(ours["response"], ours["score"].to_numpy()))
    texts = [tok.apply_chat_template([msgs[0], {"role": "assistant", "content": r}], tokenize=False,
                                     date_string="26 Jul 2024") for r in responses]
    with rb.on_cpu():
        out = rb.load("grm").GRMPipeline("text-classification", model, tok)(texts, batch_size=8, padding=True,
                                                                           truncation=True, max_length=2048)
    want = (out if torch.is_tensor(out) else torch.stack(list(out))).float().numpy().reshape(-1)
    np.testing.assert_allclose([got[r] for r in responses], want, rtol=2e-5, atol=2e-5)
    assert np.ptp(want) > 1e-3
    from probe.runs.meta import model_record

    assert model_record(lm)["input"] == {"call": "tokenizer(text)", "convention": lm.spec.input_source}


def test_a_chat_model_keeps_one_bos_on_the_same_tokenizer(grm_llama31):
    """The same template and tokenizer under the default convention: one BOS (the template's)."""
    _, _, tok = grm_llama31
    split = split_template(tok, response_conversation(PROMPT, None), n_verify=8)
    assert split.bos_count == 1 and input_call(tok) == "chat_template"


# ---------------------------------------------------------------- --input-method rewardbench on real tokenizers


@pytest.fixture(scope="module")
def llama31_classifier(tmp_path_factory):
    """A tiny LlamaForSequenceClassification on the real Llama 3.1 tokenizer and template, saved as a checkpoint."""
    import torch
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    from tests import real_tokenizers, tiny

    folder = real_tokenizers.build("llama3.1", tmp_path_factory.mktemp("cls31") / "m")
    tok = AutoTokenizer.from_pretrained(folder)
    tok.pad_token = "<|finetune_right_pad_id|>"
    model = tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok, vocab_size=len(tok),
                                                                         pad_token_id=tok.pad_token_id))
    model.save_pretrained(folder)
    torch.manual_seed(0)
    return folder, model, tok


def test_the_rewardbench_route_on_llama31_is_rewardbenchpipelines_masked_double_bos(llama31_classifier):
    """RewardBench's run script renders the template's text and RewardBenchPipeline encodes it with tokenizer(text):
    two <|begin_of_text|> on Llama 3.1, of which it masks the first. The route equals the pipeline, with the first
    BOS dropped (the same for rotary positions), and so equals the card's input here; a pipeline without the mask
    (GRM's, ArmoRM's) keeps both (test_grm_reads_the_templates_text_as_its_training_code_does)."""
    import numpy as np

    import probe
    from probe.core.scoring import ScoringOptions, prompt_split
    from probe.runs.meta import score_label
    from tests import rewardbench_code as rb

    folder, model, tok = llama31_classifier
    responses = ["Love", "Black people", "The Beatles", "peace"]
    route = probe.load(str(folder), device="cpu", input_method="rewardbench", allow_random_head=True)
    default = probe.load(str(folder), device="cpu", allow_random_head=True)
    assert input_call(route.tokenizer) == "rewardbench" and input_call(default.tokenizer) == "chat_template"
    assert route.tokenizer.rm_probe_call_ids.drop_double_bos == tok.bos_token_id
    split = prompt_split(route, "reward", PROMPT, None, ScoringOptions(), len(tok))
    assert split == prompt_split(default, "reward", PROMPT, None, ScoringOptions(), len(tok)) and split.bos_count == 1
    texts = [tok.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": r}],
                                     tokenize=False, date_string="26 Jul 2024") for r in responses]
    assert tok(texts[0])["input_ids"][:2] == [tok.bos_token_id] * 2  # what the pipeline encodes, before its mask
    with rb.on_cpu():
        out = rb.load("pipeline").RewardBenchPipeline("text-classification", model, tok)(
            texts, batch_size=8, padding=True, truncation=False, max_length=2048)
    ours = probe.score_responses(route, None, PROMPT, responses)
    got = dict(zip(ours["response"], ours["score"].to_numpy()))
    np.testing.assert_allclose([got[r] for r in responses], out[:, 0].float().numpy(), rtol=2e-5, atol=2e-5)
    assert score_label(route, "reward") == "reward, RewardBench's inputs" and score_label(default, "reward") == "reward"


@pytest.mark.parametrize("bad", [dict(score="judge"), dict(ref="smollm2", beta=0.5)])
def test_the_rewardbench_route_is_refused_where_it_is_not_reproduced(llama31_classifier, bad, monkeypatch):
    """RewardBench has no judge input, and its DPO score is the unscaled log-ratio: one line, before weights load."""
    import probe
    from probe.errors import ProbeError
    from probe.models import loading

    monkeypatch.setattr(loading, "_from_pretrained", lambda *a, **k: pytest.fail("weights loaded before the refusal"))
    folder, _, _ = llama31_classifier
    with pytest.raises((ModelLoadError, ProbeError), match="--input-method rewardbench"):
        probe.load(str(folder) if "ref" not in bad else None, device="cpu", input_method="rewardbench", **bad)


def test_an_unknown_input_method_is_one_line():
    import probe
    from probe.errors import ProbeError

    with pytest.raises(ProbeError, match="input_method='paper'"):
        probe.load(None, device="cpu", input_method="paper")


@pytest.mark.parametrize("pipeline,n_bos", [("ArmoRMPipeline", 2), ("GRMPipeline", 2), ("StarlingPipeline", 2),
                                            ("RewardBenchPipeline", 1), ("LDLPipeline", 1)])
def test_which_rewardbench_pipelines_keep_a_doubled_bos(llama31_classifier, pipeline, n_bos):
    """RewardBenchPipeline and LDLPipeline mask the first of two leading BOS; the others feed both (their code)."""
    import copy

    from probe.core.template import rewardbench_call_ids

    _, _, tok = llama31_classifier
    tok = copy.deepcopy(tok)
    tok.rm_probe_input_call = "rewardbench"
    tok.rm_probe_call_ids = rewardbench_call_ids(tok, pipeline)
    ids = render(tok, response_conversation(PROMPT, None), "Love")
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Love"}],
                                   tokenize=False, date_string="26 Jul 2024")
    card = tok(text)["input_ids"]  # what every one of these pipelines encodes
    assert ids == card[2 - n_bos:] and ids[:n_bos] == [tok.bos_token_id] * n_bos and ids[n_bos] != tok.bos_token_id


def test_a_single_bos_is_kept_where_the_pipeline_masks_a_doubled_one(llama31_classifier):
    """A template that writes no BOS: tokenizer(text) adds the only one, which RewardBenchPipeline's mask (the first
    of two leading BOS, its pipeline.py) leaves alone; the route feeds it, as it feeds the doubled one's second."""
    import copy

    from probe.core.template import rewardbench_call_ids

    _, _, tok = llama31_classifier
    tok = copy.deepcopy(tok)
    assert tok.chat_template.startswith("{{- bos_token }}")
    tok.chat_template = tok.chat_template.removeprefix("{{- bos_token }}")
    tok.rm_probe_input_call = "rewardbench"
    tok.rm_probe_call_ids = rewardbench_call_ids(tok, "RewardBenchPipeline")
    text = tok.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Love"}],
                                   tokenize=False, date_string="26 Jul 2024")
    card = tok(text)["input_ids"]
    assert card[0] == tok.bos_token_id != card[1]
    assert render(tok, response_conversation(PROMPT, None), "Love") == card
