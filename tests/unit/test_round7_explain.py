"""`probe explain` at its options' non-default values, each number checked against a plain computation of its own:
the model's activations taken by plain hooks and read by hand in float64 (parts, heads, rest), rank correlations
by hand ranks, integrated gradients' points recovered from the embeddings the model was fed, a sweep's best and
worst tokens from its scores.parquet, and the why section's bars from the numbers of explain.json.

Tolerances: the float32 rounding of what explain sums, ``(d + terms) eps32 sum|terms|`` at the values compared
(Higham's bound), or the project's float32 rule (FLOAT32_RTOL) where two different computations of one score meet.
"""

from __future__ import annotations

import html
import json
import math

import numpy as np
import pytest
import torch

import probe
from probe.attribution.inputs import response_items
from probe.config import ScoringOptions
from probe.core.precision import FLOAT32_RTOL

PROMPT = "What, in one word, is the greatest thing ever?"
EPS = torch.finfo(torch.float32).eps


def _items(lm, mode, responses, reduce="sum"):
    items, _ = response_items(lm, mode, PROMPT, list(responses), ScoringOptions(reduce))
    return {it.label: it for it in items}


def _acts(lm, ids):
    """The model's own forward on ``ids``, its activations taken by plain hooks: block 0's input, each attention's
    and MLP's output, each o_proj's input, the final norm's input and output, the logits (float64 copies)."""
    model, bb = lm.model, lm.model.model
    got: dict = {"attn": {}, "mlp": {}, "o_in": {}}
    hooks = [bb.layers[0].register_forward_pre_hook(
        lambda m, a, k: got.__setitem__("embed", (a[0] if a else k["hidden_states"]).detach()), with_kwargs=True),
        bb.norm.register_forward_pre_hook(lambda m, a: got.__setitem__("resid", a[0].detach())),
        bb.norm.register_forward_hook(lambda m, a, o: got.__setitem__("normed", o.detach()))]
    for i, layer in enumerate(bb.layers):
        hooks += [layer.self_attn.register_forward_hook(lambda m, a, o, i=i: got["attn"].__setitem__(i, o[0].detach())),
                  layer.mlp.register_forward_hook(lambda m, a, o, i=i: got["mlp"].__setitem__(i, o.detach())),
                  layer.self_attn.o_proj.register_forward_pre_hook(
                      lambda m, a, i=i: got["o_in"].__setitem__(i, a[0].detach()))]
    try:
        with torch.no_grad():
            got["logits"] = model(input_ids=torch.tensor([list(ids)])).logits.detach()
    finally:
        for h in hooks:
            h.remove()
    for k in ("attn", "mlp", "o_in"):
        got[k] = [got[k][i][0].double() for i in range(len(bb.layers))]
    for k in ("embed", "resid", "normed", "logits"):
        got[k] = got[k][0].double()
    return got


def _by_hand(lm, mode, it, reduce="sum"):
    """A Llama item's score, parts, heads and logprob normaliser by hand (float64 of the model's float32 activations):
    part P reads ``sum_p (P_p s_p w) . U_p`` with ``s_p = 1 / rms(resid_p)`` the final norm's real scale, ``U_p`` the
    score's direction at read position p; each with its rounding bound (Higham's, for explain's float32 sums)."""
    from probe.core.scoring import make_head

    a = _acts(lm, it.ids)
    model, norm = lm.model, lm.model.model.norm
    L, n_prefix = len(it.ids), len(it.prefix)
    d = a["resid"].shape[-1]
    s = 1 / torch.sqrt(a["resid"].pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    w = norm.weight.double()
    out: dict = {}
    if mode == "logprob":
        pos = list(range(n_prefix - 1, L - 1))
        targets = list(it.ids[n_prefix:])
        n = len(targets) if reduce == "mean" else 1
        U = model.lm_head.weight.double()[targets] / n
        lse = torch.logsumexp(a["logits"][pos], -1)
        picked = a["logits"][pos, targets]
        out["score"] = float((picked - lse).sum() / n)
        out["normaliser"] = float(-lse.sum() / n)
    else:
        pos = [L - 1]
        if mode == "judge":
            yes, no = make_head(lm, "judge", ScoringOptions()).ids
            W = model.lm_head.weight.double()
            U = (W[yes] - W[no])[None]
            out["score"] = float(a["logits"][L - 1, yes] - a["logits"][L - 1, no])
        else:
            U = model.score.weight.double()[:1]
            out["score"] = float(a["logits"][0])
    frozen = s[pos] * w * U  # [n_read, d]: what each coordinate of a part at a read position adds to the score

    def read(part):
        t = part[pos] * frozen
        return float(t.sum()), float(t.abs().sum())
    comps, sizes = {"embed": read(a["embed"])[0]}, {"embed": read(a["embed"])[1]}
    heads, head_sizes = {}, {}
    for i, layer in enumerate(model.model.layers):
        comps[f"L{i}.attn"], sizes[f"L{i}.attn"] = read(a["attn"][i])
        comps[f"L{i}.mlp"], sizes[f"L{i}.mlp"] = read(a["mlp"][i])
        Wo = layer.self_attn.o_proj.weight.double()
        dh = Wo.shape[1] // 4
        for h in range(4):
            part = a["o_in"][i][:, h * dh:(h + 1) * dh] @ Wo[:, h * dh:(h + 1) * dh].T
            heads[f"L{i}.attn.h{h}"], head_sizes[f"L{i}.attn.h{h}"] = read(part)
    out.update(components=comps, sizes=sizes, heads=heads, head_sizes=head_sizes, d=d, n_read=len(pos))
    return out


def _tol(size, d, n_read):
    """Higham's bound of a float32 sum of ``d n_read`` products of total size ``size`` (and the frozen scale's few
    roundings per product)."""
    return (d * n_read + 8) * EPS * size


@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_every_responses_parts_heads_and_closure_by_hand_in_a_batch(tiny_models, reduce):
    """Four responses explained together with --heads: each response's score, parts and heads are its own (by hand,
    from the model's activations), its closure line is what its own numbers give, its heads sum to its layers'
    attention parts and its heads' closure is one of its own layers' gaps, for every response, not just the first."""
    lm = tiny_models["llama-lm"]
    responses = ["Love", "the cat sat", "freedom and peace", "music"]
    out = probe.explain(lm, None, PROMPT, responses, score="logprob", heads=True, ig_steps=0, patch=False,
                        logprob_reduce=reduce)
    items = _items(lm, "logprob", responses, reduce)
    assert [r["response"] for r in out["responses"]] == responses
    for r in out["responses"]:
        want = _by_hand(lm, "logprob", items[r["response"]], reduce)
        d, m = want["d"], want["n_read"]
        assert r["continuation_ids"] == list(items[r["response"]].continuation)
        assert abs(r["score"] - want["score"]) <= FLOAT32_RTOL * (1 + abs(want["score"])), r["response"]
        assert set(r["components"]) == set(want["components"])
        for k, v in want["components"].items():
            assert abs(r["components"][k] - v) <= _tol(want["sizes"][k], d, m), (r["response"], k, r["components"][k], v)
        assert set(r["heads"]) == set(want["heads"])
        for k, v in want["heads"].items():
            assert abs(r["heads"][k] - v) <= _tol(want["head_sizes"][k], d, m), (r["response"], k, r["heads"][k], v)
        c = r["check"]
        total = sum(r["components"].values()) + r["rest"]
        assert r["rest"] == pytest.approx(sum(r["rest_items"].values()), rel=4 * 2 ** -52, abs=1e-300)
        assert c["sum_components_plus_rest"] == total
        assert c["score_minus_parts_and_rest"] == r["score"] - total
        assert c["closure"] == pytest.approx(c["decomposed_forward_score"] - total, rel=1e-12, abs=1e-12)
        assert abs(c["closure"]) <= c["closure_tolerance"] and abs(r["score"] - total) <= c["bound"]
        assert c["bound"] == pytest.approx(c["closure_tolerance"] + c["engine_tolerance"], rel=1e-12)
        gaps = []
        for layer in range(2):
            hs = [v for k, v in r["heads"].items() if k.startswith(f"L{layer}.attn.h")]
            gaps.append(abs(sum(hs) - r["components"][f"L{layer}.attn"]))
            assert gaps[-1] <= _tol(sum(want["head_sizes"][f"L{layer}.attn.h{h}"] for h in range(4)) +
                                    want["sizes"][f"L{layer}.attn"], d, m)
        assert min(abs(c["heads_closure"] - g) for g in gaps) <= 1e-12 * (1 + max(gaps))
        assert c["heads_closure"] <= c["heads_tolerance"]


@pytest.mark.parametrize("order", [0, 1])
def test_the_difference_of_exactly_two_responses_by_hand(tiny_models, order):
    """Two responses (no median to patch from): the difference is the higher-scored minus the lower whichever was
    given first, its parts the parts' differences (by hand too), its check what its numbers give and its bound the
    sum of the two items' bounds."""
    lm = tiny_models["llama-rm"]
    pair = ["Love and peace", "the"][::1 if order == 0 else -1]
    out = probe.explain(lm, None, PROMPT, pair, score="reward", ig_steps=0)
    items = _items(lm, "reward", pair)
    hand = {t: _by_hand(lm, "reward", items[t]) for t in pair}
    assert abs(hand[pair[0]]["score"] - hand[pair[1]]["score"]) > 2 * FLOAT32_RTOL * (
        1 + max(abs(h["score"]) for h in hand.values()))  # the order is the hand's own
    hi, lo = sorted(pair, key=lambda t: -hand[t]["score"])
    rec = {r["response"]: r for r in out["responses"]}
    diff = out["difference"]
    assert diff is not None and (diff["higher"], diff["lower"]) == (hi, lo)
    assert out["baseline"]["response"] is None and all("patching" not in r for r in out["responses"])
    assert diff["score"] == rec[hi]["score"] - rec[lo]["score"]
    assert diff["rest"] == rec[hi]["rest"] - rec[lo]["rest"]
    assert diff["components"] == {k: rec[hi]["components"][k] - rec[lo]["components"][k] for k in rec[hi]["components"]}
    for k, v in diff["components"].items():
        want = hand[hi]["components"][k] - hand[lo]["components"][k]
        size = hand[hi]["sizes"][k] + hand[lo]["sizes"][k]
        assert abs(v - want) <= _tol(size, hand[hi]["d"], 1), (k, v, want)
    parts = sum(diff["components"].values())
    assert diff["check"]["score_minus_parts_and_rest"] == diff["score"] - (parts + diff["rest"])
    assert diff["check"]["bound"] == rec[hi]["check"]["bound"] + rec[lo]["check"]["bound"]
    assert abs(diff["check"]["score_minus_parts_and_rest"]) <= diff["check"]["bound"]


def _logits_rest(lm, it, mode, reduce):
    """Gemma 2's rest items by hand: its logits are soft-capped (``c tanh(z / c)``), so the bend is the capped logits
    read minus the raw ones (``normed . W``), the normaliser minus the log-sum-exp of the capped logits; each with
    the rounding bound of the raw logits' d products and of the cap's tanh and the log-sum-exp."""
    from probe.core.scoring import make_head

    got = {}
    h = lm.model.model.norm.register_forward_hook(lambda m, a, o: got.__setitem__("normed", o.detach()))
    try:
        with torch.no_grad():
            capped = lm.model(input_ids=torch.tensor([list(it.ids)])).logits[0].double()
    finally:
        h.remove()
    normed = got["normed"][0].double()
    W = lm.model.lm_head.weight.double()
    L, n_prefix, d = len(it.ids), len(it.prefix), normed.shape[-1]
    cap = lm.model.config.final_logit_softcapping
    if mode == "judge":
        yes, no = make_head(lm, "judge", ScoringOptions()).ids
        raw = normed[L - 1] @ W[[yes, no]].T
        size = float((normed[L - 1].abs() @ W[[yes, no]].abs().T).sum())
        return {"score": float(capped[L - 1, yes] - capped[L - 1, no]),
                "softcap_bend": float((capped[L - 1, yes] - capped[L - 1, no]) - (raw[0] - raw[1])),
                "tol": (d + 8) * EPS * size + 8 * EPS * cap}
    pos, targets = list(range(n_prefix - 1, L - 1)), list(it.ids[n_prefix:])
    n = len(targets) if reduce == "mean" else 1
    raw = (normed[pos] * W[targets]).sum(-1)
    lse = torch.logsumexp(capped[pos], -1)
    size = float((normed[pos].abs() * W[targets].abs()).sum())
    biggest = float((normed[pos].abs() @ W.abs().T).max(-1).values.sum())
    return {"score": float((capped[pos, targets] - lse).sum() / n),
            "softcap_bend": float((capped[pos, targets] - raw).sum() / n),
            "log_softmax_normaliser": float(-lse.sum() / n),
            "tol": ((d + 8) * EPS * (size + biggest) + 8 * EPS * (cap * len(pos) + float(lse.abs().sum()))) / n}


@pytest.mark.parametrize("mode,reduce", [("logprob", "sum"), ("logprob", "mean"), ("judge", "sum")])
def test_rest_items_of_every_reduction_by_hand_on_a_soft_capped_model(tiny_models, mode, reduce):
    """Gemma 2 (soft-capped logits) under --score logprob with --logprob-reduce sum and mean, and the judge: each
    item of rest by hand (the normaliser, divided by the tokens under mean; the cap's bend; no bias), the score the
    hand's, and nothing else outside the parts but the stream's and the final norm's rounding."""
    lm = tiny_models["gemma2-lm"]
    responses = ["Love and peace", "the cat"]
    out = probe.explain(lm, None, PROMPT, responses, score=mode, ig_steps=0, patch=False, logprob_reduce=reduce)
    items = _items(lm, mode, responses, reduce)
    for r in out["responses"]:
        want = _logits_rest(lm, items[r["response"]], mode, reduce)
        rest = r["rest_items"]
        keys = {"lm_head_bias", "softcap_bend", "residual_rounding", "final_norm_rounding"}
        assert set(rest) == keys | ({"log_softmax_normaliser"} if mode == "logprob" else set())
        assert rest["lm_head_bias"] == 0.0  # Gemma's LM head has no bias
        for k in ("softcap_bend", "log_softmax_normaliser"):
            if k in want:
                assert abs(rest[k] - want[k]) <= want["tol"], (r["response"], k, rest[k], want[k], want["tol"])
        assert abs(r["check"]["decomposed_forward_score"] - want["score"]) <= want["tol"] + 8 * EPS * abs(want["score"])
        assert abs(r["score"] - want["score"]) <= FLOAT32_RTOL * (1 + abs(want["score"]))
        assert abs(r["check"]["closure"]) <= r["check"]["closure_tolerance"]


def test_rest_items_of_a_reward_head_with_a_bias_by_hand(tiny_models):
    """A linear reward head with a bias: rest is that bias and the two roundings; the parts by hand sum with rest
    to the hand's score (the model's own logit, bias included)."""
    import copy
    from dataclasses import replace

    lm = tiny_models["llama-rm"]
    model = copy.deepcopy(lm.model)
    old = model.score
    model.score = torch.nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        model.score.weight.copy_(old.weight)
        model.score.bias.fill_(0.375)
    model.requires_grad_(False)
    lm = replace(lm, model=model)
    out = probe.explain(lm, None, PROMPT, ["Love", "the cat"], score="reward", ig_steps=0, patch=False)
    items = _items(lm, "reward", ["Love", "the cat"])
    for r in out["responses"]:
        want = _by_hand(lm, "reward", items[r["response"]])
        assert set(r["rest_items"]) == {"head_bias", "residual_rounding", "final_norm_rounding"}
        assert r["rest_items"]["head_bias"] == 0.375
        size = sum(want["sizes"].values())
        assert abs(r["rest"] - (want["score"] - sum(want["components"].values()))) <= \
            _tol(size, want["d"], 1) + r["check"]["closure_tolerance"] + 8 * EPS * abs(want["score"])


def _ranks(x):
    """Average ranks (ties share the mean of their places), by hand."""
    x = np.asarray(x, dtype=float)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _agreement(a, b):
    """Spearman's rho as Pearson's r of the average ranks; its 95% interval by Fisher's z with Bonett and Wright's
    variance ``(1 + rho^2 / 2) / (n - 3)``."""
    from scipy.stats import norm, spearmanr

    ra, rb = _ranks(a), _ranks(b)
    rho = float(np.corrcoef(ra, rb)[0, 1])
    assert rho == pytest.approx(spearmanr(a, b).statistic, abs=1e-12)
    n = len(a)
    r = max(-0.999999, min(0.999999, rho))  # a perfect rank agreement's z is infinite: held just inside, as stated
    half = norm.ppf(0.975) * math.sqrt((1 + r * r / 2) / (n - 3))
    ci = [math.tanh(math.atanh(r) - half), math.tanh(math.atanh(r) + half)]
    return rho, n, ci, 1e-6 * half  # tanh moves less than its argument: the normal point's six decimals' rounding


def test_agreements_over_the_right_pairs_by_hand(tiny_models):
    """Each response's agreements (direct and AtP against patching, components and heads apart) and the pooled ones
    over every patched response: Spearman by hand ranks over exactly that level's pairs, n the pairs counted, the
    interval Fisher's z with Bonett and Wright's variance; the per-response list, its median and n_pairs."""
    lm = tiny_models["llama-lm"]
    out = probe.explain(lm, None, PROMPT, ["Love", "the cat", "freedom", "Love and peace"], score="logprob",
                        heads=True, ig_steps=0, batch_size=16)
    base = out["baseline"]["response"]
    patched = [r for r in out["responses"] if r["response"] != base]
    assert len(patched) == 3 and next(r for r in out["responses"] if r["response"] == base)["patching"][
        "is_the_baseline"]
    pooled: dict = {}
    for r in patched:
        p = r["patching"]
        for lev, keep in (("components", lambda k: k.count(".") < 2), ("heads", lambda k: k.count(".") == 2)):
            keys = [k for k in p["effects"] if keep(k)]
            assert len(keys) == (5 if lev == "components" else 8)
            eff = [p["effects"][k] for k in keys]
            for what, src in (("direct_vs_patching", p["direct_difference"]), ("atp_vs_patching", p["atp"])):
                got = p["agreement"][lev][what]
                rho, n, ci, tol = _agreement([src[k] for k in keys], eff)
                assert got["n"] == n == len(keys)
                assert got["spearman"] == pytest.approx(rho, abs=1e-12), (r["response"], lev, what)
                assert got["ci95"] == pytest.approx(ci, abs=tol), (r["response"], lev, what)
                pa, pb = pooled.setdefault((lev, what), ([], []))
                pa += [src[k] for k in keys]
                pb += eff
        assert p["spearman"] == p["agreement"]["components"]["direct_vs_patching"]["spearman"]
    levels = out["agreement"]["levels"]
    for (lev, what), (pa, pb) in pooled.items():
        rho, n, ci, tol = _agreement(pa, pb)
        got = levels[lev][what]
        assert got["n"] == n and got["spearman"] == pytest.approx(rho, abs=1e-12), (lev, what)
        assert got["ci95"] == pytest.approx(ci, abs=tol), (lev, what)
    ag = out["agreement"]
    per = [r["patching"]["spearman"] for r in patched]
    assert ag["per_response"] == per and ag["median_per_response"] == pytest.approx(float(np.median(per)), abs=1e-15)
    assert ag["overall_spearman"] == levels["components"]["direct_vs_patching"]["spearman"]
    assert ag["ci95"] == levels["components"]["direct_vs_patching"]["ci95"]
    assert ag["n_pairs"] == 3 * 5


def test_the_median_per_response_is_a_median_not_a_mean(tiny_models, monkeypatch):
    """The tiny models' patched responses all agree at Spearman 1, where a mean and a median are one number: here each
    response's agreement is set to one of three skewed values (0.1, -0.6, 0.9: median 0.1, mean 0.133), and the
    summary must be their median, over exactly those responses."""
    import probe.attribution.explain as ex

    values = iter([0.1, -0.6, 0.9])
    real = ex.agreements

    def skewed(p):
        out = real(p)
        out["components"]["direct_vs_patching"]["spearman"] = next(values)
        return out

    monkeypatch.setattr(ex, "agreements", skewed)
    out = probe.explain(tiny_models["llama-lm"], None, PROMPT, ["Love", "the cat", "freedom", "Love and peace"],
                        score="logprob", ig_steps=0, batch_size=16)
    ag = out["agreement"]
    assert ag["per_response"] == [0.1, -0.6, 0.9] and ag["median_per_response"] == 0.1


def _gl_panel(a, b, log):
    """Two Gauss-Legendre nodes and weights on [a, b], in alpha or in log alpha (then d alpha = alpha d log alpha)."""
    t, w = np.array([-1, 1]) / math.sqrt(3), np.array([1.0, 1.0])
    if not log:
        return a + (t + 1) / 2 * (b - a), w * (b - a) / 2
    la, lb = math.log(a), math.log(b)
    alphas = np.exp(la + (t + 1) / 2 * (lb - la))
    return alphas, w * (lb - la) / 2 * alphas


@pytest.mark.parametrize("baseline", ["zero", "token"])
def test_integrated_gradients_rule_points_and_completeness_by_hand(tiny_models, baseline):
    """The path's points are the rule's, recovered from the embeddings the model was fed: from a token's embeddings
    8 even panels, from zero ``[0, lo]`` then one panel per decade up to 1 (``lo`` where ``alpha max|x|`` is the
    square root of float32's smallest normal), 2 Gauss-Legendre nodes each (in log alpha above lo), breakpoints
    evaluated, then the panel with the largest completeness residual halved (at its geometric middle in log alpha);
    the attributions are ``(x - x0) . sum w grad`` by hand, the residual what they give, the target the rule's."""
    from probe.attribution.inputs import ig_baseline_id
    from probe.core.scoring import make_head

    lm = tiny_models["llama-lm"]
    it = _items(lm, "logprob", ["Love"])["Love"]
    emb = lm.model.get_input_embeddings()
    ids = torch.tensor([list(it.ids)])
    n_prefix = len(it.prefix)
    with torch.no_grad():
        x = emb(ids).float()
        x0 = x.clone()
        tok = None if baseline == "zero" else ig_baseline_id(lm.tokenizer, " the")
        if tok is None:
            x0[:, :n_prefix] = 0
        else:
            x0[:, :n_prefix] = emb(torch.full((1, n_prefix), tok)).float()
    delta = (x - x0).double()
    make_head(lm, "logprob", ScoringOptions())  # (the head the run would build: its construction must not raise)
    pos, targets = list(range(n_prefix - 1, len(it.ids) - 1)), list(it.ids[n_prefix:])

    cache: dict = {}

    def F(alpha, grad=False):
        return cache[alpha, grad]

    def fill(alphas, grad):
        """Scores (and gradients) at ``alphas`` not yet computed, all in one call."""
        alphas = [a for a in dict.fromkeys(alphas) if (a, grad) not in cache]
        if not alphas:
            return
        a = torch.tensor(alphas, dtype=torch.float32)[:, None, None]
        e = (x0 + a * (x - x0)).detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            lp = torch.log_softmax(lm.model(inputs_embeds=e).logits[:, pos].float(), -1)
            s = lp[:, range(len(pos)), targets].sum(-1)
        g = torch.autograd.grad(s.sum(), e)[0].double() if grad else [None] * len(alphas)
        for k, alpha in enumerate(alphas):
            cache[alpha, grad] = (float(s[k].detach()), g[k])

    if tok is not None:  # min(8, steps // 2) even panels
        panels = [(k / 5, (k + 1) / 5, False) for k in range(5)]
    else:
        lo = min(0.1, math.sqrt(torch.finfo(torch.float32).tiny) / float((x - x0).abs().max()))
        edges = [0.0, *np.geomspace(lo, 1.0, math.ceil(-math.log10(lo)) + 1).tolist()]
        edges[-1] = 1.0
        panels = [(a, b, a > 0) for a, b in zip(edges[:-1], edges[1:])]
    steps = 2 * len(panels) + 4 if tok is None else 10  # from zero: the first round and room for one halving
    f_at, q_of = {}, {}

    def evaluate(ps):
        fill([e for a, b, _ in ps for e in (a, b)], False)
        fill([float(t) for p in ps for t in _gl_panel(*p)[0]], True)
        for a, b, log in ps:
            for e in (a, b):
                f_at.setdefault(e, F(e)[0])
            nodes, weights = _gl_panel(a, b, log)
            q_of[a, b] = sum(w * F(float(t), True)[1] for t, w in zip(nodes, weights))
    evaluate(panels)
    goal = max(1e-12 * abs(f_at[1.0] - f_at[0.0]), 64 * EPS * (abs(f_at[1.0]) + abs(f_at[0.0])))
    res = {p: float((delta[0] * q_of[p[:2]]).sum()) - (f_at[p[1]] - f_at[p[0]]) for p in panels}
    total = sum(abs(v) for v in res.values())
    assert abs(total - goal) > FLOAT32_RTOL * (total + goal)  # whether it refines is not a coin toss
    final, dropped = list(panels), []
    if total > goal and 2 * len(panels) + 4 <= steps:  # the panel of the largest |residual| halved
        worst = max(res, key=lambda p: abs(res[p]))
        second = sorted(abs(v) for v in res.values())[-2]
        assert abs(res[worst]) - second > FLOAT32_RTOL * abs(res[worst])  # which one is not a coin toss
        a, b, log = worst
        mid = math.sqrt(a * b) if log else (a + b) / 2
        halves = [(a, mid, log), (mid, b, log)]
        evaluate(halves)
        final = [q for p in panels for q in ([p] if p != worst else halves)]
        dropped = [float(t) for t in _gl_panel(*worst)[0]]
    assert bool(dropped) == (tok is None)  # from zero this model refines; from a token it meets the floor at once
    want_all = sorted([float(t) for a, b, log in final for t in _gl_panel(a, b, log)[0]] + dropped)
    want_ends = sorted({e for a, b, _ in final for e in (a, b)})

    fed = []  # (alpha, with a gradient) of every row the backbone was fed as embeddings

    def record(m, args, kwargs):
        e = kwargs.get("inputs_embeds")
        if e is not None:
            d = (e.detach().double() - x0.double())[:, :n_prefix]
            for row in d:
                fed.append((float((row * delta[0, :n_prefix]).sum() / (delta[0, :n_prefix] ** 2).sum()),
                            e.requires_grad))
    hook = lm.model.model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        out = probe.explain(lm, None, PROMPT, ["Love"], score="logprob", patch=False, ig_steps=steps,
                            ig_target=1e-12, ig_baseline="zero" if tok is None else " the", batch_size=16)
    finally:
        hook.remove()
    g = out["responses"][0]["integrated_gradients"]
    scale = float(delta.abs().max()) + float(x0.abs().max())

    def same(got, want):
        """Each point fed is one of the rule's and each of the rule's is fed, to the float32 rounding of
        ``x0 + alpha (x - x0)`` (relative to alpha from zero; to the embeddings' size over |x - x0| from a token)."""
        def near(v, w):
            return abs(v - w) <= 8 * EPS * (abs(w) + (scale / float(delta.abs().max()) if tok is not None else 0.0))
        return all(any(near(v, w) for v in got) for w in want) and all(any(near(v, w) for w in want) for v in got)
    assert same([a for a, grad in fed if grad], want_all), "the gradients' points are not the rule's"
    assert same([a for a, grad in fed if not grad], want_ends), "the breakpoints are not the rule's"
    assert g["points"] == len(want_all) and g["panels"] == len(final) and len(g["history"]) == 1 + bool(dropped)
    q = sum(q_of[p[:2]] for p in final)
    attr = (delta[0] * q).sum(-1)[:n_prefix]
    terms = sum((delta[0] * F(float(t), True)[1]).abs().sum(-1)[:n_prefix] * abs(w)
                for a, b, log in final for t, w in zip(*_gl_panel(a, b, log)))
    assert g["positions"] == list(range(n_prefix))
    for k in range(n_prefix):
        assert abs(g["attributions"][k] - float(attr[k])) <= FLOAT32_RTOL * float(terms[k]) + 1e-30, k
    assert abs(g["score"] - f_at[1.0]) <= FLOAT32_RTOL * (1 + abs(f_at[1.0]))
    assert abs(g["baseline_score"] - f_at[0.0]) <= FLOAT32_RTOL * (1 + abs(f_at[0.0]))
    gap = g["score"] - g["baseline_score"]
    size = sum(abs(v) for v in g["attributions"])  # their float32 sum's rounding
    assert abs(g["residual"] - (sum(g["attributions"]) - gap)) <= n_prefix * EPS * size + 4 * EPS * abs(gap)
    assert g["target"] == pytest.approx(max(1e-12 * abs(gap), 64 * EPS * (abs(g["score"]) + abs(g["baseline_score"]))),
                                        rel=1e-12)
    assert g["met"] == (g["panel_residuals"] <= g["target"] and abs(g["residual"]) <= g["target"])
    assert g["baseline"] == ("zero" if tok is None else f"id {tok}")


@pytest.fixture(scope="module")
def sweep7(tiny_dirs, tmp_path_factory):
    """A sweep of 7 tokens (odd: a middle token that is neither best nor worst)."""
    from probe.commands.score import main as score_main

    root = tmp_path_factory.mktemp("sweep7")
    assert score_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--prompt", PROMPT, "--limit", "7", "--verify",
                       "0", "--device", "cpu", "--no-progress", "--output", str(root / "runs")]) == 0
    return next((root / "runs").rglob("scores.parquet")).parent


@pytest.mark.parametrize("top", [1, 100])
def test_top_at_its_edges_with_a_sweeps_run(sweep7, tmp_path, top):
    """--run of a 7-token sweep: --top 1 explains its best and its worst token, --top 100 its best 3 and worst 3
    (never the middle one, which is the median baseline), each with the score the sweep printed, as sorted by
    hand from scores.parquet (score descending, then token id)."""
    import polars as pl

    from probe.commands.explain import main as explain_main

    out = tmp_path / "ex"
    assert explain_main(["--run", str(sweep7), "--top", str(top), "--ig-steps", "0", "--no-atp", "--out",
                         str(out)]) == 0
    got = json.loads((out / "explain.json").read_text())
    rows = sorted(pl.read_parquet(sweep7 / "scores.parquet").to_dicts(), key=lambda r: (-r["score"], r["token_id"]))
    assert len(rows) == 7
    k = min(top, 3)
    want = [(r["token_id"], r["score"], "best") for r in rows[:k]] + [(r["token_id"], r["score"], "worst")
                                                                      for r in rows[-k:]]
    assert [(r["token_id"], r["score"], r["role"]) for r in got["responses"]] == want
    assert got["baseline"]["score"] == rows[3]["score"] and got["run"]["top"] == top
    assert rows[3]["token_id"] not in [r["token_id"] for r in got["responses"]]
    for r in got["responses"]:
        assert abs(r["score"] - (sum(r["components"].values()) + r["rest"])) <= r["check"]["bound"]
        assert r["patching"]["effects"] and r["patching"]["atp"] is None
    assert got["timing"]["hooked_forwards"] == 2 * k


def test_the_why_sections_bars_and_words_are_explain_jsons_numbers(tiny_models, monkeypatch):
    """The why section of an explanation with heads, patching and integrated gradients: per response one attention
    and one MLP bar at every layer, each the part explain.json holds, the attention's left of the MLP's; the largest
    parts, heads, rest items and prompt words said are the largest by size of explain.json's own."""
    from matplotlib.axes import Axes

    from probe.report.why import why_section

    lm = tiny_models["llama-lm"]
    result = probe.explain(lm, None, PROMPT, ["Love", "the cat", "freedom and peace"], score="logprob", heads=True,
                           ig_steps=8, batch_size=16)
    result = json.loads(json.dumps(result))  # as explain.json holds it
    bars = []
    real = Axes.bar

    def bar(self, x, height, *args, **kwargs):
        bars.append((list(x), list(height), kwargs.get("label")))
        return real(self, x, height, *args, **kwargs)
    monkeypatch.setattr(Axes, "bar", bar)
    page = why_section(result)
    assert len(bars) == 2 * len(result["responses"])
    top = 5

    def said(pairs):
        return ", ".join(f"{k} {v:+.3f}" for k, v in sorted(pairs, key=lambda kv: -abs(kv[1]))[:top])
    for i, r in enumerate(result["responses"]):
        (xa, ha, la), (xm, hm, lm_) = bars[2 * i], bars[2 * i + 1]
        assert (la, lm_) == ("attention", "MLP")
        assert ha == [r["components"][f"L{j}.attn"] for j in range(2)]
        assert hm == [r["components"][f"L{j}.mlp"] for j in range(2)]
        assert all(a < j < m for a, j, m in zip(xa, range(2), xm)) and len(xa) == len(xm) == 2
        assert html.escape("largest parts: " + said(r["components"].items())) in page
        assert html.escape("top heads: " + said(r["heads"].items())) in page
        outside = ", ".join(f"{k.replace('_', ' ')} {v:+.3f}" for k, v in r["rest_items"].items())
        assert html.escape(f"what lies outside the parts: {outside}") in page
        g = r["integrated_gradients"]
        words = ", ".join(f"{t!r} {a:+.3f}" for t, a in sorted(zip(g["tokens"], g["attributions"]),
                                                               key=lambda kv: -abs(kv[1]))[:top])
        assert html.escape("prompt words that matter most: " + words) in page
        c = r["check"]
        assert html.escape(f"score {r['score']:+.4f} = parts {sum(r['components'].values()):+.4f} + rest "
                           f"{r['rest']:+.4f} (to {abs(c['score_minus_parts_and_rest']):.1e}") in page
