"""Every registry family's default input is its model card's (issue 44): for each family, the card's own usage code
(or its training code's, where the card has none), run as the card writes it, on a real tokenizer of the layout the
checkpoint ships, against rm-probe's rendering through its own loader (the family's registry spec).

The dialogue families' cards (UltraRM, Beaver, Ziya, Eurus) write their text by hand and call ``tokenizer(text)``
on Llama-2-era SentencePiece tokenizers: their golden ids are the cards' code run under transformers 4.51.0 (Eurus's
with its closing tag corrected: its card writes ``[\\INST]`` for the ``[/INST]`` it names; a deliberate deviation)
(tests/testdata/card_ids.json, written by tests/testdata/card_ids_451.py), on Mistral v1's vocabulary in both
layouts and every ``legacy`` setting. The chat families' cards call the installed transformers, run here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from probe.core.template import render, response_conversation
from probe.models.chat_templates import chat_template_text
from probe.models.loading import _set_input_call, family_template, load_tokenizer
from probe.models.registry import DEFAULT, REGISTRY
from tests import real_tokenizers
from tests.real_tokenizers import mistral_v1, mistral_v1_json

GOLDEN = Path(__file__).resolve().parents[1] / "testdata" / "card_ids.json"
PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", " leading space", "café au lait", "line\nbreak", "</s> as text", "🎉 joy"]
LAYOUTS = {f"{kind}-{legacy}": (build, legacy) for kind, build in (("model", mistral_v1), ("json", mistral_v1_json))
           for legacy in (None, True, False)}
# golden key -> the registry specs that read it
DIALOGUE_CARDS = {"ultrarm": ("openbmb/UltraRM-13b", "LlamaRewardModel"),
                  "beaver": ("PKU-Alignment/beaver-7b-v1.0-reward", "PKU-Alignment/beaver-7b-v2.0-cost", "LlamaForScore"),
                  "ziya": ("IDEA-CCNL/Ziya-LLaMA-7B-Reward",),
                  "eurus": ("openbmb/Eurus-RM-7b",)}
# Where rm-probe's ids differ from the card's, and why (the same two as RewardBench's route, test_rewardbench_ids):
# a control token written inside a response ("</s>"): rm-probe encodes it as text, the card's tokenizer(text) makes it
# the control token; a double space on the tokenizer.model layout (transformers 5 merges "▁▁"; 4.51: "▁" + "▁leading"),
# where the card writes a space before the response (UltraRM, Eurus; Beaver and Ziya write none).
TEXT_DIFFERS = {("model", " leading space", "ultrarm"), ("model", " leading space", "eurus"),
                *{(kind, "</s> as text", card) for kind in ("model", "json") for card in DIALOGUE_CARDS}}
# a chat template a checkpoint's tokenizer may carry (here Mistral-Instruct's; whether Eurus-RM-7b's tokenizer_config.json
# has one could not be checked offline): the card does not call it
MISTRAL_INSTRUCT = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
                    "message['content'] + ' [/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}"
                    "{% endfor %}")


def build_cases(root: Path) -> dict:
    """The tokenizer folders (one per layout x legacy) and the texts' parts, as `card_ids_451.py` reads them."""
    for name, (make, legacy) in LAYOUTS.items():
        make(root / name, legacy)
    cases = {"layouts": list(LAYOUTS), "prompt": PROMPT, "responses": RESPONSES}
    (root / "cases.json").write_text(json.dumps(cases, ensure_ascii=False))
    return cases


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cardids")
    build_cases(root)
    for layout in LAYOUTS:  # Eurus's checkpoint carries a chat template of its own
        cfg = root / layout / "tokenizer_config.json"
        data = json.loads(cfg.read_text())
        data["chat_template"] = MISTRAL_INSTRUCT
        (root / f"{layout}-templated").mkdir()
        for f in (root / layout).iterdir():
            (root / f"{layout}-templated" / f.name).write_bytes(f.read_bytes())
        (root / f"{layout}-templated" / "tokenizer_config.json").write_text(json.dumps(data))
    return root


def _rendered(folder: Path, spec_name: str, input_method: str = "ids") -> tuple[object, dict[str, list[int]]]:
    """rm-probe's ids through its own loader's steps: the family's dialogue format, its input call."""
    spec = REGISTRY[spec_name]
    family, replaces = family_template(spec, input_method)
    tok = load_tokenizer(str(folder), None, False, family_template=family, family_replaces=replaces)
    _set_input_call(tok, spec, "reward", input_method)
    build = response_conversation(PROMPT)
    return tok, {r: render(tok, build, r) for r in RESPONSES}


def test_golden_ids_are_the_cards_own_calls_under_transformers_451():
    golden = json.loads(GOLDEN.read_text())
    assert golden["transformers"] == "4.51.0"
    assert golden["classes"]["ultrarm"] == golden["classes"]["ziya"] == "LlamaTokenizer"  # the slow class they name
    ids = golden["ids"]
    assert len(ids) == len(RESPONSES) * (6 * 2 + 3 * 2)  # Beaver, Eurus on six layouts; UltraRM, Ziya on three
    assert all(v[0] == 1 and v.count(1) == 1 for v in ids.values())  # one <s>
    assert all((v[-1] == 2) == (k.split("|")[1] == "ziya") for k, v in ids.items() if "</s>" not in k)  # Ziya: EOS


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("card", list(DIALOGUE_CARDS))
def test_dialogue_families_read_their_model_cards_ids(folders, layout, card):
    """The default route equals the card's own code (4.51.0's ids) on both layouts and every legacy setting, for each
    spec that reads the family (by id and by class); Eurus's card format is used although its tokenizer carries a
    chat template (the card never calls it). Old code: RewardBench's fastchat strings ('User: ..\\n\\nAssistant: ..
    \\n\\n', '.. ASSISTANT: .. ', '\\n\\nHuman: ..'), no EOS for Ziya, and Eurus through its tokenizer's template."""
    golden = json.loads(GOLDEN.read_text())["ids"]
    kind = layout.split("-")[0]
    if f"{layout}|{card}|0" not in golden:
        pytest.skip("the card's slow LlamaTokenizer cannot read a tokenizer.json-only folder")
    folder = folders / (f"{layout}-templated" if card == "eurus" else layout)
    for spec in DIALOGUE_CARDS[card]:
        tok, got = _rendered(folder, spec)
        assert tok.chat_template == chat_template_text(REGISTRY[spec].chat_template)
        for i, r in enumerate(RESPONSES):
            want = golden[f"{layout}|{card}|{i}"]
            if (kind, r, card) in TEXT_DIFFERS:
                assert got[r] != want, f"transformers now encodes {r!r} as 4.51 did: drop it from TEXT_DIFFERS"
                assert got[r][0] == want[0] and got[r][-1] == want[-1]
            else:
                assert got[r] == want, (spec, layout, r)


@pytest.mark.parametrize("card", ["ultrarm", "beaver", "ziya"])
def test_the_rewardbench_route_keeps_rewardbenchs_own_format(folders, card):
    """``--input-method rewardbench`` renders RewardBench's fastchat string (its run script's, with EOS), not the
    card's: the two routes give other ids."""
    spec = DIALOGUE_CARDS[card][0]
    tok, got = _rendered(folders / "model-None", spec, "rewardbench")
    assert tok.chat_template == chat_template_text(REGISTRY[spec].rewardbench_chat_template)
    _, card_ids = _rendered(folders / "model-None", spec)
    assert all(got[r] != card_ids[r] and got[r][-1] == tok.eos_token_id for r in RESPONSES)


def test_eurus_on_the_rewardbench_route_keeps_its_tokenizers_template(folders):
    """OpenBMBPipeline's ``tokenizer(text)`` on the tokenizer's own template (no BOS mask): the template's BOS and the
    call's, the response then the template's EOS, and no EOS added (the tokenizer has a template)."""
    tok, got = _rendered(folders / "model-None-templated", "openbmb/Eurus-RM-7b", "rewardbench")
    assert tok.chat_template == MISTRAL_INSTRUCT
    for r in RESPONSES:
        text = tok.apply_chat_template([{"role": "user", "content": PROMPT}, {"role": "assistant", "content": r}],
                                       tokenize=False)
        want = tok(text)["input_ids"]
        assert want[:2] == [tok.bos_token_id] * 2 and want[-1] == tok.eos_token_id and want[-2] != tok.eos_token_id
        if "</s>" not in r:  # a control token inside a response: text for rm-probe, the token for tokenizer(text)
            assert got[r] == want, r


def test_probe_load_reads_eurus_by_its_card_although_its_tokenizer_has_a_template(folders, tmp_path):
    """Through ``probe.load`` (not the loader's steps one by one): the card's format replaces the tokenizer's."""
    import probe
    from transformers import AutoTokenizer
    from tests import rewardbench_code as rb
    from tests import tiny

    src = folders / "model-None-templated"
    tok = AutoTokenizer.from_pretrained(src)
    model = tiny.family_model(rb.load("openbmb").LlamaRewardModel, tiny.llama_config(tok, pad_token_id=0))
    model.save_pretrained(tmp_path / "eurus")
    for f in src.iterdir():
        (tmp_path / "eurus" / f.name).write_bytes(f.read_bytes())
    lm = probe.load(str(tmp_path / "eurus"), device="cpu", spec="openbmb/Eurus-RM-7b")
    assert lm.tokenizer.chat_template == chat_template_text("eurus-card")
    build = response_conversation(PROMPT)
    golden = json.loads(GOLDEN.read_text())["ids"]
    assert render(lm.tokenizer, build, "Love") == golden["model-None|eurus|0"]
    rb_lm = probe.load(str(tmp_path / "eurus"), device="cpu", spec="openbmb/Eurus-RM-7b", input_method="rewardbench")
    assert rb_lm.tokenizer.chat_template == MISTRAL_INSTRUCT


def test_a_chat_template_given_by_the_user_wins_over_the_cards(folders):
    spec = REGISTRY["openbmb/Eurus-RM-7b"]
    family, replaces = family_template(spec, "ids")
    tok = load_tokenizer(str(folders / "model-None-templated"), None, False, chat_template="openbmb",
                         family_template=family, family_replaces=replaces)
    assert tok.chat_template == chat_template_text("openbmb")


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "build":  # see tests/testdata/card_ids_451.py
    build_cases(Path(sys.argv[2]))


# The chat families' cards, each as its usage code calls the tokenizer (conv: one user turn, one assistant turn).
# Llama 3.2's template writes today's date unless given one; rm-probe passes its fixed date (--date), so the card's
# call gets the same date here.
def _template_ids(tok, conv, **kw):
    """``apply_chat_template(conv, tokenize=True, return_tensors="pt")``: Skywork v0.2, ArmoRM, QRM, INF-ORM, LDL."""
    out = tok.apply_chat_template(conv, tokenize=True, return_tensors="pt", **kw)
    return (out["input_ids"] if not hasattr(out, "tolist") else out)[0].tolist()


def _encode_plus_text(tok, conv, **kw):
    """``tokenizer.encode_plus(tokenizer.apply_chat_template(message, tokenize=False), padding='longest',
    truncation=True)``: GRM's cards (-ft and -sftreg) and training code: two BOS. (``padding='longest'`` pads
    nothing in a batch of one; left out, as these Llama 3 folders carry no pad token.)"""
    text = tok.apply_chat_template(conv, tokenize=False, **kw)
    encode_plus = getattr(tok, "encode_plus", tok)  # transformers 5 removed it; for one text it was tokenizer(text)
    return encode_plus(text, truncation=True, return_tensors="pt")["input_ids"][0].tolist()


def _tokenizer_text(tok, conv, **kw):
    """URM's card: ``tokenizer(tokenizer.apply_chat_template(messages, tokenize=False))``: two BOS."""
    return tok(tok.apply_chat_template(conv, tokenize=False, **kw), return_tensors="pt")["input_ids"][0].tolist()


def _skywork_v2(tok, conv, **kw):
    """Skywork-Reward-V2's card: the template's text, its leading BOS text removed ("These two lines remove the
    potential duplicate bos token"), then ``tokenizer(text)``."""
    text = tok.apply_chat_template(conv, tokenize=False, **kw)
    if tok.bos_token is not None and text.startswith(tok.bos_token):
        text = text[len(tok.bos_token):]
    return tok(text, return_tensors="pt")["input_ids"][0].tolist()


def _skywork_v1(tok, conv, **kw):
    """Skywork-Reward v0.1's card: ``rm_tokenizer(rm_tokenizer.apply_chat_template(conv, tokenize=False))``, on its
    checkpoints' templates, from which Skywork "removed the BOS token ... to prevent it being added twice"."""
    return tok(tok.apply_chat_template(conv, tokenize=False, **kw), return_tensors="pt")["input_ids"][0].tolist()


CHAT_CARDS = {
    "Skywork/Skywork-Reward-Gemma-2-27B": ("gemma2-nobos", _skywork_v1),
    "Skywork/Skywork-Reward-Llama-3.1-8B": ("llama3.1-nobos", _skywork_v1),
    "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": ("gemma2", _template_ids),
    "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2": ("llama3.1", _template_ids),
    "Ray2333/GRM-Llama3-8B-rewardmodel-ft": ("llama3", _encode_plus_text),
    "Ray2333/GRM-Llama3.2-3B-rewardmodel-ft": ("llama3.2", _encode_plus_text),
    "Ray2333/GRM-gemma2-2B-rewardmodel-ft": ("gemma2", _encode_plus_text),
    "Ray2333/GRM-llama3-8B-sftreg": ("llama3", _encode_plus_text),
    "Ray2333/GRM-Gemma2-2B-sftreg": ("gemma2", _encode_plus_text),
    "RLHFlow/ArmoRM-Llama3-8B-v0.1": ("llama3", _template_ids),
    "nicolinho/QRM-Llama3.1-8B": ("llama3.1", _template_ids),
    "nicolinho/QRM-Gemma-2-27B": ("gemma2", _template_ids),
    "LxzGordon/URM-LLaMa-3.1-8B": ("llama3.1", _tokenizer_text),
    "Skywork/Skywork-Reward-V2-Llama-3.1-8B": ("llama3.1", _skywork_v2),
    "Skywork/Skywork-Reward-V2-Llama-3.2-1B": ("llama3.2", _skywork_v2),
    "Skywork/Skywork-Reward-V2-Qwen3-8B": ("qwen3-latest", _skywork_v2),
    "nvidia/Qwen-2.5-Nemotron-32B-Reward": ("qwen2.5", _template_ids),
    "nvidia/Qwen-3-Nemotron-32B-Reward": ("qwen3-latest", _template_ids),
    "infly/INF-ORM-Llama3.1-70B": ("llama3.1", _template_ids),
    "ShikaiChen/LDL-Reward-Gemma-2-27B-v0.1": ("gemma2", _template_ids),
}
CHAT_RESPONSES = ["Love", " leading space", "café au lait", "line\nbreak", "🎉 joy"]


@pytest.fixture(scope="module")
def chat_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("chatcards")
    out = {}
    for fam in {f for f, _ in CHAT_CARDS.values()}:
        base = fam.removesuffix("-nobos")
        out[fam] = real_tokenizers.build(base, root / fam)
        if fam.endswith("-nobos"):  # Skywork v0.1's checkpoints: the family's template without its BOS
            cfg = out[fam] / "tokenizer_config.json"
            data = json.loads(cfg.read_text())
            text = chat_template_text(base)
            data["chat_template"] = text.replace("{{- bos_token }}", "", 1).replace("{{ bos_token }}", "", 1)
            assert data["chat_template"] != text
            cfg.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("spec_name", list(CHAT_CARDS))
def test_chat_families_read_their_model_cards_ids(chat_folders, spec_name):
    """Each chat family's default input equals its card's own call on the real tokenizer of its base model. Old
    code: GRM's -ft cards and URM's card encode the template's text with ``tokenizer(...)`` (two BOS), rm-probe
    wrote one."""
    from probe.core.template import DEFAULT_DATE

    fam, card = CHAT_CARDS[spec_name]
    spec = REGISTRY[spec_name]
    family, replaces = family_template(spec, "ids")
    tok = load_tokenizer(str(chat_folders[fam]), None, False, family_template=family, family_replaces=replaces)
    _set_input_call(tok, spec, "reward", "ids")
    build = response_conversation(PROMPT)
    kw = {"date_string": DEFAULT_DATE} if fam == "llama3.2" else {}
    for r in CHAT_RESPONSES:
        conv = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": r}]
        want = card(tok, conv, **kw)
        assert render(tok, build, r) == want, (spec_name, r)
    # the template writes one BOS (Qwen none); a card that encodes the text adds the tokenizer's own (none where the
    # folder's post-processor adds none: Meta-Llama-3's first tokenizer.json)
    adds = tok("a")["input_ids"].count(tok.bos_token_id) if tok.bos_token_id is not None else 0
    n_bos = want.count(tok.bos_token_id) if tok.bos_token_id is not None else 0
    in_template = 0 if fam.startswith("qwen") or fam.endswith("-nobos") else 1
    assert n_bos == in_template + (adds if card in (_encode_plus_text, _tokenizer_text, _skywork_v1) else 0) == (
        1 if card is _skywork_v1 else n_bos)
    assert fam == "llama3" or fam.startswith("qwen") or adds == 1


def test_qwen3_nemotron_reads_the_non_thinking_form_of_its_template(chat_folders):
    """nvidia/Qwen-3-Nemotron-32B-Reward was trained with a "nothink" instruction (its card); rm-probe reads the
    checkpoint's own template, whose last assistant turn carries the empty thinking block, the form
    ``enable_thinking=False`` gives: the same ids with or without it, the block right before the response, and
    the response's slot after it (so a swept token is the whole answer, not a thought)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_folders["qwen3-latest"])
    conv = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Love"}]
    text = tok.apply_chat_template(conv, tokenize=False)
    assert text == tok.apply_chat_template(conv, tokenize=False, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nLove<|im_end|>\n")
    spec = REGISTRY["nvidia/Qwen-3-Nemotron-32B-Reward"]
    assert spec.reader == DEFAULT.reader and "nothink" in spec.input_source and "unverified" in spec.input_source
    family, replaces = family_template(spec, "ids")
    lm_tok = load_tokenizer(str(chat_folders["qwen3-latest"]), None, False, family_template=family,
                            family_replaces=replaces)
    assert render(lm_tok, response_conversation(PROMPT), "Love") == tok(text)["input_ids"]


def test_the_pair_preference_model_reads_its_readmes_input(chat_folders):
    """RLHFlow's pair-preference model (its card points to the RLHF-Reward-Modeling pair-pm README, "Service the
    RM"): the context by a plain template, both responses in ``[CONTEXT] .. [RESPONSE A] .. [RESPONSE B] .. \\n``,
    the chat template's text of that one user turn with every BOS text removed, encoded without special tokens."""
    from transformers import AutoTokenizer

    from probe.core.pairwise import Pairwise, PairwiseConversation

    tok = AutoTokenizer.from_pretrained(chat_folders["llama3"])
    plain = AutoTokenizer.from_pretrained(chat_folders["llama3"])
    plain.chat_template = ("\n{% for message in messages %}{% if loop.index0 % 2 == 0 %}\n\n<turn> user\n "
                           "{{ message['content'] }}{% else %}\n\n<turn> assistant\n {{ message['content'] }}"
                           "{% endif %}{% endfor %}\n\n\n")
    prompt_template = "[CONTEXT] {context} [RESPONSE A] {response_A} [RESPONSE B] {response_B} \n"
    reference = "It depends."
    context = plain.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False)
    for r in CHAT_RESPONSES:
        for order, (a, b) in enumerate(((r, reference), (reference, r))):
            text = prompt_template.format(context=context, response_A=a, response_B=b)
            want = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False)
                              .replace(tok.bos_token, ""), add_special_tokens=False)
            conv = PairwiseConversation(PROMPT, pairwise=Pairwise("slicpairpm", reference), order=order)
            assert conv.render_ids(tok, r) == want, (r, order)


def test_ziya_scores_and_sweep_are_its_cards_input_on_a_tiny_model(folders, tmp_path):
    """A tiny LlamaForSequenceClassification on Mistral v1's tokenizer.model, read with Ziya's spec: whole responses
    equal the model on the card's ids (4.51.0's: BOS, 'Human:..\\n\\nAssistant:..', EOS), and the sweep's rows equal
    the model on the split's prefix + token + EOS (the reward read at the EOS, as the card reads it)."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer, LlamaForSequenceClassification

    import probe
    from probe.core.scoring import ScoringOptions, prompt_split
    from tests import tiny

    src = folders / "model-None"
    tok = AutoTokenizer.from_pretrained(src)
    model = tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok, pad_token_id=0))
    model.save_pretrained(tmp_path / "ziya")
    for f in src.iterdir():
        (tmp_path / "ziya" / f.name).write_bytes(f.read_bytes())
    lm = probe.load(str(tmp_path / "ziya"), device="cpu", spec="IDEA-CCNL/Ziya-LLaMA-7B-Reward")
    golden = json.loads(GOLDEN.read_text())["ids"]
    plain = [r for r in RESPONSES if ("model", r, "ziya") not in TEXT_DIFFERS]
    with torch.no_grad():
        want = [model(input_ids=torch.tensor([golden[f"model-None|ziya|{RESPONSES.index(r)}"]])).logits[0, 0].item()
                for r in plain]
    got = dict(probe.score_responses(lm, None, PROMPT, plain).select("response", "score").iter_rows())
    assert [got[r] for r in plain] == pytest.approx(want, **tiny.F32_FORWARD)
    assert np.ptp(want) > 1e-3
    split = prompt_split(lm, "reward", PROMPT, None, ScoringOptions(), len(tok))
    assert list(split.suffix_ids) == [tok.eos_token_id] and split.prefix_ids[0] == tok.bos_token_id
    from probe.core.responses import prepare

    # a glued slot keeps a response's own leading space ('▁leading'): not a change of the response (decoded alone,
    # SentencePiece drops that space, which once flagged it "trimmed")
    rows = prepare(lm, "reward", "p", PROMPT, [" leading space", "Love"])
    assert rows.split.leading_space == "glued" and rows.change == [None, None]
    assert rows.slot_text == [" leading space", "Love"]
    sweep = probe.sweep(lm, None, PROMPT, limit=40, batch_size=16)  # with its self-check against the model's forward
    ids = sweep["token_id"].to_list()[::5]
    rows = torch.tensor([[*split.prefix_ids, t, *split.suffix_ids] for t in ids])
    with torch.no_grad():
        ref = model(input_ids=rows).logits[:, 0].numpy()
    row = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    assert [row[t] for t in ids] == pytest.approx(ref.tolist(), **tiny.F32_FORWARD)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_single_token_sweeps_split_every_card_format(folders, layout):
    """The single-token sweep's split on each card format, every layout and legacy setting: after 'ASSISTANT:' and
    'Assistant:' (Beaver, Ziya: no space) SentencePiece glues the response to the colon (the piece 'Love', not
    '▁Love'), and the slot holds the glued pieces; after 'Assistant: ' and '[/INST] ' (UltraRM, Eurus) the card's
    space is the response's first piece's own ('▁Love': the word's id, so a further leading space is "changed"). Each
    split is verified on sampled tokens (prefix + id + suffix equals
    the rendering of the id's text)."""
    from probe.core.template import split_template

    want = {"ultrarm": "changed", "beaver": "glued", "ziya": "glued", "eurus": "changed"}
    for card, specs in DIALOGUE_CARDS.items():
        tok, _ = _rendered(folders / (f"{layout}-templated" if card == "eurus" else layout), specs[0])
        split = split_template(tok, response_conversation(PROMPT), n_verify=24)
        assert split.leading_space == want[card] and split.verified_tokens >= 24, (card, split.leading_space)
        assert list(split.suffix_ids) == ([tok.eos_token_id] if card == "ziya" else [])


def test_internlm2_reads_its_cards_get_score_and_rewardbench_on_its_route(tmp_path):
    """InternLM2 reward's card calls ``model.get_score(tokenizer, chat)``: ``tokenizer.encode(
    tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False))`` (special tokens added: a
    second BOS after the template's, on a tokenizer whose call adds one) and the config's ``reward_token_id``
    appended. RewardBench's InternLMPipeline encodes without special tokens (one BOS): its route. A tiny stand-in of
    the class (tests/remote_code) on the real Llama 3.1 tokenizer, whose call adds BOS, so the two differ. Old code:
    the pipeline's one BOS by default."""
    import probe
    from probe.core.scoring import ScoringOptions, conversation
    from tests import tiny

    folder = tiny.internlm2_folder(tmp_path / "internlm2", "llama3.1")
    lms = {r: probe.load(str(folder), device="cpu", trust_remote_code=True, input_method=r)
           for r in ("ids", "rewardbench")}
    tok, reward = lms["ids"].tokenizer, lms["ids"].model.config.reward_token_id
    for r in CHAT_RESPONSES:
        chat = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": r}]
        text = tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=False, date_string="26 Jul 2024")
        card = tok.encode(text) + [reward]
        pipeline = tok.encode(text, add_special_tokens=False) + [reward]
        assert card.count(tok.bos_token_id) == 2 and pipeline.count(tok.bos_token_id) == 1
        for route, want in (("ids", card), ("rewardbench", pipeline)):
            build = conversation("reward", PROMPT, None, ScoringOptions(), lms[route])
            assert build.render_ids(lms[route].tokenizer, r) == want, (route, r)
    scores = {route: probe.score_responses(lm, None, PROMPT, CHAT_RESPONSES)["score"].to_numpy()
              for route, lm in lms.items()}  # each self-checked against the model's own forward
    assert abs(scores["ids"] - scores["rewardbench"]).max() > 1e-4
    # what meta.json and the report say of each route: the route's own words, never "the family's own" for it
    from probe.report.audit import input_words
    from probe.runs.meta import model_record

    records = {route: model_record(lm) for route, lm in lms.items()}
    assert records["ids"]["input"]["convention"] == REGISTRY["InternLM2ForRewardModel"].input_source
    rb = records["rewardbench"]["input"]
    assert rb["call"] == "rewardbench" and "InternLMPipeline" in rb["convention"]
    assert "without the tokenizer's special tokens" in rb["convention"] and "add_eos_token" not in rb["convention"]
    words = input_words({"model": records["rewardbench"], "settings": {"input_method": "rewardbench"}})
    assert "without the tokenizer's special tokens" in words and "its own:" not in words.split(". The")[0]


@pytest.mark.parametrize("spec_name", ["Ray2333/GRM-Llama3.2-3B-rewardmodel-ft", "LxzGordon/URM-LLaMa-3.1-8B"])
def test_two_bos_cards_get_one_on_the_rewardbench_route(chat_folders, spec_name):
    """GRM -ft and URM: their cards' two BOS by default; RewardBenchPipeline masks the first of a doubled BOS, so its
    route feeds one (the template's ids)."""
    fam, card = CHAT_CARDS[spec_name]
    spec = REGISTRY[spec_name]
    assert spec.rewardbench_pipeline == "RewardBenchPipeline"
    tok = load_tokenizer(str(chat_folders[fam]), None, False)
    _set_input_call(tok, spec, "reward", "rewardbench")
    build = response_conversation(PROMPT)
    conv = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": "Love"}]
    got = render(tok, build, "Love")
    assert got.count(tok.bos_token_id) == 1
    assert got == tok.apply_chat_template(conv, tokenize=True, return_dict=False, date_string="26 Jul 2024")
    assert card(tok, conv, date_string="26 Jul 2024").count(tok.bos_token_id) == 2


def test_the_glued_slot_is_not_found_on_a_byte_level_tokenizer(chat_folders):
    """A format with no space before the response on Llama 3's byte-level BPE keeps each word as its own id ('Love'
    is one id glued or not: no ▁ pieces), so the split is the ordinary one, not "glued" (whole responses; a sweep
    then fails its verification where BPE merges the colon with a word, e.g. ':k' in 'ASSISTANT:kemiz')."""
    from transformers import AutoTokenizer

    from probe.core.template import split_template

    tok = AutoTokenizer.from_pretrained(chat_folders["llama3"])
    tok.chat_template = chat_template_text("beaver-card")
    split = split_template(tok, response_conversation(PROMPT), n_verify=0, own_tokens=False)
    assert split.leading_space not in ("glued", "joined")


# the registry's other sizes and versions of a family tested above: the same card, so the same input convention
SIBLINGS = {
    "Skywork/Skywork-Reward-V2-Llama-3.1-8B": ["Skywork/Skywork-Reward-V2-Llama-3.1-8B-40M",
                                               "Skywork/Skywork-Reward-V2-Llama-3.2-3B"],
    "Skywork/Skywork-Reward-V2-Qwen3-8B": ["Skywork/Skywork-Reward-V2-Qwen3-4B", "Skywork/Skywork-Reward-V2-Qwen3-1.7B",
                                           "Skywork/Skywork-Reward-V2-Qwen3-0.6B"],
    "Ray2333/GRM-llama3-8B-sftreg": ["Ray2333/GRM-llama3-8B-distill", "Ray2333/GRM-llama3.2-3B-sftreg",
                                     "Ray2333/GRM-Gemma-2B-sftreg"],
    "PKU-Alignment/beaver-7b-v1.0-reward": ["PKU-Alignment/beaver-7b-v2.0-reward"],
    "InternLM2ForRewardModel": ["internlm/internlm2-7b-reward", "internlm/internlm2-1_8b-reward",
                                "internlm/internlm2-20b-reward"],
    "nicolinho/QRM-Llama3.1-8B": ["LlamaForRewardModelWithGating3"],
    "DebertaV2PairRM": ["llm-blender/PairRM-hf"],
    "OpenAssistant/reward-model-deberta-v3-large-v2": ["OpenAssistant/reward-model-deberta-v3-large",
                                                       "OpenAssistant/reward-model-deberta-v3-base",
                                                       "OpenAssistant/reward-model-electra-large-discriminator"],
}


@pytest.mark.parametrize("tested", list(SIBLINGS))
def test_every_registry_size_and_version_reads_its_tested_siblings_input(tested):
    """Each registry entry not tested on its own card above is a size or version of one that is: its input is that
    one's (template, call, EOS, cut, RewardBench's pipeline and format); its source names the same card."""
    def convention(s):
        return (s.chat_template, s.rewardbench_chat_template, s.input_call, s.input_eos, s.input_ends_at,
                s.rewardbench_pipeline, s.append_token)

    for name in SIBLINGS[tested]:
        assert convention(REGISTRY[name]) == convention(REGISTRY[tested]), name
        if name != "LlamaForRewardModelWithGating3":  # a class found by architecture names no card of its own
            assert REGISTRY[name].input_source == REGISTRY[tested].input_source, name
