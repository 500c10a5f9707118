"""Sweep mechanics: resume gives identical results, OOM halving loses nothing, settings are fingerprinted."""

import json

import numpy as np
import polars as pl
import pytest
import torch

from probe.errors import ProbeError, ResumeError
from probe.commands.score import ScoreVocabConfig, run
from probe.core.sweep import score_vocab
from probe.runs.rundir import RunDir
from probe.core.scoring import AdaptiveBatcher

PROMPTS = ("What, in one word, is the greatest thing ever?", "What, in one word, is the worst thing ever?")


def _config(tiny_dirs, out, **kw):
    base = dict(rm=tiny_dirs["rm"], prompt=PROMPTS, device="cpu", output=str(out), shard_size=128, batch_size=48,
                progress=False, verify=4)
    return ScoreVocabConfig(**{**base, **kw})


class Crash(Exception):
    pass


def crash_after(monkeypatch, n: int) -> None:
    """Make RunDir.write_shard raise after ``n`` shards were written (a kill between two shards)."""
    original = RunDir.write_shard
    writes = {"n": 0}

    def crashing(self, key, shard, scores):
        if writes["n"] == n:
            raise Crash
        writes["n"] += 1
        original(self, key, shard, scores)

    monkeypatch.setattr(RunDir, "write_shard", crashing)


def test_resume_after_interruption_is_identical(tiny_dirs, tmp_path, monkeypatch):
    full = run(_config(tiny_dirs, tmp_path / "a"))
    reference = full.read_table("scores.parquet")

    crash_after(monkeypatch, 7)  # die after 7 shards: the first prompt's 12 shards are not all done
    with pytest.raises(Crash):
        run(_config(tiny_dirs, tmp_path / "b"))
    monkeypatch.undo()
    (broken,) = list((tmp_path / "b").glob("*/exhaustive_*"))
    assert json.loads((broken / "meta.json").read_text())["status"] == "running"
    assert not (broken / "scores.parquet").exists()
    assert len(list((broken / "checkpoints").rglob("shard_*.npy"))) == 7

    resumed = run(_config(tiny_dirs, tmp_path / "b", resume="latest"))
    assert resumed.path == broken
    meta = resumed.read_meta()
    assert meta["status"] == "complete"
    n_tokens = meta["settings"]["n_tokens"]
    scored_now = [t["tokens_scored_now"] for t in meta["timing"]["prompts"].values()]
    assert scored_now[0] == n_tokens - 7 * 128  # nothing scored twice
    assert scored_now[1] == n_tokens
    got = resumed.read_table("scores.parquet")
    assert got.equals(reference)  # bit-identical scores, ranks and vocabulary columns
    assert got.height == 2 * n_tokens and got["token_id"].n_unique() == n_tokens


def test_resume_refuses_other_settings(tiny_dirs, tmp_path, monkeypatch):
    crash_after(monkeypatch, 0)
    with pytest.raises(Crash):
        run(_config(tiny_dirs, tmp_path))
    monkeypatch.undo()
    (broken,) = list(tmp_path.glob("*/exhaustive_*"))
    n = json.loads((broken / "meta.json").read_text())["settings"]["n_tokens"]
    with pytest.raises(ResumeError, match=rf"n_tokens \(--limit\): {n} in the run, 500 now"):
        run(_config(tiny_dirs, tmp_path, resume=str(broken), limit=500))
    # "latest" with a changed flag: the unfinished run is named, with what differs
    with pytest.raises(ProbeError, match=r"newest unfinished exhaustive run .* shard_size \(--shard-size\): 128 in the "
                                         r"run, 64 now"):
        run(_config(tiny_dirs, tmp_path, resume="latest", shard_size=64))
    with pytest.raises(ProbeError, match="no unfinished exhaustive run"):
        run(_config(tiny_dirs, tmp_path / "elsewhere", resume="latest"))


def test_resume_keeps_the_runs_batch_size(tiny_dirs, tmp_path, monkeypatch):
    reference = run(_config(tiny_dirs, tmp_path / "a")).read_table("scores.parquet")
    crash_after(monkeypatch, 3)
    with pytest.raises(Crash):
        run(_config(tiny_dirs, tmp_path / "b"))
    monkeypatch.undo()
    resumed = run(_config(tiny_dirs, tmp_path / "b", resume="latest", batch_size=7))
    assert resumed.read_meta()["settings"]["batch_size"] == 48
    assert resumed.read_table("scores.parquet").equals(reference)


def test_corrupt_or_short_shard_is_rescored(tiny_dirs, tmp_path):
    done = run(_config(tiny_dirs, tmp_path / "a", prompt=PROMPTS[:1]))
    ref = done.read_table("scores.parquet")
    meta = done.read_meta()
    meta["status"] = "running"
    done.write_meta(meta)
    shard = done.shard_path("greatest", 3)
    np.save(shard, np.zeros(5, dtype=np.float32))  # wrong length: must not be trusted
    (shard.parent / ".shard_000004.npy.tmp123").write_bytes(b"half")  # a leftover temporary file
    again = run(_config(tiny_dirs, tmp_path / "a", prompt=PROMPTS[:1], resume=str(done.path)))
    assert again.read_meta()["timing"]["prompts"]["greatest"]["tokens_scored_now"] == 128
    assert again.read_table("scores.parquet").equals(ref)


def test_outputs_are_complete_and_ranked(tiny_dirs, tmp_path):
    rd = run(_config(tiny_dirs, tmp_path))
    df = rd.read_table("scores.parquet")
    vocab = rd.read_table("vocab.parquet")
    meta = rd.read_meta()
    assert set(df["prompt_key"]) == {"greatest", "worst"}
    for key, part in df.group_by("prompt_key"):
        assert part.height == vocab.height
        best = part.sort("score", descending=True)
        assert best["rank"][0] == 1 and best["rank"].is_sorted()
    for col in ("piece", "decoded", "is_special", "is_word", "leading_space", "roundtrips"):
        assert col in df.columns
    p = meta["prompts"]["greatest"]
    assert p["text"] == PROMPTS[0] and p["prefix_ids"] and p["suffix_ids"]
    assert meta["self_check"]["greatest"]["max_abs_diff"] <= meta["self_check"]["greatest"]["tolerance"]
    assert meta["timing"]["tokens_per_s"] > 0 and meta["environment"]["versions"]["torch"]
    assert meta["score"]["mode"] == "reward"
    # a second run never overwrites the first
    rd2 = run(_config(tiny_dirs, tmp_path))
    assert rd2.path != rd.path and rd.read_table("scores.parquet").equals(df)


@pytest.mark.parity
def test_front_door_matches_the_command(tiny_dirs, tiny_models, tmp_path):
    from probe.models.loading import load_model

    lm = load_model(tiny_dirs["rm"], kind="reward", device="cpu")
    res = score_vocab(lm.model, lm.tokenizer, PROMPTS[0])
    cmd = run(_config(tiny_dirs, tmp_path, prompt=PROMPTS[:1])).read_table("scores.parquet")
    torch.testing.assert_close(torch.tensor(res.table()["score"].to_numpy()), torch.tensor(cmd["score"].to_numpy()),
                               atol=1e-5, rtol=1e-5)
    assert res.table()["token_id"].to_list() == cmd["token_id"].to_list()


def test_adaptive_batcher_halves_on_oom_without_losing_rows():
    calls = []

    def score(rows):
        calls.append(rows.shape[0])
        if rows.shape[0] > 16:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return rows[:, 0].float() * 2

    rows = torch.arange(100)[:, None]
    batcher = AdaptiveBatcher(64)
    out = batcher.run(score, rows)
    assert batcher.batch_size == 16
    np.testing.assert_array_equal(out, np.arange(100) * 2.0)
    assert calls[:3] == [64, 32, 16] and sum(c for c in calls if c <= 16) == 100


def test_adaptive_batcher_gives_up_at_one():
    def score(rows):
        raise torch.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(ProbeError, match="batch size 1"):
        AdaptiveBatcher(4).run(score, torch.zeros(3, 1))


def test_other_errors_are_not_swallowed():
    def score(rows):
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        AdaptiveBatcher(4).run(score, torch.zeros(3, 1))


def test_scores_parquet_schema(tiny_dirs, tmp_path):
    df = run(_config(tiny_dirs, tmp_path, prompt=PROMPTS[:1], limit=300)).read_table("scores.parquet")
    assert df.height == 300
    assert df.schema["token_id"] == pl.UInt32 and df.schema["score"] == pl.Float32 and df.schema["rank"] == pl.UInt32


def test_runs_newest_first_orders_same_second_runs(tmp_path):
    from probe.runs.rundir import runs_newest_first

    names = ["exhaustive_2026-11-22T07-13-02Z", "exhaustive_2026-11-22T07-13-02Z-2", "exhaustive_2026-11-22T07-13-02Z-10",
             "exhaustive_2026-11-22T07-13-03Z", "exhaustive_2026-11-21T23-59-59Z-1", "gcg_max_2026-11-23T00-00-00Z"]
    for name in names:
        (tmp_path / name).mkdir()
    (tmp_path / "exhaustive_notes.txt").write_text("not a run")
    got = [p.name for p in runs_newest_first(tmp_path, "exhaustive")]
    assert got == [names[3], names[2], names[1], names[0], names[4]]


def test_ranked_table_gives_tied_scores_the_best_rank_they_share():
    """``min`` ranks, hand-worked: 0.9, 0.9 -> 1, 1; 0.5, 0.5 -> 3, 3; 0.1 -> 5 (ordinal ranks would be 1-5, dense
    ranks 1, 1, 2, 2, 3); rows ordered by rank, then token id."""
    from probe.core.prompts import Prompt
    from probe.core.sweep import ranked_table
    from tests.fake_runs import fake_vocab

    vocab = fake_vocab(["a", "b", "c", "d", "e"])
    scores = np.array([0.5, 0.9, 0.5, 0.1, 0.9], dtype=np.float32)
    df = ranked_table(Prompt("k", "text"), np.arange(5), scores, vocab)
    assert df.select("token_id", "rank").rows() == [(1, 1), (4, 1), (0, 3), (2, 3), (3, 5)]


def test_a_real_run_with_tied_scores_ranks_them_by_the_min_rule(tiny_dirs, tmp_path):
    """Ties are real (bf16 runs, tokens with equal embeddings): ten ids given one embedding row score exactly alike
    through the whole command, and scores.parquet ranks each row 1 + the number of strictly better scores."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "tied-rm"
    shutil.copytree(tiny_dirs["rm"], folder)
    weights = load_file(folder / "model.safetensors")
    name = next(k for k in weights if k.endswith("embed_tokens.weight"))
    weights[name][100:110] = weights[name][100].clone()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    run_dir = run(ScoreVocabConfig(rm=str(folder), prompt=("What is best?",), output=str(tmp_path / "out"),
                                   limit=200, progress=False, verify=4, device="cpu"))
    df = run_dir.read_table("scores.parquet")
    tied = df.filter(pl.col("token_id").is_between(100, 109))
    assert tied["score"].n_unique() == 1 and tied["rank"].n_unique() == 1
    s = df["score"].to_numpy()
    want = [1 + int((s > v).sum()) for v in s]
    assert df["rank"].to_list() == want
    assert tied["rank"][0] == 1 + int((s > tied["score"][0]).sum())
