"""What `probe explain` costs on the embedded SmolLM2, and how far prefix-cache patching is from whole-sequence
patching.

    python -m experiments.explain_cost [--limit 2048] [--top 3] [--heads] [--threads 1] [--ig-items 1]

The issue's case: the best and worst ``--top`` tokens of a SmolLM2 log-probability sweep (here of the first
``--limit`` ids, the paper's first prompt) patched from the sweep's median token, every layer's attention and MLP
output (61 components; ``--heads``: and the 270 heads). Each token is patched every way in turn before the next
token (so that the shared CPU's load falls on every way alike): whole sequences at 16 rows per call (what `probe
explain` ran before), on the prefix's KV cache at 16 and at 64 rows per call (the default now; the prefix's forward
run once, as probe explain runs it), and attribution patching (AtP: one forward and one backward). Recorded per
way: the wall time and this process's CPU time (the work done, which the other jobs on a shared machine do not
inflate as they inflate the wall time), the calls run;
the largest gap between the two paths' effects (against the project's float32 rule, 1e-3 x (1 + |score|)); AtP's
and the direct parts' Spearman against the real effects (n, 95% interval), per level. Then integrated gradients of
the first ``--ig-items`` token(s) from the zero embeddings and from the pad token's (0: none): points used, the
residual reached and whether it met its 1% target. Writes
experiments/results/explain_cost_smollm2_cpu[_<n>thread].{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

WAYS = ("whole sequence, 16 rows per call (before)", "prefix cache, 16 rows per call",
        "prefix cache, 64 rows per call (now)", "AtP (one forward and backward)")


def main(argv=None) -> None:
    import torch

    import probe
    from experiments.common import write_results
    from probe.attribution.direct import forward
    from probe.attribution.explain import Item, explain_items
    from probe.attribution.model import stack_of
    from probe.attribution.patching import (agreement, attribution_patching, component_names, direct_difference,
                                            level, patch_effects, patch_effects_whole, prefix_state)
    from probe.attribution.readers import reader
    from probe.config import ScoringOptions
    from probe.core.scoring import make_head, n_scorable, prompt_split
    from probe.runs.cpu import reproducible_blas

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=2048)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--heads", action="store_true")
    parser.add_argument("--ig-steps", type=int, default=64)
    parser.add_argument("--ig-items", type=int, default=1, help="tokens whose integrated gradients are timed (0: none)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    reproducible_blas()
    load_before = os.getloadavg()[0]
    if args.threads:
        torch.set_num_threads(args.threads)
    prompt = "What, in one word, is the greatest thing ever?"
    lm = probe.load("smollm2", device="cpu", score="logprob")
    opts = ScoringOptions()
    df = probe.sweep(lm, None, prompt, score="logprob", limit=args.limit, verify=0).sort("rank", "token_id")
    split = prompt_split(lm, "logprob", prompt, None, opts, n_scorable(lm))
    prefix, suffix = tuple(split.prefix_ids), list(split.suffix_ids)
    rows = df.to_dicts()

    def item(r, role):
        t = int(r["token_id"])
        return Item(lm.tokenizer.decode([t]), prefix, [t, *suffix], float(r["score"]), 0, {"role": role})
    items = [item(r, "best") for r in rows[:args.top]] + [item(r, "worst") for r in rows[-args.top:]]
    median = item(rows[len(rows) // 2], "median")
    head_for = lambda k: make_head(lm, "logprob", opts, response_in_prefix=k)  # noqa: E731
    stack = stack_of(lm.model)
    names = component_names(stack, args.heads)
    base = forward(stack, median.ids, args.heads)
    wall, cpu, calls = dict.fromkeys(WAYS, 0.0), dict.fromkeys(WAYS, 0.0), dict.fromkeys(WAYS, 0)

    def timed(way, fn):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall[way] += time.perf_counter() - t0
        cpu[way] += time.process_time() - c0
        return out

    gap, allowed, worst = 0.0, 0.0, -1.0
    pairs: dict = {}
    states: dict = {}
    for it in items:  # every way on this token before the next token
        rd = reader(lm, head_for(it.k_fixed), it.ids, len(it.prefix))
        n, nb = len(it.prefix), len(median.prefix)
        whole, clean = timed(WAYS[0], lambda: patch_effects_whole(stack, rd, it.ids, n, base, nb, names, 16))
        calls[WAYS[0]] += -(-len(names) // 15)
        # the prefix's cache: once per prefix, as probe explain runs it (the first token of each way pays for it)
        for way, rows in ((WAYS[1], 16), (WAYS[2], 64)):
            if (way, it.prefix) not in states:
                states[way, it.prefix] = timed(way, lambda: prefix_state(stack, it.prefix))
            cached, _, k = timed(way, lambda: patch_effects(stack, rd, it.ids, n, base, nb, names,
                                                            states[way, it.prefix], rows))
            calls[way] += k
        state = states[WAYS[2], it.prefix]
        atp = timed(WAYS[3], lambda: attribution_patching(stack, rd, it.ids, n, base, nb, names, state))
        calls[WAYS[3]] += 1
        direct, _ = direct_difference(stack, rd, forward(stack, it.ids, args.heads), base, n, nb, names)
        rule = 2e-3 * (1 + abs(clean))  # two scores, each to the float32 rule 1e-3 x (1 + |s|)
        for name in names:
            d = abs(whole[name] - cached[name])
            if d / rule > worst:
                worst, gap, allowed = d / rule, d, rule
            got = pairs.setdefault(level(name), {"atp": [], "direct": [], "effect": []})
            got["atp"].append(atp[name])
            got["direct"].append(direct[name])
            got["effect"].append(cached[name])
        print(f"{it.label!r}: wall {wall}, cpu {cpu}", file=sys.stderr, flush=True)
    out = [{"what": f"patching, {way}", "wall_s": round(wall[way], 2), "cpu_s": round(cpu[way], 2),
            "calls": calls[way], "rows_per_call": 16 if "16" in way else 64 if "64" in way else 1} for way in WAYS]
    speed, speed16 = cpu[WAYS[0]] / max(cpu[WAYS[2]], 1e-9), cpu[WAYS[0]] / max(cpu[WAYS[1]], 1e-9)
    wall_speed = wall[WAYS[0]] / max(wall[WAYS[2]], 1e-9)
    levels = {lev: {"atp_vs_patching": agreement(got["atp"], got["effect"]),
                    "direct_vs_patching": agreement(got["direct"], got["effect"])} for lev, got in pairs.items()}
    igs, t_ig = [], 0.0
    for baseline in ((None, lm.tokenizer.pad_token_id) if args.ig_items else ()):  # zero, then the pad token's
        t0 = time.perf_counter()
        ig = explain_items(lm, head_for, items[:args.ig_items], None, patch_components=False, ig_steps=args.ig_steps,
                           ig_baseline_id=baseline, tokenizer=lm.tokenizer)
        t_ig += time.perf_counter() - t0
        igs += [r["integrated_gradients"] for r in ig["responses"]]
        print(f"integrated gradients from {igs[-1]['baseline']}: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    summary = {"speedup_patching_cpu": round(speed, 2), "speedup_patching_16_rows_cpu": round(speed16, 2),
               "speedup_patching_wall": round(wall_speed, 2), "largest_effect_gap": gap, "its_rule": allowed,
               "atp_vs_patching": {lev: got["atp_vs_patching"] for lev, got in levels.items()},
               "direct_vs_patching": {lev: got["direct_vs_patching"] for lev, got in levels.items()},
               "ig": {"wall_s": round(t_ig, 2), "baselines": [g["baseline"] for g in igs],
                      "points": [g["points"] for g in igs], "met": [g["met"] for g in igs],
                      "residual_over_gap": [abs(g["residual"]) / max(abs(g["score"] - g["baseline_score"]), 1e-12)
                                            for g in igs],
                      "panel_residuals_over_gap": [g["panel_residuals"] / max(abs(g["score"] - g["baseline_score"]),
                                                                             1e-12) for g in igs],
                      "history": [g["history"] for g in igs]},
               "tokens": [it.label for it in items], "baseline": median.label, "prefix_ids": len(prefix),
               "continuation_ids": len(items[0].continuation), "components": len(names),
               "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
               "load_average_1min": [round(load_before, 1), round(os.getloadavg()[0], 1)],
               "torch": torch.__version__}
    if igs:
        out.append({"what": f"integrated gradients ({args.ig_items} token, zero and pad baselines)",
                    "wall_s": round(t_ig, 2), "cpu_s": None, "calls": None, "rows_per_call": 8})
    out[0]["summary"] = summary

    def agree(a):
        if not a or a.get("spearman") is None:
            return "n/a"
        lo, hi = a["ci95"] or (float("nan"), float("nan"))
        return f"{a['spearman']:+.3f} (n={a['n']}, 95% [{lo:+.2f}, {hi:+.2f}])"
    ig_line = ""
    if igs:
        ig_line = (f" Integrated gradients of the first {args.ig_items} token(s), {args.ig_steps} points at most, from "
                   f"{' and from '.join(summary['ig']['baselines'])}: points used {summary['ig']['points']}, "
                   "|residual| / gap " + ", ".join(f"{x:.1e}" for x in summary["ig"]["residual_over_gap"])
                   + ", sum of the panels' |residuals| / gap "
                   + ", ".join(f"{x:.1e}" for x in summary["ig"]["panel_residuals_over_gap"])
                   + f", target (1%) met {summary['ig']['met']}.")
    intro = (f"`python -m experiments.explain_cost --limit {args.limit} --top {args.top}"
             f"{' --heads' if args.heads else ''}{f' --threads {args.threads}' if args.threads else ''}"
             f"{f' --ig-items {args.ig_items}' if args.ig_items != 1 else ''}`, float32, {summary['cpu']}, "
             f"{summary['threads']} threads, torch {summary['torch']}; the CPU is shared with other jobs (1-minute load "
             f"average {summary['load_average_1min'][0]} at the start, {summary['load_average_1min'][1]} at the end, "
             f"on {os.cpu_count()} cores): wall times are upper bounds, CPU times the work done. "
             f"SmolLM2-135M log-probability; the best and worst {args.top} of the first {args.limit} ids of the "
             f"paper's first prompt ({', '.join(repr(t) for t in summary['tokens'])}), patched from the median token "
             f"{median.label!r}: {len(names)} components each, prefix {len(prefix)} ids, continuation "
             f"{summary['continuation_ids']} ids (the last only predicted). Patching on the prefix cache at 64 rows "
             f"per call (the default now) takes {speed:.1f}x less CPU time than whole sequences at 16 rows per call "
             f"(what it ran before; {wall_speed:.1f}x less wall time); at 16 rows per call, {speed16:.1f}x less. The "
             f"largest gap between the two paths' effects is {gap:.2e} (the float32 rule for two computations of a "
             f"score allows {allowed:.2e}). AtP against real patching (all tokens' pairs, per level): components "
             f"{agree(levels.get('components', {}).get('atp_vs_patching'))}"
             + (f", heads {agree(levels.get('heads', {}).get('atp_vs_patching'))}" if args.heads else "")
             + "; the direct parts' differences against real patching: components "
             f"{agree(levels.get('components', {}).get('direct_vs_patching'))}"
             + (f", heads {agree(levels.get('heads', {}).get('direct_vs_patching'))}" if args.heads else "")
             + "." + ig_line)
    stem = "explain_cost_smollm2_cpu" + (f"_{args.threads}thread" if args.threads else "")
    print(write_results(
        stem, "probe explain: what patching and integrated gradients cost (SmolLM2, CPU)", intro,
        [("stage", lambda r: r["what"]), ("wall s", lambda r: str(r["wall_s"])),
         ("CPU s (this process)", lambda r: "" if r["cpu_s"] is None else str(r["cpu_s"])),
         ("calls x rows", lambda r: "" if r["calls"] is None else f"{r['calls']} x {r['rows_per_call']}")], out))


if __name__ == "__main__":
    main()
