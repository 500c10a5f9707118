"""Every recorded count sums over ranks and sessions: an interrupted sweep keeps the self-check that ran, and
under torchrun only rank 0 prints the results table (the counts over ranks: tests/unit/test_batch_invariance_cli.py,
slow; a social run's sessions: tests/unit/test_round4_resume.py)."""

import json

import pytest

from tests.unit.test_first_hour import _interrupt_after


def test_an_interrupted_sweep_records_the_self_check_that_ran(tiny_dirs, tmp_path, monkeypatch):
    from probe.commands.score import main

    _interrupt_after(monkeypatch, "probe.runs.rundir.RunDir:write_shard", 1)  # a kill after the first shard
    args = ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--prompt", "Best word?", "--limit", "60",
            "--shard-size", "20", "--batch-size", "8", "--verify", "2", "--output", str(tmp_path)]
    assert main(args) == 130
    (run,) = tmp_path.glob("*/exhaustive_*")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["status"] != "complete"
    (check,) = meta["self_check"].values()
    assert len(check["token_ids"]) == 2 and check["max_abs_diff"] <= check["tolerance"]


@pytest.mark.parametrize("responses", [False, True])
def test_under_torchrun_only_rank_0_prints_the_results(monkeypatch, capsys, tmp_path, responses):
    import probe.commands.responses as resp
    import probe.commands.score as score

    printed = []
    monkeypatch.setattr(score, "run", lambda config: tmp_path)
    monkeypatch.setattr(score, "print_summary", lambda run, top: printed.append(run))
    monkeypatch.setattr(resp, "run_responses", lambda config: tmp_path)
    monkeypatch.setattr(resp, "print_response_summary", lambda run, top: printed.append(run))
    argv = ["--no-progress"] + (["--responses", __file__] if responses else [])
    for rank in ("1", "0"):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", rank)
        assert score.main(argv) == 0
        assert len(printed) == (rank == "0")


def test_a_dry_run_prints_each_prompts_row_where_they_differ(capsys):
    """The packaged SmolLM2's tokenizer renders each prompt: a short and a long prompt have rows of other prefix
    lengths, each said (not one typical 48 + 3 line for all); a judge's rows hold its question's ids too."""
    import re

    from probe.commands.score import main

    long = "What, in one word, is the greatest thing ever, and why would anyone say so?"
    assert main(["--dry-run", "--prompt", "Hi?", "--prompt", long]) == 0
    rows = re.findall(r"per batch row \((\d+) prefix \+ (\d+) new tokens, \w+ path; (\w+)\)", capsys.readouterr().out)
    assert len(rows) == 2 and rows[0][0] != rows[1][0] and [r[2] for r in rows] == ["prompt1", "prompt2"]
    assert main(["--dry-run", "--prompt", "Hi?", "--score", "judge"]) == 0
    (judge,) = re.findall(r"per batch row \((\d+) prefix \+ (\d+) new tokens", capsys.readouterr().out)
    assert int(judge[0]) > int(rows[0][0]) and int(judge[1]) > int(rows[0][1])
