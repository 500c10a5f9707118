"""bfloat16, as every real user runs on a GPU: sweeps, responses and the fused log-probability head agree with
float32 within the tolerance the one self-check enforces, and scores are written as float32.

On a CPU bf16 matmuls are slow, so the models are tiny and the samples small.
"""

from __future__ import annotations

import copy

import numpy as np
import polars as pl
import pytest
import torch

import probe
from probe.commands.score import ScoreVocabConfig, run
from probe.core.engine import PrefixScorer
from probe.core.heads import LogprobHead
from probe.core.scoring import check_tolerance

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", "self-sacrifice", "café", "🎉", "nature and life"]


def _bf16(lm):
    twin = copy.deepcopy(lm)
    twin.model = twin.model.to(torch.bfloat16)
    return twin


def _within_self_check(half: np.ndarray, full: np.ndarray) -> None:
    tol = check_tolerance(full.astype(np.float64), torch.bfloat16)
    assert np.all(np.abs(half - full) <= tol), float(np.max(np.abs(half - full) - tol))
    assert np.abs(half - full).max() > 0  # really computed in another precision


@pytest.mark.parametrize("which,score", [("rm", "reward"), ("lm", "logprob")])
def test_bf16_sweep_agrees_with_float32(tiny_dirs, which, score):
    full = probe.load(tiny_dirs[which], device="cpu", score=score)
    half = _bf16(full)
    a = probe.sweep(full, None, PROMPT, limit=160, batch_size=80).sort("token_id")
    b = probe.sweep(half, None, PROMPT, limit=160, batch_size=80).sort("token_id")  # its self-check runs in bf16
    assert b["score"].dtype == pl.Float32
    _within_self_check(b["score"].to_numpy(), a["score"].to_numpy())


@pytest.mark.parametrize("which,score", [("rm", "reward"), ("lm", "logprob")])
def test_bf16_responses_agree_with_float32(tiny_dirs, which, score):
    full = probe.load(tiny_dirs[which], device="cpu", score=score)
    a = probe.score_responses(full, None, PROMPT, RESPONSES).sort("response")
    b = probe.score_responses(_bf16(full), None, PROMPT, RESPONSES).sort("response")
    assert b["score"].dtype == pl.Float32 and a["n_tokens"].equals(b["n_tokens"])
    _within_self_check(b["score"].to_numpy(), a["score"].to_numpy())


def test_bf16_fused_logprob_head_equals_the_plain_one(tiny_dirs):
    full = probe.load(tiny_dirs["lm"], device="cpu", score="logprob")
    half = _bf16(full)
    prefix = full.tokenizer.encode("<|begin_of_text|>Say one word:", add_special_tokens=False)
    rows = torch.randint(0, 1000, (24, 3))
    scores = {}
    for name, lm in (("full", full), ("half", half)):
        for fused in (True, False):
            head = LogprobHead(lm.model, "sum", fused=fused)
            scores[name, fused] = PrefixScorer(lm.model, head, prefix).score(rows).float().numpy()
    # in bf16 the two heads read the same bf16 hidden states: only their float32 accumulation order differs
    np.testing.assert_allclose(scores["half", True], scores["half", False], rtol=1e-3, atol=1e-3)
    _within_self_check(scores["half", True], scores["full", True])


def test_bf16_command_writes_float32_scores_and_records_its_check(tiny_dirs, tmp_path):
    run_dir = run(ScoreVocabConfig(rm=tiny_dirs["rm"], prompt=(PROMPT,), device="cpu", dtype="bfloat16",
                                   output=str(tmp_path), limit=96, progress=False, verify=8))
    scores = run_dir.read_table("scores.parquet")
    assert scores["score"].dtype == pl.Float32
    meta = run_dir.read_meta()
    assert meta["model"]["dtype"] == "torch.bfloat16"
    check = meta["self_check"]["greatest"]
    assert len(check["token_ids"]) == 8 and check["max_abs_diff"] <= check["tolerance"]
