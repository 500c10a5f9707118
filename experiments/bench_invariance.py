"""The cost of batch-invariant scores on the CPU (issue 62): this tree against another checkout of rm-probe (the
tree before the change), the same engine loops side by side in one run, alternating.

Invariance costs three things on a CPU: MKL's strict reproducibility mode (``MKL_CBWR=AUTO,STRICT``), sums in a
fixed tree instead of a matrix-vector product or a reduction kernel (the heads, the fused log-probability head's
per-chunk sums), and rows padded to a length set by themselves (more, smaller forwards for whole responses). Each
workload runs in a fresh process per tree (MKL reads its mode once per process), the two trees in turn (A B A B
...), timed inside the process around the engine loop alone (model loading left out), and the ratio is taken pair by
pair; the median is reported. The baseline process runs with MKL's default mode, as the old tree did.

    python -m experiments.bench_invariance --baseline /tmp/base [--repeats 3] [--threads 1]

First, each change alone in one process (the robust number on a machine whose speed drifts: the two sides alternate
within seconds of each other), then the two trees whole.
    -> experiments/results/bench_invariance_cpu.json and .md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results"
WORKLOADS = {
    "smollm2 logprob sweep (4,096 ids, batch 256)": "logprob",
    "smollm2 reward sweep (random head; 4,096 ids, batch 256)": "reward",
    "smollm2 reward, 512 whole responses of 1-40 words (batch 64)": "responses",
}

WORKER = r"""
import sys, time, os, json, random, importlib.util
sys.path.insert(0, TREE)
# this tree's kernels/ as probe.kernels (an editable install maps it to its own checkout's)
spec = importlib.util.spec_from_file_location("probe.kernels", TREE + "/kernels/__init__.py",
                                              submodule_search_locations=[TREE + "/kernels"])
sys.modules["probe.kernels"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["probe.kernels"])
import probe
assert probe.__file__.startswith(TREE), probe.__file__
import torch
import numpy as np
torch.set_num_threads(THREADS)
from probe.models.loading import load_model
from probe.core.scoring import make_head, sweep_rows, AdaptiveBatcher
from probe.core.engine import PrefixScorer
from probe.core.template import response_conversation, split_template
kind = "causal" if WORK == "logprob" else "reward"
torch.manual_seed(0)
lm = load_model(None, kind=kind, device="cpu", **({} if kind == "causal" else {"allow_random_head": True}))
head = make_head(lm, "logprob" if kind == "causal" else "reward")
split = split_template(lm.tokenizer, response_conversation("What, in one word, is the greatest thing ever?"),
                       n_verify=0)
sc = PrefixScorer(lm.model, head, split.prefix_ids)
if WORK == "responses":
    rng = random.Random(0)
    words = ["love", "peace", "the", "music", "of", "freedom", "and", "a", "very", "good", "thing", "ever"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(512)]
    rows = [lm.tokenizer.encode(t, add_special_tokens=False) + list(split.suffix_ids) for t in texts]
    rows.sort(key=len)
    score = lambda: [sc.score(rows[s:s + 64]) for s in range(0, len(rows), 64)]
else:
    ids = sweep_rows(np.arange(4096), split.suffix_ids)
    score = lambda: AdaptiveBatcher(256).run(sc.score, ids)
score()  # warm-up
t, c = time.perf_counter(), time.process_time()
score()
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_seconds": time.process_time() - c}))
"""


COMPONENTS = r"""
import sys, time, json, random, statistics
import torch, numpy as np
torch.set_num_threads(THREADS)
import probe.kernels.fused_logprob as fused
import probe.core.heads as heads
import probe.core.engine as engine
from probe.core import invariance
from probe.models.loading import load_model
from probe.core.scoring import make_head, sweep_rows, AdaptiveBatcher
from probe.core.engine import PrefixScorer
from probe.core.template import response_conversation, split_template
split_of = lambda lm: split_template(lm.tokenizer, response_conversation("What, in one word, is the greatest thing ever?"),
                                     n_verify=0)
causal = load_model(None, kind="causal", device="cpu")
torch.manual_seed(0)
reward = load_model(None, kind="reward", device="cpu", allow_random_head=True)
out = {}
def ab(name, work, on, off, repeats=8):
    work()
    times = {"invariant": [], "before": []}
    for i in range(repeats):
        for mode in (("invariant", "before") if i % 2 else ("before", "invariant")):
            (on if mode == "invariant" else off)()
            c = time.process_time(); work(); times[mode].append(time.process_time() - c)
    on()
    ratios = [a / b for a, b in zip(times["invariant"], times["before"])]
    out[name] = {k: statistics.median(v) for k, v in times.items()} | {"median_ratio": statistics.median(ratios),
                                                                       "ratios": ratios}
    print(name, round(out[name]["median_ratio"], 3), flush=True)
# the fused head's per-chunk sums: the tree against .sum(0)
sc = PrefixScorer(causal.model, make_head(causal, "logprob"), split_of(causal).prefix_ids)
rows = sweep_rows(np.arange(1024), split_of(causal).suffix_ids)
ab("logprob sweep: the fused head's sums in a tree (1,024 ids)", lambda: AdaptiveBatcher(256).run(sc.score, rows),
   lambda: setattr(fused, "tree_sum", invariance.tree_sum),
   lambda: setattr(fused, "tree_sum", lambda x, d=-1, inplace=False: x.sum(d)))
# the reward head's dot product: the tree against h @ w
sr = PrefixScorer(reward.model, make_head(reward, "reward"), split_of(reward).prefix_ids)
rrows = sweep_rows(np.arange(1024), split_of(reward).suffix_ids)
ab("reward sweep: the head's dot product in a tree (1,024 ids)", lambda: AdaptiveBatcher(256).run(sr.score, rrows),
   lambda: setattr(heads, "dot_rows", invariance.dot_rows), lambda: setattr(heads, "dot_rows", lambda h, w: h @ w))
# whole responses: each exact length its own forward against every batch padded to its longest row
rng = random.Random(0)
words = ["love", "peace", "the", "music", "of", "freedom", "and", "a", "very", "good", "thing", "ever"]
texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(256)]
resp = sorted((reward.tokenizer.encode(t, add_special_tokens=False) + list(split_of(reward).suffix_ids) for t in texts),
              key=len)
one_group = lambda lengths, device="cpu": {max(lengths): list(range(len(lengths)))}
ab("256 whole responses: exact lengths against padding to the batch's longest (batch 64)",
   lambda: [sr.score(resp[s:s + 64]) for s in range(0, len(resp), 64)],
   lambda: setattr(engine, "buckets", invariance.buckets), lambda: setattr(engine, "buckets", one_group), repeats=6)
print(json.dumps(out))
"""


def components(threads: int) -> dict:
    """Each code change of invariance against the code before it, in one process (MKL strict), alternating."""
    env = {**os.environ, "MKL_CBWR": "AUTO,STRICT"}
    code = COMPONENTS.replace("THREADS", str(threads))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=3000)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip().splitlines()[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def one(tree: Path, work: str, threads: int, strict: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    if strict:
        env["MKL_CBWR"] = "AUTO,STRICT"
    code = WORKER.replace("TREE", repr(str(tree))).replace("THREADS", str(threads)).replace("WORK", repr(work))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="a checkout of rm-probe before batch invariance (the whole-tree comparison)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    base = Path(args.baseline).resolve() if args.baseline else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=base, capture_output=True,
                            text=True).stdout.strip() if base else None
    parts = components(args.threads)
    results = {}
    for name, work in (WORKLOADS.items() if base else ()):
        pairs = []
        for _ in range(args.repeats):
            new = one(ROOT, work, args.threads, strict=True)
            old = one(base, work, args.threads, strict=False)
            pairs.append({"invariant_s": new["seconds"], "before_s": old["seconds"],
                          "ratio": new["seconds"] / old["seconds"], "invariant_cpu_s": new["cpu_seconds"],
                          "before_cpu_s": old["cpu_seconds"], "cpu_ratio": new["cpu_seconds"] / old["cpu_seconds"]})
            print(f"{name}: {new['seconds']:.3f} s invariant, {old['seconds']:.3f} s before "
                  f"({new['seconds'] / old['seconds']:.3f}x; CPU time {pairs[-1]['cpu_ratio']:.3f}x)", flush=True)
        med = lambda key: sorted(p[key] for p in pairs)[len(pairs) // 2]  # noqa: E731
        results[name] = {"pairs": pairs, "median_ratio": med("ratio"), "median_cpu_ratio": med("cpu_ratio")}
    out = {"machine": platform.processor() or platform.machine(), "threads": args.threads, "baseline_commit": commit,
           "repeats": args.repeats, "components": parts, "results": results}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_invariance_cpu.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["# Batch-invariant scores: their cost on the CPU", "",
             "**Each change, in one process** (MKL strict; the same work with the change and with the code before it, "
             "alternating; process CPU seconds, median of the pairs' ratios):", "",
             "| change | with it s | before s | ratio |", "|---|---|---|---|",
             *[f"| {k} | {v['invariant']:.3f} | {v['before']:.3f} | {v['median_ratio']:.3f} |" for k, v in parts.items()],
             "", f"{args.threads} threads; {len(next(iter(parts.values()))['ratios'])} pairs per change; "
             f"machine: {out['machine']}.", ""]
    if not base:
        lines.append("The whole trees were not compared in this run (no `--baseline`).")
    else:
        lines += ["**Whole trees, a process each** (this tree with MKL strict against the tree before with MKL's default "
             "mode):", "",
             f"`python -m experiments.bench_invariance --baseline <checkout of {commit}>`: each workload in a fresh "
             f"process per tree, alternating, {args.repeats} pairs, {args.threads} threads, engine loop only (loading "
             "left out). Ratios: invariant tree over the tree before (MKL in its default mode), median of the pairs; "
             "wall seconds, and the process's CPU seconds (all threads; less moved by the machine's other load: this "
             "2-core VM's wall times spread by 15% between identical runs).",
             "", "| workload | invariant s (median) | before s (median) | wall ratio | CPU-time ratio | pairs' CPU ratios |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        inv = sorted(p["invariant_s"] for p in r["pairs"])[len(r["pairs"]) // 2]
        old = sorted(p["before_s"] for p in r["pairs"])[len(r["pairs"]) // 2]
        spread = ", ".join(f"{p['cpu_ratio']:.3f}" for p in r["pairs"])
        lines.append(f"| {name} | {inv:.3f} | {old:.3f} | {r['median_ratio']:.3f} | {r['median_cpu_ratio']:.3f} | "
                     f"{spread} |")
    (OUT / "bench_invariance_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
