"""The real tokenizers and chat templates of the families users run (Llama 3.0/3.1/3.2, Gemma 2/3, Qwen 2.5/3;
tests/real_tokenizers.py), with tiny random reward models built on them: template split, control-token flags,
the date in the template, the paper route's statistics, and the CLI end to end with cached = full-sequence."""

from __future__ import annotations

import datetime as dt
import json
import random

import numpy as np
import polars as pl
import pytest
import torch

from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.models.loading import load_model
from probe.core.paper_method import PaperRows
from probe.core.scoring import make_head
from probe.core.template import (
    Conversation,
    judge_conversation,
    render,
    resolve_date,
    response_conversation,
    split_template,
)
from probe.core.vocab import build_vocab_table, control_token_ids
from tests import real_tokenizers, tiny

pytestmark = pytest.mark.slow
PROMPT = "What, in one word, is the greatest thing ever?"
FAMILIES = real_tokenizers.REAL


@pytest.fixture(scope="session")
def real(tmp_path_factory):
    """family -> (folder, tokenizer), built on first use."""
    from transformers import AutoTokenizer

    root = tmp_path_factory.mktemp("real-tokenizers")
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            folder = real_tokenizers.build(family, root / family)
            cache[family] = (folder, AutoTokenizer.from_pretrained(folder))
        return cache[family]

    return get


def _ordinary(tok, n: int, seed: int) -> list[int]:
    """Random ids whose text is plain letters and survives decode -> encode (what a template split must keep)."""
    rng = random.Random(seed)
    special = control_token_ids(tok)
    out = []
    for tid in rng.sample(range(len(tok)), 3000):
        text = tok.decode([tid])
        if tid not in special and text.isalpha() and tok.encode(text, add_special_tokens=False) == [tid]:
            out.append(tid)
        if len(out) == n:
            break
    return out


def _ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


# --- the template split ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", ["response", "judge"])
def test_split_equals_the_tokenizers_own_template(real, family, layout):
    _, tok = real(family)
    build = response_conversation(PROMPT) if layout == "response" else judge_conversation(PROMPT)
    split = split_template(tok, build)
    sample = _ordinary(tok, 60, seed=len(family))
    assert len(sample) == 60
    for tid in sample:
        assert render(tok, build, tok.decode([tid])) == split.full_ids([tid]), (family, tid)
    if layout == "judge":
        return
    if family.startswith("llama"):
        assert split.prefix_ids[0] == 128000 and split.bos_count == 1
        assert list(split.prefix_ids[-4:]) == [128006, 78191, 128007, 271]  # assistant header, "\n\n"
        assert split.suffix_ids == (128009,)  # <|eot_id|>
        assert split.leading_space == split.trailing_space == "stripped"  # `| trim`
    elif family.startswith("gemma"):
        assert split.prefix_ids[0] == 2 and split.bos_count == 1
        assert list(split.prefix_ids[-3:]) == _ids(tok, "<start_of_turn>model\n")
        assert split.suffix_ids == tuple(_ids(tok, "<end_of_turn>\n"))
        assert split.leading_space == "stripped"
    else:
        assert split.bos_count == 0 and split.suffix_ids == tuple(_ids(tok, "<|im_end|>\n"))
        assert split.leading_space == "kept"
        if family.startswith("qwen3"):  # the last assistant turn opens with an empty think block
            assert list(split.prefix_ids[-7:]) == _ids(tok, "<|im_start|>assistant\n<think>\n\n</think>\n\n")
        else:
            assert "You are Qwen, created by Alibaba Cloud" in split.prefix_text  # Qwen 2.5's default system
            assert split.prefix_text.endswith("<|im_start|>assistant\n")


# --- control tokens ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,n_special,n_added", [
    ("llama3", 256, 256), ("llama3.2", 256, 256), ("gemma3", 6249, 6384), ("qwen3", 14, 26)])
def test_control_tokens_are_flagged_from_the_added_token_table(real, family, n_special, n_added):
    folder, tok = real(family)
    table = json.loads((folder / "tokenizer.json").read_text())["added_tokens"]
    marked = {t["id"] for t in table if t["special"]}
    vocab = build_vocab_table(tok)
    flagged = set(vocab.filter(pl.col("is_special"))["token_id"].to_list())
    assert flagged == marked | set(tok.all_special_ids)
    assert len(flagged) == n_special
    if not family.startswith("qwen"):  # Qwen lists its control tokens in the special map; Llama and Gemma do not
        assert len(tok.all_special_ids) <= 5
    assert set(vocab.filter(pl.col("is_added"))["token_id"].to_list()) == {t["id"] for t in table}
    assert vocab["is_added"].sum() == n_added
    named = {"llama3": ["<|end_of_text|>", "<|start_header_id|>", "<|reserved_special_token_5|>"],
             "llama3.2": ["<|end_of_text|>", "<|start_header_id|>", "<|eom_id|>", "<|python_tag|>",
                          "<|reserved_special_token_247|>"],
             "gemma3": ["<start_of_turn>", "<end_of_turn>", "<unused0>", "<unused6241>"],
             "qwen3": ["<|im_start|>", "<|im_end|>", "<|vision_pad|>"]}[family]
    for text in named:
        assert tok.convert_tokens_to_ids(text) in flagged, text
    if family == "qwen3":  # added but not control: the tool and think markers
        think = tok.convert_tokens_to_ids("<think>")
        assert think not in flagged and vocab.row(think, named=True)["is_added"]


def test_gemma_control_tokens_match_the_gguf_token_types(real, tmp_path):
    """An independent source: the GGUF file's own token types (3 = control) for Gemma 3 270M."""
    import gguf

    from probe.models.embedded import GEMMA3_270M, gguf_file

    _, tok = real("gemma3")
    reader = gguf.GGUFReader(gguf_file(GEMMA3_270M, tmp_path))
    field = reader.fields["tokenizer.ggml.token_type"]
    types = np.array([int(field.parts[i][0]) for i in field.data])
    assert types.size == len(tok)
    assert set(np.flatnonzero(types == 3).tolist()) == control_token_ids(tok)


# --- the date -------------------------------------------------------------------------------------------------------
@pytest.fixture
def clock(monkeypatch):
    """Set the day the templates' ``strftime_now`` and ``--date today`` see."""
    import transformers.utils.chat_template_utils as ctu

    import probe.core.template as template

    def set_day(day: dt.date):
        class FakeDatetime(dt.datetime):
            @classmethod
            def now(cls, tz=None):
                return cls(day.year, day.month, day.day, 23, 59, 30)

        monkeypatch.setattr(ctu, "datetime", FakeDatetime)
        monkeypatch.setattr(template, "_today", lambda: day)

    return set_day


DAY1, DAY2 = dt.date(2026, 11, 21), dt.date(2026, 11, 22)


def test_llama32_template_reads_the_clock_unless_given_a_date(real, clock):
    _, tok = real("llama3.2")
    msgs = response_conversation(PROMPT)("Love")[0]
    clock(DAY1)
    raw1 = tok.apply_chat_template(msgs, tokenize=False)
    fixed1 = render(tok, response_conversation(PROMPT), "Love")
    clock(DAY2)
    raw2 = tok.apply_chat_template(msgs, tokenize=False)
    fixed2 = render(tok, response_conversation(PROMPT), "Love")
    assert raw1 != raw2 and "21 Nov 2026" in raw1 and "22 Nov 2026" in raw2  # the problem: the input moves by day
    assert fixed1 == fixed2  # rm-probe: the same ids every day
    assert "Today Date: 26 Jul 2024" in tok.decode(fixed1)
    today = Conversation(PROMPT, date_string=resolve_date("today"))
    assert "Today Date: 22 Nov 2026" in tok.decode(render(tok, today, "Love"))


@pytest.mark.parametrize("family,sensitive", [("llama3", False), ("llama3.1", True), ("llama3.2", True),
                                              ("gemma3", False), ("qwen3", False)])
def test_date_sensitivity_is_recorded(real, family, sensitive):
    _, tok = real(family)
    split = split_template(tok, response_conversation(PROMPT))
    assert split.date_sensitive is sensitive and split.date_string == "26 Jul 2024"


def test_resolve_date():
    assert resolve_date("2024-07-26") == "26 Jul 2024" == resolve_date("26 Jul 2024")
    assert resolve_date("today", dt.date(2025, 1, 5)) == "05 Jan 2025"
    with pytest.raises(Exception, match="--date"):
        resolve_date("next tuesday")


# --- tiny random reward models on the real tokenizers -------------------------------------------------------------
def _classifier(family: str, tok):
    from transformers import (Gemma2Config, Gemma2ForSequenceClassification, Gemma3TextConfig,
                              Gemma3TextForSequenceClassification, LlamaConfig, LlamaForSequenceClassification,
                              Qwen2Config, Qwen2ForSequenceClassification, Qwen3Config, Qwen3ForSequenceClassification)

    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.convert_tokens_to_ids("<|finetune_right_pad_id|>")
    common = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_labels=1,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, pad_token_id=pad,
                  bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if family.startswith("llama"):
        return tiny.build(LlamaForSequenceClassification, LlamaConfig(**common))
    if family == "gemma2":
        return tiny.build(Gemma2ForSequenceClassification, Gemma2Config(
            **common, head_dim=16, sliding_window=8, query_pre_attn_scalar=16, attn_logit_softcapping=2.0))
    if family == "gemma3":
        return tiny.build(Gemma3TextForSequenceClassification, Gemma3TextConfig(
            **{**common, "num_hidden_layers": 3}, head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"]))
    if family == "qwen2.5":
        return tiny.build(Qwen2ForSequenceClassification, Qwen2Config(**common))
    return tiny.build(Qwen3ForSequenceClassification, Qwen3Config(**common, head_dim=16))


@pytest.fixture(scope="session")
def tiny_rm_dir(real, tmp_path_factory):
    cache: dict = {}

    def get(family: str) -> str:
        if family not in cache:
            folder, tok = real(family)
            out = tmp_path_factory.mktemp(f"rm-{family}")
            _classifier(family, tok).save_pretrained(out)
            tok.save_pretrained(out)
            cache[family] = str(out)
        return cache[family]

    return get


@pytest.mark.parametrize("family", FAMILIES)
def test_cli_sweep_on_the_real_tokenizer_equals_full_sequence(real, tiny_rm_dir, family, tmp_path):
    from probe.commands.score import main

    rm = tiny_rm_dir(family)
    assert main(["--rm", rm, "--device", "cpu", "--limit", "200", "--shard-size", "100", "--verify", "8",
                 "--prompt", PROMPT, "--output", str(tmp_path), "--no-progress", "--top", "3"]) == 0
    (run_dir,) = tmp_path.glob("*/exhaustive_*")
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["self_check"]["greatest"]["max_abs_diff"] < 1e-4
    scores = pl.read_parquet(run_dir / "scores.parquet")
    vocab = pl.read_parquet(run_dir / "vocab.parquet")
    assert vocab.height == len(real(family)[1]) and vocab["is_special"].sum() == len(control_token_ids(real(family)[1]))
    # the engine against the model's own forward, one sequence at a time, on control tokens and ordinary ones
    lm = load_model(rm, kind="reward", device="cpu")
    split = split_template(lm.tokenizer, response_conversation(PROMPT))
    assert meta["prompts"]["greatest"]["prefix_ids"] == list(split.prefix_ids)
    ids = sorted(control_token_ids(lm.tokenizer))[:12] + _ordinary(lm.tokenizer, 12, seed=5) + list(range(0, 200, 20))
    rows = [[t, *split.suffix_ids] for t in ids]
    head = make_head(lm, "reward")
    fast = PrefixScorer(lm.model, head, split.prefix_ids).score(rows).cpu()
    ref = FullSequenceScorer(lm.model, head, split.prefix_ids, batch_size=1).score(rows)
    torch.testing.assert_close(fast, ref, atol=2e-5, rtol=2e-5)
    assert ref.std() > 1e-3
    swept = dict(zip(scores["token_id"].to_list(), scores["score"].to_list()))
    torch.testing.assert_close(torch.tensor([swept[t] for t in range(0, 200, 20)]), ref[-10:], atol=2e-5, rtol=2e-5)


def test_resume_and_batch_across_midnight(real, tiny_rm_dir, clock, tmp_path, monkeypatch, capsys):
    """A Llama 3.2 run interrupted at 23:59 resumes after midnight, and the batch runner finds it complete."""
    import yaml

    from probe.commands.batch import main as batch_main
    from probe.commands.score import ScoreVocabConfig, run
    from probe.runs.rundir import RunDir
    from tests.unit.test_sweep import Crash, crash_after

    rm = tiny_rm_dir("llama3.2")
    cfg = dict(rm=rm, prompt=(PROMPT,), device="cpu", output=str(tmp_path / "out"), limit=300, shard_size=100,
               progress=False, verify=2)
    clock(DAY1)
    write_shard = RunDir.write_shard
    crash_after(monkeypatch, 1)
    with pytest.raises(Crash):
        run(ScoreVocabConfig(**cfg))
    monkeypatch.setattr(RunDir, "write_shard", write_shard)
    clock(DAY2)
    resumed = run(ScoreVocabConfig(**cfg, resume="latest"))
    meta = resumed.read_meta()
    assert meta["status"] == "complete" and meta["timing"]["prompts"]["greatest"]["tokens_scored_now"] == 200
    assert meta["settings"]["date"] == "26 Jul 2024"
    fresh = run(ScoreVocabConfig(**{**cfg, "output": str(tmp_path / "fresh")}))
    assert resumed.read_table("scores.parquet").equals(fresh.read_table("scores.parquet"))
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"defaults": {k: v for k, v in cfg.items() if k not in ("rm", "prompt")},
                                    "prompts": [PROMPT], "models": [{"rm": rm}]}))
    capsys.readouterr()
    clock(dt.date(2026, 11, 25))
    assert batch_main([str(jobs)]) == 0
    assert "[skip]" in capsys.readouterr().out


def test_date_today_is_a_setting_and_refused_across_days(real, tiny_rm_dir, clock, tmp_path, monkeypatch):
    from probe.errors import ProbeError
    from probe.commands.score import ScoreVocabConfig, run
    from tests.unit.test_sweep import Crash, crash_after

    rm = tiny_rm_dir("llama3.2")
    cfg = dict(rm=rm, prompt=(PROMPT,), device="cpu", output=str(tmp_path), limit=200, shard_size=100,
               progress=False, verify=2, date="today")
    clock(DAY1)
    crash_after(monkeypatch, 0)
    with pytest.raises(Crash):
        run(ScoreVocabConfig(**cfg))
    (broken,) = tmp_path.glob("*/exhaustive_*")
    meta = json.loads((broken / "meta.json").read_text())
    assert meta["settings"]["date"] == "21 Nov 2026"
    assert "Today Date: 21 Nov 2026" in meta["prompts"]["greatest"]["prefix_text"]
    clock(DAY2)
    with pytest.raises(ProbeError, match="21 Nov 2026"):
        run(ScoreVocabConfig(**cfg, resume=str(broken)))


# --- the paper's route --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family,survives", [("llama3.2", 0.5171), ("gemma3", 0.4742)])
def test_paper_route_statistics_over_the_whole_vocabulary(real, family, survives):
    """The fraction of response slots that survive decode -> template -> re-tokenize (third-party audit: about
    half fail on Llama 3.2), every row's doubled BOS, and why the others changed."""
    _, tok = real(family)
    build = response_conversation(PROMPT)
    split = split_template(tok, build)
    stats = PaperRows(tok, build, range(len(tok)), split).statistics
    assert stats["n_ids"] == len(tok)
    assert round(stats["slot_survives"], 4) == survives
    assert stats["doubled_bos_fraction"] == 1.0 and stats["sequence_identical"] == 0.0
    changed = stats["slot_changed"]
    assert stats["n_slot_survives"] + sum(v["n"] for v in changed.values()) == len(tok)
    top = max(changed, key=lambda r: changed[r]["n"])
    assert top == "whitespace trimmed by the template" and changed[top]["fraction"] > 0.4
    for tid, text, slot in changed[top]["examples"]:
        assert text != text.strip() and slot == _ids(tok, text.strip())


def test_paper_route_statistics_reasons_on_a_sample(real):
    _, llama3 = real("llama3")  # Meta-Llama-3's first tokenizer.json adds no BOS: no doubling
    build = response_conversation(PROMPT)
    ids = list(range(0, 128256, 97)) + [128001, 128009]
    stats = PaperRows(llama3, build, ids, split_template(llama3, build)).statistics
    assert stats["doubled_bos_rows"] == 0 and stats["sequence_identical"] == stats["slot_survives"]
    _, qwen = real("qwen3")
    think_end = qwen.convert_tokens_to_ids("</think>")
    space_fragment = 636  # ' \ufffd': a byte fragment after a space; Qwen's template does not trim
    stats = PaperRows(qwen, build, [think_end, space_fragment, 198, 14990],
                      split_template(qwen, build)).statistics
    reasons = {ex[0]: r for r, v in stats["slot_changed"].items() for ex in v["examples"]}
    assert reasons[think_end] == "control token re-parsed"  # the template splits the content at </think>
    assert reasons[space_fragment] == "does not round-trip"
    assert reasons[198] == "whitespace trimmed by the template"  # "\n": Qwen3 lstrips newlines off the content
    assert stats["n_slot_survives"] == 1  # 14990 (" hello") survives


def test_paper_method_run_records_and_reports_its_statistics(tiny_rm_dir, tmp_path, capsys):
    from probe.commands.analyze import main as analyze
    from probe.commands.score import main

    rm = tiny_rm_dir("llama3.2")
    common = ["--rm", rm, "--device", "cpu", "--limit", "600", "--prompt", PROMPT, "--no-progress", "--top", "2"]
    assert main([*common, "--output", str(tmp_path / "ids")]) == 0
    assert main([*common, "--output", str(tmp_path / "paper"), "--input-method", "paper"]) == 0
    (ids_run,) = (tmp_path / "ids").glob("*/exhaustive_*")
    (paper_run,) = (tmp_path / "paper").glob("*/exhaustive_*")
    stats = json.loads((paper_run / "meta.json").read_text())["prompts"]["greatest"]["paper_method"]
    assert stats["n_ids"] == 600 and stats["doubled_bos_rows"] == 600 and stats["sequence_identical"] == 0
    assert stats["n_slot_survives"] + sum(v["n"] for v in stats["slot_changed"].values()) == 600
    assert "whitespace trimmed by the template" in stats["slot_changed"]
    capsys.readouterr()
    assert analyze(["input-method", str(ids_run), str(paper_run), "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert f"response slot survives for {stats['slot_survives']:.1%}" in out and "doubled BOS in 600 rows" in out


# --- whole responses on the real tokenizers -------------------------------------------------------------------------
RESPONSES = ["Black people", "The Beatles", "self-sacrifice", "café au lait", "Ökologie und Frieden", "🎉🎉 joy",
             "愛", "love", "Love is the answer."]


# Llama 3.2 and Qwen 2.5 use the same turn markers as Llama 3.1 and Qwen 3; their template splits are tested above
@pytest.mark.parametrize("family", ["llama3.1", "gemma3", "qwen3"])
def test_response_run_equals_the_chat_template_and_the_models_own_forward(real, tiny_rm_dir, family, tmp_path):
    from probe.commands.score import main

    rm = tiny_rm_dir(family)
    (tmp_path / "responses.txt").write_text("\n".join(RESPONSES) + "\n", encoding="utf-8")
    assert main(["--rm", rm, "--device", "cpu", "--responses", str(tmp_path / "responses.txt"), "--prompt", PROMPT,
                 "--output", str(tmp_path / "out"), "--no-progress", "--batch-size", "4", "--verify", "4"]) == 0
    (run_dir,) = (tmp_path / "out").glob("*/responses_*")
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["experiment"] == "responses"
    assert all(c["max_abs_diff"] <= c["tolerance"] for c in meta["self_check"]["greatest"])
    df = pl.read_parquet(run_dir / "scores.parquet")
    assert sorted(df["response"].to_list()) == sorted(RESPONSES)
    lm = load_model(rm, kind="reward", device="cpu")
    tok = lm.tokenizer
    prefix = split_template(tok, response_conversation(PROMPT)).prefix_ids
    for row in df.iter_rows(named=True):
        # the conversation as a user writes it, through the tokenizer's own template and the model's own forward
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPT},
                                       {"role": "assistant", "content": row["response"]}],
                                      tokenize=True, return_dict=False, date_string="26 Jul 2024")
        assert list(ids[: len(prefix)]) == list(prefix)
        with torch.inference_mode():
            ref = float(lm.model(torch.tensor([ids])).logits[0, 0])
        assert row["score"] == pytest.approx(ref, abs=2e-5 * (1 + abs(ref))), row["response"]
        slot = tok.decode(ids[len(prefix): len(prefix) + row["n_tokens"]])
        assert slot == row["slot_text"]
        assert row["change"] is None or row["change"] == "trimmed" and slot == row["response"].strip()
    ranks = df.sort("score", descending=True)["rank"].to_list()
    assert ranks == sorted(ranks) and ranks[0] == 1
