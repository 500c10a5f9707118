"""Benchmark whole-response scoring: the prefix-cache engine against the plain full-sequence path and the floor.

    python -m experiments.bench_responses                              # EloEverything's 7,530 items x 3 prompts
    python -m experiments.bench_responses --model gemma3-270m --sample 300

The items are the ``name`` column of the paper's released EloEverything table; each is scored as the whole
assistant response (``logprob`` proxy) under the three prompts of the paper's EloEverything tables, with the code path of ``probe score
--responses`` (`probe.core.responses`: rows sorted by length, batches of ``--batch-size``, one prefix cache per
prompt). Beside it, in the same process, on a sample of ``--sample`` items per prompt: the same head through the
model's own forward on the full sequences (prefix included), batched by length (`FullSequenceScorer`: what a
user would do without a cache), for the ratio on identical work. The floor: FLOPs of the cached work (2 x
non-embedding parameters x the tokens run, plus 2 x hidden x vocabulary for every predicted token of the LM
head) over the float32 GEMM rate measured in the same run (best of before and after). Writes
experiments/results/bench_responses_<model>_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv=None) -> dict:
    import numpy as np
    import polars as pl
    import torch

    import probe
    from experiments.bench_sweep import matmul_rate, non_embedding_params
    from experiments.common import PAPER_RELEASE
    from probe.core.engine import FullSequenceScorer
    from experiments.fig5_elo import PROMPT_TEXT
    from probe.core.responses import prepare, score_rows
    from probe.core.scoring import make_head

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="a packaged model (smollm2, gemma3-270m) or a folder")
    ap.add_argument("--table", default=str(PAPER_RELEASE / "elo_greatest_ever.csv"))
    ap.add_argument("--limit", type=int, default=None, help="first N items only")
    ap.add_argument("--sample", type=int, default=400, help="items per prompt also scored by the full-sequence path")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args(argv)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    device = torch.device("cpu")
    names = pl.read_csv(args.table)["name"].cast(pl.String).to_list()[: args.limit]
    rate0 = matmul_rate(device, torch.float32, 2048)
    lm = probe.load(args.model, score="logprob", device="cpu")
    model = lm.model
    hidden, vocab = model.config.hidden_size, model.get_output_embeddings().weight.shape[0]
    per_token = 2 * non_embedding_params(model)
    head_per_prediction = 2 * hidden * vocab
    prompts = {stem.removeprefix("elo_"): text for stem, text in PROMPT_TEXT.items()}
    out = {"model": lm.model_id, "items": len(names), "prompts": prompts, "batch_size": args.batch_size,
           "per_prompt": {}}
    cached_s = full_s = flops = sample_cached_s = 0.0
    n_sample = 0
    for key, text in prompts.items():
        t0 = time.perf_counter()
        rows = prepare(lm, "logprob", key, text, names)
        t_prepare = time.perf_counter() - t0
        t0 = time.perf_counter()
        scores = score_rows(lm, "logprob", rows, batch_size=args.batch_size, verify=0)
        t_cached = time.perf_counter() - t0
        # the cached work: the prefix once; per row every continuation token but the last is run (the logprob head
        # drops the last input), and every continuation token is predicted (the first from the prefix's last state)
        n_run = sum(len(c) - 1 for c in rows.continuations)
        n_pred = sum(len(c) for c in rows.continuations)
        work = per_token * (n_run + len(rows.prefix_ids)) + head_per_prediction * n_pred
        # the same head on full sequences (no cache), and the engine again, on one sample
        rng = np.random.default_rng(0)
        pick = sorted(rng.choice(len(names), size=min(args.sample, len(names)), replace=False).tolist())
        head = make_head(lm, "logprob")
        plain = FullSequenceScorer(model, head, list(rows.prefix_ids), batch_size=args.batch_size)
        t0 = time.perf_counter()
        ref = plain.score([rows.continuations[i] for i in pick]).numpy()
        t_full = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = score_rows(lm, "logprob", rows, pick, batch_size=args.batch_size, verify=0)
        t_sample = time.perf_counter() - t0
        out["per_prompt"][key] = {
            "prepare_s": round(t_prepare, 3), "cached_s": round(t_cached, 3),
            "responses_per_s": round(len(names) / t_cached, 1), "mean_continuation": round(n_pred / len(names), 2),
            "prefix_tokens": len(rows.prefix_ids), "gflop": round(work / 1e9, 1),
            "sample": len(pick), "sample_full_sequence_s": round(t_full, 3), "sample_cached_s": round(t_sample, 3),
            "max_abs_diff_cached_vs_full": float(np.abs(again - ref).max()),
            "template_changes": sum(c is not None for c in rows.change)}
        cached_s += t_cached
        full_s += t_full
        sample_cached_s += t_sample
        flops += work
        n_sample += len(pick)
        del scores
    rate1 = matmul_rate(device, torch.float32, 2048)
    rate = max(rate0, rate1)
    out.update({
        "gemm_gflops": {"before": rate0 / 1e9, "after": rate1 / 1e9},
        "cached_s": round(cached_s, 2), "floor_s": round(flops / rate, 2), "fraction_of_floor": flops / rate / cached_s,
        "speedup_over_full_sequence": full_s / sample_cached_s,
        "full_sequence_estimate_s": round(full_s / n_sample * len(names) * len(prompts), 1),
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "versions": {"torch": torch.__version__},
    })
    RESULTS.mkdir(exist_ok=True)
    tag = Path(args.model).name.replace("/", "_")
    (RESULTS / f"bench_responses_{tag}_cpu.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [f"# Whole-response scoring: {out['model']} (CPU, float32, {out['machine']['threads']} threads)", "",
             f"`python -m experiments.bench_responses --model {args.model}`: {len(names):,} EloEverything items x "
             f"{len(prompts)} prompts, logprob proxy, batch {args.batch_size}; GEMM "
             f"{rate / 1e9:.0f} GFLOP/s (best of before/after).", "",
             "| prompt | prefix | mean continuation | cached s | responses/s | sample | full-sequence s | cached s "
             "(sample) | max abs diff |", "|---|---|---|---|---|---|---|---|---|"]
    for key, p in out["per_prompt"].items():
        lines.append(f"| {key} | {p['prefix_tokens']} | {p['mean_continuation']} | {p['cached_s']} | "
                     f"{p['responses_per_s']} | {p['sample']} | {p['sample_full_sequence_s']} | {p['sample_cached_s']} "
                     f"| {p['max_abs_diff_cached_vs_full']:.2e} |")
    lines += ["", f"All {len(names) * len(prompts):,} responses: {out['cached_s']} s cached, floor "
              f"{out['floor_s']} s ({out['fraction_of_floor']:.1%} of the floor); the full-sequence path is "
              f"{out['speedup_over_full_sequence']:.2f}x slower on the same samples (about "
              f"{out['full_sequence_estimate_s']:.0f} s for the whole set)."]
    (RESULTS / f"bench_responses_{tag}_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
