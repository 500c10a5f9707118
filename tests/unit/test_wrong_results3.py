"""Issue 63: a family named by ``--spec`` (a config's ``spec:``, the API's ``spec=``) gets all of its family (judge
prompt, default score mode, input, system turn), a judge family's input goes with its own prompt only, an explicit
empty ``--system`` is what runs, and meta.json's ``system`` and ``date`` say what the model was fed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

import probe
from probe.errors import ProbeError
from probe.models.registry import lookup
from tests.tiny import F32_FORWARD
from tests.unit.test_lmunit import DEFAULT_SYSTEM_PROMPT, QUERY, RESPONSES, card_score, prepare
from tests.unit.test_refused_families import WORLDPM, worldpm_dir  # noqa: F401  (a module fixture)

LMUNIT = "ContextualAI/LMUnit-llama3.1-70b"
DATE = "26 Jul 2024"


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    """A tiny LMUnit (Llama 3.1 base, its real tokenizer) in a folder whose name says nothing: only --spec names its
    family. (folder, the card's model, its tokenizer, LMUnit's scores of RESPONSES under QUERY)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests import tiny

    folder = tiny.lmunit_folder(tmp_path_factory.mktemp("judge") / "tiny-judge", "llama3.1")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    want = {r: card_score(model, tok, prepare(tok, QUERY, r)) for r in RESPONSES}
    assert lookup(str(folder))[0].name == "default"  # the premise: the path does not name LMUnit
    assert len({round(v, 4) for v in want.values()}) > 1
    return folder, model, tok, want


def _by_response(df: pl.DataFrame, column: str = "response") -> dict[str, float]:
    return dict(zip(df[column].to_list(), df["score"].to_list()))


def _close(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    np.testing.assert_allclose([got[r] for r in want], list(want.values()), rtol=F32_FORWARD["rel"],
                               atol=F32_FORWARD["abs"])


# --- 1. a family named by --spec: its judge prompt, default score mode and input -----------------------------------
def test_spec_names_lmunit_in_the_api(judge):
    """probe.load(path, score="rating", spec=LMUnit) and probe.load(path, spec=LMUnit): LMUnit's scores. Before, the
    first was scored under RewardBench 2's 1-9 prompt (no answer prefix, no top-20 rule; about 5.1 here) and the second
    loaded a sequence classifier (a checkpoint without a head: refused)."""
    folder, _, _, want = judge
    for score in ("rating", "auto"):
        lm = probe.load(str(folder), device="cpu", score=score, spec=LMUNIT)
        _close(_by_response(probe.score_responses(lm, None, QUERY, RESPONSES)), want)
        assert lm.kind == "causal" and lm.own_judge == "lmunit"


def test_spec_names_lmunit_in_the_cli_and_a_config(judge, tmp_path):
    """probe score --spec (auto, and --score rating from a --config file) on the folder: LMUnit's scores; meta.json
    names its judge prompt and input call."""
    from probe.commands.score import main

    folder, _, _, want = judge
    answers = tmp_path / "answers.txt"
    answers.write_text("\n".join(RESPONSES) + "\n")
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"rm": str(folder), "spec": LMUNIT, "score": "rating"}))
    for label, args in (("cli", ["--rm", str(folder), "--spec", LMUNIT]), ("config", ["--config", str(config)])):
        out = tmp_path / label
        assert main([*args, "--prompt", QUERY, "--responses", str(answers), "--device", "cpu", "--output", str(out),
                     "--no-progress"]) == 0
        (run,) = list(out.glob("*/responses_*"))
        _close(_by_response(pl.read_parquet(run / "scores.parquet")), want)
        meta = json.loads((run / "meta.json").read_text())
        assert meta["score"]["mode"] == "rating" and meta["score"]["judge_prompt"]["name"] == "lmunit"
        assert meta["model"]["input"]["call"] == "tokenizer(text)" and meta["model"]["spec_match"] == "--spec"


def test_spec_names_lmunit_in_a_social_suite(judge, tmp_path):
    """probe social --suite with a model's spec: its scores are LMUnit's."""
    from probe.commands.social import main

    folder, model, tok, _ = judge
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": QUERY, "chosen": RESPONSES[0], "rejected": RESPONSES[1]}) + "\n")
    suite = tmp_path / "suite.yaml"
    suite.write_text(json.dumps({"models": [{"rm": str(folder), "spec": LMUNIT}],
                                 "datasets": [{"dataset": "pairs", "data": str(data)}]}))
    assert main(["--suite", str(suite), "--device", "cpu", "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    scores = pl.read_parquet(run / "scores.parquet")
    want = [card_score(model, tok, prepare(tok, p, t)) for p, t in zip(scores["prompt"], scores["text"])]
    np.testing.assert_allclose(scores["score"].to_numpy(), want, rtol=F32_FORWARD["rel"], atol=F32_FORWARD["abs"])


def test_lmunits_input_call_goes_with_its_own_prompt_only(judge):
    """LMUnit's vLLM encoding (tokenizer(text): two BOS on Llama 3.1) under its own prompt; read by log-probabilities
    or under another rating prompt, the chat template's ids (one BOS), recorded as such. Before, every score mode got
    the second BOS. Scoring a model loaded for one reading another way is one line (the input would be the other)."""
    from probe.core.scoring import conversation
    from probe.core.template import render
    from probe.runs.meta import input_convention

    folder, _, tok, _ = judge
    bos = tok.bos_token_id
    own = probe.load(str(folder), device="cpu", spec=LMUNIT, score="rating")
    logprob = probe.load(str(folder), device="cpu", spec=LMUNIT, score="logprob")
    other = probe.load(str(folder), device="cpu", spec=LMUNIT, score="rating", judge_prompt="rewardbench2-rating-1to9")
    from probe.config import ScoringOptions
    from probe.core.judges import load_judge_prompt

    for lm, mode, prompt, n_bos in ((own, "rating", "lmunit", 2), (logprob, "logprob", None, 1),
                                    (other, "rating", "rewardbench2-rating-1to9", 1)):
        opts = ScoringOptions(judge_prompt=load_judge_prompt(prompt, "rating") if prompt else None)
        ids = render(lm.tokenizer, conversation(mode, QUERY, None, opts, lm), "Yes.")
        assert ids[:n_bos] == [bos] * n_bos and ids[n_bos] != bos, (mode, prompt)
    assert logprob.own_judge is None and "without its judge prompt" in input_convention(logprob)
    messages = [{"role": "user", "content": QUERY}, {"role": "assistant", "content": "Yes."}]
    assert render(logprob.tokenizer, conversation("logprob", QUERY, None, ScoringOptions(), logprob), "Yes.") == \
        list(tok.apply_chat_template(messages, tokenize=True, return_dict=False))
    for lm, kwargs in ((logprob, {"score": "rating"}), (own, {"score": "logprob"}),
                       (own, {"judge_prompt": "rewardbench2-rating-1to9"})):
        with pytest.raises(ProbeError, match="load it again") as err:
            probe.score_responses(lm, None, QUERY, RESPONSES[:1], **kwargs)
        assert "\n" not in str(err.value)


def test_an_unknown_spec_is_one_line_before_loading(tmp_path, capsys):
    from probe.commands.score import main

    assert main(["--rm", str(tmp_path), "--spec", "nobody/none", "--prompt", "hi", "--device", "cpu"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--spec nobody/none: unknown" in lines[0]
    with pytest.raises(ProbeError, match="unknown"):
        probe.load(str(tmp_path), spec="nobody/none")


# --- 2. meta.json's system and date: what the model was fed -------------------------------------------------------
def test_wrapped_conversations_record_the_date_they_write_and_their_system(tmp_path):
    """On Llama 3.1's real template (it writes the date into its system block), every wrapped conversation (a
    principle question, a step separator, an appended reward token, LMUnit's judge turn and answer prefix, a pairwise
    judge's turn) is date-sensitive in its split, and the split names the system message it fed. Before, only a plain
    `Conversation` was found date-sensitive: the others' runs recorded date null."""
    from probe.core.judges import load_judge_prompt, rating_conversation
    from probe.core.pairwise import PairwiseConversation, judge_pairwise
    from probe.core.scoring import AppendedToken, FollowUpQuestion, StepSeparated
    from probe.core.template import response_conversation, split_template
    from tests import real_tokenizers

    tok = real_tokenizers.load("llama3.1", tmp_path)
    prompt, other = "What is the greatest thing ever?", tok.convert_tokens_to_ids("<|reserved_special_token_0|>")
    lmunit = load_judge_prompt("lmunit", "rating")
    cases = {"principle question": (FollowUpQuestion(response_conversation(prompt, None, DATE), "Is it true?"), None),
             "step separator": (StepSeparated(response_conversation(prompt, "Be brief.", DATE), other), "Be brief."),
             "appended token": (AppendedToken(response_conversation(prompt, None, DATE), other), None),
             "LMUnit": (rating_conversation(lmunit, prompt, None, DATE), DEFAULT_SYSTEM_PROMPT),
             "pairwise judge": (PairwiseConversation(prompt, judge_pairwise(None, None), None, 0, DATE), None),
             "empty --system": (response_conversation(prompt, "", DATE), "")}
    for name, (build, system) in cases.items():
        split = split_template(tok, build, n_verify=4)
        assert DATE in split.prefix_text, name  # the premise: the template writes the date
        assert split.date_sensitive and split.date_string == DATE, name
        assert split.system == system, name


def _run_meta(out: Path, pattern: str) -> dict:
    (run,) = list(out.glob(pattern))
    return json.loads((run / "meta.json").read_text())


def test_lmunit_sweep_records_its_system_turn_and_date(judge, tmp_path):
    """A sweep of LMUnit (named by --spec) on Llama 3.1: settings.date is the date its judge turn's template wrote,
    the prompt's system is LMUnit's 'rationale=No' (the run gave none: system_given null). Before: both null."""
    from probe.commands.score import main

    folder = judge[0]
    assert main(["--rm", str(folder), "--spec", LMUNIT, "--score", "rating", "--prompt", QUERY, "--limit", "8",
                 "--judge-prompt", "lmunit", "--device", "cpu",
                 "--output", str(tmp_path), "--no-progress"]) == 0
    meta = _run_meta(tmp_path, "*/exhaustive_*")
    (info,) = meta["prompts"].values()
    assert meta["settings"]["date"] == DATE and DATE in info["prefix_text"] and info["date_sensitive"]
    assert info["system"] == DEFAULT_SYSTEM_PROMPT and DEFAULT_SYSTEM_PROMPT in info["prefix_text"]
    assert info["system_given"] is None


def test_principle_sweep_records_the_date(tmp_path):
    """Nemotron's principle model (a question after the response) on Llama 3.1's template: the sweep's date."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from probe.commands.score import main
    from tests import real_tokenizers, tiny
    from tests.unit.test_nemotron import PRINCIPLE, _nemotron_config

    folder = real_tokenizers.build("llama3.1", tmp_path / "m" / PRINCIPLE)
    tiny.build(LlamaForCausalLM, _nemotron_config(AutoTokenizer.from_pretrained(folder))).save_pretrained(folder)
    assert main(["--rm", str(folder), "--prompt", "Is water wet?", "--limit", "8", "--verify", "2", "--device", "cpu",
                 "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    meta = _run_meta(tmp_path / "out", "*/exhaustive_*")
    (info,) = meta["prompts"].values()
    assert meta["model"]["spec"]["name"] == PRINCIPLE and "Only answer Yes or No" in info["suffix_text"]
    assert meta["settings"]["date"] == DATE and DATE in info["prefix_text"]


@pytest.fixture(scope="module")
def prm(tmp_path_factory):
    from tests import tiny

    return tiny.prm_folder(tmp_path_factory.mktemp("prm") / "tiny-prm")


def test_prm_runs_record_the_cards_system_prompt(prm, tmp_path):
    """A process reward model's sweep, responses, social and GCG runs: meta.json's system is the card's (which its
    prefix holds), the run's own none beside it. Before: null in all four while the card's was fed."""
    from probe.commands import gcg, score, social
    from tests.unit.test_prm import QUERY as MATH, QWEN_MATH_SYSTEM

    common = ["--rm", str(prm), "--trust-remote-code", "--device", "cpu", "--no-progress"]
    answers = tmp_path / "answers.txt"
    answers.write_text("12\nIt is 12.\n")
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": MATH, "chosen": "12", "rejected": "24"}) + "\n")
    assert score.main([*common, "--prompt", MATH, "--limit", "8", "--verify", "2", "--output", str(tmp_path / "s")]) == 0
    assert score.main([*common, "--prompt", MATH, "--responses", str(answers), "--output", str(tmp_path / "r")]) == 0
    assert social.main([*common, "--dataset", "pairs", "--data", str(data), "--output", str(tmp_path / "c")]) == 0
    assert gcg.main([*common, "--prompt", MATH, "--length", "1", "--steps", "1", "--search-width", "4", "--topk", "4",
                     "--output", str(tmp_path / "g")]) == 0
    for out, pattern in (("s", "*/exhaustive_*"), ("r", "*/responses_*")):
        (info,) = _run_meta(tmp_path / out, pattern)["prompts"].values()
        assert info["system"] == QWEN_MATH_SYSTEM and info["system_given"] is None, out
        assert QWEN_MATH_SYSTEM in info["prefix_text"], out
    for out, pattern in (("c", "*/social_*"), ("g", "*/gcg_*")):
        settings = _run_meta(tmp_path / out, pattern)["settings"]
        assert settings["system"] == QWEN_MATH_SYSTEM and settings["system_given"] is None, out


def test_an_empty_system_is_an_empty_system_turn(prm):
    """--system "" is what runs: an empty system turn, as the card's code with system "" feeds it (before: no system
    message, so Qwen's template wrote its default "You are Qwen, ..." in its place)."""
    from tests.unit.test_prm import QUERY as MATH
    from transformers import AutoModel, AutoTokenizer

    from tests.unit.test_prm import make_step_rewards

    tok = AutoTokenizer.from_pretrained(prm)
    model = AutoModel.from_pretrained(prm, dtype=torch.float32, trust_remote_code=True).eval()

    def card(step, system):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": MATH},
                    {"role": "assistant", "content": step + "<extra_0>"}]
        ids = tok.encode(tok.apply_chat_template(messages, tokenize=False), return_tensors="pt")
        with torch.no_grad():
            return make_step_rewards(model(input_ids=ids)[0], ids == tok.encode("<extra_0>")[0])[0][0]

    lm = probe.load(str(prm), device="cpu", trust_remote_code=True)
    got = _by_response(probe.score_responses(lm, None, MATH, ["12", "It is 24."], system=""))
    _close(got, {r: card(r, "") for r in ("12", "It is 24.")})
    assert abs(card("12", "") - card("12", "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.")) \
        > 1e-6  # the premise: the two inputs score differently


def test_worldpm_sweep_records_its_empty_system_turn(worldpm_dir, tmp_path):  # noqa: F811
    """WorldPM's card writes an empty system turn: the sweep records system "" (not null, which says none: Qwen's
    default system prompt in its place), and its prefix holds the empty turn."""
    from probe.commands.score import main

    assert main(["--rm", str(worldpm_dir), "--spec", WORLDPM, "--trust-remote-code", "--prompt", "Hi?", "--limit", "4",
                 "--verify", "2", "--device", "cpu", "--output", str(tmp_path), "--no-progress"]) == 0
    (info,) = _run_meta(tmp_path, "*/exhaustive_*")["prompts"].values()
    assert info["system"] == "" and info["system_given"] is None
    assert "<|im_start|>system\n<|im_end|>" in info["prefix_text"] and "You are Qwen" not in info["prefix_text"]


# --- 3. allenai's RewardBench 2 classifiers: the template's ids, and RewardBench 2's where they differ --------------
RB2 = "allenai/Llama-3.1-Tulu-3-8B-RM"
# open-instruct's 'tulu' chat template (open_instruct/dataset_processor.py, as docs/tulu3.md trains this RM with
# `--chat_template tulu` and no --add_bos): no BOS written; rewritten here in its own words, same rendering
TULU = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ '<|system|>\\n' + m['content'] + '\\n' }}"
        "{% elif m['role'] == 'user' %}{{ '<|user|>\\n' + m['content'] + '\\n' }}{% elif m['role'] == 'assistant' %}"
        "{{ '<|assistant|>\\n' + m['content'] + eos_token }}{% if not loop.last %}{{ '\\n' }}{% endif %}{% endif %}"
        "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}")


@pytest.mark.parametrize("template", ["llama3.1", "tulu"])
def test_rb2_classifier_inputs_are_the_templates_and_rewardbench2s_are_said(tmp_path, template, caplog):
    """A tiny RB2 classifier on the real Llama 3.1 tokenizer, its template Llama 3.1 Instruct's (writes BOS) or
    open-instruct's 'tulu' (writes none). The default input is the template's ids (open-instruct's training call);
    RewardBenchPipeline (RewardBench 2's default_v2) on the template's text gives the same scores where the template
    writes BOS, and, where it does not, the scores of one BOS more, which --input-method rewardbench reproduces. The
    registry's account says so, and loading says so for the checkpoint whose ids differ (before: 'the same ids')."""
    import logging

    from transformers import AutoModelForSequenceClassification

    from probe.core.scoring import ScoringOptions, conversation
    from probe.core.template import render
    from probe.models.registry import REGISTRY
    from tests import real_tokenizers, rewardbench_code as rb, tiny

    tok = real_tokenizers.load("llama3.1", tmp_path / "tok")
    if template == "tulu":
        tok.chat_template = TULU
    tok.pad_token = tok.convert_ids_to_tokens(128004)  # as run_v2.py pads (Llama 3.1's finetune pad id)
    cfg = tiny.llama_config(tok, pad_token_id=128004)
    cfg.num_labels = 1
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(cfg).eval()
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    folder = tmp_path / "rm"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    prompt, responses = "What is the greatest thing ever?", ["Love", "The Beatles", "peace and quiet"]
    with caplog.at_level(logging.WARNING, logger="probe.models.loading"):
        lm = probe.load(str(folder), device="cpu", spec=RB2)
    route = probe.load(str(folder), device="cpu", spec=RB2, input_method="rewardbench")
    conv = [{"role": "user", "content": prompt}, {"role": "assistant", "content": "Love"}]
    trained = list(tok.apply_chat_template(conv, tokenize=True, return_dict=False))
    build = conversation("reward", prompt, None, ScoringOptions(), lm)
    assert render(lm.tokenizer, build, "Love") == trained
    bos = [tok.bos_token_id]
    assert render(route.tokenizer, build, "Love") == (trained if template == "llama3.1" else bos + trained)
    texts = [tok.apply_chat_template([conv[0], {"role": "assistant", "content": r}], tokenize=False)
             for r in responses]
    with rb.on_cpu():
        rb2 = rb.load("pipeline").RewardBenchPipeline("text-classification", model, tok)(
            texts, batch_size=1, truncation=False, max_length=2048)[:, 0].float().numpy()
    default, reproduced = (_by_response(probe.score_responses(m, None, prompt, responses)) for m in (lm, route))
    np.testing.assert_allclose([reproduced[r] for r in responses], rb2, rtol=2e-5, atol=2e-5)
    differs = max(abs(default[r] - s) for r, s in zip(responses, rb2))
    warned = [r.message for r in caplog.records if "writes no BOS" in r.message]
    if template == "llama3.1":
        assert differs < 1e-4 and not warned
    else:
        assert differs > 1e-4 and len(warned) == 1 and "--input-method rewardbench" in warned[0]
    assert "one BOS more where it writes none" in REGISTRY[RB2].input_source


# --- the same slip elsewhere: what --spec names, wherever the family is looked up ------------------------------------
def test_the_dry_run_plans_the_dtype_of_the_family_spec_names(monkeypatch, tmp_path):
    """--dry-run's memory plan takes the dtype of the family --spec names (Ziya: float16 on GPU), not the path's."""
    from probe.config import ScoreVocabConfig
    from probe.models import dryrun

    seen = {}
    monkeypatch.setattr(dryrun, "plan", lambda rm, dtype, *a, **k: seen.setdefault("dtype", dtype) and {})
    dryrun.plan_for_config(ScoreVocabConfig(rm=str(tmp_path), spec="IDEA-CCNL/Ziya-LLaMA-7B-Reward", device="cuda",
                                            device_memory=80.0))
    assert seen["dtype"] == torch.float16


def test_a_persona_grid_names_the_cards_system_turn_for_a_persona_without_one(prm, tmp_path):
    """A persona grid on a process reward model: the control (no system message of its own) was fed the card's system
    prompt; the personas section and its label say so (before: 'the chat template wrote its own default', Qwen's)."""
    from probe.commands.score import main
    from probe.core.prompts import system_label
    from tests.unit.test_prm import QUERY as MATH, QWEN_MATH_SYSTEM

    grid = tmp_path / "personas.yaml"
    grid.write_text("control:\nterse: Answer tersely.\n")
    assert main(["--rm", str(prm), "--trust-remote-code", "--prompt", MATH, "--systems", str(grid), "--limit", "4",
                 "--verify", "2", "--device", "cpu", "--output", str(tmp_path / "out"), "--no-progress"]) == 0
    meta = _run_meta(tmp_path / "out", "*/exhaustive_*")
    personas = meta["personas"]
    assert personas["systems_fed"] == {"control": QWEN_MATH_SYSTEM}
    assert repr(QWEN_MATH_SYSTEM) in system_label(personas, "control") and "default" not in system_label(personas, "control")
    assert system_label(personas, "terse") == repr("Answer tersely.")
    systems = {info.get("persona"): info["system"] for info in meta["prompts"].values()}
    assert systems == {"control": QWEN_MATH_SYSTEM, "terse": "Answer tersely."}
