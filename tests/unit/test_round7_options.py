"""Options at values the tests never used (issue 74): a boolean where a number belongs, --top at its edges, an
odd-sized small sweep, exactly two responses, the terminal tables' cells, the W flag of a response, the dry run's
figures for one prompt, a figure's table with empty cells, and MKL's mode in a process that ran torch first."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import polars as pl
import pytest

from probe.commands.cli import main as cli
from tests.fake_runs import fake_vocab, write_fake_response_run, write_fake_run


def _one_line(err: str) -> str:
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err.strip()


# --- a boolean where a number belongs ------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, text, setting", [
    (("score", "--rm", "smollm2", "--dry-run"), "beta: true\n", "beta"),
    (("score", "--rm", "smollm2", "--dry-run"), "device_memory: false\n", "device_memory"),
    (("analyze", "top", "x"), "rbo_p: true\n", "rbo_p"),
])
def test_a_switch_value_where_a_number_belongs_is_refused(capsys, tmp_path, argv, text, setting):
    """YAML's true is Python's True, which is 1 (and false 0): ``beta: true`` ran as --beta 1 and
    ``device_memory: false`` as 0 GiB; refused in one line naming the file and the setting, as --beta true is."""
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    assert cli([*argv, "--config", str(path)]) == 2
    err = _one_line(capsys.readouterr().err)
    assert str(path) in err and f"{setting}: {text.split(': ')[1].strip()} is not a number" in err


def test_a_switch_value_where_a_number_belongs_in_a_job_file_and_a_suite(tmp_path, capsys):
    from probe.commands.batch import read_jobs
    from probe.errors import DataFormatError

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text("defaults:\n  beta: true\nmodels:\n  - rm: smollm2\n")
    with pytest.raises(DataFormatError, match=r"defaults: beta: true is not a number"):
        read_jobs(jobs)
    suite = tmp_path / "suite.yaml"
    suite.write_text("models:\n  - rm: smollm2\n    beta: false\ndatasets:\n  - dataset: crows_pairs\n")
    assert cli(["social", "--suite", str(suite), "--output", str(tmp_path / "out")]) == 2
    assert re.search(r"models\[1\]: beta: false is not a number", _one_line(capsys.readouterr().err))


# --- --top at its edges --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [("score", "--dry-run", "--top", "0"), ("analyze", "top", "x", "--top", "0"),
                                  ("analyze", "misalignment", "x", "--top", "0")])
def test_top_0_is_refused(capsys, argv):
    assert cli(list(argv)) == 2
    assert "--top must be >= 1" in _one_line(capsys.readouterr().err)


def test_top_1_lists_one_token_and_one_word_a_side(tmp_path, capsys):
    """--top 1: one best and one worst token, never the same, in the terminal and in the files; the summary's
    lists as long."""
    tokens = ["love", "war", "peace", "zzq", "xq", "joy", "qq"]
    run = write_fake_run(tmp_path / "runs", "org/rm", tokens, {"p": "What?"},
                         lambda k, t: float(-tokens.index(t)))
    assert cli(["analyze", "top", str(run.path), "--top", "1", "--out", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "best 1 (all tokens)" in out and "worst 1 (all tokens)" in out and "best 1 (words only)" in out
    files = {p.name.split("__")[-1]: pl.read_csv(p)["decoded"].to_list() for p in (tmp_path / "a").glob("*__p__*.csv")}
    assert files == {"best.csv": ["love"], "worst.csv": ["qq"], "best_words.csv": ["love"],
                     "worst_words.csv": ["joy"]}
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())["summary"]
    (entry,) = summary.values()
    assert entry["best"] == ["love"] and entry["worst"] == ["qq"] and entry["per_side"] == 1


def test_misalignment_top_1_lists_one_item_a_side(tmp_path, capsys):
    from tests.unit.test_round7_stats import TABLE

    (tmp_path / "t.csv").write_text(TABLE)
    assert cli(["analyze", "misalignment", "--table", str(tmp_path / "t.csv"), "--top", "1",
                "--out", str(tmp_path / "o")]) == 0
    summary = json.loads((tmp_path / "o" / "misalignment.json").read_text())
    items = pl.read_csv(tmp_path / "o" / "items.csv")
    assert summary["most_undervalued"] == [items.sort("rank_diff", descending=True, maintain_order=True)["name"][0]]
    assert summary["most_overvalued"] == [items.sort("rank_diff", maintain_order=True)["name"][0]]
    printed = capsys.readouterr().out
    assert re.search(r"most undervalued \(1 of the \d+ items? models rank below humans", printed)


# --- an odd-sized small sweep, exactly two responses -----------------------------------------------------------------
def _table(tokens, scores):
    from probe.core.prompts import Prompt
    from probe.core.sweep import ranked_table

    return ranked_table(Prompt("p", "What?"), np.arange(len(tokens)), np.asarray(scores, np.float32),
                        fake_vocab(tokens))


def test_the_terminal_tables_of_an_odd_sized_sweep_leave_the_middle_token_out():
    """5 tokens (3 of them words) at --top 20: best 2 of 5 and worst 2 of 5, the middle token in neither; words
    best 1 of 3 and worst 1 of 3; at --top 1 the sides are 1 and 1 and say no "of"."""
    from probe.report.text import format_top_bottom

    tokens = ["love", "zzq", "war", "xq", "peace"]
    df = _table(tokens, [5, 4, 3, 2, 1])
    meta = {"model": {"id": "m"}, "score": {"mode": "reward"}}
    text = format_top_bottom(df, "p", "What?", meta, 20)
    best, worst = text.split("worst 2 of 5 (all tokens)")
    assert "best 2 of 5 (all tokens)" in best and "best 1 of 3 (words only)" in best
    assert "worst 1 of 3 (words only)" in worst
    shown = lambda part, t: f"'{t}'" in part  # noqa: E731
    assert [shown(best, t) for t in tokens] == [True, True, False, False, False]
    assert [shown(worst, t) for t in tokens] == [False, False, False, True, True]
    assert "'war'" not in text
    one = format_top_bottom(df, "p", "What?", meta, 1)
    assert "best 1 (all tokens)" in one and "worst 1 (all tokens)" in one and "best 1 of" not in one
    b1, w1 = one.split("worst 1 (all tokens)")
    assert shown(b1, "love") and not shown(b1, "peace") and shown(w1, "peace") and not shown(w1, "love")


def test_exactly_two_responses_print_once_at_any_top(tmp_path, capsys):
    """Two responses: at --top 1 one table of both ("all 2"), neither listed twice; three at --top 1: best 1 and
    worst 1, different responses."""
    from probe.commands.responses import print_response_summary
    from probe.runs.rundir import RunDir

    for responses, top, titles in ((["yes", "no"], 1, ["all 2"]), (["yes", "no"], 20, ["all 2"]),
                                   (["yes", "no", "maybe"], 1, ["best 1", "worst 1"])):
        run = write_fake_response_run(tmp_path / f"r{len(responses)}{top}", "org/m", responses, {"p": "Q?"},
                                      lambda k, r: -float(len(r)))
        meta = run.read_meta()
        meta["timing"] = {"score_s": 1.0, "responses_per_s": 2.0}
        run.write_meta(meta)
        print_response_summary(RunDir(run.path), top)
        out = capsys.readouterr().out
        assert [line for line in out.splitlines() if line in titles or line.startswith(("best", "worst", "all"))] \
            == titles, out
        shown = {r: out.count(repr(r)) for r in responses}  # scored -len: "no" best, then "yes", "maybe"
        assert shown == ({"yes": 1, "no": 1} if len(responses) == 2 else {"no": 1, "yes": 0, "maybe": 1}), out


# --- the terminal's tables ------------------------------------------------------------------------------------------
def test_plain_table_cells_at_their_edges():
    """A float shows in fixed notation down to 10^-digits (0.001 at 3 digits), below it in scientific notation;
    NaN as nan, None as "-", bools as yes/no, ints with separators; a number column with an empty cell is still
    right-aligned, a column of empty cells and a text column left-aligned."""
    from probe.report.text import plain_table

    rows = [{"x": 0.001, "y": None, "n": 12345, "t": "ab", "e": None},
            {"x": 0.00099, "y": 1.5, "n": 7, "t": "c", "e": None},
            {"x": -0.001, "y": float("nan"), "n": -3, "t": "longer text", "e": None},
            {"x": 0.0, "y": 2e-7, "n": 0, "t": "d\ne", "e": None}]
    assert plain_table(rows).splitlines() == [
        "       x         y       n  t            e",
        "--------  --------  ------  -----------  -",
        "   0.001         -  12,345  ab           -",
        "9.90e-04     1.500       7  c            -",
        "  -0.001       nan      -3  longer text  -",
        "   0.000  2.00e-07       0  d e          -"]
    assert plain_table([{"v": 0.01}, {"v": 0.0099}], digits=2).splitlines()[2:] == ["   0.01", "9.9e-03"]
    assert plain_table(pl.DataFrame({"ok": [True, False]})).splitlines()[2:] == ["yes", "no"]


# --- the W flag -----------------------------------------------------------------------------------------------------
def test_a_one_word_response_is_a_word_whatever_white_space_surrounds_it():
    """A response run's W flag: one English word, read without the white space around it (" love " is the word
    love), never two words, a word with a full stop, or a fragment."""
    from probe.analysis.sweeps import response_rows

    responses = [" love ", "love", "Love\n", "love it", "love.", "xq", "peace"]
    df = pl.DataFrame({"prompt_key": ["p"] * 7, "response": responses, "n_tokens": [1] * 7,
                       "score": [float(i) for i in range(7)], "rank": list(range(7, 0, -1))})
    flags = dict(zip(responses, response_rows(df)["is_word"].to_list()))
    assert flags == {" love ": True, "love": True, "Love\n": True, "love it": False, "love.": False, "xq": False,
                     "peace": True}


def test_findings_without_an_english_word_say_so():
    from probe.report.audit import findings

    df = _table(["zzq", "xq", "qq", "#"], [4, 3, 2, 1])
    lines = findings(df, {}, "p")
    assert lines[0] == "No token is an English word (the W flag): no optimal or pessimal words."
    assert lines[1].startswith("All 4 tokens, best first: 'zzq', 'xq', 'qq', '#'")


# --- --dry-run's plan -----------------------------------------------------------------------------------------------
def test_the_dry_runs_work_per_prompt_is_one_prompts_whatever_the_run_holds():
    """"one prompt over V tokens" divided the run's work by 3 (the paper's prompts) whatever the run held: a run of
    one --prompt was said to cost a third of its one prompt."""
    import torch

    from probe.models.dryrun import describe, plan

    for n in (1, 2, 3):
        p = plan("smollm2", torch.float32, 8.0, "logprob", n_prompts=n, device_type="cpu")
        per_prompt = float(re.search(r"one prompt over [\d,]+ tokens: ([\d.]+) PFLOP", describe(p)).group(1))
        assert p["sweep_flops"] % n == 0 and p["n_prompts"] == n
        assert per_prompt == round(p["sweep_flops"] / n / 1e15, 2) and per_prompt > 0, n
    one, three = (plan("smollm2", torch.float32, 8.0, "logprob", n_prompts=n, device_type="cpu")["sweep_flops"]
                  for n in (1, 3))
    assert three == 3 * one


def test_the_dry_run_of_prompts_of_two_shapes_takes_the_larger_row_and_the_smaller_batch(monkeypatch):
    """Two prompts whose rows differ: the plan's row is the longer one's and its batch the smaller one's, so that
    the one batch size fits both; the memory given (--device-memory) bounds it."""
    from probe.config import ScoreVocabConfig
    from probe.models import dryrun

    long = "What, in one word, is the greatest thing ever, and why would anyone say so? " * 8
    config = ScoreVocabConfig(prompt=("Hi?", long), dry_run=True, device="cuda", device_memory=0.5)
    p = dryrun.plan_for_config(config)
    rows = {tuple(r["prompts"]): r for r in p["rows"]}
    short_row, long_row = rows[("prompt1",)], rows[("prompt2",)]
    assert long_row["prefix_tokens"] > short_row["prefix_tokens"]
    assert p["bytes_per_row"] == long_row["bytes_per_row"] > short_row["bytes_per_row"]
    alone = [dryrun.plan_for_config(ScoreVocabConfig(prompt=(t,), dry_run=True, device="cuda", device_memory=0.5))
             for t in ("Hi?", long)]
    assert p["batch_size"] == min(a["batch_size"] for a in alone) and alone[0]["batch_size"] > alone[1]["batch_size"]


# --- a figure's inputs ----------------------------------------------------------------------------------------------
def test_figure_2_of_a_table_with_empty_cells_ranks_the_items_every_model_scored(tmp_path):
    """An item table with empty cells (a user's --elo-data): figure 2's tau-b are over the items every model
    scored, as misalignment and figure 5 count them; it raised LinAlgError (NaN tau into the MDS)."""
    from scipy import stats as sps

    from experiments import fig2_agreement

    table = tmp_path / "elo_greatest_ever.csv"
    table.write_text("elo_rank,elo_score,name,elo_matches,org/a,org/b,org/c\n1,2000,a,5,3.0,1.0,2\n"
                     "2,1990,b,5,,2.0,1\n3,1980,c,5,2.0,,0\n4,1970,d,5,1.0,0.5,3\n5,1960,e,5,0.5,3.0,-1\n"
                     "6,1950,f,5,0.2,0.1,5\n7,1940,g,5,0.1,0.2,4\n")
    out = fig2_agreement.main(fig2_agreement.Fig2Config(table=str(table), out=str(tmp_path / "f"), permutations=10))
    complete = pl.read_csv(table).drop_nulls()
    assert out["n_items"] == complete.height == 5
    tau = np.array(out["kendall_tau_b"])
    assert tau[0, 1] == pytest.approx(sps.kendalltau(complete["org/a"], complete["org/b"]).statistic, abs=1e-6)
    assert np.isfinite(tau).all() and np.isfinite(np.array(out["mds"])).all()


def test_figure_1s_moments_are_the_sample_variance_and_skewness():
    """Table 3's moments by hand on 5 scores: the mean, the sample variance (n - 1 in the denominator) and the
    skewness m3 / m2^1.5 of the central moments."""
    from experiments.fig1_distributions import moments

    x = np.array([1.0, 2.0, 2.0, 3.0, 7.0])
    m = x.mean()
    m2, m3 = ((x - m) ** 2).mean(), ((x - m) ** 3).mean()
    got = moments(x)
    assert got["n"] == 5 and got["mean"] == pytest.approx(3.0)
    assert got["variance"] == pytest.approx(((x - m) ** 2).sum() / 4, abs=1e-12)
    assert got["skewness"] == pytest.approx(m3 / m2**1.5, abs=1e-12)


def test_the_sweep_figures_refuse_a_response_run_in_one_line(tmp_path, capsys):
    from experiments.make_figures import main as make_figures

    run = write_fake_response_run(tmp_path / "runs", "org/m", ["a", "b", "c"], {"greatest": "Q?"})
    assert make_figures(["--runs", str(run.path), "--out", str(tmp_path / "f"), "--elo-data",
                         str(tmp_path / "none")]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "is a response run (probe score --responses); the sweep figures need runs over the whole vocabulary" in err


# --- MKL's mode ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode, env, strict, why", [
    (0x10000 | 2, "AUTO,STRICT", True, None),  # MKL_CBWR_AUTO | MKL_CBWR_STRICT: what the commands set
    (0x10000 | 6, "AVX2,STRICT", True, None),  # the user's strict mode
    (2, "AUTO,STRICT", False, "MKL ran a product before rm-probe could set MKL_CBWR"),
    (1, None, False, "MKL ran a product before rm-probe could set MKL_CBWR"),  # MKL_CBWR_OFF, nothing set
    (3, "COMPATIBLE", False, "MKL_CBWR was set to another mode"),
    (-1, "AUTO,STRICT", False, "MKL ran a product before"),  # an error code of mkl_cbwr_get: not strict
])
def test_blas_mode_reads_mkls_mode_and_says_why_it_is_not_strict(monkeypatch, mode, env, strict, why):
    import torch

    from probe.runs import cpu

    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)
    monkeypatch.setattr(cpu, "_mkl_cbwr_get", lambda: (lambda which: mode))
    if env is None:
        monkeypatch.delenv("MKL_CBWR", raising=False)
    else:
        monkeypatch.setenv("MKL_CBWR", env)
    got = cpu.blas_mode()
    assert got["strict"] is strict and got["cbwr_mode"] == hex(mode) and got["MKL_CBWR"] == env
    assert ("why" in got) is (not strict) and (why is None or why in got["why"]), got
    monkeypatch.setattr(cpu, "_mkl_cbwr_get", lambda: None)
    assert cpu.blas_mode() == {"blas": "MKL", "strict": False,
                               "why": "MKL's reproducibility mode cannot be read from this torch"}
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    assert cpu.blas_mode()["blas"] == "not MKL" and cpu.blas_mode()["strict"] is False


def test_prepare_after_torch_sets_only_mkls_mode(monkeypatch):
    """In a process that imported torch first (the API's case), OpenMP's settings are too late and left alone;
    MKL_CBWR is still set where the user has not."""
    from probe.runs import cpu

    for name in ("OMP_NUM_THREADS", "GOMP_SPINCOUNT", "MKL_CBWR"):
        monkeypatch.delenv(name, raising=False)
    assert "torch" in sys.modules
    assert cpu.prepare() == {"MKL_CBWR": "AUTO,STRICT"}
    assert "OMP_NUM_THREADS" not in os.environ and "GOMP_SPINCOUNT" not in os.environ
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert cpu.prepare() == {} and os.environ["MKL_CBWR"] == "COMPATIBLE"


@pytest.mark.parametrize("first, strict", [("", True), ("x = torch.randn(64, 64)\nx @ x\n", False)])
def test_a_process_that_ran_torch_before_rm_probe_is_told_mkls_mode(first, strict):
    """A fresh process: rm-probe set first, MKL strict; a product before it, MKL's default mode, said so."""
    import torch

    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    code = (f"import torch\n{first}from probe.runs.cpu import blas_mode, reproducible_blas\nreproducible_blas()\n"
            "y = torch.randn(8, 8)\ny @ y\nimport json\nprint(json.dumps(blas_mode()))\n")
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    mode = json.loads(done.stdout.strip().splitlines()[-1])
    assert mode["strict"] is strict and mode["MKL_CBWR"] == "AUTO,STRICT", mode
    assert ("why" in mode) is (not strict) and (strict or "ran a product before rm-probe" in mode["why"])
