"""Activation patching, and attribution patching: cause, to set beside the direct parts.

Each component (the embedding, each layer's attention and MLP output, optionally each head) is replaced by its
value under a baseline response, one component per batch row; its *effect* is ``score - patched score``: how much
of the score's lead over the baseline flows through it, directly and through every later layer. The like-for-like
direct number is the component's *direct difference*: its part of the score minus the part its baseline value
would have given, read through the same frozen norm and reader (``u . frozen(part - part_baseline)``): patching's
effect on the score through the direct path alone.

Positions: the continuation's (the shared prefix's parts are equal in both), aligned from the right end (the
read position and the template's closing ids line up); continuations of different lengths replace the last
``min`` positions only (recorded as ``aligned_positions``). A log-probability's first token is read at the
prompt's last position, which no response changes: patching from a baseline response moves only the later
tokens' log-probabilities (and the direct differences are read at those positions alone), so on a sweep's one-token
responses it explains the closing tokens' part of the score, not ``log p(token | prompt)``.

Since a patch touches the continuation only, the prefix's keys and values are those of the unpatched forward: the
patched forwards run on the prefix's KV cache (`patch_effects`), over the continuation's positions alone, as the
engine scores them; `patch_effects_whole` is the plain reference over whole sequences (tests hold the two equal).
Measured on SmolLM2's sweep tokens (experiments/results/explain_cost_smollm2_cpu.md).

Attribution patching (AtP, Nanda 2023; Kramar et al. 2024): one forward and one backward of the unpatched
continuation give ``d score / d a`` for every component's output ``a``; ``(a - a_baseline) . d score / d a`` over
the patched positions estimates each component's (and head's) patching effect to first order. Its agreement with
real patching is reported as a Spearman correlation with the number of pairs and a 95% interval
(`agreement`), within one level (components, or heads): never mixing a layer's attention part with the heads that
sum to it.

Every forward holds rows of the one explained item: ``batch`` rows per call, row 0 unpatched, the last call padded
by repeating its last component (whose result is dropped), so a call's shape is a function of the item alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from probe.attribution.model import Captured, Stack, Window, freeze, patching, tapped
from probe.attribution.readers import Reader


@dataclass
class Patched:
    effects: dict[str, float]  # component -> score - patched score
    direct_difference: dict[str, float]  # component -> its direct part minus the baseline value's
    atp: dict[str, float] | None  # component -> attribution patching's estimate of its effect
    aligned_positions: int
    forwards: int  # patched calls run
    path: str  # "prefix cache" or "whole sequence"


@dataclass
class PrefixState:
    """An item's prefix run once: its KV cache and final hidden states (the continuation's forwards start here)."""

    cache: object
    hidden: Tensor  # [1, p, d]


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None where it is undefined."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def agreement(a: Sequence[float], b: Sequence[float]) -> dict:
    """Spearman's rho of two lists of numbers, the number of pairs ``n`` and a 95% interval (Fisher's z with Bonett
    and Wright's variance for Spearman's rho, ``(1 + rho^2 / 2) / (n - 3)``; none below 4 pairs)."""
    rho = spearman(a, b)
    n = len(a)
    out = {"spearman": rho, "n": n, "ci95": None}
    if rho is not None and n >= 4:
        r = max(-0.999999, min(0.999999, rho))
        half = 1.959964 * math.sqrt((1 + r * r / 2) / (n - 3))
        z = math.atanh(r)
        out["ci95"] = [math.tanh(z - half), math.tanh(z + half)]
    return out


def component_names(stack: Stack, heads: bool) -> list[str]:
    names = ["embed"]
    for b in stack.blocks:
        names += [f"L{b.index}.attn", f"L{b.index}.mlp"]
        if heads and b.o_proj is not None:
            names += [f"L{b.index}.attn.h{h}" for h in range(b.n_heads)]
    return names


def level(name: str) -> str:
    """``heads`` for a head's name, ``components`` for the embedding and a layer's attention or MLP part."""
    return "heads" if name.count(".") == 2 else "components"


def _tensor_of(cap: Captured, name: str):
    if name == "embed":
        return cap.embed
    layer, kind = name.split(".")[:2]
    return (cap.attn if kind == "attn" else cap.mlp)[int(layer[1:])]


def aligned(n_cont: int, n_base_cont: int) -> int:
    """How many of the continuation's last positions are patched: the shorter continuation's length."""
    return min(n_cont, n_base_cont)


def direct_difference(stack: Stack, rd: Reader, cap: Captured, base: Captured, n_prefix: int, n_base_prefix: int,
                      names: Sequence[str]) -> tuple[dict[str, float], int]:
    """Each component's direct part minus that of its baseline value, through the target's frozen norm and reader."""
    L, Lb = cap.resid.shape[1], base.resid.shape[1]
    n = aligned(L - n_prefix, Lb - n_base_prefix)
    pos = torch.tensor(rd.positions, device=cap.resid.device)
    frozen = freeze(stack.final_norm, cap.resid[0, pos], cap.normed[0, pos])
    u = rd.directions_of(cap.normed[:1]).to(cap.resid.device)
    inside = pos >= L - n  # read positions inside the patched window (the others are not changed by a patch)
    pos_b = pos - L + Lb
    out = {}
    for name in names:
        parts = name.split(".")
        scale = 1.0
        if len(parts) == 3:  # a head: its slice through its columns of o_proj (and a frozen post-attention norm)
            b = stack.blocks[int(parts[0][1:])]
            scale = b.scale
            h, dh = int(parts[2][1:]), b.head_dim
            W = b.o_proj.weight.float()[:, h * dh:(h + 1) * dh]
            delta = cap.o_in[b.index][0, pos, h * dh:(h + 1) * dh].float()
            delta = delta - torch.where(inside[:, None], base.o_in[b.index][0, pos_b.clamp(min=0),
                                                                            h * dh:(h + 1) * dh].float(), delta)
            delta = delta @ W.T
            if b.post_attn_norm is not None:
                delta = freeze(b.post_attn_norm, cap.attn_raw[b.index][0, pos], cap.attn[b.index][0, pos]).apply(delta)
        else:
            if name != "embed":
                scale = stack.blocks[int(parts[0][1:])].scale
            t, tb = _tensor_of(cap, name), _tensor_of(base, name)
            here = t[0, pos].float()
            delta = here - torch.where(inside[:, None], tb[0, pos_b.clamp(min=0)].float(), here)
        out[name] = scale * float((frozen.apply(delta) * u).sum())
    return out, n


def plan_calls(names: Sequence[str], batch: int) -> list[list[str]]:
    """The components in calls of ``batch - 1`` (row 0 of each call is the unpatched row), the last call padded to
    the same size by repeating its last component: every call has ``batch`` rows."""
    per = max(1, batch - 1)
    calls = [list(names[s:s + per]) for s in range(0, len(names), per)]
    if calls and len(calls[-1]) < per:
        calls[-1] += [calls[-1][-1]] * (per - len(calls[-1]))
    return calls


def patch_effects_whole(stack: Stack, rd: Reader, ids: Sequence[int], n_prefix: int, base: Captured,
                        n_base_prefix: int, names: Sequence[str], batch: int = 16) -> tuple[dict[str, float], float]:
    """The reference: ``score - patched score`` of each component from forwards over the whole sequence."""
    dev = stack.backbone.get_input_embeddings().weight.device
    row = torch.tensor([list(ids)], device=dev)
    L, Lb = len(ids), base.resid.shape[1]
    n = aligned(L - n_prefix, Lb - n_base_prefix)
    window = Window(L - n, n, Lb - n)
    effects, clean = {}, None
    for chunk in plan_calls(names, batch):
        plan = {0: None, **{i + 1: name for i, name in enumerate(chunk)}}
        with torch.no_grad(), patching(stack, plan, base, window):
            normed = stack.backbone(input_ids=row.expand(len(plan), -1), use_cache=False).last_hidden_state
        scores = rd.score(normed).float().cpu()
        clean = float(scores[0]) if clean is None else clean
        for i, name in enumerate(chunk):
            effects[name] = clean - float(scores[i + 1])
    return effects, clean


def prefix_state(stack: Stack, prefix: Sequence[int]) -> PrefixState | None:
    """The prefix's KV cache and hidden states, or None where this model's cache cannot be shared (the caller then
    patches whole sequences)."""
    from probe.core.cache import UnsupportedCache, check_replicable
    from probe.core.engine import output_cache

    dev = stack.backbone.get_input_embeddings().weight.device
    with torch.no_grad():
        out = stack.backbone(input_ids=torch.tensor([list(prefix)], device=dev), use_cache=True)
    cache = output_cache(out)
    try:
        check_replicable(cache)
    except UnsupportedCache:
        return None
    return PrefixState(cache, out.last_hidden_state)


def _on_prefix(stack: Stack, state: PrefixState, cont: Tensor) -> Tensor:
    """Final hidden states of ``prefix + cont`` rows ([b, n] continuation ids) on the prefix's cache: the prefix's
    own, then the continuation's."""
    from probe.core.cache import replicate
    from probe.core.engine import cache_keyword

    b = cont.shape[0]
    out = stack.backbone(input_ids=cont, use_cache=True, **{cache_keyword(stack.backbone): replicate(state.cache, b)})
    return torch.cat([state.hidden.expand(b, -1, -1), out.last_hidden_state], 1)


def _fed(rd: Reader, ids: Sequence[int], n_prefix: int) -> list[int]:
    """The continuation ids a forward must run for ``rd`` to read its positions (a log-probability's last id is only
    predicted, never fed)."""
    need = max(rd.positions) + 1
    return list(ids[n_prefix:max(need, n_prefix + 1)])


def patch_effects(stack: Stack, rd: Reader, ids: Sequence[int], n_prefix: int, base: Captured, n_base_prefix: int,
                  names: Sequence[str], state: PrefixState, batch: int = 16) -> tuple[dict[str, float], float, int]:
    """``score - patched score`` of each component on the prefix's cache, ``batch`` rows per call (row 0 of each call
    unpatched: the score it is measured from). Returns (effects, unpatched score, calls)."""
    dev = stack.backbone.get_input_embeddings().weight.device
    m, Lb = len(ids) - n_prefix, base.resid.shape[1]
    n = aligned(m, Lb - n_base_prefix)
    window = Window(m - n, n, Lb - n)
    cont = torch.tensor([_fed(rd, ids, n_prefix)], device=dev)
    effects, clean = {}, None
    calls = plan_calls(names, batch)
    for chunk in calls:
        plan = {0: None, **{i + 1: name for i, name in enumerate(chunk)}}
        with torch.no_grad(), patching(stack, plan, base, window):
            scores = rd.score(_on_prefix(stack, state, cont.expand(len(plan), -1))).float().cpu()
        clean = float(scores[0]) if clean is None else clean
        for i, name in enumerate(chunk):
            effects[name] = clean - float(scores[i + 1])
    return effects, clean, len(calls)


def attribution_patching(stack: Stack, rd: Reader, ids: Sequence[int], n_prefix: int, base: Captured,
                         n_base_prefix: int, names: Sequence[str], state: PrefixState) -> dict[str, float]:
    """AtP's estimate of each component's patching effect, ``(a - a_baseline) . d score / d a`` over the patched
    positions, from one forward and one backward of the unpatched continuation on the prefix's cache."""
    dev = stack.backbone.get_input_embeddings().weight.device
    m, Lb = len(ids) - n_prefix, base.resid.shape[1]
    n = aligned(m, Lb - n_base_prefix)
    window = Window(m - n, n, Lb - n)
    cont = torch.tensor([_fed(rd, ids, n_prefix)], device=dev)
    heads = any(level(k) == "heads" for k in names)
    with torch.enable_grad(), tapped(stack, heads, window) as taps:
        score = rd.score(_on_prefix(stack, state, cont))[0]
        keys = [k for k in taps if taps[k]["delta"].numel()]
        grads = dict(zip(keys, torch.autograd.grad(score, [taps[k]["delta"] for k in keys], allow_unused=True)))
    out = {}
    for name in names:
        parts = name.split(".")
        key = f"{parts[0]}.o_in" if len(parts) == 3 else name
        g = grads.get(key)
        if g is None:
            out[name] = 0.0
            continue
        clean = taps[key]["clean"]
        _, there = window.slices(clean.shape[1] + window.start)
        other = (base.o_in[int(parts[0][1:])] if len(parts) == 3 else _tensor_of(base, name))[:, there].float()
        diff = (clean.float() - other) * g.float()
        if len(parts) == 3:
            b = stack.blocks[int(parts[0][1:])]
            h, dh = int(parts[2][1:]), b.head_dim
            diff = diff[..., h * dh:(h + 1) * dh]
        out[name] = float(diff.sum())
    return out


def patch(stack: Stack, rd: Reader, ids: Sequence[int], n_prefix: int, cap: Captured, base: Captured,
          n_base_prefix: int, heads: bool = False, batch: int = 16, state: PrefixState | None = None,
          atp: bool = True) -> Patched:
    """Every component patched (on the prefix's cache where ``state`` is given, else whole sequences), its direct
    difference, and AtP's estimate (on the cache only)."""
    names = component_names(stack, heads)
    if state is not None:
        effects, _, calls = patch_effects(stack, rd, ids, n_prefix, base, n_base_prefix, names, state, batch)
        path = "prefix cache"
    else:
        effects, _ = patch_effects_whole(stack, rd, ids, n_prefix, base, n_base_prefix, names, batch)
        calls, path = len(plan_calls(names, batch)), "whole sequence"
    direct, n = direct_difference(stack, rd, cap, base, n_prefix, n_base_prefix, names)
    estimate = (attribution_patching(stack, rd, ids, n_prefix, base, n_base_prefix, names, state)
                if atp and state is not None else None)
    return Patched(effects, direct, estimate, n, calls, path)


def agreements(p: Patched) -> dict:
    """Per level (components, heads): the direct differences' and AtP's agreement with the patching effects."""
    out = {}
    for lev in ("components", "heads"):
        keys = [k for k in p.effects if level(k) == lev]
        if not keys:
            continue
        eff = [p.effects[k] for k in keys]
        out[lev] = {"direct_vs_patching": agreement([p.direct_difference[k] for k in keys], eff)}
        if p.atp is not None:
            out[lev]["atp_vs_patching"] = agreement([p.atp[k] for k in keys], eff)
    return out
