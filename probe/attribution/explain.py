"""`probe explain`'s work on a loaded model: each response's score decomposed (`direct`), patched (`patching`) and
its prompt attributed (`ig`), as one JSON-ready record per response and a summary of the whole.

Responses that share a prefix and a length go through one hooked forward per ``batch`` of them (a sweep's best and
worst N: one forward, not a reload per token); the baseline runs once; the patching batches follow.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from probe.attribution.direct import decompose, forward
from probe.attribution.model import stack_of
from probe.attribution.patching import patch, spearman
from probe.attribution.readers import reader, refusal


@dataclass
class Item:
    """One response to explain: its text (or decoded ids), the prefix its continuation follows, the continuation
    (response ids and the template's closing ids), the score the engine gave it (`probe score --responses`, or the
    sweep's), and how many of the prefix's last ids the head scores with it."""

    label: str
    prefix: tuple[int, ...]
    continuation: list[int]
    engine_score: float | None = None
    k_fixed: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def ids(self) -> list[int]:
        return [*self.prefix, *self.continuation]


def check_explainable(loaded, head) -> None:
    from probe.errors import ProbeError

    why = refusal(head, loaded)
    if why is not None:
        raise ProbeError(f"probe explain: {why}")
    stack_of(loaded.model)


def explain_items(loaded, head_for, items: Sequence[Item], baseline: Item | None = None, *, heads: bool = False,
                  patch_components: bool = True, ig_steps: int = 32, ig_baseline_id: int | None = None,
                  batch: int = 16, tokenizer=None) -> dict:
    """Every item explained; ``head_for(k_fixed)`` gives the score head (make_head). Returns
    ``{"responses": [...], "agreement": {...}, "timing": {...}, "reader": note}``."""
    from probe.attribution.ig import integrated_gradients

    stack = stack_of(loaded.model)
    t0 = time.perf_counter()
    records: list[dict | None] = [None] * len(items)
    caps: dict[int, tuple] = {}
    groups: dict[tuple, list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault((it.prefix, len(it.continuation)), []).append(i)
    n_forwards = 0
    note = None
    for members in groups.values():
        for s in range(0, len(members), batch):
            part = members[s:s + batch]
            cap = forward(stack, torch.tensor([items[i].ids for i in part]), heads)
            n_forwards += 1
            for r, i in enumerate(part):
                it = items[i]
                rd = reader(loaded, head_for(it.k_fixed), it.ids, len(it.prefix))
                note = rd.note
                dec = decompose(stack, rd, cap, r, heads)
                records[i] = _record(it, dec, tokenizer)
                if patch_components and baseline is not None:
                    if it.ids == baseline.ids:  # patching a response with itself changes nothing
                        records[i]["patching"] = {"baseline": baseline.label, "is_the_baseline": True}
                    else:
                        caps[i] = (rd, _row(cap, r))
    t_direct = time.perf_counter() - t0
    t1 = time.perf_counter()
    pooled_direct, pooled_effect = [], []
    n_patched = 0
    if patch_components and baseline is not None:
        base = forward(stack, baseline.ids, heads)
        for i, (rd, cap) in caps.items():
            it = items[i]
            p = patch(stack, rd, it.ids, len(it.prefix), cap, base, len(baseline.prefix), heads, batch)
            n_patched += p.forwards
            names = list(p.effects)
            records[i]["patching"] = {
                "baseline": baseline.label, "effects": p.effects, "direct_difference": p.direct_difference,
                "spearman": p.spearman, "aligned_positions": p.aligned_positions,
                "what": "effect = score - score with the component replaced by its value under the baseline; "
                        "direct_difference = the component's direct part minus its baseline value's (same frozen "
                        "norm and reader)"}
            pooled_direct += [p.direct_difference[k] for k in names]
            pooled_effect += [p.effects[k] for k in names]
    t_patch = time.perf_counter() - t1
    t2 = time.perf_counter()
    if ig_steps:
        for i, it in enumerate(items):
            rd = reader(loaded, head_for(it.k_fixed), it.ids, len(it.prefix))
            res = integrated_gradients(stack, rd, it.ids, range(len(it.prefix)), ig_steps, batch=max(1, batch // 2),
                                       baseline_id=ig_baseline_id)
            tokens = [tokenizer.decode([t]) for t in it.prefix] if tokenizer is not None else None
            records[i]["integrated_gradients"] = {
                "positions": res.positions, "tokens": tokens, "attributions": res.attributions, "score": res.score,
                "baseline_score": res.baseline_score, "residual": res.residual, "steps": res.steps,
                "baseline": res.baseline,
                "what": "per prompt position: (x - x0) . the mean gradient on the straight path (midpoint rule); "
                        "residual = sum(attributions) - (score - baseline_score), shrinking as 1/steps^2"}
    t_ig = time.perf_counter() - t2
    per = [r["patching"]["spearman"] for r in records if "spearman" in r.get("patching", {})]
    agreement = {"per_response": per, "overall_spearman": spearman(pooled_direct, pooled_effect),
                 "median_per_response": float(np.median([p for p in per if p is not None]))
                 if any(p is not None for p in per) else None,
                 "n_pairs": len(pooled_direct)}
    return {"responses": records, "difference": difference(records), "agreement": agreement, "reader": note,
            "timing": {"direct_s": round(t_direct, 3), "hooked_forwards": n_forwards, "patching_s": round(t_patch, 3),
                       "patched_forward_batches": n_patched, "ig_s": round(t_ig, 3)}}


def difference(records: list[dict]) -> dict | None:
    """The highest-scored response minus the lowest, part by part (a difference decomposes as each score does)."""
    if len(records) < 2:
        return None
    hi = max(records, key=lambda r: r["score"])
    lo = min(records, key=lambda r: r["score"])
    return {"higher": hi["response"], "lower": lo["response"], "score": hi["score"] - lo["score"],
            "components": {k: hi["components"][k] - lo["components"][k] for k in hi["components"]},
            "rest": hi["rest"] - lo["rest"]}


def _row(cap, r: int):
    """Row ``r`` of a captured batch as a one-row capture."""
    from probe.attribution.model import Captured

    one = lambda t: None if t is None else t[r:r + 1]  # noqa: E731
    return Captured(one(cap.embed), [one(t) for t in cap.attn], [one(t) for t in cap.mlp],
                    [one(t) for t in cap.o_in], [one(t) for t in cap.attn_raw], one(cap.resid), one(cap.normed))


def _record(it: Item, dec, tokenizer) -> dict:
    rest = dec.rest_total
    score = it.engine_score if it.engine_score is not None else dec.score
    out = {"response": it.label, **it.extra, "continuation_ids": list(it.continuation), "score": float(score),
           "components": dec.components, "rest": rest, "rest_items": dec.rest,
           "check": {"sum_components_plus_rest": sum(dec.components.values()) + rest,
                     "decomposed_forward_score": dec.score, "closure": dec.closure,
                     "closure_tolerance": dec.tolerance,
                     "engine_minus_decomposed_forward": None if it.engine_score is None else
                     float(it.engine_score) - dec.score}}
    if dec.heads:
        out["heads"] = dec.heads
        out["check"]["heads_closure"] = dec.heads_closure
    if tokenizer is not None:
        out["continuation_text"] = tokenizer.decode(list(it.continuation))
    return out


def summary_markdown(result: dict, title: str, top: int = 6) -> str:
    """explain.md: per response, its score, the largest parts, rest, the agreement with patching and the prompt
    positions that matter most."""
    lines = [f"# Why a token wins: {title}", "", f"Reader: {result.get('reader')}.", ""]
    ag = result["agreement"]
    if ag["n_pairs"]:
        lines += [f"Agreement of the direct parts with activation patching (Spearman over components): overall "
                  f"{_f(ag['overall_spearman'])}, median per response {_f(ag['median_per_response'])} "
                  f"({ag['n_pairs']} component pairs).", ""]
    diff = result.get("difference")
    if diff:
        big = sorted(diff["components"].items(), key=lambda kv: -abs(kv[1]))[:top]
        lines += [f"{diff['higher']!r} minus {diff['lower']!r}: {diff['score']:+.4f} = parts "
                  f"{sum(diff['components'].values()):+.4f} + rest {diff['rest']:+.4f}; largest "
                  + ", ".join(f"{k} {v:+.3f}" for k, v in big), ""]
    for r in result["responses"]:
        comps = sorted(r["components"].items(), key=lambda kv: -abs(kv[1]))[:top]
        lines += [f"## {r['response']!r}: score {r['score']:+.4f}", "",
                  f"sum of parts {sum(r['components'].values()):+.4f} + rest {r['rest']:+.4f} "
                  f"(closure {r['check']['closure']:.2e}, allowed {r['check']['closure_tolerance']:.1e})", "",
                  "| component | part |", "|---|---:|", *[f"| {k} | {v:+.4f} |" for k, v in comps], ""]
        if "heads" in r:
            hs = sorted(((k, v) for k, v in r["heads"].items() if ".h" in k), key=lambda kv: -abs(kv[1]))[:top]
            lines += ["Top heads: " + ", ".join(f"{k} {v:+.3f}" for k, v in hs), ""]
        if "effects" in r.get("patching", {}):
            p = r["patching"]
            eff = sorted(p["effects"].items(), key=lambda kv: -abs(kv[1]))[:3]
            lines += [f"Patching against {p['baseline']!r}: Spearman {_f(p['spearman'])}; largest effects "
                      + ", ".join(f"{k} {v:+.3f}" for k, v in eff), ""]
        if "integrated_gradients" in r:
            g = r["integrated_gradients"]
            toks = g["tokens"] or [str(p) for p in g["positions"]]
            best = sorted(zip(toks, g["attributions"]), key=lambda kv: -abs(kv[1]))[:top]
            lines += [f"Prompt positions (integrated gradients, {g['steps']} steps, {g['baseline']} baseline; "
                      f"residual {g['residual']:+.2e}): " + ", ".join(f"{t!r} {a:+.3f}" for t, a in best), ""]
    return "\n".join(lines) + "\n"


def _f(x) -> str:
    return "n/a" if x is None else f"{x:+.3f}"
