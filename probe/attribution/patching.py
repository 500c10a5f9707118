"""Activation patching: cause, to set beside the direct parts.

Each component (the embedding, each layer's attention and MLP output, optionally each head) is replaced by its
value under a baseline response, one component per batch row, ``batch`` patched forwards at a time; its *effect*
is ``score - patched score``: how much of the score's lead over the baseline flows through it, directly and
through every later layer. The like-for-like direct number is the component's *direct difference*: its part of
the score minus the part its baseline value would have given, read through the same frozen norm and reader
(``u . frozen(part - part_baseline)``): patching's effect on the score through the direct path alone. The
Spearman correlation of the two over the components says how far the direct parts tell cause on this model.

Positions: the continuation's (the shared prefix's parts are equal in both), aligned from the right end (the
read position and the template's closing ids line up); continuations of different lengths replace the last
``min`` positions only (recorded as ``aligned_positions``). A log-probability's first token is read at the
prompt's last position, which no response changes: patching from a baseline response moves only the later
tokens' log-probabilities (and the direct differences are read at those positions alone), so on a sweep's one-token
responses it explains the closing tokens' part of the score, not ``log p(token | prompt)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from probe.attribution.model import Captured, Stack, freeze, patching
from probe.attribution.readers import Reader


@dataclass
class Patched:
    effects: dict[str, float]  # component -> score - patched score
    direct_difference: dict[str, float]  # component -> its direct part minus the baseline value's
    spearman: float | None  # of the two over the components (None: fewer than 3, or constant)
    aligned_positions: int
    forwards: int  # patched forwards run


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None where it is undefined."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 3 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    return float(spearmanr(a, b).statistic)


def component_names(stack: Stack, heads: bool) -> list[str]:
    names = ["embed"]
    for b in stack.blocks:
        names += [f"L{b.index}.attn", f"L{b.index}.mlp"]
        if heads and b.o_proj is not None:
            names += [f"L{b.index}.attn.h{h}" for h in range(b.n_heads)]
    return names


def _tensor_of(cap: Captured, name: str):
    if name == "embed":
        return cap.embed
    layer, kind = name.split(".")[:2]
    return (cap.attn if kind == "attn" else cap.mlp)[int(layer[1:])]


def direct_difference(stack: Stack, rd: Reader, cap: Captured, base: Captured, n_prefix: int, n_base_prefix: int,
                      names: Sequence[str]) -> tuple[dict[str, float], int]:
    """Each component's direct part minus that of its baseline value, through the target's frozen norm and reader."""
    L, Lb = cap.resid.shape[1], base.resid.shape[1]
    n = min(L - n_prefix, Lb - n_base_prefix)
    pos = torch.tensor(rd.positions, device=cap.resid.device)
    frozen = freeze(stack.final_norm, cap.resid[0, pos], cap.normed[0, pos])
    u = rd.directions.to(cap.resid.device)
    inside = pos >= L - n  # read positions inside the patched window (the others are not changed by a patch)
    pos_b = pos - L + Lb
    out = {}
    for name in names:
        parts = name.split(".")
        if len(parts) == 3:  # a head: its slice through its columns of o_proj (and a frozen post-attention norm)
            b = stack.blocks[int(parts[0][1:])]
            h, dh = int(parts[2][1:]), b.head_dim
            W = b.o_proj.weight.float()[:, h * dh:(h + 1) * dh]
            delta = cap.o_in[b.index][0, pos, h * dh:(h + 1) * dh].float()
            delta = delta - torch.where(inside[:, None], base.o_in[b.index][0, pos_b.clamp(min=0),
                                                                            h * dh:(h + 1) * dh].float(), delta)
            delta = delta @ W.T
            if b.post_attn_norm is not None:
                delta = freeze(b.post_attn_norm, cap.attn_raw[b.index][0, pos], cap.attn[b.index][0, pos]).apply(delta)
        else:
            t, tb = _tensor_of(cap, name), _tensor_of(base, name)
            here = t[0, pos].float()
            delta = here - torch.where(inside[:, None], tb[0, pos_b.clamp(min=0)].float(), here)
        out[name] = float((frozen.apply(delta) * u).sum())
    return out, n


def patch_effects(stack: Stack, rd: Reader, ids: Sequence[int], n_prefix: int, base: Captured, n_base_prefix: int,
                  names: Sequence[str], batch: int = 16) -> tuple[dict[str, float], float]:
    """``score - patched score`` of each component, ``batch`` patched forwards per backbone call (row 0 of each
    call unpatched: the score it is measured from)."""
    dev = stack.backbone.get_input_embeddings().weight.device
    row = torch.tensor([list(ids)], device=dev)
    effects, clean = {}, None
    per = max(1, batch - 1)
    for s in range(0, len(names), per):
        chunk = list(names[s:s + per])
        plan = {0: None, **{i + 1: name for i, name in enumerate(chunk)}}
        with torch.no_grad(), patching(stack, plan, base, n_prefix, n_base_prefix):
            normed = stack.backbone(input_ids=row.expand(len(plan), -1), use_cache=False).last_hidden_state
        scores = rd.score(normed).float().cpu()
        clean = float(scores[0]) if clean is None else clean
        for i, name in enumerate(chunk):
            effects[name] = clean - float(scores[i + 1])
    return effects, clean


def patch(stack: Stack, rd: Reader, ids: Sequence[int], n_prefix: int, cap: Captured, base: Captured,
          n_base_prefix: int, heads: bool = False, batch: int = 16) -> Patched:
    names = component_names(stack, heads)
    effects, _ = patch_effects(stack, rd, ids, n_prefix, base, n_base_prefix, names, batch)
    direct, n = direct_difference(stack, rd, cap, base, n_prefix, n_base_prefix, names)
    rho = spearman([direct[k] for k in names], [effects[k] for k in names])
    return Patched(effects, direct, rho, n, -(-len(names) // max(1, batch - 1)))
