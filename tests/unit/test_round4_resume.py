"""Issue 57: every resume path resumed with settings that differ from the run's. Response runs, social runs and
sweeps refuse a resume whose settings would change a number (one line, exit 2, naming the setting), in each field
that does; a response run resumed with another --batch-size keeps the batch size it started with (its remaining
shards batched as one uninterrupted run batches them); a social run cut inside a data set with two prefixes, one
of them longer than a chunk, scores only the chunks it had not kept; probe batch resumes the newest unfinished run
of a job. (--seed and social's --batch-size are another branch's, issue 56.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from tests.unit.test_first_hour import _interrupt_after
from tests.unit.test_responses import ITEMS
from tests.unit.test_responses import _args as response_args
from tests.unit.test_rows_torchrun import killed_copy

# a setting of each kind that changes a number, at a value other than the run's: (flag, value, what the refusal
# names). The chat template is the tokenizer's own text from a file (the same ids): the setting alone differs.
COMMON = [("--revision", "main", "revision"), ("--input-method", "rewardbench", "input_method"),
          ("--date", "02 Feb 2020", "date")]


def short_id(value) -> str:
    return str(value).split()[0][:12]


def unfinished(run: Path, root: Path, lost: list[str]) -> Path:
    """A copy of the finished ``run`` as a kill would have left it: ``lost`` files and the results gone."""
    return killed_copy(run, root, lost)[0]


def with_flag(args: list[str], flag: str, value: str) -> list[str]:
    if flag in args:
        out = list(args)
        out[out.index(flag) + 1] = value
        return out
    return [*args, flag, value]


def refused(main, args: list[str], run: Path, names: str, capsys) -> None:
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    assert main([*args, "--resume", str(run)]) == 2
    err = capsys.readouterr().err
    assert "was made with other settings" in err and names in err, err[-2000:]
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before  # nothing written


# --- probe score --responses ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def response_run(tiny_dirs, tmp_path_factory):
    from probe.commands.score import main

    root = tmp_path_factory.mktemp("responses")
    assert main(response_args(tiny_dirs, root, "full")) == 0
    (run,) = (root / "full").glob("*/responses_*")
    return root, run


@pytest.mark.parametrize("flag, value, names", [*COMMON, ("--shard-size", "4", "shard_size"),
                                                ("--system", "Answer briefly.", "prompts")], ids=short_id)
def test_a_response_run_refuses_a_resume_with_other_settings(tiny_dirs, response_run, tmp_path, flag, value, names,
                                                             capsys):
    from probe.commands.score import main

    root, run = response_run
    cut = unfinished(run, tmp_path, ["checkpoints/worst_ever_one/shard_000001.npy"])
    args = response_args(tiny_dirs, root, "x")
    refused(main, with_flag(args[:args.index("--output")] + args[args.index("--output") + 2:], flag, value), cut,
            names, capsys)


def test_a_response_run_refuses_its_responses_in_another_order(tiny_dirs, response_run, tmp_path, capsys):
    from probe.commands.score import main

    root, run = response_run
    cut = unfinished(run, tmp_path, ["checkpoints/worst_ever_one/shard_000001.npy"])
    other = tmp_path / "reordered.txt"
    other.write_text("\n".join(ITEMS[::-1]) + "\n", encoding="utf-8")
    args = with_flag(response_args(tiny_dirs, root, "x"), "--responses", str(other))
    refused(main, args, cut, "responses_sha256", capsys)


def test_a_resumed_response_run_keeps_the_batch_size_it_started_with(tiny_dirs, response_run, tmp_path,
                                                                     monkeypatch):
    """Started at --batch-size 4, resumed with --batch-size 3: the shards left are batched 4 at a time, as one
    uninterrupted run batches them (same scores, bitwise), and meta.json still says 4; the self-checks are the
    run's own (of each prompt's first shard), not run again on a later shard."""
    from probe.commands.score import main
    from probe.core.scoring import AdaptiveBatcher

    root, run = response_run
    cut = unfinished(run, tmp_path, ["checkpoints/greatest_ever_one/shard_000002.npy",
                                     "checkpoints/worst_ever_one/shard_000001.npy"])
    sizes, original = [], AdaptiveBatcher.run

    def spy(self, fn, *rows, **kw):
        sizes.append(self.batch_size)
        return original(self, fn, *rows, **kw)

    monkeypatch.setattr(AdaptiveBatcher, "run", spy)
    args = with_flag(response_args(tiny_dirs, tmp_path, "x"), "--batch-size", "3")
    assert main([*args, "--resume", str(cut)]) == 0
    assert sizes and set(sizes) == {4}
    meta = json.loads((cut / "meta.json").read_text())
    assert meta["batch_size"] == 4 and meta["timing"]["sessions"][-1]["responses_scored"] == 2 + 5
    # each prompt's self-check is the one of its first shard, kept; none run again on the shards left
    assert meta["self_check"] == json.loads((run / "meta.json").read_text())["self_check"]
    assert pl.read_parquet(cut / "scores.parquet").equals(pl.read_parquet(run / "scores.parquet"))


# --- probe social ----------------------------------------------------------------------------------------------------
def social_args(tiny_dirs, data: Path, out: Path) -> list[str]:
    return ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--batch-size", "16", "--output", str(out),
            "--dataset", "pairs", "--data", str(data)]


@pytest.fixture(scope="module")
def social_run(tiny_dirs, tmp_path_factory):
    """One data set of two prompts: 'Q?' with 131 items (262 rows: chunks 0 of 256 and 1 of 6 rows) and 'R?' with
    3 (chunk 2)."""
    from probe.commands.social import main

    root = tmp_path_factory.mktemp("social")
    data = root / "pairs.jsonl"
    rows = [{"prompt": "Q?", "chosen": f"Yes{'!' * (i % 5)} {i}", "rejected": f"No {i}", "subset": "a"}
            for i in range(131)]
    rows += [{"prompt": "R?", "chosen": f"Sure {i}", "rejected": "Never" * (i + 1), "subset": "b"} for i in range(3)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(social_args(tiny_dirs, data, root / "full")) == 0
    (run,) = (root / "full").glob("*/social_*")
    return data, run


@pytest.mark.parametrize("flag, value, names", [*COMMON, ("--system", "Answer briefly.", "system"),
                                                ("--chat-template", None, "chat_template")], ids=short_id)
def test_a_social_run_refuses_a_resume_with_other_settings(tiny_dirs, social_run, tmp_path, flag, value, names,
                                                           capsys):
    from probe.commands.social import main

    data, run = social_run
    cut = unfinished(run, tmp_path, ["checkpoints/000.parquet"])
    refused(main, with_flag(social_args(tiny_dirs, data, tmp_path / "x"), flag, value or tiny_dirs["template"]), cut,
            names, capsys)


def test_a_social_run_cut_inside_a_data_set_scores_only_the_chunks_it_lacks(tiny_dirs, social_run, tmp_path,
                                                                           monkeypatch):
    """Cut as it keeps chunk 2 (every chunk kept as it finishes; chunks 1 and 2 scored in one window): the kept chunks 0 and 1 (the short one) are read back,
    only chunk 2 is scored, and the table is the uninterrupted run's, bitwise."""
    from probe.commands.social import main

    data, run = social_run
    monkeypatch.setattr("probe.social.scoring.FLUSH_ROWS", 1)
    _interrupt_after(monkeypatch, "probe.runs.rundir.RunDir:write_chunks", 2)
    assert main(social_args(tiny_dirs, data, tmp_path / "cut")) == 130
    (cut,) = (tmp_path / "cut").glob("*/social_*")
    kept = {p.name: len(np.load(p)["scores"]) for p in (cut / "checkpoints" / "000").glob("chunks_*.npz")}
    assert kept == {"chunks_000000.npz": 256, "chunks_000001.npz": 6}
    monkeypatch.undo()
    from probe.core.scoring import AdaptiveBatcher

    original = AdaptiveBatcher.run
    rows = []  # the rows each chunk scored on resume (the record of rows_scored is counted, not measured)

    def counted(self, fn, cont, *a, **k):
        rows.append(len(cont))
        return original(self, fn, cont, *a, **k)

    monkeypatch.setattr("probe.core.scoring.AdaptiveBatcher.run", counted)
    assert main([*social_args(tiny_dirs, data, tmp_path / "cut"), "--resume"]) == 0
    assert rows == [2 * 3]
    assert pl.read_parquet(cut / "scores.parquet").equals(pl.read_parquet(run / "scores.parquet"))
    timing = json.loads((cut / "meta.json").read_text())["timing"]
    assert timing[-1]["rows_scored"] == 2 * 3
    assert len(timing) == 2 and timing[0]["wall_s"] > 0  # the interrupted session's time is kept, not only the last


# --- probe score (a sweep) -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sweep_run(tiny_dirs, tmp_path_factory):
    from probe.commands.score import main

    root = tmp_path_factory.mktemp("sweep")
    args = ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--prompt", "Best word?", "--limit", "60",
            "--shard-size", "20", "--batch-size", "8", "--verify", "2"]
    assert main([*args, "--output", str(root / "full")]) == 0
    (run,) = (root / "full").glob("*/exhaustive_*")
    return args, run


@pytest.mark.parametrize("flag, value, names", [*COMMON[:2], ("--system", "Answer briefly.", "prompts")],
                         ids=short_id)
def test_a_sweep_refuses_a_resume_with_other_settings(tiny_dirs, sweep_run, tmp_path, flag, value, names, capsys):
    """(A sweep records the date and its template by the prompt ids they give: this template writes no date.)"""
    from probe.commands.score import main

    args, run = sweep_run
    cut = unfinished(run, tmp_path, [str(next((run / "checkpoints").rglob("shard_000001.npy")).relative_to(run))])
    refused(main, with_flag([*args, "--output", str(tmp_path / "x")], flag, value), cut, names, capsys)


# --- probe batch -----------------------------------------------------------------------------------------------------
def test_batch_resumes_the_newest_unfinished_run_of_a_job(tiny_dirs, tmp_path, capsys):
    from probe.commands.batch import main

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"defaults": {"device": "cpu", "output": str(tmp_path / "out"), "limit": 40,
                                                 "shard_size": 20, "progress": False, "verify": 0},
                                    "prompts": ["Best word?"], "models": [{"rm": tiny_dirs["rm"]}]}))
    assert main([str(jobs)]) == 0
    (first,) = (tmp_path / "out").glob("*/exhaustive_*")
    meta = json.loads((first / "meta.json").read_text())
    older, newer = (first.parent / f"{first.name}-{k}" for k in (1, 2))
    for run in (older, newer):  # two unfinished copies, created after the first in the same second, in this order
        shutil.copytree(first, run)
        for shard in run.rglob("shard_000001.npy"):
            shard.unlink()
        (run / "scores.parquet").unlink()
        (run / "meta.json").write_text(json.dumps({**meta, "status": "running"}))
    shutil.rmtree(first)
    assert main([str(jobs)]) == 0
    assert "[resume]" in capsys.readouterr().out
    status = {run.name: json.loads((run / "meta.json").read_text())["status"] for run in (older, newer)}
    assert status == {older.name: "running", newer.name: "complete"}
