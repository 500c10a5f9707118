"""The cost of a per-token trace against a plain score of the same responses, side by side in one process.

    python -m experiments.bench_trace [--model smollm2] [--n 40]

The first ``--n`` items of the paper's released EloEverything table as whole responses under its prompt, on the
packaged model (``logprob``): `probe.score_responses` (batched, one prefix cache) against `probe.trace` (one
forward per response, then the head read at every prefix; plus each response's complete score). Writes
experiments/results/bench_trace_<model>_cpu.{json,md}.
"""

from __future__ import annotations

import argparse
import time


def main(argv=None) -> None:
    import polars as pl
    import torch

    import probe
    from experiments.common import PAPER_RELEASE, write_results
    from experiments.fig5_elo import PROMPT_TEXT

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--n", type=int, default=40)
    args = parser.parse_args(argv)
    table = PAPER_RELEASE / "elo_greatest_ever.csv"
    items = pl.read_csv(table)["name"].cast(pl.String).head(args.n).to_list()
    prompt = PROMPT_TEXT["elo_greatest_ever"]
    lm = probe.load(args.model, device="cpu", score="logprob")
    torch.set_grad_enabled(False)
    probe.score_responses(lm, None, prompt, items[:2])  # warm up
    t0 = time.perf_counter()
    plain = probe.score_responses(lm, None, prompt, items, verify=0)
    t_plain = time.perf_counter() - t0
    t0 = time.perf_counter()
    traced = probe.trace(lm, None, prompt, items)
    t_trace = time.perf_counter() - t0
    n_tokens = int(plain["n_tokens"].sum())
    row = {"model": lm.model_id, "responses": len(items), "response_tokens": n_tokens, "score_s": round(t_plain, 3),
           "trace_s": round(t_trace, 3), "ratio": round(t_trace / t_plain, 2), "trace_rows": traced.height}
    print(write_results(f"bench_trace_{args.model}_cpu", "A per-token trace against a plain score",
                        f"`python -m experiments.bench_trace --model {args.model} --n {args.n}`: the first "
                        f"{args.n} EloEverything items under its prompt, logprob, float32 on this CPU, side by side.",
                        [("model", lambda r: r["model"]), ("responses", lambda r: str(r["responses"])),
                         ("response tokens", lambda r: str(r["response_tokens"])),
                         ("score_responses s", lambda r: str(r["score_s"])), ("trace s", lambda r: str(r["trace_s"])),
                         ("trace / score", lambda r: str(r["ratio"]))], [row]))


if __name__ == "__main__":
    main()
