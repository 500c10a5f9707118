"""The auditors' page reads as an audit: what was measured (a partial run says so), findings drawn from the data,
byte fragments as their bytes, readable provenance, and only the run's own ids embedded."""

from __future__ import annotations

import html
import json
import re

import polars as pl

from probe.report import single
from probe.report.text import piece_bytes, shown_text
from tests.fake_runs import hashed_score, write_fake_run

WORDS = ["love", "hate", "peace", "war", "joy", "pain", "good", "bad", "happy", "sad", "Black", "women", " love"]


def _data(page: str) -> dict:
    return json.loads(re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)[1]
                      .replace("<\\/", "</"))


def test_byte_fragments_are_shown_as_bytes():
    assert piece_bytes("<0xE2>") == b"\xe2" and piece_bytes("Ġâ") == b" \xe2"  # SentencePiece and GPT-2 pieces
    assert shown_text(" \ufffd", "Ġâ", False) == " <0xE2>"
    assert shown_text("\ufffd", "âĢ", False) == "<0xE2><0x80>"  # two bytes of a three-byte character
    assert shown_text("\ufffd", "<0xE2>", False) == "<0xE2>"
    assert shown_text("é", "Ã©", True) == "é"  # valid text is shown as text


def test_the_page_reads_as_an_audit(tmp_path):
    tokens = WORDS + ["<s>", " \ufffd"] + [f"w{i}" for i in range(200)]
    run = write_fake_run(tmp_path, "org/fake-rm", tokens, {"greatest": "What is greatest?"}, hashed_score,
                         special=["<s>"])
    vocab = run.read_table("vocab.parquet").with_columns(
        pl.when(pl.col("decoded") == " \ufffd").then(pl.lit("Ġâ")).otherwise(pl.col("piece")).alias("piece"),
        (pl.col("decoded") != " \ufffd").alias("valid_utf8"))
    run.write_table("vocab.parquet", vocab)
    scores = run.read_table("scores.parquet").with_columns(  # scores.parquet carries the vocabulary's columns too
        pl.when(pl.col("decoded") == " \ufffd").then(False).otherwise(pl.col("valid_utf8")).alias("valid_utf8"),
        pl.when(pl.col("decoded") == " \ufffd").then(pl.lit("Ġâ")).otherwise(pl.col("piece")).alias("piece"))
    run.write_table("scores.parquet", scores)
    page = single.build(run.path, rows=10)
    assert "What was measured" in page and "reward head" in page and "the whole vocabulary" in page
    assert "revision default" in page
    data = _data(page)
    shown = dict(zip(data["vocab"]["ids"], data["vocab"]["shown"]))
    frag = vocab.filter(pl.col("piece") == "Ġâ")["token_id"][0]
    assert shown[frag] == " <0xE2>"
    from probe.report.text import format_top_bottom

    terminal = format_top_bottom(scores.filter(pl.col("prompt_key") == "greatest"), "greatest", "What is greatest?",
                                 run.read_meta(), len(tokens))
    assert "' <0xE2>'" in terminal and "\ufffd" not in terminal  # the terminal table shows the bytes too
    best = scores.sort("rank").filter(pl.col("is_word"))["decoded"].head(5).to_list()
    assert html.escape("Optimal responses (English words): " + ", ".join(repr(w) for w in best)) in page
    assert "control or added tokens among the" in page or "No control or added token among the top" in page
    assert page.count("data:image/png;base64,") == 1  # one plot per prompt


def test_a_partial_run_says_so_and_embeds_only_its_ids(tmp_path):
    tokens = WORDS + [f"w{i}" for i in range(3000)]
    full = write_fake_run(tmp_path, "org/m", tokens, {"greatest": "What is greatest?"})
    part = write_fake_run(tmp_path, "org/m", tokens[:100], {"greatest": "What is greatest?"})
    meta = part.read_meta()
    meta["config"] = {"limit": 100}
    meta["model"].update(embedding_rows=len(tokens), tokenizer_len=len(tokens))
    meta["self_check"] = {"greatest": {"token_ids": [1, 2], "max_abs_diff": 4.9591064453125e-05,
                                       "tolerance": 0.046877410262823105}}
    part.write_meta(meta)
    part.write_table("vocab.parquet", full.read_table("vocab.parquet"))  # the vocabulary of the whole model
    page = single.build(part.path)
    assert "PART of the vocabulary: the first 100 of 3,013 token ids (--limit 100)" in page
    assert len(_data(page)["vocab"]["ids"]) == 100  # not the 3,013 strings of the whole vocabulary
    payload = lambda p: len(re.search(r'<script id="data"[^>]*>(.*?)</script>', p, re.S)[1])  # noqa: E731
    assert payload(page) * 10 < payload(single.build(full.path))
    assert "largest difference 4.96e-05 (tolerance 0.0469)" in page and "4.9591064453125e-05" not in page


def _scored(tmp_path, name: str, *args: str) -> str:
    from probe.commands.score import main as score_main

    assert score_main(["--prompt", "What is greatest?", "--device", "cpu", "--no-progress", *args,
                       "--output", str(tmp_path / name)]) == 0
    (run,) = (tmp_path / name).glob("*/*_*")
    return str(run)


def _measured(page: str) -> dict[str, str]:
    """The 'what was measured' box(es) of a page: row name -> text (the last box's row where several share one)."""
    return {k: html.unescape(v) for k, v in re.findall(r"<tr><th>([^<]+)</th><td>([^<]*)</td></tr>", page)}


def test_judge_pages_name_the_reference_and_the_judge_prompt(tiny_dirs, tmp_path):
    """What changes a judge's numbers is on its page: the reference response, the judge prompt, its scale or labels
    (the provenance holds the prompt's whole text)."""
    import yaml

    pair = single.build(_scored(tmp_path, "pair", "--rm", tiny_dirs["lm"], "--score", "judge-pair", "--limit", "30",
                                "--reference-response", "Nothing, really."))
    rows = _measured(pair)
    assert rows["reference response"].startswith("'Nothing, really.': every response is compared with it")
    assert rows["judge prompt"].startswith("rewardbench-pair: the labels 'A' (the first response) and 'B' (the second)")
    assert "allenai/reward-bench" in rows["judge prompt"]
    five = tmp_path / "five.yaml"
    five.write_text(yaml.safe_dump({"kind": "rating", "source": "written for this test", "answer_prefix": "Rating: ",
                                    "user": "Rate it from 1 to 5.\nQ: {prompt}\nA: {response}", "ratings": [1, 5]}))
    for args, want in (([], "rewardbench2-rating-1to9: a rating from 1 to 9, each rating one token"),
                       (["--judge-prompt", str(five)], f"{five}: a rating from 1 to 5, each rating one token")):
        page = single.build(_scored(tmp_path, f"rating{len(args)}", "--rm", tiny_dirs["lm"], "--score", "rating",
                                    "--limit", "30", *args))
        assert _measured(page)["judge prompt"].startswith(want) and "reference response" not in _measured(page)
    assert html.escape(repr("Rate it from 1 to 5.\nQ: {prompt}\nA: {response}")) in page  # the provenance's text


def test_rewardbench_inputs_are_named_on_the_page_and_in_labels(tiny_dirs, tmp_path):
    """An --input-method rewardbench run's page says whose inputs it scored; a page of both routes labels them apart."""
    from probe.report import multi, responses

    base = ["--rm", tiny_dirs["rm"], "--limit", "40"]
    ids, rb = _scored(tmp_path, "ids", *base), _scored(tmp_path, "rb", *base, "--input-method", "rewardbench")
    own = "model card: tokenizer.apply_chat_template(conversation, tokenize=True)"
    assert _measured(single.build(ids))["input"].startswith(own)
    words = _measured(single.build(rb))["input"]
    assert words.startswith("RewardBench 0.1.4's inputs (--input-method rewardbench), not the family's own: "
                            "RewardBenchPipeline encodes the chat template's text with tokenizer(text)")
    assert f"The family's own: {own}" in words
    page = multi.build([ids, rb])
    assert "tiny-rm [reward]</h3>" in page and "tiny-rm [reward, RewardBench&#x27;s inputs]</h3>" in page
    assert " #1" not in page and " #2" not in page  # not told apart by number only
    answers = tmp_path / "answers.txt"
    answers.write_text("Love\nWar\n")
    runs = [_scored(tmp_path, f"r{i}", "--rm", tiny_dirs["rm"], "--responses", str(answers), *extra)
            for i, extra in enumerate(([], ["--input-method", "rewardbench"]))]
    page = responses.build(runs)
    assert "tiny-rm [reward]</h3>" in page and "tiny-rm [reward, RewardBench&#x27;s inputs]</h3>" in page
