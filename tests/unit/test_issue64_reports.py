"""Issue 64 (a new user's third hour): analyses over few items say so, and reports read as a person would write
them. Each test failed on the tree before its fix."""

import json

import polars as pl
import pytest

from probe.analysis.misalignment import ELO_TABLE_PROMPTS
from tests.fake_runs import hashed_score, write_fake_response_run, write_fake_run


def _elo_table(path, names):
    pl.DataFrame({"elo_rank": range(1, len(names) + 1), "elo_score": [2000.0 - 10 * i for i in range(len(names))],
                  "name": names, "elo_matches": [5] * len(names),
                  "paper/RM": [float(-i) for i in range(len(names))]}).write_csv(path)


def test_misalignment_over_few_items_says_n_the_interval_and_the_prompt(tmp_path, capsys):
    """A 5-response run of which 2 are items of the table: tau 1.0 "on 2 of 7,530 items" was printed without a word
    about n = 2, nor about the run's prompt not being the table's."""
    from probe.commands.analyze import main as analyze

    names = [f"item {i}" for i in range(40)]
    _elo_table(tmp_path / "elo_greatest_ever.csv", names)
    responses = ["item 0", "item 1", "x", "y", "z"]
    other = write_fake_response_run(tmp_path / "runs", "org/lm", responses, {"p": "What is best?"},
                                    lambda k, r: -float(responses.index(r)))
    assert analyze(["misalignment", str(other.path), "--table", str(tmp_path / "elo_greatest_ever.csv"),
                    "--out", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr()
    summary = json.loads((tmp_path / "a" / "misalignment.json").read_text())
    assert summary["n_items"] == 2 and summary["kendall_tau_human"] == {"lm": 1.0}
    assert summary["kendall_tau_human_interval"] == {"lm": None} and "Fisher-z" in summary["interval"]
    assert "only 2 item(s)" in printed.err and "too few for an interval" in printed.err
    assert f"not under the prompt of elo_greatest_ever.csv ({ELO_TABLE_PROMPTS['elo_greatest_ever']!r}" in printed.err
    assert summary["human"] == "the column 'elo_score' of elo_greatest_ever.csv"
    # the table's own prompt, every item: no prompt warning, an interval that says how sure tau is
    full = write_fake_response_run(tmp_path / "runs", "org/lm2", names,
                                   {"p": ELO_TABLE_PROMPTS["elo_greatest_ever"]})
    assert analyze(["misalignment", str(full.path), "--table", str(tmp_path / "elo_greatest_ever.csv"),
                    "--out", str(tmp_path / "b")]) == 0
    printed = capsys.readouterr()
    summary = json.loads((tmp_path / "b" / "misalignment.json").read_text())
    import math

    tau = summary["kendall_tau_human"]["lm2"]
    lo, hi = summary["kendall_tau_human_interval"]["lm2"]
    half = 1.959963984540054 * math.sqrt(0.437 / (40 - 4))
    assert math.isclose(lo, math.tanh(math.atanh(tau) - half), rel_tol=1e-12)
    assert math.isclose(hi, math.tanh(math.atanh(tau) + half), rel_tol=1e-12)
    assert "warning" not in printed.err and summary["warnings"] == []


def test_misalignment_without_a_table_names_the_lexicon_it_used(tmp_path, capsys):
    """Without --table the summary said "human": "elo_score" (the --table default) while AFINN was used."""
    from probe.commands.analyze import main as analyze

    words = ["love", "hate", "good", "bad", "happy", "sad", "peace", "war", "joy", "pain", "nice", "awful"]
    run = write_fake_run(tmp_path / "runs", "org/rm", words, {"greatest": "What is the greatest thing ever?"})
    assert analyze(["misalignment", str(run.path), "--out", str(tmp_path / "m")]) == 0
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["summary"]["human"] == "AFINN-111 valence (--valence afinn111)"
    assert summary["config"]["human"] is None and "elo_score" not in json.dumps(summary)
    assert "only 12 item(s)" in capsys.readouterr().err


def test_contrast_over_few_strings_keeps_top_and_bottom_apart():
    """On 5 strings the top-100 and bottom-100 sets were both all 5: two reversed rankings had a top overlap of 1.00.
    Now k is at most half the strings, and the JSON gives each correlation's interval."""
    import numpy as np

    from probe.analysis.contrast import contrast
    from tests.fake_runs import fake_vocab

    v = fake_vocab([f"w{i}" for i in range(5)])
    a = v.with_columns(pl.Series("score", np.arange(5.0)))
    b = v.with_columns(pl.Series("score", -np.arange(5.0)))
    res = contrast(a, b, k=100)
    assert res.k == 2 and res.top_overlap == 0.0 and res.bottom_overlap == 0.0
    js = res.to_json()
    one = pytest.approx([-1.0, -1.0], abs=1e-12)  # scipy's -1 is -1 + 1 ulp; tanh brings the interval back to it
    assert res.kendall == pytest.approx(-1.0, abs=1e-15) and js["kendall_tau_b_interval"] == one
    assert js["spearman_interval"] == one


def _responses(n):
    """n responses of 1..n tokens whose summed log-probability falls with length (rank 1 = the shortest)."""
    return pl.DataFrame({"prompt_key": ["p"] * n, "response": [" ".join(["w"] * (i + 1)) for i in range(n)],
                         "n_tokens": list(range(1, n + 1)), "score": [-float(i) for i in range(1, n + 1)],
                         "rank": list(range(1, n + 1))})


def test_response_findings_on_five_responses_neither_overlap_nor_claim_length():
    """On 5 responses the best 3 and the worst 3 shared one, and "Much of this order is length" was said from
    n = 5; now one list, said so, and n with the interval (or too few)."""
    from probe.report.audit import response_findings

    meta = {"score": {"mode": "logprob", "reduce": "sum"}}
    lines = response_findings(_responses(5), meta)
    assert lines[0] == ("All 5 responses, best first: 'w', 'w w', 'w w w', 'w w w w', 'w w w w w' (too few for "
                        "separate most preferred and least preferred lists).")
    assert not any("Much of this order is length" in x for x in lines)
    assert "Spearman -1.00 (95% interval -1.00 to -1.00, Fisher z) over 5 responses" in lines[1]
    assert lines[2].startswith("5 responses are too few to say how much of this order is length")
    many = response_findings(_responses(40), meta)
    assert many[0].startswith("Most preferred: 'w', 'w w', 'w w w'; least preferred: ")
    assert "Much of this order is length: a summed log-probability falls with every token." in many


def test_sweep_findings_on_few_words_never_list_a_word_as_both_best_and_worst():
    from probe.report.audit import findings
    from tests.fake_runs import fake_vocab

    v = fake_vocab(["love", "war", "peace", "zzq", "xq"])
    df = v.with_columns(pl.Series("score", [5.0, 4.0, 3.0, 2.0, 1.0]), pl.Series("rank", [1, 2, 3, 4, 5]))
    lines = findings(df, {}, "p")
    assert lines[0] == ("All 3 English words, best first: 'love', 'war', 'peace' (too few for separate optimal "
                        "responses (english words) and pessimal lists).")
    assert lines[1].startswith("All 5 tokens, best first: ")


def test_a_judge_runs_length_row_describes_the_judge():
    from probe.report.audit import length_words

    for mode in ("rating", "judge-pair"):
        text = length_words({"score": {"mode": mode}})
        assert "reward head" not in text and "judge" in text, mode
    pair_rm = length_words({"score": {"mode": "reward"}, "model": {"pairwise": "pairrm", "reference_response": "x"}})
    assert "reward head" not in pair_rm and "reference response" in pair_rm


def test_tables_print_every_column_without_polars_furniture(tmp_path, capsys):
    """The social, framing, exposure and agreement tables were raw polars prints: "shape: (1, 17)", a dtype row, and
    columns hidden behind "…" past the terminal's width. Now a header, a rule and every column."""
    from probe.commands.analyze import main as analyze
    from probe.commands.social import print_tables

    wide = pl.DataFrame({"domain": ["bias"], "dataset": ["bbq"], **{f"metric_{i}": [i / 7] for i in range(16)}})
    print_tables(wide)
    out = capsys.readouterr().out
    assert "shape:" not in out and "…" not in out and "str" not in out.split("\n")[3]
    header = out.splitlines()[2]
    assert header.split() == ["dataset", *[f"metric_{i}" for i in range(16)]]
    words = ["love", "hate", "good", "bad", "happy", "sad", "peace", "war", "joy", "pain", "nice", "awful",
             "great", "terrible", "kind", "cruel", "hope", "fear", "win", "lose"]
    runs = [str(write_fake_run(tmp_path / "runs", f"org/m{i}", words, {"greatest": "What is the greatest?"},
                               lambda k, t, i=i: hashed_score(f"{k}{i}", t)).path) for i in range(2)]
    printed = {}
    for analysis, extra in (("framing", runs[:1]), ("exposure", runs[:1]), ("agreement", runs)):
        assert analyze([analysis, *extra, "--out", str(tmp_path / analysis), "--permutations", "10"]) == 0
        printed[analysis] = capsys.readouterr().out
        assert "shape:" not in printed[analysis] and "┆" not in printed[analysis], analysis
    for analysis in ("framing", "exposure"):  # every column of the CSV in the printed header
        columns = pl.read_csv(tmp_path / analysis / f"{analysis}.csv").columns
        assert printed[analysis].splitlines()[0].split() == columns, analysis


def test_plain_table_cells():
    from probe.report.text import plain_table

    text = plain_table([{"model": "a/b", "estimate": 0.123456, "n": 1200, "ci": None, "ok": True},
                        {"model": "c", "estimate": -2e-05, "n": 3, "ci": "x", "ok": False}])
    assert text.splitlines() == ["model   estimate      n  ci  ok",
                                 "-----  ---------  -----  --  ---",
                                 "a/b        0.123  1,200  -   yes",
                                 "c      -2.00e-05      3  x   no"]


def test_the_terminal_tables_of_a_small_run_never_list_a_token_as_both_best_and_worst():
    """A --limit 10 run printed best 20 and worst 20 of the same 10 tokens; now each side shows half of them."""
    from probe.core.prompts import Prompt
    from probe.core.sweep import ranked_table
    from probe.report.text import format_top_bottom
    from tests.fake_runs import fake_vocab

    import numpy as np

    tokens = ["love", "war", "peace", "joy", "zzq", "xq", "hate", "good", "qq", "bad"]
    vocab = fake_vocab(tokens)
    df = ranked_table(Prompt("p", "What?"), np.arange(10), np.arange(10, 0, -1).astype(np.float32), vocab)
    text = format_top_bottom(df, "p", "What?", {"model": {"id": "m"}, "score": {"mode": "reward"}}, 20)
    assert "best 5 of 10 (all tokens)" in text and "worst 5 of 10 (all tokens)" in text
    best, worst = text.split("worst 5 of 10")
    for token in tokens:
        assert (repr(token) in best) + (repr(token) in worst) == 1, token


def test_agreement_over_few_shared_strings_says_so(tmp_path, capsys):
    from probe.commands.analyze import main as analyze

    words = ["love", "hate", "good", "bad", "joy"]
    runs = [str(write_fake_run(tmp_path / "runs", f"org/m{i}", words, {"greatest": "What is the greatest?"},
                               lambda k, t, i=i: hashed_score(f"{k}{i}", t)).path) for i in range(2)]
    assert analyze(["agreement", *runs, "--out", str(tmp_path / "a"), "--permutations", "10"]) == 0
    assert "warning: greatest: only 5 strings shared by all runs" in capsys.readouterr().err
