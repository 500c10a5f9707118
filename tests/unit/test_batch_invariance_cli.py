"""Batch invariance through the commands (issue 62): the runs a user makes at other batch sizes, after an
out-of-memory halving, resumed after a kill, dealt by ``probe batch --shard`` or over torchrun's ranks write the same
scores, bit for bit. Each of these compared within 1e-5 before, and the first three moved (a tiny reward model's
3,200-id sweep: 1,122 scores at --batch-size 7; 40 whole responses at 5: 26 of 40)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch
import yaml

PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.fixture(scope="module")
def wide_rm(tmp_path_factory):
    """A tiny Llama reward model with a 3,200-token vocabulary, saved as a Hugging Face folder."""
    from transformers import LlamaForSequenceClassification

    from tests import tiny

    tok = tiny.make_tokenizer("llama3", vocab_size=3200)
    folder = tmp_path_factory.mktemp("wide") / "rm"
    tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _sweep(rm: str, out: Path, **kw):
    from probe.commands.score import run
    from probe.config import ScoreVocabConfig

    cfg = ScoreVocabConfig(**{**dict(rm=rm, prompt=(PROMPT,), device="cpu", output=str(out), progress=False,
                                     verify=2), **kw})
    return run(cfg).read_table("scores.parquet").sort("token_id")


def _same(a: pl.DataFrame, b: pl.DataFrame, key: str = "token_id") -> None:
    assert a[key].to_list() == b[key].to_list()
    assert np.array_equal(a["score"].to_numpy(), b["score"].to_numpy()), \
        int(np.sum(a["score"].to_numpy() != b["score"].to_numpy()))


def test_a_sweep_at_batch_sizes_256_85_and_7_is_bitwise_the_same(wide_rm, tmp_path):
    want = _sweep(wide_rm, tmp_path / "b256", batch_size=256)
    assert want.height == 3200 and want["score"].n_unique() > 3000
    for batch in (85, 7):
        _same(_sweep(wide_rm, tmp_path / f"b{batch}", batch_size=batch), want)


def test_a_resumed_sweep_equals_an_uninterrupted_one_at_another_batch_size(wide_rm, tmp_path, monkeypatch):
    """Killed after two shards at --batch-size 7, resumed (which keeps 7): the default batch's scores."""
    from tests.unit.test_sweep import Crash, crash_after

    want = _sweep(wide_rm, tmp_path / "whole", batch_size=256, limit=1024)
    crash_after(monkeypatch, 2)
    with pytest.raises(Crash):
        _sweep(wide_rm, tmp_path / "killed", batch_size=7, limit=1024, shard_size=256)
    monkeypatch.undo()
    _same(_sweep(wide_rm, tmp_path / "killed", batch_size=7, limit=1024, shard_size=256, resume="latest"), want)


def test_an_out_of_memory_halving_in_a_sweep_changes_no_bit(wide_rm, tmp_path, monkeypatch):
    from probe.core.engine import PrefixScorer

    want = _sweep(wide_rm, tmp_path / "plain", batch_size=256, limit=1024)
    original, calls = PrefixScorer.score, {"raised": 0}

    def score(self, cont, lengths=None, *rest):
        if len(cont) > 8 and not calls["raised"]:  # the sweep's first batch (the self-check's rows are fewer)
            calls["raised"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory")
        return original(self, cont, lengths, *rest)

    monkeypatch.setattr(PrefixScorer, "score", score)
    run = tmp_path / "oom"
    _same(_sweep(wide_rm, run, batch_size=15, limit=1024), want)
    (meta,) = run.glob("*/exhaustive_*/meta.json")
    assert calls["raised"] == 1 and json.loads(meta.read_text())["oom_halvings"][0]["batch_size"] == 7


def test_the_embedded_models_logprob_sweep_at_64_and_37(tmp_path):
    """SmolLM2-135M-Instruct (real weights): the fused log-probability head over 512 ids."""
    want = _sweep("smollm2", tmp_path / "b64", batch_size=64, limit=512)
    _same(_sweep("smollm2", tmp_path / "b37", batch_size=37, limit=512), want)


def test_whole_responses_at_batch_sizes_64_and_5(tiny_dirs, tmp_path):
    from probe.commands.score import main

    words = ["love", "peace", "the", "music", "of", "freedom", "and", "a", "very", "good", "thing", "ever"]
    rng = np.random.default_rng(0)
    items = [" ".join(rng.choice(words, size=int(rng.integers(1, 25)))).capitalize() for _ in range(40)]
    (tmp_path / "items.txt").write_text("\n".join(items) + "\n")
    tables = {}
    for batch in (64, 5):
        out = tmp_path / f"b{batch}"
        assert main(["--rm", tiny_dirs["rm"], "--device", "cpu", "--responses", str(tmp_path / "items.txt"),
                     "--prompt", PROMPT, "--output", str(out), "--no-progress", "--batch-size", str(batch)]) == 0
        (run,) = out.glob("*/responses_*")
        tables[batch] = pl.read_parquet(run / "scores.parquet").sort("response")
    assert tables[64]["n_tokens"].n_unique() > 10  # responses of many lengths, padded beside each other
    _same(tables[5], tables[64], key="response")


def test_probe_batch_dealt_by_shard_writes_the_scores_one_process_writes(wide_rm, tiny_dirs, tmp_path):
    """Two jobs run whole in one process, and again dealt by --shard 1/2 and 2/2 to two processes (a scheduler's
    job array, on machines that plan other batch sizes: here 85 and 7 instead of 7 and 256)."""
    from probe.commands.batch import main

    def jobs(out: Path, sizes: tuple[int, int]) -> Path:
        data = {"defaults": {"device": "cpu", "output": str(out), "progress": False, "verify": 2, "limit": 700},
                "prompts": [PROMPT], "models": [{"rm": wide_rm, "batch_size": sizes[0]},
                                                {"rm": tiny_dirs["rm"], "batch_size": sizes[1]}]}
        path = out.parent / f"{out.name}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    assert main([str(jobs(tmp_path / "whole", (7, 256)))]) == 0
    dealt = jobs(tmp_path / "dealt", (85, 7))
    assert main([str(dealt), "--shard", "1/2"]) == 0 and main([str(dealt), "--shard", "2/2"]) == 0
    for whole in sorted((tmp_path / "whole").glob("*/exhaustive_*/scores.parquet")):
        (other,) = (tmp_path / "dealt").glob(f"{whole.parent.parent.name}/exhaustive_*/scores.parquet")
        _same(pl.read_parquet(other).sort("token_id"), pl.read_parquet(whole).sort("token_id"))


@pytest.mark.slow
def test_a_sweep_under_torchrun_with_two_ranks_equals_one_process(wide_rm, tmp_path):
    """torchrun --nproc_per_node 2 (one thread each, gloo) against one process with two threads."""
    args = ["-m", "probe.exhaustive", "--rm", wide_rm, "--device", "cpu", "--prompt", PROMPT, "--no-progress",
            "--shard-size", "512"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    ranks = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                            *args, "--output", str(tmp_path / "ranks")], env=env, check=True, capture_output=True,
                           text=True, timeout=600)
    assert ranks.stdout.count("wrote ") == 1  # the results table once, from rank 0
    timing = json.loads(next((tmp_path / "ranks").rglob("meta.json")).read_text())["timing"]
    assert [p["tokens_scored"] for p in timing["prompts"].values()] == [3200]  # both ranks' tokens, not rank 0's 1,536
    subprocess.run([sys.executable, *args, "--output", str(tmp_path / "one"), "--batch-size", "85"],
                   env={**env, "OMP_NUM_THREADS": "2"}, check=True, capture_output=True, timeout=600)
    a, b = (pl.read_parquet(next((tmp_path / n).rglob("scores.parquet"))).sort("token_id") for n in ("ranks", "one"))
    assert a.height == 3200
    _same(a, b)
