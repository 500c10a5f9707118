"""On a GPU (``make gpu-test``: ``pytest tests -m gpu --device cuda``): the engine's cached scores against the
model's own forward on CUDA for every family, in float32 and bf16 (the self-check's measured tolerance, and as
accurate as the model's own bf16 forward against float32), the shared-prefix attention against the plain cache
path, and OOM halving on the real allocator. Skipped without ``--device cuda``; `make test` deselects them."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import numpy as np
import pytest
import torch

from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.scoring import AdaptiveBatcher, ScoringOptions, check_rows, make_head, prompt_split

pytestmark = pytest.mark.gpu

PROMPT = "What, in one word, is the greatest thing ever?"
CASES = [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("chatml-rm-padeot", "reward"), ("armo-like", "reward"),
         ("qrm-like", "reward"), ("llama-lm", "logprob"), ("gemma2-lm", "logprob"), ("llama-lm", "judge"),
         ("qwen2-rm", "reward"), ("qwen3-rm", "reward"), ("gemma3-rm", "reward"), ("qwen3-lm", "logprob"),
         ("gemma3-lm", "logprob")]


def _rows(lm, mode, n=24, max_len=4, seed=3):
    split = prompt_split(lm, mode, PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    rng = random.Random(seed)
    rows = [[rng.randrange(len(lm.tokenizer)) for _ in range(rng.randint(1, max_len))] + list(split.suffix_ids)
            for _ in range(n)]
    return list(split.prefix_ids), rows


@pytest.mark.parametrize("name,mode", CASES)
def test_cached_equals_full_sequence_on_cuda_float32(tiny_models, device, name, mode):
    lm = tiny_models[name]
    assert lm.model.device.type == "cuda" == device.type
    prefix, rows = _rows(lm, mode)
    for shared in (True, False):
        fast = PrefixScorer(lm.model, make_head(lm, mode), prefix, shared_attention=shared).score(rows).cpu()
        ref = FullSequenceScorer(lm.model, make_head(lm, mode), prefix).score(rows)
        torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-4)  # TF32 may be on for matmuls


@pytest.mark.parametrize("name,mode", CASES)
def test_bf16_on_cuda_passes_the_self_check_and_is_as_accurate_as_the_models_own(tiny_models, device, name, mode):
    full = tiny_models[name]
    half = replace(full, model=copy.deepcopy(full.model).to(torch.bfloat16))
    prefix, rows = _rows(full, mode, n=16, max_len=1)
    from probe.core.engine import pad_rows

    cont, lengths = pad_rows(rows)
    head = make_head(half, mode)
    scorer = PrefixScorer(half.model, head, prefix)
    check = check_rows(half, head, prefix, scorer, cont, lengths, [str(r) for r in rows])
    assert check.rounding_noise > 0 and check.max_abs_diff <= check.tolerance
    truth = FullSequenceScorer(full.model, make_head(full, mode), prefix).score(cont, lengths).numpy()
    own = FullSequenceScorer(half.model, make_head(half, mode), prefix).score(cont, lengths).numpy()
    fast = scorer.score(cont, lengths).cpu().numpy()
    assert np.abs(fast - truth).max() <= 2 * max(np.abs(own - truth).max(), 1e-6)


def test_oom_halving_on_the_cuda_allocator_loses_no_row(tiny_models, device):
    """A batch that cannot fit in a capped share of the card: halved until it fits, the same scores as small
    batches. The cap leaves room for about a quarter of the full batch, by the memory plan's bytes per row
    (probe/models/memory.py; the fused head holds one vocabulary chunk per position, not the whole logits)."""
    from probe.core.engine import pad_rows
    from probe.core.scoring import scoring_path
    from probe.core.invariance import tile_rows
    from probe.models.memory import row_cost, tile_floor

    lm = tiny_models["llama-lm"]
    prefix, rows = _rows(lm, "logprob", n=8192, max_len=1)
    cont, lengths = pad_rows(rows)
    scorer = PrefixScorer(lm.model, make_head(lm, "logprob"), prefix)
    want = AdaptiveBatcher(256).run(scorer.score, cont, lengths=lengths)
    per_row = row_cost(lm.model.config, len(prefix), cont.shape[1], torch.float32, "logprob", scoring_path(lm)).total
    # set_per_process_memory_fraction needs the device's index: torch.device("cuda") alone raises ValueError
    index = device.index if device.index is not None else torch.cuda.current_device()
    # what a batch of one row holds: on a GPU a whole tile of products whatever the batch (probe/core/invariance.py;
    # the plan counts it as `tile_floor`), twice for the allocator's rounding; the first GPU run with tiles found the
    # plan's floor alone too little for this cap (every halving down to one row failed)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(index)
    before = torch.cuda.memory_allocated(index)
    scorer.score(cont[:1], lengths[:1])
    one = torch.cuda.max_memory_allocated(index) - before
    assert one >= 0.5 * tile_floor(lm.model.config, torch.float32, "logprob", tile_rows(device))
    torch.cuda.empty_cache()
    _, total = torch.cuda.mem_get_info(index)
    cap = torch.cuda.memory_reserved(index) + 2 * one + per_row * 8192 // 4
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), index)
    try:
        batcher = AdaptiveBatcher(8192)
        got = batcher.run(scorer.score, cont, lengths=lengths)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    assert batcher.batch_size < 8192  # it really ran out of memory and halved
    assert np.array_equal(got, want)  # batch invariance: the halved batches give the same bits
