"""Patching at sweep speed (probe/attribution/patching.py): on the prefix's KV cache at the continuation's positions,
equal to whole-sequence patching, in calls of one item and one shape; attribution patching (AtP) is the first-order
term of real patching; agreements carry n and a 95% interval, within one level, and verdicts only where n allows."""

from __future__ import annotations

import pytest
import torch

from probe.attribution.direct import forward
from probe.attribution.inputs import response_items
from probe.attribution.model import Captured, stack_of
from probe.attribution.patching import (agreement, attribution_patching, component_names, patch_effects,
                                        patch_effects_whole, prefix_state)
from probe.attribution.readers import reader
from probe.config import ScoringOptions
from probe.core.precision import FLOAT32_RTOL
from probe.core.scoring import make_head

PROMPT = "What, in one word, is the greatest thing ever?"


def _setup(lm, mode, texts=("Love and peace", "the cat sat")):
    opts = ScoringOptions()
    items, _ = response_items(lm, mode, PROMPT, list(texts), opts)
    it, base = items
    stack = stack_of(lm.model)
    rd = reader(lm, make_head(lm, mode, opts, response_in_prefix=it.k_fixed), it.ids, len(it.prefix))
    return stack, rd, it, base, forward(stack, base.ids, heads=True)


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-lm", "logprob"), ("gemma3-lm", "judge"),
                                       ("qwen3-rm", "reward"), ("gemma2-rm", "reward")])
def test_patching_on_the_prefix_cache_equals_whole_sequence_patching(tiny_models, name, mode):
    """Every component and head patched on the prefix's cache, over the continuation's positions only, gives the
    effects whole-sequence patching gives (the prefix's positions are the same text in both: patching them changes
    nothing), to the project's float32 rule for two computations of one score; every call has ``batch`` rows
    (row 0 unpatched, the last call padded by repeating a row), so a call's shape is the item's alone."""
    lm = tiny_models[name]
    stack, rd, it, base, base_cap = _setup(lm, mode)
    names = component_names(stack, heads=True)
    rows = []
    hook = stack.backbone.register_forward_pre_hook(
        lambda m, a, k: rows.append((k.get("input_ids") if k.get("input_ids") is not None else a[0]).shape),
        with_kwargs=True)
    try:
        state = prefix_state(stack, it.prefix)
        rows.clear()
        cached, clean, calls = patch_effects(stack, rd, it.ids, len(it.prefix), base_cap, len(base.prefix), names,
                                             state, batch=7)
        shapes = list(rows)
    finally:
        hook.remove()
    whole, clean_whole = patch_effects_whole(stack, rd, it.ids, len(it.prefix), base_cap, len(base.prefix), names, 7)
    assert calls == len(shapes) == -(-len(names) // 6)
    assert {s[0] for s in shapes} == {7} and all(s[1] < len(it.continuation) + 1 for s in shapes)
    assert abs(clean - clean_whole) <= FLOAT32_RTOL * (1 + abs(clean_whole))
    assert clean == pytest.approx(it.engine_score, rel=FLOAT32_RTOL, abs=FLOAT32_RTOL)
    assert set(cached) == set(whole) == set(names)
    moved = [k for k in names if whole[k] != 0]
    assert len(moved) > len(names) // 2
    for k in names:
        assert abs(cached[k] - whole[k]) <= 2 * FLOAT32_RTOL * (1 + abs(clean_whole)), (k, cached[k], whole[k])


def _towards(cap: Captured, base: Captured, eps: float, n: int) -> Captured:
    """A baseline capture whose last ``n`` positions sit ``eps`` of the way from ``cap``'s values to ``base``'s."""
    def mix(a, b):
        if a is None:
            return None
        out = a.clone()
        out[:, -n:] = a[:, -n:] + eps * (b[:, -n:] - a[:, -n:])
        return out
    return Captured(mix(cap.embed, base.embed), [mix(a, b) for a, b in zip(cap.attn, base.attn)],
                    [mix(a, b) for a, b in zip(cap.mlp, base.mlp)], [mix(a, b) for a, b in zip(cap.o_in, base.o_in)],
                    [mix(a, b) for a, b in zip(cap.attn_raw, base.attn_raw)], mix(cap.resid, base.resid),
                    mix(cap.normed, base.normed))


@pytest.mark.parametrize("name,mode", [("llama-lm", "logprob"), ("llama-rm", "reward"), ("gemma2-lm", "judge")])
def test_attribution_patching_is_the_first_order_term_of_patching(tiny_models, name, mode):
    """AtP's estimate ``(a - a_base) . d score / d a`` (one backward) is the derivative of real patching: patched
    ``eps`` of the way towards the baseline, the effect is ``eps x AtP + O(eps^2)``; the central difference at
    eps = +-1/64 matches AtP, for every component and head, to the second-order remainder measured at the same
    steps (the difference of the two one-sided quotients bounds it) plus float32's rounding of the scores."""
    lm = tiny_models[name]
    stack, rd, it, base, base_cap = _setup(lm, mode, ("Love and peace", "Hate and war"))
    assert len(it.continuation) == len(base.continuation)  # the window covers the whole continuation, aligned
    names = component_names(stack, heads=True)
    cap = forward(stack, it.ids, heads=True)
    state = prefix_state(stack, it.prefix)
    atp = attribution_patching(stack, rd, it.ids, len(it.prefix), base_cap, len(base.prefix), names, state)
    n = len(it.continuation)
    eps = 1 / 64
    up, clean, _ = patch_effects(stack, rd, it.ids, len(it.prefix), _towards(cap, base_cap, eps, n), len(it.prefix),
                                 names, state, batch=16)
    down, _, _ = patch_effects(stack, rd, it.ids, len(it.prefix), _towards(cap, base_cap, -eps, n), len(it.prefix),
                               names, state, batch=16)
    noise = 8 * torch.finfo(torch.float32).eps * (1 + abs(clean)) / eps
    for k in names:
        central = (up[k] - down[k]) / (2 * eps)
        curvature = abs(up[k] + down[k]) / eps  # |f(e) + f(-e)| / e ~ e f'': the second-order term's size
        assert abs(central - atp[k]) <= curvature + noise, (k, central, atp[k], curvature, noise)
    assert sum(abs(v) for v in atp.values()) > 0


def test_agreements_carry_n_and_an_interval_and_verdicts_need_enough_pairs():
    """Spearman with n and a 95% interval; no verdict from 5 pairs (before: 'read them as causes' from 5), the
    verdict the whole interval supports otherwise."""
    from probe.report.why import agreement_words

    five = agreement([1.0, 2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 5.0, 4.0])
    assert five["n"] == 5 and five["spearman"] == pytest.approx(0.9) and five["ci95"][0] < 0.9 < five["ci95"][1]
    assert "too few pairs" in agreement_words(five) and "causes" not in agreement_words(five)
    many = agreement([float(x) for x in range(60)], [x + (1.0 if x % 2 else -1.0) for x in range(60)])
    assert many["ci95"][0] >= 0.7 and "read them as causes" in agreement_words(many)
    spread = agreement([float(x) for x in range(12)], [3.0, 1.0, 2.0, 0.0, 5.0, 4.0, 8.0, 6.0, 7.0, 11.0, 9.0, 10.0])
    lo, hi = spread["ci95"]
    assert lo < 0.7 and "read them as causes" not in agreement_words(spread)
    assert agreement([1.0, 2.0], [2.0, 1.0])["ci95"] is None and agreement_words(None).startswith("not measured")


def test_components_and_heads_are_compared_within_one_level(tiny_models):
    """With heads, each response's agreement is over components alone (the embedding, attention and MLP parts) and
    over heads alone, never one Spearman mixing a layer's attention part with the heads that sum to it."""
    import probe
    from probe.attribution.patching import spearman

    lm = tiny_models["llama-lm"]
    out = probe.explain(lm, None, PROMPT, ["Love", "the cat", "freedom"], score="logprob", heads=True, ig_steps=0)
    layers = len(stack_of(lm.model).blocks)
    for r in out["responses"]:
        p = r.get("patching", {})
        if "effects" not in p:
            continue
        comps = [k for k in p["effects"] if k.count(".") < 2]
        heads = [k for k in p["effects"] if k.count(".") == 2]
        assert len(comps) == 1 + 2 * layers and len(heads) == 4 * layers
        want = spearman([p["direct_difference"][k] for k in comps], [p["effects"][k] for k in comps])
        assert p["spearman"] == p["agreement"]["components"]["direct_vs_patching"]["spearman"] == want
        assert p["agreement"]["components"]["direct_vs_patching"]["n"] == len(comps)
        assert p["agreement"]["heads"]["atp_vs_patching"]["n"] == len(heads)
    levels = out["agreement"]["levels"]
    assert levels["components"]["direct_vs_patching"]["n"] == 2 * (1 + 2 * layers)
    assert levels["heads"]["atp_vs_patching"]["n"] == 2 * 4 * layers
