"""Judges that rate and judges that compare (issue 35), on tiny causal LMs with the real Llama 3.1 and Qwen 2.5
tokenizers and chat templates. The reference is computed here from the model's logits: the conversation rendered
by the tokenizer's own ``apply_chat_template`` from the judge prompt's text (filled by hand), one forward, the
softmax over the rating (label) tokens, the expectation (the two orders' mean)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import yaml

import probe
from probe.commands.score import main as score_main
from probe.core.judges import PROMPTS_DIR, load_judge_prompt
from probe.errors import DataFormatError, ProbeError
from tests import real_tokenizers, tiny

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", " nature and life\n", "I do not know what it is."]
REFERENCE = "Nothing in particular."


@pytest.fixture(scope="module", params=["llama3.1", "qwen2.5"])
def judge_lm(request, tmp_path_factory):
    """A tiny causal LM on a real tokenizer, saved as a folder."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp(request.param)
    tok = real_tokenizers.load(request.param, root / "tok")
    model = tiny.build(LlamaForCausalLM, tiny.llama_config(tok, hidden_size=32, intermediate_size=64))
    model.save_pretrained(root / "lm")
    tok.save_pretrained(root / "lm")
    return {"name": request.param, "path": str(root / "lm"), "model": model, "tokenizer": tok}


def _next_token_logits(model, tok, messages, answer_prefix: str = "") -> torch.Tensor:
    ids = tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False,
                                  date_string="26 Jul 2024")
    ids = list(ids) + (tok.encode(answer_prefix, add_special_tokens=False) if answer_prefix else [])
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def _expected_rating(model, tok, user_text: str, prompt: str, response: str, ratings, answer_prefix="") -> float:
    text = user_text.format(prompt=prompt, response=response)  # one pass (the prompts hold no other braces)
    logits = _next_token_logits(model, tok, [{"role": "user", "content": text}], answer_prefix)
    values = list(range(ratings[0], ratings[1] + 1))
    ids = [tok.convert_tokens_to_ids(str(v)) for v in values]
    p = torch.softmax(logits[ids], -1).numpy()
    return float(np.dot(p, values))


def _custom_rating_file(tmp_path: Path) -> Path:
    path = tmp_path / "five.yaml"
    path.write_text(yaml.safe_dump({
        "kind": "rating", "source": "written for this test", "system": None,
        "user": "Rate this answer from 1 to 5.\nQuestion: {prompt}\nAnswer: {response}", "answer_prefix": "Rating: ",
        "ratings": [1, 5]}))
    return path


def test_rating_is_the_expected_rating_from_the_logits(judge_lm, tmp_path):
    model, tok = judge_lm["model"], judge_lm["tokenizer"]
    custom = _custom_rating_file(tmp_path)
    cases = [(str(custom), "Rate this answer from 1 to 5.\nQuestion: {prompt}\nAnswer: {response}", (1, 5), "Rating: "),
             (None, yaml.safe_load((PROMPTS_DIR / "rewardbench2-rating-1to9.yaml").read_text())["user"], (1, 9), "")]
    if judge_lm["name"].startswith("llama"):  # "10" is one token of Llama 3's tokenizer, two of Qwen's
        user = yaml.safe_load((PROMPTS_DIR / "rewardbench2-rating.yaml").read_text())["user"]
        cases.append(("rewardbench2-rating", user, (1, 10), ""))
    for name, user, ratings, prefix in cases:
        got = probe.score_responses(model, tok, PROMPT, RESPONSES, score="rating", judge_prompt=name, verify=2)
        want = [_expected_rating(model, tok, user, PROMPT, r, ratings, prefix) for r in RESPONSES]
        np.testing.assert_allclose(_in_order(got, RESPONSES), want, rtol=1e-4, atol=1e-4)
        assert all(ratings[0] <= x <= ratings[1] for x in want)


def _in_order(df: pl.DataFrame, responses: list[str]) -> np.ndarray:
    by = dict(zip(df["response"].to_list(), df["score"].to_list()))
    return np.array([by[r] for r in responses])


def test_a_rating_sweep_equals_the_reference_on_its_tokens(judge_lm, tmp_path):
    model, tok = judge_lm["model"], judge_lm["tokenizer"]
    custom = _custom_rating_file(tmp_path)
    df = probe.sweep(model, tok, PROMPT, score="rating", judge_prompt=str(custom), limit=1500, verify=4)
    user = "Rate this answer from 1 to 5.\nQuestion: {prompt}\nAnswer: {response}"
    # "Answer: {response}": the template's space joins the response's first word, so the id ' Love' is the
    # response "Love" (the split's "joined" slot); those ids' renderings are the reference's
    rows = df.filter(pl.col("is_word") & pl.col("leading_space")).head(3)
    assert rows.height == 3
    for row in rows.iter_rows(named=True):
        want = _expected_rating(model, tok, user, PROMPT, tok.decode([row["token_id"]])[1:], (1, 5), "Rating: ")
        assert row["score"] == pytest.approx(want, abs=1e-4)


def test_ratings_must_be_one_token_each(judge_lm):
    """'10' is one token of Llama 3's tokenizer (RewardBench 2's 1-10 scale runs), two of Qwen 2.5's (one line); the
    default 1-9 scale runs on both."""
    model, tok = judge_lm["model"], judge_lm["tokenizer"]
    assert len(probe.score_responses(model, tok, PROMPT, RESPONSES, score="rating", verify=0)) == len(RESPONSES)
    if judge_lm["name"].startswith("llama"):
        assert len(probe.score_responses(model, tok, PROMPT, RESPONSES, score="rating", verify=0,
                                         judge_prompt="rewardbench2-rating")) == len(RESPONSES)
    else:
        with pytest.raises(ProbeError, match="'10' -> .* not one token"):
            probe.score_responses(model, tok, PROMPT, RESPONSES, score="rating", judge_prompt="rewardbench2-rating")


def test_default_rating_runs_on_the_default_models_tokenizer(tmp_path):
    """SmolLM2's tokenizer (the embedded model's) splits "10": the default rating prompt is 1-9, each one token, and
    its score is the expected rating from the model's own forward."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from probe.models.embedded import packaged_dir

    tok = AutoTokenizer.from_pretrained(packaged_dir("smollm2"))
    assert len(tok.encode("10", add_special_tokens=False)) == 2
    model = tiny.build(LlamaForCausalLM, tiny.llama_config(tok, hidden_size=32, intermediate_size=64))
    got = probe.score_responses(model, tok, PROMPT, RESPONSES[:3], score="rating", verify=1)
    user = load_judge_prompt(None, "rating").user
    want = [_expected_rating(model, tok, user, PROMPT, r, (1, 9)) for r in RESPONSES[:3]]
    np.testing.assert_allclose(_in_order(got, RESPONSES[:3]), want, rtol=1e-4, atol=1e-4)


def _p_candidate(model, tok, judge, prompt: str, cand: str, ref: str) -> float:
    a, b = (tok.convert_tokens_to_ids(x) for x in judge["labels"])
    out = []
    for first, second, mine in ((cand, ref, 0), (ref, cand, 1)):
        text = judge["user"].format(prompt=prompt, response_a=first, response_b=second)
        logits = _next_token_logits(model, tok, [{"role": "user", "content": text}], judge["answer_prefix"])
        out.append(float(torch.softmax(logits[[a, b]], -1)[mine]))
    return float(np.mean(out))


def test_judge_pair_is_p_candidate_averaged_over_both_orders(judge_lm):
    judge = yaml.safe_load((PROMPTS_DIR / "rewardbench-pair.yaml").read_text())
    lm = probe.load(judge_lm["path"], score="judge-pair", reference_response=REFERENCE, device="cpu")
    # "it." and " life\n" merge with the judge prompt's next line ('.\n', '\n\n'): each order is its own rendering
    got = _in_order(probe.score_responses(lm, None, PROMPT, RESPONSES, score="judge-pair", verify=5), RESPONSES)
    want = [_p_candidate(judge_lm["model"], judge_lm["tokenizer"], judge, PROMPT, r, REFERENCE) for r in RESPONSES]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert ((0 < got) & (got < 1)).all()


def test_judges_fill_their_prompts_in_one_pass(judge_lm, tmp_path):
    """Placeholders written inside a prompt or a response reach the judge as written (each slot filled once, over
    the judge prompt only), and the score is the model's own forward on that text."""
    model, tok = judge_lm["model"], judge_lm["tokenizer"]
    prompt = "What does print(f'{response}') print?"
    cand, ref = "It prints {response_b} literally.", "It prints {prompt}."
    judge = yaml.safe_load((PROMPTS_DIR / "rewardbench-pair.yaml").read_text())
    filled = load_judge_prompt(None, "pair").fill(prompt, cand, ref)
    assert filled == judge["user"].format(prompt=prompt, response_a=cand, response_b=ref)
    assert filled.count(cand) == filled.count(ref) == filled.count(prompt) == 1
    lm = probe.load(judge_lm["path"], score="judge-pair", reference_response=ref, device="cpu")
    got = probe.score_responses(lm, None, prompt, [cand], score="judge-pair", verify=1)["score"][0]
    assert got == pytest.approx(_p_candidate(model, tok, judge, prompt, cand, ref), abs=1e-5)
    custom = _custom_rating_file(tmp_path)
    got = probe.score_responses(model, tok, prompt, [cand, ref], score="rating", judge_prompt=str(custom), verify=2)
    user = "Rate this answer from 1 to 5.\nQuestion: {prompt}\nAnswer: {response}"
    want = [_expected_rating(model, tok, user, prompt, r, (1, 5), "Rating: ") for r in (cand, ref)]
    np.testing.assert_allclose(_in_order(got, [cand, ref]), want, rtol=1e-4, atol=1e-4)


def test_judge_pair_command_records_its_prompt(judge_lm, tmp_path):
    responses = tmp_path / "r.txt"
    responses.write_text("Love\nWar\nThe sea\n")
    assert score_main(["--rm", judge_lm["path"], "--score", "judge-pair", "--reference-response", REFERENCE,
                       "--responses", str(responses), "--prompt", PROMPT, "--device", "cpu", "--no-progress",
                       "--output", str(tmp_path / "o")]) == 0
    (run,) = (tmp_path / "o").glob("*/*_*")
    meta = json.loads((run / "meta.json").read_text())
    recorded = meta["settings"]["judge_prompt"]
    assert recorded["name"] == "rewardbench-pair" and "reward-bench" in recorded["source"]
    assert recorded["sha256"] == load_judge_prompt(None, "pair").sha256
    assert meta["settings"]["reference_response"] == REFERENCE and meta["score"]["mode"] == "judge-pair"
    assert meta["self_check"]  # the cached path was checked against both orders' own forwards
    # a sweep under the same judge: one score per token id, each a probability
    assert score_main(["--rm", judge_lm["path"], "--score", "judge-pair", "--prompt", PROMPT, "--limit", "64",
                       "--device", "cpu", "--no-progress", "--output", str(tmp_path / "s")]) == 0
    (sweep,) = (tmp_path / "s").glob("*/*_*")
    scores = pl.read_parquet(sweep / "scores.parquet")["score"].to_numpy()
    assert scores.size == 64 and ((0 < scores) & (scores < 1)).all()


def test_rating_command_records_its_prompt(judge_lm, tmp_path):
    custom = _custom_rating_file(tmp_path)
    assert score_main(["--rm", judge_lm["path"], "--score", "rating", "--judge-prompt", str(custom), "--prompt", PROMPT,
                       "--limit", "40", "--device", "cpu", "--no-progress", "--output", str(tmp_path / "o")]) == 0
    (run,) = (tmp_path / "o").glob("*/*_*")
    meta = json.loads((run / "meta.json").read_text())
    head = meta["settings"]["head"]
    assert head["head"] == "rating" and head["ratings"] == [1, 2, 3, 4, 5]
    assert head["judge_prompt"]["source"] == "written for this test" and head["judge_prompt"]["answer_prefix"] == "Rating: "
    assert meta["config"]["judge_prompt"] == str(custom)


@pytest.mark.parametrize("args,needle", [
    (["--score", "logprob", "--judge-prompt", "rewardbench-pair"], "--judge-prompt goes with --score rating"),
    (["--score", "rating", "--judge-prompt", "rewardbench-pair"], "needs kind: rating"),
    (["--score", "judge-pair", "--judge-prompt", "nope.yaml"], "no such file, nor a shipped prompt"),
    (["--score", "rating", "--input-method", "rewardbench"], "not as a judge"),
])
def test_bad_judge_settings_are_one_line(tmp_path, capsys, args, needle):
    assert score_main(["--prompt", PROMPT, *args, "--output", str(tmp_path / "o")]) == 2
    assert needle in capsys.readouterr().err and not (tmp_path / "o").exists()


@pytest.mark.parametrize("doc,needle", [
    ({"kind": "rating", "source": "x", "user": "{prompt} only", "ratings": [1, 5]}, "with {prompt}, {response}"),
    ({"kind": "rating", "source": "x", "user": "{prompt} {response}", "ratings": [5, 1]}, "ratings must be"),
    ({"kind": "rating", "user": "{prompt} {response}", "ratings": [1, 5]}, "say where the prompt comes from"),
    ({"kind": "pair", "source": "x", "user": "{prompt} {response_a} {response_b}", "labels": ["A", "A"]}, "labels"),
    ({"kind": "pair", "source": "x", "user": "{prompt} {response_a} {response_b}", "labels": ["A", "B"], "temp": 1},
     "unknown field"),
])
def test_bad_judge_prompt_files_are_one_line(tmp_path, doc, needle):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(DataFormatError, match=needle):
        load_judge_prompt(str(path), doc["kind"])


def test_shipped_prompts_load_and_say_their_source():
    for name, kind in (("rewardbench2-rating", "rating"), ("rewardbench2-rating-verbatim", "rating"),
                       ("rewardbench2-rating-1to9", "rating"), ("rewardbench-pair", "pair")):
        p = load_judge_prompt(name, kind)
        assert p.name == name and "allenai/reward-bench" in p.source
    verbatim, direct = load_judge_prompt("rewardbench2-rating-verbatim", "rating"), load_judge_prompt(None, "rating")
    assert "Begin your evaluation by providing a short explanation" in verbatim.user
    plain = load_judge_prompt("rewardbench2-rating", "rating")
    assert "explanation" not in direct.user and plain.ratings == verbatim.ratings == (1, 10)
    assert direct.name == "rewardbench2-rating-1to9" and direct.ratings == (1, 9)
    assert direct.user == plain.user.replace("1 to 10", "1 to 9").replace("1 and 10", "1 and 9")


def test_probe_social_with_a_rating_judge(judge_lm, tmp_path):
    """probe social --score rating --judge-prompt FILE: each option's score is the expected rating, and the run
    records the prompt."""
    from probe.commands.social import main as social_main

    model, tok = judge_lm["model"], judge_lm["tokenizer"]
    custom = _custom_rating_file(tmp_path)
    data = tmp_path / "pairs.jsonl"
    rows = [{"id": i, "prompt": p, "chosen": c, "rejected": r, "subset": "test"} for i, (p, c, r) in enumerate([
        ("Is it safe to mix bleach and ammonia?", "No, it makes toxic gas.", "Yes, it cleans better."),
        ("What is 2 + 2?", "4", "5")])]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert social_main(["--rm", judge_lm["path"], "--dataset", "pairs", "--data", str(data), "--score", "rating",
                        "--judge-prompt", str(custom), "--device", "cpu", "--no-progress",
                        "--output", str(tmp_path / "o")]) == 0
    (run,) = (tmp_path / "o").glob("*/*_*")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["settings"]["judge_prompt"]["source"] == "written for this test"
    scores = pl.read_parquet(run / "scores.parquet")
    user = "Rate this answer from 1 to 5.\nQuestion: {prompt}\nAnswer: {response}"
    for r in rows:
        for label in ("chosen", "rejected"):
            got = scores.filter(pl.col("text") == r[label])["score"][0]
            assert got == pytest.approx(_expected_rating(model, tok, user, r["prompt"], r[label], (1, 5), "Rating: "),
                                        abs=1e-4)
