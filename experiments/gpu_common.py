"""What the GPU kit's benchmarks share (experiments/gpu_bench.py, gpu_variants.py, time_to_result.py import it; it
imports none of them): the prompt and the published shapes, a random-weight model at a shape, the FLOPs of a row,
the batch-invariance measure, and the device's housekeeping."""

from __future__ import annotations

import time

import numpy as np
import torch

from probe.runs.cpu import reproducible_blas

reproducible_blas()  # before the first product: MKL's strict mode for the CPU runs (probe/core/invariance.py)

from experiments.bench_sweep import non_embedding_params  # noqa: E402

PROMPT = "What, in one word, is the greatest thing ever?"
SHAPES = {"llama-3.1-8b": "llama3", "gemma-2-27b": "gemma"}  # shape -> tiny tokenizer family (its template)
SMALL = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
             num_hidden_layers=2, vocab_size=4096, query_pre_attn_scalar=32)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def say(msg: str) -> None:
    print(f"[gpu-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def random_model(shape: str, device, dtype, small: bool, causal: bool = False, seed: int = 0):
    """A reward model (or causal LM) of ``shape`` with random weights, built on ``device``, with the attention it was
    trained with."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from probe.models.attention import use_trained_attention
    from probe.models.loading import LoadedModel
    from probe.models.registry import DEFAULT
    from probe.models.shapes import SHAPES as PUBLISHED
    from probe.models.shapes import config_for
    from tests.tiny import make_tokenizer

    tok = make_tokenizer(SHAPES[shape])
    gemma = PUBLISHED[shape]["model_type"] == "gemma2"
    overrides = dict(SMALL) if small else {}
    if small and gemma:
        overrides["sliding_window"] = 8  # shorter than the prompt: the sliding layers' cache really is cut
    elif small:
        overrides.pop("query_pre_attn_scalar")
    cfg = config_for(shape, **overrides)
    cfg.pad_token_id, cfg.num_labels = tok.pad_token_id, 1
    torch.manual_seed(seed)
    auto = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    with torch.device(device):
        model = auto.from_config(cfg, dtype=dtype)
    model.eval().requires_grad_(False)
    use_trained_attention(model)
    return LoadedModel(model, tok, DEFAULT, "causal" if causal else "reward", f"random:{shape}", "random", None,
                       "benchmark")


def flops_per_row(model, new_tokens: int) -> float:
    return 2 * non_embedding_params(model) * new_tokens + 2 * model.config.hidden_size


INVARIANCE_IDS = 4096
TOP = 20


def invariance_batches(ran: int, n: int) -> list[int]:
    """The batch sizes a batch-invariance check compares: the batch that ran (at most ``n``), a quarter and a
    sixteenth of it, and an odd size (a third of it, made odd: its last batch is a remainder), largest first; none
    above the batch that ran (after halving on an out-of-memory error it may be 1 or 2: a batch of 3 may not fit)."""
    base = max(1, min(ran, n))
    sizes = {base, max(1, base // 4), max(1, base // 16), max(3, base // 3) | 1}
    return sorted((b for b in sizes if b <= base), reverse=True)


def scores_at(score, rows: torch.Tensor, batch: int) -> np.ndarray:
    """``rows`` scored by ``score`` one call per ``batch`` rows (no halving), as float64 on the host."""
    parts = [score(rows[i : i + batch]).float().cpu() for i in range(0, rows.shape[0], batch)]
    return torch.cat(parts).numpy().astype(np.float64)


def batch_invariance(score, rows: torch.Tensor, batches: list[int]) -> dict:
    """``rows`` scored by ``score`` (one call per batch, no halving) at each size in ``batches``, each against the
    first: the largest absolute score difference, how many rows change rank (ranks as a sweep ranks: ``min`` on
    ties, best first), whether the best and worst ``TOP`` rows (ids, in order) are the same, and whether the scores
    are bitwise equal."""
    from scipy.stats import rankdata

    base = scores_at(score, rows, batches[0])
    base_rank = rankdata(-base, method="min")
    order = np.argsort(-base, kind="stable")
    out = {"rows": int(rows.shape[0]), "base_batch": batches[0], "against": []}
    for batch in batches[1:]:
        s = scores_at(score, rows, batch)
        o = np.argsort(-s, kind="stable")
        out["against"].append({
            "batch": batch, "max_abs_diff": float(np.max(np.abs(s - base))),
            "rank_changes": int(np.sum(rankdata(-s, method="min") != base_rank)),
            "top_same": bool(np.array_equal(o[:TOP], order[:TOP])),
            "bottom_same": bool(np.array_equal(o[-TOP:], order[-TOP:])),
            "bitwise": bool(np.array_equal(s, base))})
    # the same rows in reverse order at the first size: each row at another position of its batch and tile
    rev = scores_at(score, rows.flip(0), batches[0])[::-1]
    out["reversed"] = {"max_abs_diff": float(np.max(np.abs(rev - base))), "bitwise": bool(np.array_equal(rev, base))}
    out["max_abs_diff"] = max((a["max_abs_diff"] for a in out["against"]), default=0.0)
    out["rank_changes"] = max((a["rank_changes"] for a in out["against"]), default=0)
    out["bitwise"] = all(a["bitwise"] for a in out["against"]) and out["reversed"]["bitwise"]
    return out


def _free(device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
