"""Batch invariance (issue 58): the same ids scored at the plan's batch and at other batch sizes.

RewardBench's users report scores that change with the batch size (its issue #137). The GPU kit measures it per
sweep path and shape (experiments/gpu_bench.py, ``batch_invariance``); here the same measurement runs on the CPU in
float32 and is held to float32's own rounding, measured on the same rows (stochastic rounding simulated on every
module's output, as the self-check measures half precision: probe/core/precision.py), never to a number tuned on
one machine: the CPU's kernels are not bitwise batch-invariant in general (PyTorch's CPU SDPA kernel gives a row
other last bits at another batch size; an odd batch size can change a matmul's blocking), and which sizes happen to
agree bitwise depends on the CPU's instruction set.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments.gpu_bench import PROMPT, batch_invariance, invariance_batches, path_plan, random_model
from probe.core.engine import PrefixScorer
from probe.core.heads import LinearRewardHead
from probe.core.precision import HALF_TOLERANCE, ROUNDING_REPEATS, simulated_rounding
from probe.core.scoring import sweep_rows
from probe.core.template import response_conversation, split_template

pytestmark = pytest.mark.parity
NOISE_ROWS = 512  # the rows float32's rounding noise is measured on (all 4,096 would cost 4 more sweeps per path)


@pytest.fixture(scope="module", params=["llama-3.1-8b", "gemma-2-27b"])
def shape(request):
    """A random-weight reward model of the published shape at the kit's reduced widths (vocabulary 4,096; Gemma 2's
    sliding window shorter than the prompt), float32 on the CPU, with the prompt's split and every id as a row."""
    lm = random_model(request.param, torch.device("cpu"), torch.float32, small=True)
    split = split_template(lm.tokenizer, response_conversation(PROMPT), n_verify=0)
    rows = sweep_rows(np.arange(lm.model.get_input_embeddings().num_embeddings), split.suffix_ids)
    return lm, split, rows


def _noise(lm, scorer, rows: torch.Tensor, batch: int) -> float:
    """The largest change of any row's score when every module output is rounded to its other float32 neighbour at
    random (ROUNDING_REPEATS seeds): how far two correct float32 computations of these scores may lie apart."""
    def at() -> torch.Tensor:
        return torch.cat([scorer.score(rows[i : i + batch]) for i in range(0, rows.shape[0], batch)])

    base = at()
    worst = 0.0
    for seed in range(ROUNDING_REPEATS):
        with simulated_rounding(lm.model, seed):
            worst = max(worst, float((at() - base).abs().max()))
    return worst


@pytest.mark.parametrize("path", ["shared", "cache", "uncached"])
def test_scores_do_not_depend_on_the_batch_size_beyond_float32_rounding(shape, path):
    lm, split, rows = shape
    head = LinearRewardHead(lm.model, 0)
    scorer = PrefixScorer(lm.model, head, split.prefix_ids, use_cache=path != "uncached",
                          shared_attention=path == "shared")
    plan = path_plan(lm, head, len(split.prefix_ids), rows.shape[1], path)[0]
    batches = invariance_batches(plan, rows.shape[0])
    assert len(batches) == 4 and batches[0] == min(plan, rows.shape[0]) and any(b % 2 for b in batches[1:])
    result = batch_invariance(scorer.score, rows, batches)
    tolerance = HALF_TOLERANCE * _noise(lm, scorer, rows[:NOISE_ROWS], batches[0])
    assert 0 < tolerance < 1e-4  # float32's rounding of these scores: a few units in the last place, not zero
    assert result["max_abs_diff"] <= tolerance, result
    base = torch.cat([scorer.score(rows[i : i + batches[0]]) for i in range(0, rows.shape[0], batches[0])]).numpy()
    gaps = np.diff(np.sort(base))
    near_ties = int(np.sum(gaps <= 2 * tolerance))
    # a row may change rank only by trading places with a row whose score lies within rounding of its own
    assert result["rank_changes"] <= 2 * near_ties, (result, near_ties)


def test_batch_invariance_counts_what_moves():
    """A scorer whose row 5 gains 1.5 in odd-sized batches: the odd size moves it above row 4 (two rank changes,
    the best 20 change, the worst do not); the even sizes change nothing."""
    def score(x: torch.Tensor) -> torch.Tensor:
        return -x[:, 0].float() + 1.5 * (x.shape[0] % 2) * (x[:, 0] == 5).float()

    rows = torch.arange(100).reshape(-1, 1)
    r = batch_invariance(score, rows, [40, 13, 10])
    odd, even = r["against"]
    assert (odd["batch"], odd["max_abs_diff"], odd["rank_changes"]) == (13, 1.5, 2)
    assert not odd["top_same"] and odd["bottom_same"] and not odd["bitwise"]
    assert (even["max_abs_diff"], even["rank_changes"], even["top_same"], even["bitwise"]) == (0.0, 0, True, True)
    assert (r["max_abs_diff"], r["rank_changes"], r["bitwise"]) == (1.5, 2, False)


def test_invariance_batches():
    assert invariance_batches(256, 4096) == [256, 85, 64, 16]
    assert invariance_batches(8192, 4096) == [4096, 1365, 1024, 256]  # never above the rows compared
    assert invariance_batches(4, 4096) == [4, 3, 1]
    # a batch halved to 1 or 2 by memory: nothing larger is tried (before: a batch of 3 compared against)
    assert invariance_batches(2, 4096) == [2, 1] and invariance_batches(1, 4096) == [1]
    assert all(invariance_batches(r, 4096)[0] == r == max(invariance_batches(r, 4096)) for r in range(1, 40))
