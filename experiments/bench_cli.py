"""Benchmark the whole CLI sweep of a packaged model against its floor, on this CPU.

    python -m experiments.bench_cli --model smollm2 --tokens 16384
    python -m experiments.bench_cli --model gemma3-270m --tokens 8192
    PYTHONPATH=/tmp/before python -m experiments.bench_cli --model smollm2 --label before   # an older checkout

It runs ``probe.commands.score.run`` (the command's own code path: template split, vocabulary table, self-check,
shards, checkpoints) on the first ``--tokens`` ids for the paper's "greatest" prompt, in this process, and
measures the float32 GEMM rate (best of 2048^3 products) before and after it; the floor uses the higher of
the two (the host is shared, and its rate drifts). FLOPs per candidate for the ``logprob`` proxy: the rows are
[token, *template suffix], the last suffix token is only predicted, so ``n_in`` = 1 + len(suffix) - 1 tokens
go through the backbone (2 x non-embedding parameters each) and the LM head runs at the same ``n_in``
positions (2 x hidden x vocabulary each). Reported: the fraction of the floor of the sweep phase, of the whole
command for these tokens, and the whole command extrapolated to one prompt over the full vocabulary (the
fixed part: load, vocabulary table, template split and self-check, measured here, plus the sweep at its
measured rate). Results: experiments/results/bench_cli_<model>_<label>.json, and bench_cli.md from all of them.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PROMPT = "What, in one word, is the greatest thing ever?"


def gemm_rate(repeats: int = 6) -> float:
    import torch

    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * 2048**3 / best


def flops_per_candidate(model, n_suffix: int) -> tuple[float, int]:
    emb = model.get_input_embeddings().weight
    vocab, hidden = emb.shape
    out = model.get_output_embeddings().weight
    non_embedding = sum(p.numel() for p in model.parameters()) - emb.numel() - (
        0 if out.data_ptr() == emb.data_ptr() else out.numel())
    n_in = n_suffix  # [token, *suffix] with the last suffix token only predicted
    return 2 * non_embedding * n_in + 2 * hidden * vocab * n_in, vocab


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="a packaged model: smollm2 or gemma3-270m")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--label", default="current")
    args = ap.parse_args(argv)
    import torch

    import probe

    root = Path(probe.__file__).resolve().parents[1]  # the checkout measured (PYTHONPATH picks an older one)

    torch.set_num_threads(min(2, torch.get_num_threads()))
    from probe.commands.score import ScoreVocabConfig, run
    from probe.models.loading import load_model

    rate_before = gemm_rate()
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        run_dir = run(ScoreVocabConfig(rm=args.model, prompt=(PROMPT,), limit=args.tokens, output=out, progress=False,
                                       device="cpu"))
        wall = time.perf_counter() - t0
        meta = json.loads((Path(run_dir.path) / "meta.json").read_text())
    rate_after = gemm_rate()
    rate = max(rate_before, rate_after)
    lm = load_model(args.model, kind="causal", device="cpu")
    n_suffix = len(meta["prompts"]["greatest"]["suffix_ids"])
    per_cand, vocab = flops_per_candidate(lm.model, n_suffix)
    sweep_s = meta["timing"]["sweep_s"]
    floor_per_token = per_cand / rate
    fixed_s = wall - sweep_s
    full_sweep_s = vocab * sweep_s / args.tokens
    result = {
        "model": args.model, "label": args.label, "checkout": str(root), "tokens": args.tokens, "vocab": vocab,
        "gflop_per_candidate": per_cand / 1e9, "gemm_gflops": {"before": rate_before / 1e9, "after": rate_after / 1e9},
        "sweep_s": sweep_s, "tokens_per_s": args.tokens / sweep_s, "wall_s": wall, "fixed_s": fixed_s,
        "fraction_of_floor": {"sweep": floor_per_token * args.tokens / sweep_s,
                              "command": floor_per_token * args.tokens / wall,
                              "command_full_vocabulary": floor_per_token * vocab / (full_sweep_s + fixed_s)},
        "full_vocabulary_estimate_s": {"floor": floor_per_token * vocab, "command": full_sweep_s + fixed_s},
        "head": meta["score"], "machine": {"cpu": platform.processor() or platform.machine(),
                                           "threads": torch.get_num_threads()},
        "versions": meta["environment"]["versions"], "git_commit": meta["environment"]["git_commit"],
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"bench_cli_{args.model}_{args.label}.json").write_text(json.dumps(result, indent=2) + "\n")
    write_table()
    f = result["fraction_of_floor"]
    print(f"{args.model} [{args.label}]: {result['tokens_per_s']:.1f} tokens/s; fraction of the floor: sweep "
          f"{f['sweep']:.1%}, command {f['command']:.1%}, one full-vocabulary prompt {f['command_full_vocabulary']:.1%} "
          f"({result['full_vocabulary_estimate_s']['command']:.0f} s vs floor {result['full_vocabulary_estimate_s']['floor']:.0f} s)")
    return 0


def write_table() -> None:
    rows = [json.loads(p.read_text()) for p in sorted(RESULTS.glob("bench_cli_*.json"))]
    lines = ["# The CLI sweep against its floor (CPU, float32, 2 threads)", "",
             "`experiments/bench_cli.py`: `probe.commands.score.run` on the first N ids of the 'greatest' prompt, the "
             "float32 GEMM rate measured in the same process (best of before and after). Fractions are floor time / "
             "measured time.", "",
             "| model | code | tokens | GFLOP/cand | GEMM GFLOP/s | tokens/s | sweep | command | one full prompt (est.) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        f = r["fraction_of_floor"]
        rate = max(r["gemm_gflops"].values())
        lines.append(f"| {r['model']} | {r['label']} ({(r.get('git_commit') or '')[:7]}) | {r['tokens']:,} | "
                     f"{r['gflop_per_candidate']:.3f} | {rate:.0f} | {r['tokens_per_s']:.1f} | {f['sweep']:.1%} | "
                     f"{f['command']:.1%} | {f['command_full_vocabulary']:.1%} "
                     f"({r['full_vocabulary_estimate_s']['command']:.0f} s, floor "
                     f"{r['full_vocabulary_estimate_s']['floor']:.0f} s) |")
    (RESULTS / "bench_cli.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
