"""The GPU kit's measured variants of the sweep's default path (experiments/gpu_bench.py runs them; issue 62 and 66).

The default path (shared-prefix attention, rows packed into forwards of ``probe.core.invariance.TILE_ROWS`` token
positions) beside: no tiles (forwards at the batch's own shape: the first GPU run's engine), tiles of 2,048 rows, the
default's tile forwards replayed from a CUDA graph captured at the plan's batch (every batch padded to it), and, last,
the backbone under ``torch.compile``. Each variant: seconds over the same timed rows scaled to the vocabulary, fraction of the
bf16 floor, and batch invariance (the first 4,096 ids at the batch that ran, a quarter and a sixteenth of it, an odd
size, and the same rows in reverse order: a row at another position of its tile) against its own first batch, and
whether its scores equal the default's bitwise.

Also here: a profile of one batch per shape (``torch.profiler``: GEMM, attention, norms and element-wise, copies,
other kernels and the time between them) and the largest allocations of that batch (what the memory plan may miss).
The time to result is experiments/time_to_result.py's. This module imports experiments/gpu_common.py only (the bench
imports this one).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager

import numpy as np
import torch

from experiments.gpu_common import (INVARIANCE_IDS, PROMPT, _free, batch_invariance, flops_per_row, invariance_batches,
                                    random_model, say, scores_at, sync)


@contextmanager
def tiles(rows: int | None):
    """The engine's product tiles for the block (``RM_PROBE_TILE_ROWS``; 0: none)."""
    before = os.environ.get("RM_PROBE_TILE_ROWS")
    if rows is not None:
        os.environ["RM_PROBE_TILE_ROWS"] = str(rows)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("RM_PROBE_TILE_ROWS", None)
        else:
            os.environ["RM_PROBE_TILE_ROWS"] = before


class GraphedScore:
    """``scorer``'s scores with its packed tiles' forwards (probe/core/packing.py) replayed from a CUDA graph captured
    once for ``batch`` rows of one length (each call copies its rows into the captured input, a shorter batch padded
    with its last row); the head reads the replayed hidden states as the scorer's own `read` does."""

    def __init__(self, scorer, example: torch.Tensor, batch: int):
        from probe.core.packing import layout, run_tiles

        self.scorer, self.batch = scorer, batch
        self.rows = example[:1].expand(batch, -1).clone()
        self.lengths = torch.full((batch,), example.shape[1], device=example.device)
        self.sizes = [example.shape[1]] * batch
        n_in = [example.shape[1] - int(scorer.head.drops_last_input)] * batch
        self.layout = layout(n_in, [scorer.n_prefix] * batch, scorer.tiles, scorer.device, self.rows.device,
                             prefix=scorer.shared)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.inference_mode():
            for _ in range(2):  # warm-up off the default stream, as capture requires
                run_tiles(scorer.backbone, scorer.device, self.rows, self.layout)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(self.graph):
            self.tiles = run_tiles(scorer.backbone, scorer.device, self.rows, self.layout)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        n = rows.shape[0]
        if n > self.batch:
            return torch.cat([self(rows[s : s + self.batch]) for s in range(0, n, self.batch)])
        self.rows[:n].copy_(rows)
        if n < self.batch:
            self.rows[n:].copy_(rows[-1:].expand(self.batch - n, -1))
        self.graph.replay()
        with torch.inference_mode():
            return self.scorer.read(self.rows, self.lengths, self.sizes, self.tiles)[:n].clone()


def _seconds(score, rows: torch.Tensor, batch: int, n: int, device) -> float:
    """Seconds to score ``rows[:n]`` in batches of ``batch`` (after one warm-up batch), scaled to all rows."""
    n = min(rows.shape[0], max(batch, n // batch * batch))
    score(rows[:batch])
    sync(device)
    t = time.perf_counter()
    for s in range(0, n, batch):
        score(rows[s : s + batch])
    sync(device)
    return (time.perf_counter() - t) * rows.shape[0] / n


def _measure(name: str, score, rows, batch: int, timed_rows: int, floor: float, device, default=None) -> dict:
    ids = min(INVARIANCE_IDS, rows.shape[0])
    seconds = _seconds(score, rows, batch, timed_rows, device)
    inv = batch_invariance(score, rows[:ids], invariance_batches(batch, ids))
    base = scores_at(score, rows[:ids], min(batch, ids))
    out = {"seconds": seconds, "fraction_of_floor": floor / seconds, "batch": batch, "batch_invariance": inv,
           "scores": base}
    if default is not None:
        out["equals_default"] = bool(np.array_equal(base, default))
        out["max_abs_diff_from_default"] = float(np.max(np.abs(base - default)))
    say(f"variant {name}: {seconds:.2f} s ({100 * floor / seconds:.1f}% of the floor), batch {batch}, bitwise across "
        f"batches {inv['bitwise']}, reversed rows {inv.get('reversed', {}).get('bitwise')}"
        + (f", equals the default {out['equals_default']}" if default is not None else ""))
    return out


def bench_variants(shape: str, device, dtype, small: bool, rate: float, compile_budget: float | None = None,
                   only_compile: bool = False) -> dict:
    """The sweep's shared path of ``shape`` in each variant (module docstring); ``compile_budget``: seconds the
    ``torch.compile`` variant may take (None: not run); ``only_compile``: the default and that variant only."""
    from probe.core.engine import PrefixScorer
    from probe.core.heads import LinearRewardHead
    from probe.core.scoring import default_batch_size, sweep_rows
    from probe.core.template import response_conversation, split_template

    lm = random_model(shape, device, dtype, small)
    split = split_template(lm.tokenizer, response_conversation(PROMPT), n_verify=0)
    vocab = lm.model.get_input_embeddings().num_embeddings
    rows = sweep_rows(np.arange(vocab), split.suffix_ids).to(device)
    head = LinearRewardHead(lm.model, 0)
    batch = min(vocab, default_batch_size(lm, len(split.prefix_ids), rows.shape[1], "reward", head))
    floor = vocab * flops_per_row(lm.model, rows.shape[1]) / rate
    timed_rows = 1024 if small else (16384 if shape == "gemma-2-27b" else 32768)
    out = {"shape": shape, "vocab": vocab, "floor_s": floor, "timed_rows": timed_rows, "variants": {}, "errors": {}}

    def scorer():
        return PrefixScorer(lm.model, head, split.prefix_ids)

    default = None
    plans = [("default", None)] + ([] if only_compile else [("untiled", 0), ("tiles_2048", 2048)])
    for name, rows_per_tile in plans:
        try:
            with tiles(rows_per_tile):
                sc = scorer()
                r = _measure(name, sc.score, rows, batch, timed_rows, floor, device, default)
                r["tile_rows"] = sc.tiles
        except Exception as err:  # noqa: BLE001 (one variant's failure is recorded; the others run)
            out["errors"][name] = f"{type(err).__name__}: {str(err).strip()[:300]}"
            say(f"variant {name} FAILED: {out['errors'][name]}")
            continue
        if name == "default":
            default = r["scores"]
        out["variants"][name] = r
        _free(device)
    if only_compile:
        pass
    elif device.type == "cuda":
        try:
            sc = scorer()
            graphed = GraphedScore(sc, rows[:batch], batch)
            out["variants"]["cuda_graph"] = _measure("cuda_graph", graphed, rows, batch, timed_rows, floor, device,
                                                     default)
            del graphed
        except Exception as err:  # noqa: BLE001
            out["errors"]["cuda_graph"] = f"{type(err).__name__}: {str(err).strip()[:300]}"
            say(f"variant cuda_graph FAILED: {out['errors']['cuda_graph']}")
        _free(device)
    else:
        out["errors"]["cuda_graph"] = "skipped: CUDA graphs need a GPU"
    if compile_budget is not None:
        out["variants"].update(_compiled(scorer, rows, batch, timed_rows, floor, device, default, compile_budget,
                                         out["errors"]))
    for v in out["variants"].values():
        v.pop("scores", None)
    del lm, rows
    _free(device)
    return out


def _compiled(scorer, rows, batch, timed_rows, floor, device, default, budget: float, errors: dict) -> dict:
    """The default path with the backbone under ``torch.compile`` (static shapes): its compile seconds too."""
    sc = scorer()
    try:
        backbone = sc.backbone
        compiled = torch.compile(backbone, dynamic=False)
        sc.backbone = compiled
        t = time.perf_counter()
        sc.score(rows[:batch])
        sync(device)
        first = time.perf_counter() - t
        say(f"variant compile: first batch (compiling) {first:.1f} s")
        if first > budget:
            errors["compile"] = f"compiling took {first:.0f} s, over its {budget:.0f} s"
            return {}
        r = _measure("compile", sc.score, rows, batch, timed_rows, floor, device, default)
        r["compile_seconds"] = first
        return {"compile": r}
    except Exception as err:  # noqa: BLE001
        errors["compile"] = f"{type(err).__name__}: {str(err).strip()[:300]}"
        say(f"variant compile FAILED: {errors['compile']}")
        return {}
    finally:
        del sc
        _free(device)


# --------------------------------------------------------------------------------------------- profile, memory
CATEGORIES = (("gemm", ("gemm", "cutlass", "xmma", "nvjet", "sm90", "sm80", "cublas", "aten::mm", "aten::addmm",
                        "aten::bmm", "aten::matmul", "aten::linear")),
              ("attention", ("softmax", "flash", "fmha", "attention")),
              ("norms and element-wise", ("elementwise", "reduce", "vectorized", "norm", "mul", "add", "pow", "mean",
                                          "rsqrt", "silu", "gelu", "tanh", "exp", "where", "masked")),
              ("copies", ("copy", "cat", "memcpy", "memset", "index", "gather", "fill", "to_copy")))


def category(name: str) -> str:
    low = name.lower()
    for cat, keys in CATEGORIES:
        if any(k in low for k in keys):
            return cat
    return "other"


def profile_batch(shape: str, device, dtype, small: bool) -> dict:
    """One batch of the default path at the plan's batch, profiled: time per kernel category, the time between
    kernels, and (on a GPU) the largest allocations by operator and input shape."""
    from torch.profiler import ProfilerActivity, profile

    from probe.core.engine import PrefixScorer
    from probe.core.heads import LinearRewardHead
    from probe.core.scoring import default_batch_size, sweep_rows
    from probe.core.template import response_conversation, split_template

    lm = random_model(shape, device, dtype, small)
    split = split_template(lm.tokenizer, response_conversation(PROMPT), n_verify=0)
    rows = sweep_rows(np.arange(8192 if not small else 512), split.suffix_ids).to(device)
    head = LinearRewardHead(lm.model, 0)
    batch = min(rows.shape[0], default_batch_size(lm, len(split.prefix_ids), rows.shape[1], "reward", head))
    sc = PrefixScorer(lm.model, head, split.prefix_ids)
    sc.score(rows[:batch])
    sync(device)
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t = time.perf_counter()
    with profile(activities=activities) as prof:
        sc.score(rows[:batch])
        sync(device)
    wall = time.perf_counter() - t
    by: dict[str, float] = {}
    events = [e for e in prof.events() if (e.device_type.name == "CUDA") == cuda]
    if not cuda:  # the CPU: top-level operators only (their children are inside them)
        events = [e for e in events if e.cpu_parent is None and e.name.startswith("aten::")]
    for e in events:
        us = e.device_time_total if cuda else e.cpu_time_total
        by[category(e.name)] = by.get(category(e.name), 0.0) + us / 1e6
    busy = sum(by.values())
    out = {"shape": shape, "batch": batch, "wall_s": wall, "seconds_by_category": by, "kernel_s": busy,
           "between_kernels_s": max(0.0, wall - busy), "kernels": len(events)}
    top: dict[str, float] = {}
    for e in events:
        top[e.name[:90]] = top.get(e.name[:90], 0.0) + (e.device_time_total if cuda else e.cpu_time_total) / 1e6
    out["top_kernels"] = sorted(top.items(), key=lambda kv: -kv[1])[:12]
    if cuda:
        out["largest_allocations"] = _largest_allocations(sc, rows[:batch], device)
        out["peak_bytes_over_weights"] = out["largest_allocations"].pop("peak_over_start")
    say(f"profile {shape}: batch {batch}, {wall * 1e3:.1f} ms wall, " + ", ".join(
        f"{k} {v * 1e3:.1f} ms" for k, v in sorted(by.items(), key=lambda kv: -kv[1])))
    del lm, sc, rows
    _free(device)
    return out


def _largest_allocations(sc, rows, device) -> dict:
    """Per operator and input shape, the device memory it allocated during one batch (largest first), and the
    batch's peak above what was allocated before it."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True,
                 record_shapes=True) as prof:
        sc.score(rows)
        sync(device)
    peak = torch.cuda.max_memory_allocated(device) - start
    table = prof.key_averages(group_by_input_shape=True)
    items = sorted(((e.key, str(e.input_shapes)[:160], int(e.self_device_memory_usage)) for e in table
                    if e.self_device_memory_usage > 0), key=lambda x: -x[2])[:15]
    return {"peak_over_start": peak, "top": [{"op": k, "shapes": s, "bytes": b} for k, s, b in items]}


def bench_invariance(shape: str, device, dtype, small: bool) -> dict:
    """The default path's batch invariance alone: the first 4,096 ids at the plan's batch, a quarter and a sixteenth
    of it, an odd size and in reverse order (what `sweep:` measures beside the timings)."""
    from probe.core.engine import PrefixScorer
    from probe.core.heads import LinearRewardHead
    from probe.core.scoring import default_batch_size, sweep_rows
    from probe.core.template import response_conversation, split_template

    lm = random_model(shape, device, dtype, small)
    split = split_template(lm.tokenizer, response_conversation(PROMPT), n_verify=0)
    rows = sweep_rows(np.arange(INVARIANCE_IDS), split.suffix_ids).to(device)
    head = LinearRewardHead(lm.model, 0)
    batch = default_batch_size(lm, len(split.prefix_ids), rows.shape[1], "reward", head)
    sc = PrefixScorer(lm.model, head, split.prefix_ids)
    out = batch_invariance(sc.score, rows, invariance_batches(batch, rows.shape[0]))
    out["tile_rows"] = sc.tiles
    say(f"invariance {shape}: bitwise {out['bitwise']} (reversed {out['reversed']['bitwise']}), largest difference "
        f"{out['max_abs_diff']:.3g}")
    del lm, sc
    _free(device)
    return out
