"""How far the direct parts of `probe explain` agree with activation patching, on the embedded models.

    python -m probe score --score logprob --prompt "What, in one word, is the greatest thing ever?" --output DIR
    python -m experiments.explain_agreement --run DIR/<model>/exhaustive_<time> [--top 5] [--gemma]

SmolLM2 (logprob): the sweep's best and worst ``--top`` tokens explained as `probe explain --run` explains them
(one hooked forward; each layer's attention and MLP output patched from the run's median token; integrated
gradients, 32 steps, zero baseline). SmolLM2 (judge): the same tokens' texts as whole responses under the Yes/No
judge, patched from the median token's text. ``--gemma``: the packaged Gemma 3 270M (logprob), the same texts.
Writes experiments/results/explain_agreement_smollm2.{json,md}: per model and mode, the Spearman of each token's
direct differences against its patching effects (over the 61 components), their median and the pooled value,
the largest closure against its bound, the IG completeness residuals and the time each stage took.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _row(model: str, mode: str, result: dict, tokens: list[str]) -> dict:
    rs = result["responses"]
    per = [r["patching"].get("spearman") for r in rs if "patching" in r]
    ig = [abs(r["integrated_gradients"]["residual"]) for r in rs if "integrated_gradients" in r]
    gap = [abs(r["integrated_gradients"]["score"] - r["integrated_gradients"]["baseline_score"])
           for r in rs if "integrated_gradients" in r]
    return {"model": model, "mode": mode, "tokens": tokens, "per_token_spearman": per,
            "median_spearman": result["agreement"]["median_per_response"],
            "pooled_spearman": result["agreement"]["overall_spearman"], "n_pairs": result["agreement"]["n_pairs"],
            "baseline": result["baseline"]["response"],
            "max_closure": max(abs(r["check"]["closure"]) for r in rs),
            "max_closure_bound": max(r["check"]["closure_tolerance"] for r in rs),
            "max_engine_minus_forward": max(abs(r["check"]["engine_minus_decomposed_forward"] or 0) for r in rs),
            "ig_residual_median": float(np.median(ig)) if ig else None,
            "ig_residual_over_gap_median": float(np.median(np.array(ig) / np.maximum(gap, 1e-9))) if ig else None,
            "timing": result["timing"]}


def main(argv=None) -> None:
    import probe
    from experiments.common import write_results
    from probe.config import ScoringOptions
    from probe.core.scoring import make_head
    from probe.attribution.explain import explain_items
    from probe.attribution.inputs import explain_responses, read_sweep, sweep_items

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--ig-steps", type=int, default=32)
    parser.add_argument("--gemma", action="store_true")
    parser.add_argument("--no-judge", action="store_true")
    args = parser.parse_args(argv)
    meta, scores = read_sweep(args.run)
    lm = probe.load("smollm2", device="cpu", score="logprob")
    opts = ScoringOptions()
    items, median, key = sweep_items(meta, scores, args.top, None, lm.tokenizer)
    prompt = meta["prompts"][key]["text"]
    t0 = time.perf_counter()
    res = explain_items(lm, lambda k: make_head(lm, "logprob", opts, response_in_prefix=k), items, median,
                        ig_steps=args.ig_steps, tokenizer=lm.tokenizer)
    res["baseline"] = {"response": median.label}
    res["timing"]["total_s"] = round(time.perf_counter() - t0, 2)
    texts = [it.label for it in items]
    rows = [_row(lm.model_id, "logprob (sweep tokens, --run)", res, texts)]
    print(f"logprob: {res['timing']}", file=sys.stderr, flush=True)
    judged_texts = [t for t in texts if t.strip()] or texts
    if not args.no_judge:
        t0 = time.perf_counter()
        judged = explain_responses(lm, "judge", prompt, judged_texts, opts,
                                   baseline=median.label if median.label.strip() else None, ig_steps=args.ig_steps)
        judged["timing"]["total_s"] = round(time.perf_counter() - t0, 2)
        rows.append(_row(lm.model_id, "judge (the same texts as responses)", judged, judged_texts))
        print(f"judge: {judged['timing']}", file=sys.stderr, flush=True)
    if args.gemma:
        g = probe.load("gemma3-270m", device="cpu", score="logprob")
        t0 = time.perf_counter()
        gem = explain_responses(g, "logprob", prompt, judged_texts, opts, baseline=median.label, ig_steps=0)
        gem["timing"]["total_s"] = round(time.perf_counter() - t0, 2)
        rows.append(_row(g.model_id, "logprob (the same texts as responses)", gem, judged_texts))

    def f(x):
        return "n/a" if x is None else f"{x:+.3f}"
    print(write_results(
        "explain_agreement_smollm2", "probe explain: direct parts against activation patching",
        f"`python -m experiments.explain_agreement --run <SmolLM2 logprob sweep> --top {args.top}"
        f" --ig-steps {args.ig_steps}{' --gemma' if args.gemma else ''}{' --no-judge' if args.no_judge else ''}`, float32 on this CPU (2 cores shared). Prompt {prompt!r}; the sweep's "
        f"best and worst {args.top} tokens, patched from its median token {median.label!r}. Spearman: per token, "
        "its components' direct differences (part minus the baseline value's part, same frozen norm and reader) "
        "against their patching effects (score minus the score with that component replaced); pooled: all tokens' "
        "pairs together. Closure: |score - (sum of parts + rest)|, against its rounding bound.",
        [("model", lambda r: r["model"]), ("mode", lambda r: r["mode"]),
         ("median Spearman", lambda r: f(r["median_spearman"])), ("pooled", lambda r: f(r["pooled_spearman"])),
         ("per token", lambda r: ", ".join(f"{t!r} {f(s)}" for t, s in zip(r["tokens"], r["per_token_spearman"]))),
         ("max closure (bound)", lambda r: f"{r['max_closure']:.1e} ({r['max_closure_bound']:.1e})"),
         ("IG residual / gap (median)", lambda r: "n/a" if r["ig_residual_over_gap_median"] is None
          else f"{r['ig_residual_over_gap_median']:.3f}"),
         ("time: direct / patching / IG s", lambda r: f"{r['timing']['direct_s']} / {r['timing']['patching_s']} / "
                                                    f"{r['timing']['ig_s']}")], rows))


if __name__ == "__main__":
    main()
