"""The GPU kit's benchmarks (experiments/gpu_kit.py runs them; alone: python -m experiments.gpu_bench --out F.json).

Random weights at the published shapes (probe/models/shapes.py), full depth, in bf16 on a GPU (float32 on a CPU,
where ``--small`` shrinks every width so that the kit's own CI run stays short). Every ratio is measured in this
run against the matmul rate measured in this run (bf16 8192^3 on a GPU; float32 1024^3 on a CPU):

* ``sweep``: the whole vocabulary (128,256 ids of Llama-3.1-8B's shape; 256,000 of Gemma-2-27B's) as one-token
  responses after the paper's first prompt, on each path: ``shared`` (prefix cache, shared-prefix attention),
  ``cache`` (prefix cache, a per-row view), ``uncached`` (the prefix recomputed for every row, as the paper's code
  did; timed on a sample of rows and scaled to the vocabulary, said so); with the batch the memory plan picks; the
  floor is the FLOPs of the new tokens (2 x non-embedding parameters x tokens per row, and the head) over the
  matmul rate; the plan's bytes per row against ``torch.cuda.max_memory_allocated``, and the largest batch that
  ran (doubling from the plan's until the allocator refuses).
  Batch invariance: the first 4,096 ids of the vocabulary scored again on each path at the batch that ran, a quarter
  and a sixteenth of it and an odd size (1,024 ids on the uncached path at full size, whose rows cost the whole
  prompt each): the largest score difference against the batch that ran, how many of those ids change rank, and
  whether the best and worst 20 change (RewardBench's users see scores move with the batch size: its issue #137).
* ``ref``: the same sweep with a ``--ref`` reference model (two models per row).
* ``gcg``: one GCG step at search width 512 (gradient, sampling, scoring the candidates), against the same step
  with the plain full-sequence forward.
* ``responses`` and ``social``: whole responses and social items (three options each) through the Python API and
  the social scorer, items per second, the self-check included.
* ``bf16``: the self-check's measured disagreement against its tolerance, tiny families, on this device.
* ``torchrun``: ``probe.exhaustive`` under ``torchrun --nproc_per_node 1`` against one plain process: the same
  scores, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from experiments import gpu_variants, time_to_result
from experiments.bench_sweep import matmul_rate, timed
# the pieces the variants share, below both modules (names kept here for the scripts and tests that import them)
from experiments.gpu_common import (INVARIANCE_IDS, PROMPT, SHAPES, SMALL, TOP, _free, batch_invariance,  # noqa: F401
                                    flops_per_row, invariance_batches, random_model, say, scores_at, sync)

# in the order they run: what the last whole run (run3) did not reach first after the sweeps (compile), the short
# invariance steps only where named (--steps)
STEPS = ("sweep:llama-3.1-8b", "sweep:gemma-2-27b", "variants:llama-3.1-8b", "variants:gemma-2-27b", "profile",
         "compile", "e2e", "ref", "gcg", "responses", "social", "bf16", "torchrun")
SHORT = ("invariance:llama-3.1-8b", "invariance:gemma-2-27b")


def sweep_seconds(scorer, rows: torch.Tensor, batch: int, device, timed_rows: int | None = None) -> tuple[float, int, int]:
    """Seconds to score all of ``rows`` (halving the batch on out-of-memory, as the commands do): timed over the
    first ``timed_rows`` (whole batches; all where None) after one warm-up batch, and scaled to all rows (batches of
    one shape cost alike). Returns (seconds, rows timed, the batch size that ran)."""
    from probe.core.scoring import AdaptiveBatcher

    batcher = AdaptiveBatcher(batch)
    n = rows.shape[0] if timed_rows is None else min(rows.shape[0], max(batch, timed_rows // batch * batch))
    batcher.run(scorer.score, rows[: min(batch, n)])  # warm-up: the allocator, kernels; the first halvings
    sync(device)
    t = time.perf_counter()
    batcher.run(scorer.score, rows[:n])
    sync(device)
    return (time.perf_counter() - t) * rows.shape[0] / n, n, batcher.batch_size


def largest_batch(scorer, rows: torch.Tensor, start: int, device, cap: int = 16384) -> int:
    """Doubling from ``start`` up to ``cap``: the largest batch one forward ran at before the allocator refused."""
    from probe.core.scoring import is_oom

    ok, b = start, start * 2
    while b <= min(rows.shape[0], cap):
        try:
            scorer.score(rows[:b])
            sync(device)
            ok, b = b, b * 2
        except Exception as err:  # noqa: BLE001 (the allocator's several error types: is_oom decides)
            if not is_oom(err):
                raise
            break
        finally:
            torch.cuda.empty_cache()
    return ok


PLAN_PATH = {"shared": "shared", "cache": "cache", "uncached": "full"}  # this benchmark's path -> the plan's


def path_plan(lm, head, n_prefix: int, n_new: int, path: str) -> tuple[int, int, int]:
    """(batch, bytes per row, fixed bytes) the memory plan gives ``path``: the shared path's batch is the commands'
    own (`default_batch_size`); the other paths' from the same plan with their own costs."""
    from probe.core.scoring import default_batch_size
    from probe.models.memory import batch_for, fixed_bytes, row_cost

    plan = PLAN_PATH[path]
    cost = row_cost(lm.model.config, n_prefix, n_new, lm.dtype, "reward", plan).total
    fixed = fixed_bytes(lm.model.config, n_prefix, lm.dtype, plan)
    if path == "shared" or lm.device.type != "cuda":
        return default_batch_size(lm, n_prefix, n_new, "reward", head), cost, fixed
    return max(1, batch_for(torch.cuda.mem_get_info(lm.device)[0], fixed, cost)), cost, fixed


def bench_sweep(shape: str, device, dtype, small: bool, rate: float, timed: dict) -> dict:
    """One shape's whole-vocabulary sweep on each path; ``timed``: path -> rows timed (None: all), scaled to all."""
    from probe.core.engine import PrefixScorer
    from probe.core.heads import LinearRewardHead
    from probe.core.scoring import is_oom, sweep_rows
    from probe.core.template import response_conversation, split_template

    lm = random_model(shape, device, dtype, small)
    weights = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    split = split_template(lm.tokenizer, response_conversation(PROMPT), n_verify=0)
    vocab = lm.model.get_input_embeddings().num_embeddings
    rows = sweep_rows(np.arange(vocab), split.suffix_ids).to(device)
    new, n_prefix = rows.shape[1], len(split.prefix_ids)
    head = LinearRewardHead(lm.model, 0)
    floor = vocab * flops_per_row(lm.model, new) / rate
    out = {"shape": shape, "vocab": vocab, "layers": lm.model.config.num_hidden_layers, "prefix": n_prefix,
           "new_tokens_per_row": new, "weights_bytes": weights, "flops_per_row": flops_per_row(lm.model, new),
           "floor_s": floor, "paths": {}, "errors": {}}
    for path in ("shared", "cache", "uncached"):
        batch, per_row, fixed = path_plan(lm, head, n_prefix, new, path)
        scorer = PrefixScorer(lm.model, head, split.prefix_ids, use_cache=path != "uncached",
                              shared_attention=path == "shared")
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            seconds, n, ran = sweep_seconds(scorer, rows, batch, device, timed[path])
        except Exception as err:  # noqa: BLE001 (one path's failure is recorded; the other paths still run)
            if not is_oom(err) and not isinstance(err, RuntimeError):
                raise
            out["errors"][path] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            say(f"sweep {shape} {path} FAILED: {out['errors'][path]}")
            del scorer
            _free(device)
            continue
        entry = {"seconds": seconds, "rows_per_s": vocab / seconds, "tokens_per_s": vocab * new / seconds,
                 "fraction_of_floor": floor / seconds, "timed_rows": n, "scaled_to_vocabulary": n != vocab,
                 "plan_batch": batch, "batch_that_ran": ran, "plan_bytes_per_row": per_row, "plan_fixed_bytes": fixed}
        if device.type == "cuda":
            entry["max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
            entry["measured_bytes_per_row"] = (entry["max_memory_allocated"] - weights - fixed) / ran
            if path == "shared":
                entry["largest_batch_that_ran"] = largest_batch(scorer, rows, ran, device)
        ids = INVARIANCE_IDS if path != "uncached" or small else INVARIANCE_IDS // 4
        entry["batch_invariance"] = batch_invariance(scorer.score, rows[:ids], invariance_batches(ran, ids))
        say(f"sweep {shape} {path}: batch invariance over {ids} ids, largest difference "
            f"{entry['batch_invariance']['max_abs_diff']:.3g}, {entry['batch_invariance']['rank_changes']} rank changes")
        out["paths"][path] = entry
        say(f"sweep {shape} {path}: {seconds:.2f} s ({100 * floor / seconds:.1f}% of the floor {floor:.2f} s), "
            f"batch {ran}")
        del scorer
        _free(device)
    if "uncached" in out["paths"] and "shared" in out["paths"]:
        out["speedup_shared_vs_uncached"] = out["paths"]["uncached"]["seconds"] / out["paths"]["shared"]["seconds"]
    del lm, head, rows
    _free(device)
    return out


def bench_ref(device, dtype, small: bool) -> dict:
    """The Llama shape's log-probability sweep alone and with a second random model as ``--ref`` (the implicit reward:
    two forwards per row), on a quarter of the vocabulary, scaled to all of it."""
    from dataclasses import replace

    from probe.core.scoring import build_scorer, default_batch_size, make_head, sweep_rows
    from probe.core.template import response_conversation, split_template

    shape = "llama-3.1-8b"
    policy = random_model(shape, device, dtype, small, causal=True)
    lm = replace(policy, ref=random_model(shape, device, dtype, small, causal=True, seed=1), beta=1.0)
    split = split_template(lm.tokenizer, response_conversation(PROMPT), n_verify=0)
    vocab = lm.model.get_input_embeddings().num_embeddings
    rows = sweep_rows(np.arange(vocab), split.suffix_ids).to(device)
    batch = default_batch_size(lm, len(split.prefix_ids), rows.shape[1], "logprob", make_head(lm, "logprob"))
    single, n, _ = sweep_seconds(build_scorer(policy, make_head(policy, "logprob"), split.prefix_ids), rows, batch,
                                 device, vocab // 4)
    both, _, ran = sweep_seconds(build_scorer(lm, make_head(lm, "logprob"), split.prefix_ids), rows, batch, device,
                                 vocab // 4)
    say(f"ref: {single:.2f} s alone, {both:.2f} s with --ref ({both / single:.2f}x)")
    del policy, lm
    _free(device)
    return {"shape": shape, "rows": vocab, "timed_rows": n, "batch_with_ref": ran, "seconds_alone": single,
            "seconds_with_ref": both, "ratio": both / single}


def bench_gcg(device, dtype, small: bool) -> dict:
    """One GCG step at width 512 on the Llama shape (reward head): cached against the plain full-sequence forward."""
    from probe.config import GCGConfig
    from probe.core.engine import PrefixScorer
    from probe.core.gcg import GCG
    from probe.core.scoring import make_head
    from probe.core.template import response_conversation, split_template

    lm = random_model("llama-3.1-8b", device, dtype, small)
    split = split_template(lm.tokenizer, response_conversation(PROMPT), n_verify=0)
    config = GCGConfig(length=4, steps=1, search_width=512, topk=64, filter_ids=False)
    allowed = torch.ones(lm.model.get_input_embeddings().num_embeddings, dtype=torch.bool)
    allowed[len(lm.tokenizer):] = False
    head = make_head(lm, "reward")
    out = {}
    for name, cached in (("cached", True), ("full_sequence", False)):
        gcg = GCG(lm, head, split, config, allowed)
        if not cached:
            plain = PrefixScorer(lm.model, head, split.prefix_ids, use_cache=False)
            gcg.scorer, gcg.terms = plain, [(plain, *gcg.terms[0][1:])]
        ids = torch.arange(100, 104)
        gen = torch.Generator().manual_seed(0)

        def step():
            grad = gcg.token_gradient(ids.to(gcg.device))
            gcg.objective(gcg.sample(ids, grad, gen))

        out[name] = timed(step, device, repeats=2)
    out["speedup"] = out["full_sequence"] / out["cached"]
    say(f"gcg step (width 512): {out['cached']:.3f} s cached, {out['full_sequence']:.3f} s full-sequence")
    _free(device)
    return out


def _texts(n: int, seed: int) -> list[str]:
    from tests.tiny import WORDS

    words = WORDS.read_text().split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, size=int(rng.integers(1, 12)))).capitalize() for _ in range(n)]


def bench_responses(device, dtype, small: bool, n: int) -> dict:
    import probe

    lm = random_model("llama-3.1-8b", device, dtype, small)
    responses = _texts(n, 0)
    probe.score_responses(lm, None, PROMPT, responses[:64])  # warm-up
    sync(device)
    t = time.perf_counter()
    probe.score_responses(lm, None, PROMPT, responses)
    sync(device)
    seconds = time.perf_counter() - t
    say(f"responses: {n} in {seconds:.2f} s ({n / seconds:.1f}/s)")
    _free(device)
    return {"shape": "llama-3.1-8b", "responses": n, "seconds": seconds, "items_per_s": n / seconds}


def bench_social(device, dtype, small: bool, n: int) -> dict:
    """BBQ-shaped items: a context and question (12 distinct prompts), three answer options each."""
    from probe.core.scoring import default_batch_size
    from probe.social.items import Item
    from probe.social.scoring import score_items

    lm = random_model("llama-3.1-8b", device, dtype, small)
    contexts = _texts(12, 1)
    answers = _texts(3 * n, 2)
    items = [Item("synthetic", "bias", str(i), f"{contexts[i % 12]}. Who was it?",
                  tuple(answers[3 * i : 3 * i + 3]), ("a", "b", "unknown"), gold=2, undesirable=0) for i in range(n)]
    batch = default_batch_size(lm, 64, 24, "reward")
    score_items(lm, "reward", items[:8], batch_size=batch)  # warm-up
    sync(device)
    t = time.perf_counter()
    score_items(lm, "reward", items, batch_size=batch)
    sync(device)
    seconds = time.perf_counter() - t
    say(f"social: {n} items in {seconds:.2f} s ({n / seconds:.1f}/s)")
    _free(device)
    return {"shape": "llama-3.1-8b", "items": n, "options_per_item": 3, "batch": batch, "seconds": seconds,
            "items_per_s": n / seconds}


def bench_bf16(device, small: bool) -> dict:
    """The self-check's disagreement against its tolerance in bf16 on this device, per tiny family and head (two
    families and 8 rows where ``small``: bf16 on a CPU is slow)."""
    from experiments.bf16_tolerance import TINY, _tiny, measure

    rows = []
    for name, mode in TINY[:2] if small else TINY:
        loaded = _tiny(name)
        loaded.model.to(device)
        r = measure(loaded, mode, 8 if small else 48)
        rows.append({"model": name, "mode": mode, "fast_vs_own_bf16": r["fast_vs_own_bf16"],
                     "rounding_noise": r["rounding_noise"], "tolerance": 2 * r["rounding_noise"],
                     "ratio_to_tolerance": r["fast_vs_own_bf16"] / (2 * r["rounding_noise"]),
                     "own_bf16_vs_float32": r["own_bf16_vs_float32"]})
    worst = max(r["ratio_to_tolerance"] for r in rows)
    say(f"bf16 self-check: largest disagreement {worst:.2f} x the tolerance over {len(rows)} cases")
    return {"rows": rows, "largest_ratio_to_tolerance": worst}


def bench_torchrun(device, limit: int) -> dict:
    """``torchrun --nproc_per_node 1 -m probe.exhaustive`` against ``python -m probe.exhaustive``: bitwise scores."""
    import polars as pl
    from transformers import LlamaForSequenceClassification

    from tests import tiny

    with tempfile.TemporaryDirectory() as tmp:
        tok = tiny.make_tokenizer("llama3")
        model = tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok))
        model.save_pretrained(f"{tmp}/rm")
        tok.save_pretrained(f"{tmp}/rm")
        args = ["-m", "probe.exhaustive", "--rm", f"{tmp}/rm", "--device", device.type, "--limit", str(limit),
                "--prompt", PROMPT]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        runner = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
        times = {}
        for name, cmd in (("plain", [sys.executable, *args]), ("torchrun", [*runner, *args])):
            t = time.perf_counter()
            done = subprocess.run([*cmd, "--output", f"{tmp}/{name}"], env=env, capture_output=True, text=True,
                                  timeout=300)
            times[name] = time.perf_counter() - t
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                raise RuntimeError(f"{name} run failed: {' | '.join(tail)}")
        a, b = (pl.read_parquet(next(Path(tmp, n).rglob("scores.parquet"))).sort(["prompt_key", "token_id"])
                for n in times)
        same = a["token_id"].to_list() == b["token_id"].to_list() and a["score"].to_list() == b["score"].to_list()
    say(f"torchrun (1 process): {'bitwise equal' if same else 'DIFFERENT'} scores over {a.height} rows")
    return {"rows": a.height, "bitwise_equal": bool(same), "seconds": times}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="every width shrunk (the kit's CPU run in CI)")
    ap.add_argument("--steps", default=",".join(STEPS), help=f"which of {', '.join(STEPS + SHORT)}")
    ap.add_argument("--out", required=True, help="the JSON file to write")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    steps = args.steps.split(",")
    unknown = sorted(set(steps) - set(STEPS + SHORT))
    if unknown:
        ap.error(f"--steps: unknown {', '.join(unknown)}")
    rate = matmul_rate(device, dtype, 8192 if device.type == "cuda" else 1024)
    say(f"matmul rate {rate / 1e12:.2f} TFLOP/s ({dtype}, {device})")
    result: dict = {"device": str(device), "dtype": str(dtype).removeprefix("torch."), "small": args.small,
                    "matmul_flops_per_s": rate, "results": {}, "errors": {}}
    def timed(shape):  # rows timed per path (None: all), each scaled to the whole vocabulary
        if args.small:
            return {"shared": None, "cache": 1024, "uncached": 256}
        big = shape == "gemma-2-27b"  # about a minute for its shared path alone at the floor: a quarter is timed
        return {"shared": 65536 if big else None, "cache": 32768, "uncached": 4096}

    plans = {
        **{f"sweep:{s}": (lambda s=s: bench_sweep(s, device, dtype, args.small, rate, timed(s))) for s in SHAPES},
        "ref": lambda: bench_ref(device, dtype, args.small),
        "gcg": lambda: bench_gcg(device, dtype, args.small),
        "responses": lambda: bench_responses(device, dtype, args.small, 2048 if not args.small else 64),
        "social": lambda: bench_social(device, dtype, args.small, 1024 if not args.small else 32),
        "bf16": lambda: bench_bf16(device, args.small),
        "torchrun": lambda: bench_torchrun(device, 4096 if not args.small else 256),
        **{f"variants:{s}": (lambda s=s: gpu_variants.bench_variants(s, device, dtype, args.small, rate)) for s in SHAPES},
        "profile": lambda: {s: gpu_variants.profile_batch(s, device, dtype, args.small) for s in SHAPES},
        "e2e": lambda: time_to_result.bench_e2e(device, dtype, args.small),
        # the default path's batch invariance alone (a short device call; `sweep:` measures it with everything else)
        **{f"invariance:{s}": (lambda s=s: gpu_variants.bench_invariance(s, device, dtype, args.small)) for s in SHAPES},
        # last: compiling may take minutes; CI's CPU run skips it (inductor's C++ build on 2 cores)
        "compile": lambda: (gpu_variants.bench_variants("llama-3.1-8b", device, dtype, args.small, rate,
                                                        compile_budget=150.0, only_compile=True)
                            if device.type == "cuda" else {"skipped": "torch.compile is measured on a GPU only"}),
    }
    for step in steps:
        t = time.perf_counter()
        say(f"{step} ...")
        try:
            value = plans[step]()
            if ":" in step:
                kind, shape = step.split(":", 1)
                result["results"].setdefault(kind, {})[shape] = value
            else:
                result["results"][step] = value
        except Exception as err:  # noqa: BLE001 (one benchmark's failure is recorded, the others still run)
            result["errors"][step] = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
            say(f"{step} FAILED: {result['errors'][step]}")
            _free(device)
        result.setdefault("seconds", {})[step] = time.perf_counter() - t
        tmp = Path(args.out).with_suffix(".tmp")  # what is done so far survives a kill, whole
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(args.out)
        _free(device)
    return result


if __name__ == "__main__":
    sys.exit(1 if main()["errors"] else 0)
