"""Process reward models (Qwen2.5-Math-PRM-7B, -72B, Qwen2.5-Math-7B-PRM800K): a response's reward as one step, read
at the step separator ``<extra_0>`` appended after it, equal to the model card's own code run on the same tiny model
(tests/tiny.py ``prm_folder``: the stand-in of its remote class on Qwen 2.5's real tokenizer) through
``probe.load`` + ``probe.score_responses``, a sweep and ``probe social``."""

import json

import numpy as np
import polars as pl
import pytest
import torch
import torch.nn.functional as F

from probe.models.registry import REGISTRY, lookup
from tests.tiny import F32_FORWARD

# the card's system prompt, as its code writes it (data["system"])
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
PRM_IDS = ("Qwen/Qwen2.5-Math-PRM-7B", "Qwen/Qwen2.5-Math-PRM-72B", "Qwen/Qwen2.5-Math-7B-PRM800K")
QUERY = "Sue has 18 flamingos and gives away 6. How many are left?"
STEPS = ["12", "She has 18 - 6 = 12 left.\n\nThe answer is \\boxed{12}.", " twelve ", "<|im_end|> a control token as text"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from tests import tiny

    return tiny.prm_folder(tmp_path_factory.mktemp("prm") / "tiny-prm")


def make_step_rewards(logits, token_masks):  # the model card's function, as it writes it
    probabilities = F.softmax(logits, dim=-1)
    probabilities = probabilities * token_masks.unsqueeze(-1)  # bs, seq_len, num_labels
    all_scores_res = []
    for i in range(probabilities.size(0)):
        sample = probabilities[i]  # seq_len, num_labels
        positive_probs = sample[sample != 0].view(-1, 2)[:, 1]  # valid_tokens, num_labels
        non_zero_elements_list = positive_probs.cpu().tolist()
        all_scores_res.append(non_zero_elements_list)
    return all_scores_res


@pytest.fixture(scope="module")
def card(folder):
    """The card's code (Qwen/Qwen2.5-Math-PRM-7B, the same for -72B and -7B-PRM800K) on the tiny model, float32 on
    CPU where the card asks bfloat16: ``card(query, steps, system)`` -> its list of step rewards."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModel.from_pretrained(folder, dtype=torch.float32, trust_remote_code=True).eval()

    def run(query, steps, system=QWEN_MATH_SYSTEM):
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": query},
            {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"},
        ]
        conversation_str = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
        input_ids = tokenizer.encode(conversation_str, return_tensors="pt")
        with torch.no_grad():
            outputs = model(input_ids=input_ids)
        step_sep_id = tokenizer.encode("<extra_0>")[0]
        token_masks = input_ids == step_sep_id
        return make_step_rewards(outputs[0], token_masks)[0]

    run.tokenizer = tokenizer
    return run


@pytest.fixture(scope="module")
def lm(folder):
    import probe

    return probe.load(str(folder), device="cpu", trust_remote_code=True)


def test_every_prm_id_resolves_to_the_step_reader(folder, lm):
    """Each id, and a checkpoint under another name by its class, reads the step head at <extra_0> with the card's
    system prompt; before this reader they fell to the default linear head (or failed to load)."""
    for name in (*PRM_IDS, "Qwen2ForProcessRewardModel"):
        spec = REGISTRY[name]
        assert (spec.reader, spec.step_token, spec.system_prompt, spec.auto_class) == (
            "step", "<extra_0>", QWEN_MATH_SYSTEM, "AutoModel"), name
        assert spec.trust_remote_code and spec.input_source == REGISTRY[PRM_IDS[0]].input_source
    assert lookup("somewhere/my-prm-finetune", ["Qwen2ForProcessRewardModel"])[0].reader == "step"
    assert lm.spec.reader == "step" and lm.spec_match == "architecture"
    from probe.core.heads import StepRewardHead
    from probe.core.scoring import make_head

    assert isinstance(make_head(lm, "reward"), StepRewardHead)


def test_score_responses_equal_the_cards_step_reward(lm, card):
    """Each whole response as one step (the card's list of one step): its reward equals the card's, on the cached
    engine and the model's own forward alike (score_responses self-checks the one against the other). The ids are the
    card's, the separator and the template's end of turn after the response; a control token inside a response is
    text in both (the card's apply_chat_template(tokenize=False) + encode would read it as the token: not compared)."""
    import probe
    from probe.core.scoring import ScoringOptions, conversation

    tok = card.tokenizer
    build = conversation("reward", QUERY, None, ScoringOptions(), lm)
    for r in STEPS[:3]:
        messages = [{"role": "system", "content": QWEN_MATH_SYSTEM}, {"role": "user", "content": QUERY},
                    {"role": "assistant", "content": r + "<extra_0>"}]
        want = tok.encode(tok.apply_chat_template(messages, tokenize=False))
        assert build.render_ids(lm.tokenizer, r) == want, r
    got = probe.score_responses(lm, None, QUERY, STEPS)
    scores = dict(zip(got["response"].to_list(), got["score"].to_list()))
    for r in STEPS[:3]:
        (want,) = card(QUERY, [r])
        assert scores[r] == pytest.approx(want, **F32_FORWARD), r
    assert len({round(v, 6) for v in scores.values()}) == len(STEPS)  # the rewards differ: a real comparison
    # --system replaces the card's system prompt (and changes the reward)
    other = probe.score_responses(lm, None, QUERY, STEPS[:1], system="Be brief.")["score"][0]
    assert other == pytest.approx(card(QUERY, STEPS[:1], "Be brief.")[0], **F32_FORWARD)
    assert abs(other - scores[STEPS[0]]) > 1e-4


def test_the_reward_is_read_at_the_separator_after_the_last_step(card, lm):
    """The card's rewards of several steps, each read at its own separator: the first is the reward of that step
    alone (a causal model), which the reader gives for that step as the whole response."""
    import probe

    two = card(QUERY, STEPS[:2])
    assert len(two) == 2
    assert probe.score_responses(lm, None, QUERY, STEPS[:1])["score"][0] == pytest.approx(two[0], **F32_FORWARD)


def test_sweep_equals_the_card_on_each_token(lm, card):
    """A sweep of the first ids: each token's reward equals the card's on its text (where the text re-encodes to the
    same id), at the separator after it."""
    import probe

    df = probe.sweep(lm, None, QUERY, limit=60)
    tok = card.tokenizer
    checked = 0
    for tid, score in zip(df["token_id"].to_list(), df["score"].to_list()):
        text = tok.decode([tid])
        if tok.encode(text, add_special_tokens=False) != [tid]:
            continue
        (want,) = card(QUERY, [text])
        assert score == pytest.approx(want, **F32_FORWARD), (tid, text)
        checked += 1
    assert checked >= 40
    assert df["score"].std() > 1e-4


def test_social_command_scores_equal_the_card(folder, card, tmp_path):
    """``probe social`` on a pairs file: every option's score equals the card's reward of that option as one step."""
    from probe.commands.social import main

    data = tmp_path / "pairs.jsonl"
    rows = [{"prompt": QUERY, "chosen": "12", "rejected": "24"},
            {"prompt": "What is 3 times 4?", "chosen": "3 * 4 = 12.", "rejected": "It is 7."}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["--rm", str(folder), "--trust-remote-code", "--device", "cpu", "--dataset", "pairs", "--data",
                 str(data), "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    scores = pl.read_parquet(run / "scores.parquet")
    assert scores.height == 4
    want = [card(p, [t])[0] for p, t in zip(scores["prompt"].to_list(), scores["text"].to_list())]
    np.testing.assert_allclose(scores["score"].to_numpy(), want, rtol=F32_FORWARD["rel"], atol=F32_FORWARD["abs"])
    meta = json.loads((run / "meta.json").read_text())
    assert "<extra_0>" in json.dumps(meta)  # the input convention (or head) that names the separator is recorded


def test_a_tokenizer_without_the_separator_is_one_line(folder, tmp_path):
    """A PRM spec on a tokenizer that lacks <extra_0> as one token: one line, not a reward read elsewhere."""
    import shutil

    import probe
    from probe.errors import ProbeError
    from tests import real_tokenizers

    other = tmp_path / "plain-qwen"
    shutil.copytree(folder, other)
    real_tokenizers.build("qwen2.5", other)  # the plain Qwen 2.5 tokenizer: 151651 is <|quad_end|>
    lm = probe.load(str(other), device="cpu", trust_remote_code=True)
    with pytest.raises(ProbeError, match="step separator '<extra_0>' is not one token"):
        probe.score_responses(lm, None, QUERY, ["12"])


def test_trace_is_the_cards_step_reward_of_each_cut_response(lm, card):
    """``probe trace`` of a process reward model: each prefix row is the card's step reward of the response cut
    there, the separator appended after the cut (the step it would be); the complete row is the whole response's.
    Old code read each prefix on the plain one-forward path, whose rows hold no separator: an error, no trace."""
    from probe.core.trace import trace

    text = "She has 18 - 6 = 12 flamingos left."
    df, _ = trace(lm, "reward", QUERY, [text])
    prefix = df.filter(pl.col("kind") == "prefix")
    assert set(df["method"].to_list()) == {"each prefix closed"}
    tok = card.tokenizer
    ids = prefix["token_id"].to_list()
    checked = 0
    for k in range(1, len(ids) + 1):
        cut = tok.decode(ids[:k])
        if tok.encode(cut, add_special_tokens=False) != ids[:k]:
            continue
        (want,) = card(QUERY, [cut])
        assert prefix["score"][k - 1] == pytest.approx(want, **F32_FORWARD), (k, cut)
        checked += 1
    assert checked >= 8 and prefix["score"].std() > 1e-4
    complete = df.filter(pl.col("kind") == "complete")["score"][0]
    assert complete == pytest.approx(card(QUERY, [text])[0], **F32_FORWARD)


def test_the_rewardbench_route_is_refused_in_one_line(folder):
    """RewardBench 0.1.4 has no pipeline for a process reward model (its default would load a sequence classifier's
    random head on the checkpoint), so ``--input-method rewardbench`` has nothing to reproduce: one line, before the
    weights load. Old code scored a third input, neither RewardBench's nor the card's: the step head without the
    card's system prompt (the template's default system turn; tiny model, response '12': 0.703 against the card's
    0.274)."""
    import probe
    from probe.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="--input-method rewardbench: RewardBench 0.1.4 has no pipeline"):
        probe.load(str(folder), device="cpu", trust_remote_code=True, input_method="rewardbench")
