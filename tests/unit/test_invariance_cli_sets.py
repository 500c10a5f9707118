"""Issue 70's sets, through the command line, under a BLAS that rounds by the row count (tests/hostile_blas.py): each
set bitwise equal at every batch size on any CPU, by construction (on the tree before issue 70 each failed under the
double; an AMD EPYC with AVX2 only moved them with its real BLAS: 17 of 40 responses between 1 and 64, 162 of 200 sweep
ids). The commands run in this process, so that the double sees every product."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest


PROMPT = "What, in one word, is the greatest thing ever?"
WORDS = ["love", "peace", "the", "music", "of", "freedom", "and", "a", "very", "good", "thing", "ever"]


def _responses_file(tmp_path, n: int, longest: int = 25):
    rng = np.random.default_rng(0)
    items = [" ".join(rng.choice(WORDS, size=int(rng.integers(1, longest)))).capitalize() for _ in range(n)]
    path = tmp_path / "items.txt"
    path.write_text("\n".join(items) + "\n")
    return path


def _run(args: list[str], out) -> tuple[pl.DataFrame, dict]:
    from probe.commands.score import main

    assert main([*args, "--device", "cpu", "--prompt", PROMPT, "--output", str(out), "--no-progress"]) == 0
    (run,) = [p for p in out.glob("*/*") if (p / "meta.json").is_file()]
    return pl.read_parquet(run / "scores.parquet"), json.loads((run / "meta.json").read_text())


def _equal_at(args: list[str], batches: tuple[int, ...], tmp_path, key: str) -> dict:
    tables, metas = {}, {}
    for b in batches:
        tables[b], metas[b] = _run([*args, "--batch-size", str(b)], tmp_path / f"b{b}")
        tables[b] = tables[b].sort(key)
    first = tables[batches[0]]
    assert first["score"].n_unique() > first.height // 2  # scores that vary
    for b in batches[1:]:
        assert tables[b][key].to_list() == first[key].to_list()
        moved = int(np.sum(tables[b]["score"].to_numpy() != first["score"].to_numpy()))
        assert moved == 0, f"{moved} of {first.height} scores moved between --batch-size {batches[0]} and {b}"
    return metas[batches[0]]


def test_40_responses_of_the_tiny_reward_model_at_batch_1_2_5_and_64(tiny_dirs, tmp_path, hostile):
    meta = _equal_at(["--rm", tiny_dirs["rm"], "--responses", str(_responses_file(tmp_path, 40))], (64, 5, 2, 1),
                     tmp_path, "response")
    record = meta["model"]["batch_invariance"]
    assert record["batch_invariant"] is True and record["row_check"]["row_stable"]  # the double rounds by rows only


def test_12_responses_under_the_judge_at_batch_1_and_64(tiny_dirs, tmp_path, hostile):
    _equal_at(["--rm", tiny_dirs["lm"], "--score", "judge", "--responses", str(_responses_file(tmp_path, 12))],
              (64, 1), tmp_path, "response")


def test_a_200_id_sweep_at_batch_1_and_64(tiny_dirs, tmp_path, hostile):
    _equal_at(["--rm", tiny_dirs["rm"], "--limit", "200"], (64, 1), tmp_path, "token_id")


@pytest.mark.slow
def test_40_responses_of_the_embedded_smollm2_logprob_at_batch_1_and_64(tmp_path, hostile):
    _equal_at(["--rm", "smollm2", "--score", "logprob", "--responses", str(_responses_file(tmp_path, 40))], (64, 1),
              tmp_path, "response")
