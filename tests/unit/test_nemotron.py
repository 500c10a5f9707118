"""NVIDIA's Nemotron reward models (issue 54), read as their model cards read them: a LlamaForCausalLM whose reward is
the next-token logit of vocabulary id 0 after the conversation. The cards' code (nvidia/Llama-3.1-Nemotron-70B-Reward-HF
and nvidia/Llama-3.3-Nemotron-70B-Reward, as their users copy it):

    tokenized_message = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=False,
                                                      return_tensors="pt", return_dict=True)
    response_token_ids = model.generate(tokenized_message['input_ids'], attention_mask=tokenized_message[
        'attention_mask'], max_new_tokens=1, return_dict_in_generate=True, output_scores=True)
    reward = response_token_ids['scores'][0][0][0].item()

and, for nvidia/Llama-3.3-Nemotron-70B-Reward-Principle (its card's README as a public repository copies it), a
principle asked after the response and the 'Yes' logit minus the 'No' logit:

    principle_question = f"Evaluate the response to the previous prompt in terms of whether it satisfies this principle:
                           {principle}. Only answer Yes or No."
    messages = [user: prompt, assistant: response, user: principle_question]
    tokenized_message = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, ...)
    ... generate as above; reward = scores[0][0][9642] - scores[0][0][2822]

run here on tiny models of the published config (shrunk) and the real Llama 3.1 tokenizer, against `probe.load` +
`probe.score_responses`, `probe.sweep` and `probe social`."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

import probe
from probe.models.registry import REGISTRY, lookup
from tests import real_tokenizers, tiny

PROMPT = "How many r in strawberry?"
RESPONSES = ["There are 3 r's in strawberry.", "There are 2 r's in strawberry.", "Love", " leading space",
             "café au lait", "line\nbreak"]
XSTEST = "xstest/xstest_v2_completions_gpt4.csv"
# id -> tokenizer folder: Llama 3.1's template as Meta ships it (the -HF card's base), and the same template without
# its BOS, which is how a secondary source (a user's loader checked against the 3.3 card, 2026-09-26) describes
# nvidia/Llama-3.3-Nemotron-70B-Reward's ("no BOS: its template has none"); the checkpoint's own template is read
# either way, so both must give the card's ids
CASES = {"nvidia/Llama-3.1-Nemotron-70B-Reward-HF": "llama3.1",
         "nvidia/Llama-3.3-Nemotron-70B-Reward": "llama3.1-nobos"}
PRINCIPLE = "nvidia/Llama-3.3-Nemotron-70B-Reward-Principle"  # on Llama 3.1's template as Meta ships it


def _nemotron_config(tok):
    """nvidia/Llama-3.1-Nemotron-70B-Reward-HF's config.json (Llama-3.1-70B's: 64 heads over 8 KV heads, llama3 rope
    scaling, untied LM head, no pad id), shrunk: 2 layers, width 64, 8 heads over 1 KV head."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=224, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=1, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        bos_token_id=128000, eos_token_id=[128001, 128008, 128009], pad_token_id=None,
        architectures=["LlamaForCausalLM"])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """id -> a folder named as the Hub names the checkpoint (``.../nvidia/<name>``), so the registry finds it by path."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from probe.models.chat_templates import chat_template_text

    root = tmp_path_factory.mktemp("nemotron")
    out = {}
    for name, fam in {**CASES, PRINCIPLE: "llama3.1"}.items():
        folder = real_tokenizers.build("llama3.1", root / "tok" / fam)
        if fam.endswith("-nobos"):
            cfg = folder / "tokenizer_config.json"
            data = json.loads(cfg.read_text())
            data["chat_template"] = chat_template_text("llama3.1").replace("{{- bos_token }}", "", 1)
            assert data["chat_template"] != chat_template_text("llama3.1")
            cfg.write_text(json.dumps(data))
        tok = AutoTokenizer.from_pretrained(folder)
        model = tiny.build(LlamaForCausalLM, _nemotron_config(tok))
        torch.manual_seed(2)
        with torch.no_grad():  # random init leaves the LM head near 0: spread it so that rewards differ visibly
            model.lm_head.weight.normal_(0, 1.0)
        dest = root / name
        model.save_pretrained(dest)
        tok.save_pretrained(dest)
        out[name] = dest
    return out


def card_reward(model, tok, prompt: str, response: str) -> float:
    """The model card's code, as written there."""
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    tokenized_message = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=False,
                                                return_tensors="pt", return_dict=True)
    response_token_ids = model.generate(tokenized_message["input_ids"],
                                        attention_mask=tokenized_message["attention_mask"], max_new_tokens=1,
                                        return_dict_in_generate=True, output_scores=True, pad_token_id=128009)
    return response_token_ids["scores"][0][0][0].item()


def card_principle_reward(model, tok, prompt: str, response: str, principle: str) -> float:
    """The principle model's card code, as written there."""
    principle_question = (f"Evaluate the response to the previous prompt in terms of whether it satisfies this "
                          f"principle: {principle}. Only answer Yes or No.")
    messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response},
                {"role": "user", "content": principle_question}]
    tokenized_message = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)
    response_token_ids = model.generate(tokenized_message["input_ids"],
                                        attention_mask=tokenized_message["attention_mask"], max_new_tokens=1,
                                        return_dict_in_generate=True, output_scores=True, pad_token_id=128009)
    score_no = response_token_ids["scores"][0][0][2822].item()
    score_yes = response_token_ids["scores"][0][0][9642].item()
    return score_yes - score_no


def _card_model(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(folder)


@pytest.mark.parametrize("name", list(CASES))
def test_every_nemotron_id_resolves_to_the_logit_reader(name):
    """Old code: no entry, the default linear head (a sequence classifier's random ``score`` on a causal LM)."""
    for ref in (name, f"/models/{name}", name + "-Multilingual" if name.endswith("70B-Reward") else name):
        spec, how = lookup(ref)
        assert how != "default" and spec.reader == "logit" and spec.label_index == 0, ref
        assert "apply_chat_template" in spec.input_source and "['scores'][0][0][0]" in spec.input_source


def test_the_principle_model_resolves_to_its_yes_minus_no_reader():
    spec, how = lookup(f"/models/{PRINCIPLE}")
    assert how != "default" and spec.reader == "logit" and (spec.label_index, spec.logit_minus) == (9642, 2822)
    assert spec.principle == "correctness" and "{principle}" in spec.principle_question


@pytest.mark.parametrize("principle", [None, "conciseness"])
def test_principle_scores_and_sweep_equal_the_cards_generate(folders, principle):
    """Whole responses and a sweep's rows equal the card's Yes-minus-No score, with the card's principle
    ('correctness') by default and with another one given; the two principles give other scores."""
    tok_ids = _card_model(folders[PRINCIPLE])[1].convert_ids_to_tokens([9642, 2822])
    assert tok_ids == ["Yes", "No"]  # the card's hard-coded ids, in Llama 3's vocabulary
    lm = probe.load(str(folders[PRINCIPLE]), device="cpu", principle=principle)
    used = principle or "correctness"
    assert lm.principle == used
    model, tok = _card_model(folders[PRINCIPLE])
    want = [card_principle_reward(model, tok, PROMPT, r, used) for r in RESPONSES]
    got = dict(probe.score_responses(lm, None, PROMPT, RESPONSES).select("response", "score").iter_rows())
    assert [got[r] for r in RESPONSES] == pytest.approx(want, **tiny.F32_FORWARD)
    other = [card_principle_reward(model, tok, PROMPT, r, "correctness" if principle else "conciseness")
             for r in RESPONSES]
    assert max(abs(a - b) for a, b in zip(want, other)) > 1e-3  # the principle is part of the score
    sweep = probe.sweep(lm, None, PROMPT, limit=48, batch_size=16)  # self-checked against the model's forward
    rows = sweep.filter(pl.col("roundtrips") & ~pl.col("is_special")
                        & (pl.col("decoded").str.strip_chars() == pl.col("decoded"))).head(8)
    assert rows.height >= 6
    want = [card_principle_reward(model, tok, PROMPT, text, used) for text in rows["decoded"].to_list()]
    assert rows["score"].to_list() == pytest.approx(want, **tiny.F32_FORWARD)


def test_a_principle_for_a_model_that_takes_none_is_one_line(folders, tmp_path, capsys):
    from probe.commands.score import main
    from probe.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="--principle: .* takes no principle"):
        probe.load(str(folders["nvidia/Llama-3.1-Nemotron-70B-Reward-HF"]), device="cpu", principle="honesty")
    with pytest.raises(ValueError, match="--principle is empty"):
        probe.load(str(folders[PRINCIPLE]), device="cpu", principle=" ")
    with pytest.raises(ModelLoadError, match="--input-method rewardbench: RewardBench 0.1.4 has no pipeline"):
        probe.load(str(folders[PRINCIPLE]), device="cpu", input_method="rewardbench")
    responses = tmp_path / "r.txt"
    responses.write_text("Love\n")
    code = main(["--rm", str(folders["nvidia/Llama-3.1-Nemotron-70B-Reward-HF"]), "--prompt", PROMPT, "--responses",
                 str(responses), "--principle", "honesty", "--device", "cpu", "--output", str(tmp_path / "out")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "takes no principle" in err[0]


@pytest.mark.parametrize("name", list(CASES))
def test_scores_and_sweep_equal_the_cards_generate(folders, name):
    """Whole responses through probe.load + score_responses, and a sweep's rows, equal the card's generate(...)
    scores[0][0][0] on the same tiny model; the sweep's own self-check compares with the model's forward."""
    lm = probe.load(str(folders[name]), device="cpu")
    assert lm.spec.name == name and lm.spec.reader == "logit" and lm.kind == "reward"
    model, tok = _card_model(folders[name])
    want = [card_reward(model, tok, PROMPT, r) for r in RESPONSES]
    got = dict(probe.score_responses(lm, None, PROMPT, RESPONSES).select("response", "score").iter_rows())
    assert [got[r] for r in RESPONSES] == pytest.approx(want, **tiny.F32_FORWARD)
    assert np.ptp(want) > 1e-2
    sweep = probe.sweep(lm, None, PROMPT, limit=64, batch_size=16)  # self-checked against logits[:, -1, 0]
    # tokens whose text the card's call encodes back to the same one id (the template trims content: no outer space)
    rows = sweep.filter(pl.col("roundtrips") & ~pl.col("is_special")
                        & (pl.col("decoded").str.strip_chars() == pl.col("decoded"))).head(12)
    assert rows.height >= 8
    want = [card_reward(model, tok, PROMPT, text) for text in rows["decoded"].to_list()]
    assert rows["score"].to_list() == pytest.approx(want, **tiny.F32_FORWARD)


def test_the_reference_path_is_the_models_own_logit_and_a_bad_index_is_refused(folders):
    """The self-check's reference (``own_forward``) is the model's own forward at the card's logit,
    ``logits[:, -1, 0]``; an index past the LM head's rows is one line, not an IndexError."""
    from probe.core.heads import LogitRewardHead
    from probe.errors import ProbeError

    lm = probe.load(str(folders["nvidia/Llama-3.1-Nemotron-70B-Reward-HF"]), device="cpu")
    enc = lm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT},
                                            {"role": "assistant", "content": "Love"}], tokenize=True, return_dict=True)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        own = LogitRewardHead(lm.model, 0).own_forward(lm.model, ids, ids.shape[1] - 1)
        assert own.item() == lm.model(input_ids=ids).logits[0, -1, 0].item()
    with pytest.raises(ProbeError, match="label-index"):
        LogitRewardHead(lm.model, lm.model.config.vocab_size)


def test_social_scores_equal_the_cards_generate(folders, social_data, tmp_path):
    """``probe social`` on a slice of XSTest's published completions: every option's score is the card's reward of
    (prompt, option)."""
    from probe.commands.social import main
    from probe.social.loaders import load

    name = "nvidia/Llama-3.3-Nemotron-70B-Reward"
    data = social_data / XSTEST
    assert main(["--rm", str(folders[name]), "--device", "cpu", "--output", str(tmp_path), "--dataset", "xstest",
                 "--data", str(data), "--limit", "3", "--no-progress"]) == 0
    (run,) = list(tmp_path.glob("*/social_*"))
    meta = json.loads((run / "meta.json").read_text())
    assert name in json.dumps(meta)
    scores = pl.read_parquet(run / "scores.parquet")
    items = {it.item_id: it for it in load("xstest", data)}
    model, tok = _card_model(folders[name])
    assert scores.height >= 4
    for item_id, option, score in scores.select("item_id", "option", "score").iter_rows():
        it = items[item_id]
        assert score == pytest.approx(card_reward(model, tok, it.prompt, it.options[option]), **tiny.F32_FORWARD)


def test_the_principle_is_recorded_in_meta_fingerprint_and_report(folders, tmp_path, capsys):
    """``probe score --responses --principle``: meta.json's model section names the principle and the question asked,
    the run's settings (its fingerprint) hold it, so that two principles are two runs, and the report shows it."""
    from probe.commands.score import main
    from probe.report.audit import judge_rows

    responses = tmp_path / "r.txt"
    responses.write_text("Love\nThere are 3 r's in strawberry.\n")
    metas = {}
    for principle in ("honesty", "brevity"):
        out = tmp_path / principle
        assert main(["--rm", str(folders[PRINCIPLE]), "--prompt", PROMPT, "--responses", str(responses),
                     "--principle", principle, "--device", "cpu", "--output", str(out), "--no-progress"]) == 0
        (meta_file,) = out.glob("*/responses_*/meta.json")
        metas[principle] = json.loads(meta_file.read_text())
    meta = metas["honesty"]
    assert meta["model"]["principle"] == "honesty"
    assert "satisfies this principle: honesty. Only answer Yes or No." in meta["model"]["principle_question"]
    assert meta["settings"]["principle"] == "honesty"
    assert metas["honesty"]["fingerprint"] != metas["brevity"]["fingerprint"]
    printed = capsys.readouterr()
    assert "[reward against the principle 'brevity'" in printed.out + printed.err  # the run's first line
    rows = dict(judge_rows(meta))
    assert rows["principle"].startswith("'honesty': every response is scored against it")


def test_social_with_a_principle_and_its_trace_keep_the_principle(folders, social_data, tmp_path):
    """``probe social --principle``: each option's score is the card's reward under that principle; ``probe trace
    --social`` of the run scores it under the run's principle unasked (not the card's default) and agrees."""
    from probe.commands.social import main
    from probe.commands.trace import main as trace_main
    from probe.social.loaders import load

    data = social_data / XSTEST
    assert main(["--rm", str(folders[PRINCIPLE]), "--principle", "harmlessness", "--device", "cpu", "--output",
                 str(tmp_path / "out"), "--dataset", "xstest", "--data", str(data), "--limit", "2",
                 "--no-progress"]) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    assert json.loads((run / "meta.json").read_text())["model"]["principle"] == "harmlessness"
    items = {it.item_id: it for it in load("xstest", data)}
    model, tok = _card_model(folders[PRINCIPLE])
    scores = pl.read_parquet(run / "scores.parquet")
    for item_id, option, score in scores.select("item_id", "option", "score").head(2).iter_rows():
        it = items[item_id]
        want = card_principle_reward(model, tok, it.prompt, it.options[option], "harmlessness")
        assert score == pytest.approx(want, **tiny.F32_FORWARD)
    assert trace_main(["--social", str(run), "--limit", "1", "--device", "cpu", "--out", str(tmp_path / "t")]) == 0
    traced = json.loads((tmp_path / "t" / "trace.json").read_text())["run_scores"]
    assert traced["n"] >= 1 and traced["equal_within_float32_tolerance"] is True, traced


def test_the_principle_models_trace_asks_the_principle_after_each_cut_response(folders):
    """Each prefix row of a principle model's trace is the card's Yes-minus-No reward of the response cut there, the
    principle asked after it (the cut closes the assistant's turn; the question and the generation prompt follow). Old
    code read the 'Yes' and 'No' logits at the cut response's last token, with no question asked: the model's next
    token of the response, no score of the card's."""
    from probe.core.trace import trace

    lm = probe.load(str(folders[PRINCIPLE]), device="cpu", principle="conciseness")
    model, tok = _card_model(folders[PRINCIPLE])
    text = "Strawberry has three letters r in it."
    df, _ = trace(lm, "reward", PROMPT, [text])
    prefix = df.filter(pl.col("kind") == "prefix")
    ids = prefix["token_id"].to_list()
    checked = 0
    for k in range(1, len(ids) + 1):
        cut = tok.decode(ids[:k])
        if cut != cut.strip() or tok.encode(cut, add_special_tokens=False) != ids[:k]:
            continue  # the card re-encodes the text (the template trims it): compare where it gives these ids
        want = card_principle_reward(model, tok, PROMPT, cut, "conciseness")
        assert prefix["score"][k - 1] == pytest.approx(want, **tiny.F32_FORWARD), (k, cut)
        checked += 1
    assert checked >= 5
    complete = df.filter(pl.col("kind") == "complete")["score"][0]
    assert complete == pytest.approx(card_principle_reward(model, tok, PROMPT, text, "conciseness"),
                                     **tiny.F32_FORWARD)
    assert prefix["score"][-1] == pytest.approx(complete, **tiny.F32_FORWARD)  # the whole response, cut nowhere


def test_the_paper_route_asks_the_principle(folders, tmp_path):
    """``probe score --input-method paper`` on the principle model: each token's row is the paper's decode-render-
    re-tokenize input of the card's conversation, the principle question asked after the response, read as the card
    reads it (Yes minus No at the last position). Old code rendered the paper's texts without the question (the
    conversation built without the model), read after the assistant's end of turn."""
    from probe.commands.score import main

    assert main(["--rm", str(folders[PRINCIPLE]), "--prompt", PROMPT, "--input-method", "paper", "--limit", "24",
                 "--principle", "brevity", "--device", "cpu", "--output", str(tmp_path), "--no-progress"]) == 0
    (scores,) = list(tmp_path.glob("*/*/scores.parquet"))
    df = pl.read_parquet(scores)
    model, tok = _card_model(folders[PRINCIPLE])
    question = REGISTRY[PRINCIPLE].principle_question.replace("{principle}", "brevity")
    for tid, score in df.select("token_id", "score").head(6).iter_rows():
        messages = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": tok.decode([tid])},
                    {"role": "user", "content": question}]
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = torch.tensor([tok(text)["input_ids"]])  # the paper's route: the text through tokenizer(text)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        assert score == pytest.approx(float(logits[9642] - logits[2822]), **tiny.F32_FORWARD), tid
