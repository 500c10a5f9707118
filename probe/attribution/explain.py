"""`probe explain`'s work on a loaded model: each response's score decomposed (`direct`), held to its checks
(`checks`), patched and estimated by attribution patching (`patching`) and its prompt attributed (`ig`), as one
JSON-ready record per response and a summary of the whole.

Batch invariance by construction: every forward run here holds the rows of one explained item only (its own
hooked forward, one row; its prefix's forward; its patching calls, ``batch`` rows each, the last padded by
repeating a row; its integrated-gradients calls, likewise), so a call's shape is a function of that item alone and
an item's explanation cannot depend on which other items are explained with it. The baseline's forward is one row
of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from probe.attribution.checks import closure_line, enforce, measured_noise, reported_tolerance
from probe.attribution.direct import decompose, forward
from probe.attribution.model import stack_of, stream_settings
from probe.attribution.patching import agreement, agreements, level, patch, prefix_state
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


def dtype_note(dtype: torch.dtype) -> str:
    """What is exact in this dtype, in words (README "Why a token wins")."""
    name = str(dtype).replace("torch.", "")
    if dtype == torch.float32:
        return ("float32: parts summed in float32; the residual stream's and the final norm's rounding (items of "
                "rest) are rounding-sized; score = parts + rest to Higham's bound of the float32 readout")
    return (f"{name}: the parts are the model's own {name} activations, summed in float32; the residual stream's "
            f"and the final norm's {name} rounding are items of rest (each checked against its {name} bound); "
            f"score = parts + rest to the head's own {name} rounding, and the reported score equals the forward "
            f"decomposed to twice its measured {name} rounding noise")


def explain_items(loaded, head_for, items: Sequence[Item], baseline: Item | None = None, *, heads: bool = False,
                  patch_components: bool = True, atp: bool = True, ig_steps: int = 128, ig_target: float = 0.01,
                  ig_baseline_id: int | None = None, batch: int = 64, tokenizer=None,
                  source: str = "the score reported", whole_sequences: bool = False) -> dict:
    """Every item explained; ``head_for(k_fixed)`` gives the score head (make_head). Returns
    ``{"responses": [...], "agreement": {...}, "timing": {...}, "reader": note}``. ``whole_sequences``: patch
    over whole sequences instead of the prefix's cache (the reference path, for measurements)."""
    from probe.attribution.ig import integrated_gradients
    from probe.core.precision import is_half, roundings_per_output

    model = loaded.model
    stack = stack_of(model)
    settings = stream_settings(model)
    dtype = next(model.parameters()).dtype
    rounds = roundings_per_output(next(model.parameters()).device.type, dtype)
    t0 = time.perf_counter()
    records: list[dict] = []
    kept: dict[int, tuple] = {}
    note = None
    for i, it in enumerate(items):
        head = head_for(it.k_fixed)
        rd = reader(loaded, head, it.ids, len(it.prefix))
        note = rd.note

        def own(x, head=head, n=len(it.prefix)):
            return head.own_forward(model, x, n)
        cap = forward(stack, it.ids, heads, own=own)  # one row: this item alone
        dec = decompose(stack, rd, cap, 0, heads, rounds)
        bound = None
        if it.engine_score is not None:
            ids = torch.tensor([it.ids], device=next(model.parameters()).device)
            with torch.no_grad():
                noise = measured_noise(model, lambda: float(own(ids)[0]), dec.score) if is_half(dtype) else None
            bound = reported_tolerance(dec.score, dtype, noise)
        enforce(it.label, dec, settings, it.engine_score, bound, source, heads)
        records.append(_record(it, dec, bound, tokenizer))
        kept[i] = (rd, cap)
    t_direct = time.perf_counter() - t0
    t1 = time.perf_counter()
    pooled: dict[str, dict[str, list]] = {}
    n_calls = 0
    states: dict[tuple, object] = {}
    if patch_components and baseline is not None:
        base = forward(stack, baseline.ids, heads)
        for i, it in enumerate(items):
            if it.ids == baseline.ids:  # patching a response with itself changes nothing
                records[i]["patching"] = {"baseline": baseline.label, "is_the_baseline": True}
                continue
            rd, cap = kept[i]
            state = None
            if not whole_sequences:
                if it.prefix not in states:
                    states[it.prefix] = prefix_state(stack, it.prefix)
                state = states[it.prefix]
            p = patch(stack, rd, it.ids, len(it.prefix), cap, base, len(baseline.prefix), heads, batch, state, atp)
            n_calls += p.forwards
            agree = agreements(p)
            records[i]["patching"] = {
                "baseline": baseline.label, "effects": p.effects, "direct_difference": p.direct_difference,
                "atp": p.atp, "agreement": agree, "spearman": agree["components"]["direct_vs_patching"]["spearman"],
                "aligned_positions": p.aligned_positions, "path": p.path,
                "what": "effect = score - score with the component replaced by its value under the baseline (at the "
                        "continuation's last aligned_positions positions); direct_difference = the component's "
                        "direct part minus its baseline value's (same frozen norm and reader); atp = attribution "
                        "patching's first-order estimate of the effect, (a - a_baseline) . d score / d a; agreement: "
                        "Spearman with n and a 95% interval, within one level (components, or heads)"}
            for k in p.effects:
                got = pooled.setdefault(level(k), {"effect": [], "direct": [], "atp": []})
                got["effect"].append(p.effects[k])
                got["direct"].append(p.direct_difference[k])
                if p.atp is not None:
                    got["atp"].append(p.atp[k])
    t_patch = time.perf_counter() - t1
    t2 = time.perf_counter()
    if ig_steps:
        for i, it in enumerate(items):
            rd, _ = kept[i]
            res = integrated_gradients(stack, rd, it.ids, range(len(it.prefix)), ig_steps,
                                       batch=max(1, min(8, batch // 2)), baseline_id=ig_baseline_id, target=ig_target)
            tokens = [tokenizer.decode([t]) for t in it.prefix] if tokenizer is not None else None
            records[i]["integrated_gradients"] = {
                "positions": res.positions, "tokens": tokens, "attributions": res.attributions, "score": res.score,
                "baseline_score": res.baseline_score, "residual": res.residual, "target": res.target,
                "met": res.met, "panel_residuals": res.panel_residuals, "points": res.points, "panels": res.panels,
                "baseline": res.baseline,
                "rule": res.rule, "history": res.history,
                "what": "per prompt position: (x - x0) . the integral of the gradient on the straight path; residual "
                        "= sum(attributions) - (score - baseline_score), measured; met: the sum of the path's panels' "
                        "|residuals| (panel_residuals, which bounds |residual|) <= target "
                        f"({ig_target:g} x |score - baseline_score|, or the scores' own rounding where larger)"}
    t_ig = time.perf_counter() - t2
    per = [r["patching"]["spearman"] for r in records if "spearman" in r.get("patching", {})]
    levels = {}
    for lev, got in pooled.items():
        levels[lev] = {"direct_vs_patching": agreement(got["direct"], got["effect"])}
        if got["atp"]:
            levels[lev]["atp_vs_patching"] = agreement(got["atp"], got["effect"])
    comp = levels.get("components", {}).get("direct_vs_patching", {})
    agreement_out = {"per_response": per, "overall_spearman": comp.get("spearman"), "ci95": comp.get("ci95"),
                     "median_per_response": float(np.median([p for p in per if p is not None]))
                     if any(p is not None for p in per) else None,
                     "n_pairs": comp.get("n", 0), "levels": levels}
    return {"responses": records, "difference": difference(records), "agreement": agreement_out, "reader": note,
            "exactness": dtype_note(dtype),
            "timing": {"direct_s": round(t_direct, 3), "hooked_forwards": len(items), "patching_s": round(t_patch, 3),
                       "patched_calls": n_calls, "patch_rows_per_call": batch, "ig_s": round(t_ig, 3)}}


def difference(records: list[dict]) -> dict | None:
    """The highest-scored response minus the lowest, part by part (a difference decomposes as each score does),
    with its own check: the gap of the reported difference from the parts' and rest's is the two items' gaps, held
    to the sum of their bounds."""
    if len(records) < 2:
        return None
    hi = max(records, key=lambda r: r["score"])
    lo = min(records, key=lambda r: r["score"])
    parts = {k: hi["components"][k] - lo["components"][k] for k in hi["components"]}
    rest = hi["rest"] - lo["rest"]
    score = hi["score"] - lo["score"]
    return {"higher": hi["response"], "lower": lo["response"], "score": score, "components": parts, "rest": rest,
            "check": {"score_minus_parts_and_rest": score - (sum(parts.values()) + rest),
                      "bound": hi["check"]["bound"] + lo["check"]["bound"]}}


def _record(it: Item, dec, reported_bound: float | None, tokenizer) -> dict:
    rest = dec.rest_total
    score = it.engine_score if it.engine_score is not None else dec.score
    total = sum(dec.components.values()) + rest
    bound = dec.tolerance + (reported_bound or 0.0)
    out = {"response": it.label, **it.extra, "continuation_ids": list(it.continuation), "score": float(score),
           "components": dec.components, "rest": rest, "rest_items": dec.rest,
           "check": {"sum_components_plus_rest": total, "decomposed_forward_score": dec.score,
                     "closure": dec.closure, "closure_tolerance": dec.tolerance,
                     "engine_minus_decomposed_forward": None if it.engine_score is None else
                     float(it.engine_score) - dec.score, "engine_tolerance": reported_bound,
                     "score_minus_parts_and_rest": float(score) - total, "bound": bound,
                     "residual_stream_gap_over_bound": dec.stream_gap, "dtype": dec.dtype}}
    if dec.held:
        out["held"] = dec.held
    if dec.heads:
        out["heads"] = dec.heads
        out["check"]["heads_closure"] = dec.heads_closure
        out["check"]["heads_tolerance"] = dec.heads_tolerance
    if tokenizer is not None:
        out["continuation_text"] = tokenizer.decode(list(it.continuation))
    return out


def summary_markdown(result: dict, title: str, top: int = 6) -> str:
    """explain.md: per response, its score, the largest parts, rest, the agreement with patching and the prompt
    positions that matter most."""
    from probe.report.why import agreement_words

    lines = [f"# Why a token wins: {title}", "", f"Reader: {result.get('reader')}.", "",
             f"Exactness: {result.get('exactness', '')}.", ""]
    for lev, got in result["agreement"].get("levels", {}).items():
        for what, a in got.items():
            lines += [f"{lev}, {what.replace('_', ' ')}: {agreement_words(a)}.", ""]
    diff = result.get("difference")
    if diff:
        big = sorted(diff["components"].items(), key=lambda kv: -abs(kv[1]))[:top]
        lines += [f"{diff['higher']!r} minus {diff['lower']!r}: {diff['score']:+.4f} = parts "
                  f"{sum(diff['components'].values()):+.4f} + rest {diff['rest']:+.4f} (to "
                  f"{abs(diff['check']['score_minus_parts_and_rest']):.1e}, within {diff['check']['bound']:.1e}); "
                  "largest " + ", ".join(f"{k} {v:+.3f}" for k, v in big), ""]
    for r in result["responses"]:
        comps = sorted(r["components"].items(), key=lambda kv: -abs(kv[1]))[:top]
        lines += [f"## {r['response']!r}: score {r['score']:+.4f}", "", closure_line(r), "",
                  "| component | part |", "|---|---:|", *[f"| {k} | {v:+.4f} |" for k, v in comps], ""]
        if "heads" in r:
            hs = sorted(((k, v) for k, v in r["heads"].items() if ".h" in k), key=lambda kv: -abs(kv[1]))[:top]
            lines += ["Top heads: " + ", ".join(f"{k} {v:+.3f}" for k, v in hs), ""]
        if "effects" in r.get("patching", {}):
            p = r["patching"]
            eff = sorted(p["effects"].items(), key=lambda kv: -abs(kv[1]))[:3]
            said = "; ".join(f"{lev}, {what.replace('_', ' ')}: {agreement_words(a)}"
                             for lev, got in p["agreement"].items() for what, a in got.items())
            lines += [f"Patching against {p['baseline']!r} ({p['path']}): {said}; largest effects "
                      + ", ".join(f"{k} {v:+.3f}" for k, v in eff), ""]
        if "integrated_gradients" in r:
            g = r["integrated_gradients"]
            toks = g["tokens"] or [str(p) for p in g["positions"]]
            best = sorted(zip(toks, g["attributions"]), key=lambda kv: -abs(kv[1]))[:top]
            lines += [f"Prompt positions (integrated gradients, {g['points']} points, {g['baseline']} baseline; "
                      f"residual {g['residual']:+.2e}, target {g['target']:.1e}: "
                      f"{'met' if g['met'] else 'NOT met'}): " + ", ".join(f"{t!r} {a:+.3f}" for t, a in best), ""]
    return "\n".join(lines) + "\n"
