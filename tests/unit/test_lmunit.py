"""LMUnit (ContextualAI/LMUnit-llama3.1-70b, -qwen2.5-72b): a response rated against a natural-language unit test
(``--unit-test``), equal to the authors' own code (ContextualAI/LMUnit: eval/eval.py's input, vLLM's encoding of the
prompt string, LMUnit.postprocess on the top-20 log-probabilities) run on the same tiny model of each base's
architecture (tests/tiny.py ``lmunit_folder``) on the real tokenizer of its base, through ``probe.load`` +
``probe.score_responses``, a sweep and ``probe social``."""

import json
import math

import numpy as np
import polars as pl
import pytest
import torch

from probe.models.registry import REGISTRY
from tests.tiny import F32_FORWARD

IDS = {"llama3.1": "ContextualAI/LMUnit-llama3.1-70b", "qwen2.5": "ContextualAI/LMUnit-qwen2.5-72b"}
QUERY = "What security checks does HIPAA require when connecting research databases?"
RESPONSES = ["Encrypt data at rest and in transit; log every access.", "Yes.", "I don't know", "  spaced  "]
# lmunit/constants.py, as the package writes them
UNIT_TEST_PROMPT = "Query: {query}\n\nResponse: {response}\n\nUnit Test: {natural_unit_test}"
DEFAULT_UNIT_TEST = "Is the response helpful?"
DEFAULT_SYSTEM_PROMPT = "rationale=No"
OTHER_TEST = "Does the response specify minimum system logs required for compliance?"


# lmunit/lmunit.py (LMUnit's scoring methods), as the package writes them, without its logger
DIGIT_TOKENS = ["0", "1", "2", "3", "4", "5", "6"]
DIGIT_VALUES = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def score_from_top_logprobs(top_logprobs_dicts, digit_tokens, digit_values):
    total_prob = 0.0
    weighted_sum = 0.0
    for digit_tok, digit_val in zip(digit_tokens, digit_values):
        if digit_tok in top_logprobs_dicts:
            p = math.exp(top_logprobs_dicts[digit_tok])
            weighted_sum += p * digit_val
            total_prob += p
    return weighted_sum / total_prob if total_prob > 0 else 0.0


def _find_score_position(tokens):
    score_positions = [i + 3 for i in range(len(tokens) - 1) if tokens[i] == "score" and tokens[i + 1] == '":']
    return score_positions[0] if score_positions else None


def postprocess(data):
    output_text = data["content"]
    score_pos = _find_score_position(data["tokens"])
    if score_pos is None:
        return {"output_text": "Error: No score position found in output", "score": 0}
    score_token = (str(int(float(data["tokens"][score_pos]))) if isinstance(data["tokens"][score_pos], float)
                   else str(data["tokens"][score_pos]))
    if score_token.strip() not in DIGIT_TOKENS:
        return {"output_text": "Error: Invalid score token", "score": 0}
    top_logprobs_dicts = {str(int(token)) if isinstance(token, float) else str(token): logprob
                          for token, logprob in zip(data["tokens_logprobs"][score_pos], data["top_logprobs"][score_pos])}
    score_val = score_from_top_logprobs(top_logprobs_dicts, DIGIT_TOKENS, DIGIT_VALUES)
    return {"output_text": output_text, "score": score_val}


def prepare(tokenizer, query, response, unit_test=DEFAULT_UNIT_TEST):  # eval/eval.py's process_sample
    message = [{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
               {"role": "user", "content": UNIT_TEST_PROMPT.format(query=query, response=response,
                                                                   natural_unit_test=unit_test)}]
    return tokenizer.apply_chat_template(message, tokenize=False, add_generation_prompt=True)


def card_score(model, tokenizer, prompt_text, logprobs=20, ids=None):
    """LMUnit.generate + postprocess on vLLM's outputs, emulated with the model's own forward: vLLM encodes the
    prompt string with the tokenizer's special tokens; greedy decoding (temperature 0) returns, per generated token,
    the ``logprobs`` most likely tokens' log-probabilities (decoded). A random tiny model does not write LMUnit's
    output, so its start ``{"score": `` is teacher-forced (what a trained LMUnit writes under rationale=No); the
    token after it is the model's greedy one. ``ids``: the prompt's ids instead of ``prompt_text``'s (a sweep's row,
    which no text gives)."""
    ids = tokenizer.encode(prompt_text) if ids is None else list(ids)
    forced = tokenizer.encode('{"score": ', add_special_tokens=False)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + forced])).logits[0, len(ids) - 1:].float()
    logp = torch.log_softmax(logits, -1)
    out = forced + [int(logits[-1].argmax())]
    top = [logp[i].topk(logprobs) for i in range(len(out))]
    data = {"content": tokenizer.decode(out), "tokens": [tokenizer.decode(t) for t in out],
            "tokens_logprobs": [[tokenizer.decode([int(t)]) for t in k.indices] for k in top],
            "top_logprobs": [k.values.tolist() for k in top]}
    return postprocess(data)["score"]


@pytest.fixture(scope="module", params=list(IDS))
def family(request, tmp_path_factory):
    """(family, folder named as the Hub id's last part, the card's model and tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests import tiny

    name = request.param
    folder = tiny.lmunit_folder(tmp_path_factory.mktemp(name) / IDS[name].split("/")[1], name)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return name, folder, model, AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def lm(family):
    import probe

    return probe.load(str(family[1]), device="cpu")


def test_every_lmunit_id_is_read_as_its_unit_test_judge(family, lm):
    """Both ids: a rating judge under LMUnit's prompt by default (--score auto), its input call vLLM's; before, the
    default sequence-classification head (a checkpoint without one: refused)."""
    from probe.config import resolve_score_mode
    from probe.core.heads import RatingHead
    from probe.core.scoring import make_head

    for name in IDS.values():
        spec = REGISTRY[name]
        assert (spec.judge_prompt, spec.input_call) == ("lmunit", "tokenizer(text)"), name
        assert resolve_score_mode("auto", name) == "rating"
    assert lm.kind == "causal" and lm.spec.name == IDS[family[0]]
    head = make_head(lm, "rating", _opts())
    assert isinstance(head, RatingHead) and head.top_k == 20 and head.values.tolist() == DIGIT_VALUES


def _opts(unit_test=None, judge_prompt=None):
    from probe.config import ScoreVocabConfig

    return ScoreVocabConfig(rm="ContextualAI/LMUnit-qwen2.5-72b", unit_test=unit_test,
                            judge_prompt=judge_prompt).scoring_options()


@pytest.mark.parametrize("unit_test", [None, OTHER_TEST])
def test_score_responses_equal_lmunits_code(family, lm, unit_test):
    """Each response's score equals LMUnit's, the default unit test and another (--unit-test); the ids are vLLM's
    (Llama 3.1: the template's BOS and the tokenizer's, two) then the output's start."""
    import probe
    from probe.core.scoring import conversation

    _, _, model, tok = family
    test = unit_test or DEFAULT_UNIT_TEST
    build = conversation("rating", QUERY, None, _opts(unit_test), lm)
    for r in RESPONSES:
        want = tok.encode(prepare(tok, QUERY, r, test)) + tok.encode('{"score": ', add_special_tokens=False)
        assert build.render_ids(lm.tokenizer, r) == want, r
    got = probe.score_responses(lm, None, QUERY, RESPONSES, unit_test=unit_test)
    scores = dict(zip(got["response"].to_list(), got["score"].to_list()))
    for r in RESPONSES:
        assert scores[r] == pytest.approx(card_score(model, tok, prepare(tok, QUERY, r, test)), **F32_FORWARD), r
    assert len({round(v, 5) for v in scores.values()}) > 1 and 0 < min(scores.values())  # a real comparison


def test_the_unit_test_changes_the_score_and_is_recorded(family, lm, tmp_path):
    """A run with --unit-test records it (meta.json's score settings, hence the resume fingerprint, and the report)
    and scores otherwise; the default is recorded too."""
    from probe.commands.score import main

    runs = {}
    for label, extra in (("default", []), ("other", ["--unit-test", OTHER_TEST])):
        out = tmp_path / label
        assert main(["--rm", str(family[1]), "--prompt", QUERY, "--limit", "16", "--device", "cpu", "--output",
                     str(out), "--no-progress", *extra]) == 0
        (run,) = list(out.glob("*/*/meta.json"))
        runs[label] = json.loads(run.read_text()), pl.read_parquet(run.parent / "scores.parquet")
    (meta, scores), (meta2, scores2) = runs["default"], runs["other"]
    assert json.dumps(meta).count(DEFAULT_UNIT_TEST) >= 1 and OTHER_TEST in json.dumps(meta2)
    assert meta["fingerprint"] != meta2["fingerprint"]
    assert np.abs(scores.sort("token_id")["score"].to_numpy() - scores2.sort("token_id")["score"].to_numpy()).max() > 0
    from probe.report.audit import judge_rows

    assert ("unit test" in dict(judge_rows(meta2))) and OTHER_TEST in dict(judge_rows(meta2))["unit test"]


def test_sweep_equals_lmunits_code_on_each_token(family, lm):
    """A sweep of the first ids: each token's score equals LMUnit's reading of the model on the sweep's row (the
    token's id in the response's place: most of these, punctuation after 'Response: ', are rows no text gives, so
    the rows' ids are handed to LMUnit's scoring; the text-to-ids part is the test above's)."""
    import probe
    from probe.core.scoring import prompt_split

    _, _, model, tok = family
    df = probe.sweep(lm, None, QUERY, limit=40)
    split = prompt_split(lm, "rating", QUERY, None, _opts(), 40)
    forced = tok.encode('{"score": ', add_special_tokens=False)
    assert list(split.suffix_ids[-len(forced):]) == forced
    want = [card_score(model, tok, None, ids=split.full_ids([t])[:-len(forced)]) for t in df["token_id"].to_list()]
    np.testing.assert_allclose(df["score"].to_numpy(), want, rtol=F32_FORWARD["rel"], atol=F32_FORWARD["abs"])
    assert df["score"].std() > 1e-4


def test_social_command_equals_lmunits_code(family, tmp_path):
    """``probe social`` on a pairs file, with --unit-test: every option's score equals LMUnit's."""
    from probe.commands.social import main

    _, folder, model, tok = family
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": QUERY, "chosen": RESPONSES[0], "rejected": RESPONSES[1]}) + "\n"
                    + json.dumps({"prompt": "Is the sky green?", "chosen": "No, it is blue.", "rejected": "Yes."}) + "\n")
    assert main(["--rm", str(folder), "--device", "cpu", "--dataset", "pairs", "--data", str(data), "--unit-test",
                 OTHER_TEST, "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    scores = pl.read_parquet(run / "scores.parquet")
    want = [card_score(model, tok, prepare(tok, p, t, OTHER_TEST))
            for p, t in zip(scores["prompt"].to_list(), scores["text"].to_list())]
    np.testing.assert_allclose(scores["score"].to_numpy(), want, rtol=F32_FORWARD["rel"], atol=F32_FORWARD["abs"])
    assert OTHER_TEST in (run / "meta.json").read_text()


def test_the_top_k_reading_is_lmunits_postprocess():
    """The reading on hand-made next-token logits, against LMUnit's postprocess on the same top k: digits outside the
    top k do not count; a most likely token that is not a digit gives 0; and with k=3 as with k=20."""
    from probe.core.heads import RatingHead

    vocab = [str(d) for d in range(10)] + [f"w{i}" for i in range(40)]
    gen = torch.Generator().manual_seed(0)
    for k in (3, 20):
        head = RatingHead(torch.nn.Identity(), list(range(7)), list(range(7)))
        head.top_k = k
        logits = torch.randn(64, len(vocab), generator=gen) * 2
        logits[:32, :7] += 2.0  # half the rows: digits likely on top
        got = head._top_k_rating(logits)
        for row, score in zip(logits, got.tolist()):
            logp = torch.log_softmax(row, -1)
            top = logp.topk(k)
            data = {"content": "", "tokens": ["{\"", "score", "\":", " ", vocab[int(row.argmax())]],
                    "tokens_logprobs": [[]] * 4 + [[vocab[int(i)] for i in top.indices]],
                    "top_logprobs": [[]] * 4 + [top.values.tolist()]}
            assert score == pytest.approx(postprocess(data)["score"], rel=1e-5, abs=1e-6)
        assert (got == 0).any() and (got > 0).any()


@pytest.mark.parametrize("rm,extra", [
    ("Qwen/Qwen2.5-Math-PRM-7B", []), ("Skywork/Skywork-Reward-V2-Llama-3.1-8B", []),
    ("ContextualAI/LMUnit-qwen2.5-72b", ["--judge-prompt", "rewardbench2-rating-1to9"]),
    ("ContextualAI/LMUnit-qwen2.5-72b", ["--score", "logprob"]),
    ("ContextualAI/LMUnit-qwen2.5-72b", ["--unit-test", " "])])
def test_unit_test_for_a_model_that_takes_none_is_one_line(capsys, tmp_path, rm, extra):
    """--unit-test where nothing reads one (a reward model, a rating prompt without {unit_test}, another score), or
    an empty one: exit 2, one line, before any model loads (none of these ids is on this machine)."""
    from probe.commands.score import main

    args = ["--unit-test", "Is it short?", *extra] if "--unit-test" not in extra else extra
    code = main(["--rm", rm, "--prompt", QUERY, "--output", str(tmp_path), "--device", "cpu", *args])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "--unit-test" in lines[0] and "Traceback" not in lines[0], lines


def test_paper_route_keeps_the_outputs_start(family, tmp_path):
    """``--input-method paper``: each token decoded, LMUnit's messages rendered as text, the output's start
    ``{"score": `` after it, the whole text through the tokenizer (vLLM's call on the prompt, then the start as the
    model writes it): each row equals LMUnit's reading. Old code dropped the answer prefix from the paper's texts and
    read the rating right after the assistant's header, where LMUnit's model writes '{"' (a score of 0 there)."""
    from probe.commands.score import main

    _, folder, model, tok = family
    assert main(["--rm", str(folder), "--prompt", QUERY, "--input-method", "paper", "--limit", "24", "--device", "cpu",
                 "--output", str(tmp_path), "--no-progress"]) == 0
    (scores,) = list(tmp_path.glob("*/*/scores.parquet"))
    rows = pl.read_parquet(scores).sort("token_id").head(8)
    want = [card_score(model, tok, prepare(tok, QUERY, tok.decode([t]))) for t in rows["token_id"].to_list()]
    np.testing.assert_allclose(rows["score"].to_numpy(), want, rtol=F32_FORWARD["rel"], atol=F32_FORWARD["abs"])
