"""The newest features as a user meets them (issue 34): every analysis on response runs, constant runs, a reference
model that cannot be one, tied ranks, the response report, the side-by-side page, honest interrupts and resumes, and
small texts. Each test runs the commands as a user does (the CLI's own entry points, real run folders)."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from probe.commands.analyze import main as analyze_main
from probe.commands.cli import main as cli_main
from probe.commands.report import main as report_main
from probe.commands.score import main as score_main

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", "nature and life", "peace", "I do not know what it is."]


def _one_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.fixture(scope="module")
def ref_pair(tiny_dirs, tmp_path_factory):
    """The tiny causal LM and a perturbed copy of it (a reference)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tests import tiny

    root = tmp_path_factory.mktemp("refpair")
    model = tiny.perturbed_copy(AutoModelForCausalLM.from_pretrained(tiny_dirs["lm"]), seed=3)
    model.save_pretrained(root / "ref")
    AutoTokenizer.from_pretrained(tiny_dirs["lm"]).save_pretrained(root / "ref")
    return tiny_dirs["lm"], str(root / "ref")


@pytest.fixture(scope="module")
def runs(tiny_dirs, ref_pair, tmp_path_factory):
    """Real run folders: two response runs (reward; implicit reward), two sweeps (one of the first 1,000 ids only),
    a --ref sweep and a social run."""
    root = tmp_path_factory.mktemp("runs")
    responses = root / "responses.txt"
    responses.write_text("\n".join(RESPONSES) + "\n")
    base = ["--prompt", PROMPT, "--device", "cpu", "--no-progress"]
    out = {}
    for name, args in (("resp_rm", ["--rm", tiny_dirs["rm"], "--allow-random-head", "--responses", str(responses)]),
                       ("resp_ref", ["--rm", ref_pair[0], "--ref", ref_pair[1], "--responses", str(responses)]),
                       ("sweep", ["--rm", tiny_dirs["rm"], "--allow-random-head"]),
                       ("sweep_part", ["--rm", tiny_dirs["lm"], "--score", "logprob", "--limit", "1000"])):
        assert score_main([*args, *base, "--output", str(root / name)]) == 0
        (out[name],) = [str(p) for p in (root / name).glob("*/*_*")]
    return out


# --- item 1: analyses on response runs; other kinds of run ----------------------------------------------------------
def test_top_and_agreement_read_response_runs(runs, tmp_path, capsys):
    assert analyze_main(["top", runs["resp_rm"], runs["resp_ref"], "--out", str(tmp_path / "top")]) == 0
    printed = capsys.readouterr().out
    assert "6 responses" in printed and "implicit vs ref" in printed and "all 6" in printed
    files = sorted(p.name for p in (tmp_path / "top").iterdir())
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files  # no spaces or brackets in file names
    table = pl.read_csv(next((tmp_path / "top").glob("tiny-rm*all.csv")))
    assert table.columns == ["rank", "response", "n_tokens", "score"] and table.height == 6
    # two runs of one model are told apart by their mode and number: brackets and spaces never reach a file name
    assert analyze_main(["top", runs["sweep"], runs["sweep"], "--top", "3", "--out", str(tmp_path / "twice")]) == 0
    names = sorted(p.name for p in (tmp_path / "twice").iterdir())
    assert len(names) > 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in names), names
    assert analyze_main(["agreement", runs["resp_rm"], runs["resp_ref"], "--out", str(tmp_path / "ag")]) == 0
    summary = json.loads((tmp_path / "ag" / "agreement.json").read_text())
    (entry,) = summary.values()
    assert entry["n_strings"] == 6  # the same six responses, matched by their text
    # against the runs' own scores: Kendall tau-b of the two score columns
    from scipy import stats

    a, b = (pl.read_parquet(Path(runs[k]) / "scores.parquet").sort("response")["score"].to_numpy()
            for k in ("resp_rm", "resp_ref"))
    m1, m2 = entry["models"]
    assert entry["kendall_tau_b"][m1][m2] == pytest.approx(stats.kendalltau(a, b).statistic, abs=1e-6)


@pytest.mark.parametrize("analysis", ["framing", "exposure"])
def test_slopes_on_response_runs_without_rated_words_are_one_line(runs, tmp_path, capsys, analysis):
    out = tmp_path / analysis
    assert analyze_main([analysis, runs["resp_rm"], "--out", str(out)]) == 2
    assert "one-word responses only" in _one_line(capsys) and not out.exists()  # no empty folder left


def test_social_and_gcg_runs_are_named_not_a_traceback(tiny_dirs, social_data, tmp_path, capsys):
    from probe.commands.social import main as social_main

    assert social_main(["--rm", tiny_dirs["rm"], "--allow-random-head", "--dataset", "crows_pairs", "--data",
                        str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv"), "--limit", "3", "--device",
                        "cpu", "--no-progress", "--output", str(tmp_path / "s")]) == 0
    (social,) = list((tmp_path / "s").glob("*/social_*"))
    capsys.readouterr()
    assert analyze_main(["top", str(social), "--out", str(tmp_path / "a")]) == 2
    line = _one_line(capsys)
    assert "social-benchmark run" in line and "summary.json" in line and "result.json" not in line
    assert report_main([str(social)]) == 2
    line = _one_line(capsys)
    assert "social-benchmark run" in line and "result.json" not in line


# --- item 2: a constant run in agreement ----------------------------------------------------------------------------
def test_agreement_with_a_constant_run_is_one_line(runs, tmp_path, capsys):
    import shutil

    const = tmp_path / "const"
    shutil.copytree(runs["sweep"], const)
    df = pl.read_parquet(const / "scores.parquet").with_columns(pl.lit(0.0, dtype=pl.Float32).alias("score"),
                                                              pl.lit(1, dtype=pl.UInt32).alias("rank"))
    df.write_parquet(const / "scores.parquet")
    out = tmp_path / "ag"
    assert analyze_main(["agreement", runs["sweep"], str(const), runs["sweep_part"], "--out", str(out)]) == 2
    assert "every score is the same" in _one_line(capsys) and not out.exists()


# --- items 3 and 4: references that cannot be one; tied ranks ------------------------------------------------------
def test_reference_of_another_vocabulary_is_refused_without_converting_a_packaged_model(tiny_dirs, monkeypatch,
                                                                                        capsys, tmp_path):
    """--ref against the packaged SmolLM2: the refusal reads the GGUF's tokenizer only (the model's conversion is
    never called), and its examples are escaped (no raw control characters)."""
    from probe.models import embedded

    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "_convert", lambda *a: pytest.fail("the packaged model was converted"))
    assert score_main(["--rm", tiny_dirs["lm"], "--ref", "smollm2", "--prompt", PROMPT, "--device", "cpu",
                       "--output", str(tmp_path / "o")]) == 2
    line = _one_line(capsys)
    assert "its tokenizer is not the model's" in line and line.isprintable()
    assert list((tmp_path / "cache").glob("*-tokenizer"))  # the tokenizer alone, cached


def test_reference_equal_to_the_model_is_refused(tiny_dirs, tmp_path, capsys):
    assert score_main(["--rm", tiny_dirs["lm"], "--ref", tiny_dirs["lm"], "--prompt", PROMPT, "--device", "cpu",
                       "--output", str(tmp_path)]) == 2
    assert "is the model itself" in _one_line(capsys) and not list(tmp_path.rglob("meta.json"))


def test_tied_scores_share_their_rank_in_both_tables():
    from tests.fake_runs import fake_vocab
    from probe.report.text import format_top_bottom

    tokens = [" love", " peace", " war", "xq", " music", " hate"]
    vocab = fake_vocab(tokens)
    df = vocab.with_columns(pl.Series("score", [1.0, 1.0, 0.5, 0.5, 0.0, 0.0], dtype=pl.Float32),
                            pl.lit("p").alias("prompt_key"))
    df = df.with_columns(pl.col("score").rank("min", descending=True).cast(pl.UInt32).alias("rank"))
    text = format_top_bottom(df, "p", "q?", {"model": {"id": "m"}, "score": {"mode": "reward"}}, 6)
    def ranks(token: str, side: int) -> set[str]:  # side 0: all tokens (left), 1: words only (right)
        cells = [(ln[:64], ln[64:])[side] for ln in text.splitlines() if len(ln) > (64 if side else 0)]
        return {c.split()[0] for c in cells if f"'{token}'" in c}

    assert ranks(" love", 0) == ranks(" peace", 0) == {"1"}  # tied: one rank, 1, in both tables
    assert ranks(" love", 1) == ranks(" peace", 1) == {"1"}
    # 6 tokens and 5 words, fewer than twice 6: each side shows half of them (3 tokens, 2 words), none twice
    assert ranks(" war", 0) == ranks("xq", 0) == {"3"} and ranks(" war", 1) == set()  # tied at 3: one each side
    assert ranks(" hate", 0) == {"5"} and ranks(" hate", 1) == {"4"}  # words: love, peace, war (1, 1, 3), then 4


# --- items 5 and 6: the response run's header and report ------------------------------------------------------------
def test_response_run_of_an_implicit_reward_says_so_and_its_report_explains_it(runs, capsys):
    from probe.commands.responses import print_response_summary
    from probe.runs.rundir import RunDir

    print_response_summary(RunDir(runs["resp_ref"]), 20)
    out = capsys.readouterr().out
    assert "implicit vs ref" in out and ", logprob," not in out
    assert "all 6" in out and "best 20" not in out  # few responses: one table, not two that repeat
    assert report_main([runs["resp_ref"], runs["resp_rm"], "--out", str(Path(runs["resp_ref"]) / "both.html")]) == 0
    page = (Path(runs["resp_ref"]) / "both.html").read_text()
    assert "What was measured" in page and "implicit reward against" in page
    assert "an implicit reward sums a log-ratio" in page and "no term per token" in page
    assert "Score against length in tokens: Spearman" in page and page.count("data:image/png;base64,") == 1
    assert page.count("all 6, best first") == 2 and "<b>worst</b>" not in page
    # the findings' Spearman is the run's own, recomputed here
    from scipy import stats

    df = pl.read_parquet(Path(runs["resp_ref"]) / "scores.parquet")
    rho = stats.spearmanr(df["n_tokens"].to_numpy(), df["score"].to_numpy()).statistic
    from probe.analysis.stats import rank_correlation_interval

    lo, hi = rank_correlation_interval(rho, 6, "spearman")  # n and the interval beside it (issue 64)
    assert f"Spearman {rho:+.2f} (95% interval {lo:+.2f} to {hi:+.2f}, Fisher z) over 6 responses" in page
    assert "6 responses are too few to say how much of this order is length" in page


def test_summed_logprob_report_says_it_favours_short_responses():
    from probe.report.audit import length_words

    assert "favours short responses" in length_words({"score": {"mode": "logprob", "reduce": "sum"}})
    assert "mean log-probability" in length_words({"score": {"mode": "logprob", "reduce": "mean"}})


# --- item 7: the side-by-side page -----------------------------------------------------------------------------------
def test_side_by_side_page_warns_of_other_id_ranges_and_rounds(runs, tmp_path):
    from probe.report import multi

    page = multi.build([runs["sweep"], runs["sweep_part"]], 5)
    assert "The runs cover different token ids" in page and "part of its vocabulary" in page
    assert "a blank cell: that model's run has no token" in page
    slopes = re.findall(r"<table id='slopes-[^']*'>(.*?)</table>", page)[0]
    assert not re.search(r"\d\.\d{6,}", slopes)  # no 16-digit estimates beside rounded intervals
    assert not multi.coverage_warnings(*_same_runs(runs))


def _same_runs(runs):
    from probe.analysis.sweeps import load_sweep, run_labels

    sweeps = [load_sweep(runs["sweep"]), load_sweep(runs["sweep"])]
    return sweeps, [s.prompt(next(iter(s.prompts))) for s in sweeps], run_labels(sweeps)


def test_heatmap_title_is_whole_and_its_numbers_readable(monkeypatch):
    """The title wraps instead of being cut; numbers on the dark ends of the scale are white."""
    import matplotlib.axes

    from probe.report.multi import heatmap_png

    seen = {"texts": [], "title": None}
    real_text, real_title = matplotlib.axes.Axes.text, matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "text", lambda self, x, y, s, **k: (
        seen["texts"].append((s, k.get("color"))), real_text(self, x, y, s, **k))[1])
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda self, t, **k: (
        seen.__setitem__("title", t), real_title(self, t, **k))[1])
    title = "greatest: Kendall tau-b over 885 shared strings of two tokenizers"
    heatmap_png(np.array([[1.0, 0.1], [0.1, 1.0]]), ["a", "b"], title)
    assert seen["title"].replace("\n", " ") == title and "\n" in seen["title"]
    assert ("1.00", "white") in seen["texts"] and ("0.10", "black") in seen["texts"]


# --- item 8: interrupt and resume -----------------------------------------------------------------------------------
def _sweep_args(tiny_dirs, out):
    return ["score", "--rm", tiny_dirs["rm"], "--allow-random-head", "--prompt", PROMPT, "--device", "cpu",
            "--no-progress", "--shard-size", "200", "--output", str(out)]


def _stop_at(monkeypatch, n: int, how):
    """Make the n-th shard write stop the run (before writing it)."""
    from probe.runs.rundir import RunDir

    real, calls = RunDir.write_shard, {"n": 0}

    def write(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == n:
            how()
        return real(self, *a, **k)

    monkeypatch.setattr(RunDir, "write_shard", write)


def _raise_interrupt():
    raise KeyboardInterrupt


@pytest.mark.parametrize("stop,code,word", [(_raise_interrupt, 130, "interrupted"),
                                            (lambda: os.kill(os.getpid(), signal.SIGTERM), 143, "terminated")])
def test_an_interrupt_says_what_it_kept_and_resume_says_what_is_left(tiny_dirs, tmp_path, monkeypatch, capsys, stop,
                                                                      code, word):
    _stop_at(monkeypatch, 4, stop)  # three shards finished
    assert cli_main(_sweep_args(tiny_dirs, tmp_path)) == code
    err = capsys.readouterr().err
    assert f"{word}: 3 finished checkpoint file(s) are saved" in err and "--resume" in err
    (run,) = list(tmp_path.glob("*/exhaustive_*"))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] == word and meta["interruptions"][-1]["how"] == word
    monkeypatch.undo()
    assert cli_main([*_sweep_args(tiny_dirs, tmp_path), "--resume"]) == 0
    err = capsys.readouterr().err
    n = json.loads((run / "meta.json").read_text())["settings"]["n_tokens"]
    per = -(-n // 200)
    assert f"3 of {per} shards kept; {n - 600:,} token scores left" in err
    assert json.loads((run / "meta.json").read_text())["status"] == "complete"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))


def test_an_interrupt_before_any_shard_says_nothing_is_kept(tiny_dirs, tmp_path, monkeypatch, capsys):
    _stop_at(monkeypatch, 1, _raise_interrupt)
    assert cli_main(_sweep_args(tiny_dirs, tmp_path)) == 130
    err = capsys.readouterr().err
    assert "no part of" in err and "nothing is kept" in err and "finished shards are saved" not in err


# --- item 10: small texts -------------------------------------------------------------------------------------------
def test_byte_fragments_in_a_sequence_are_shown_as_bytes(tmp_path):
    from probe.report.text import shown_ids
    from tests import real_tokenizers

    tok = real_tokenizers.load("llama3.1", tmp_path / "tok")
    vocab = tok.get_vocab()
    frag = vocab["\u0135"]  # a byte-level piece for byte 0x93, not a character on its own
    word = tok.encode("Love", add_special_tokens=False)
    assert "\ufffd" in tok.decode([*word, frag])
    assert shown_ids(tok, [*word, frag]) == "Love<0x93>"
    assert shown_ids(tok, word) == "Love"


def test_a_folder_that_is_not_a_run_is_one_plain_line(tmp_path, capsys):
    """No Python errno or exception text: a missing folder, a folder without meta.json, a damaged meta.json."""
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "meta.json").write_text("{bad")
    for folder, said in ((tmp_path / "missing", "no such run folder"), (tmp_path, "not a run folder"),
                         (damaged, "meta.json is not valid JSON (line 1, column 2")):
        for command in (lambda f: report_main([str(f)]), lambda f: analyze_main(["top", str(f), "--out",
                                                                                  str(tmp_path / "o")])):
            assert command(folder) == 2
            line = _one_line(capsys)
            assert said in line and "Errno" not in line, line
