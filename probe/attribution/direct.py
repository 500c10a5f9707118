"""Direct decomposition: the score as the sum of what each component wrote into the residual stream, read
through the final norm frozen at the scale it really had, plus what lies outside (`rest`).

``resid = embed + sum_l (attn_l + mlp_l)`` at every read position; ``normed = (resid - centre) * s * w (+ b)``
with ``s`` the real scale; the head's linear reader ``u`` gives ``u . normed`` = the sum of the parts
``u . ((part - centre) * s * w)`` (each part's centring is its own mean: LayerNorm's centring is linear). Every
sum is in float32. Per attention head: o_proj's input split into its heads' columns, each head's slice through
its columns of o_proj (and, for Gemma 2/3, through the post-attention norm frozen at its real scale); the heads
plus o_proj's bias (an item of its own) are the layer's attention part.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from probe.attribution.model import Captured, Stack, capture, freeze
from probe.attribution.readers import Reader


@dataclass
class Decomposition:
    score: float  # the reader's own score of this forward (float32)
    components: dict[str, float]  # embed, L{i}.attn, L{i}.mlp
    rest: dict[str, float]  # items outside the parts (head bias, -log-sum-exp, soft-cap bend, final norm bias)
    heads: dict[str, float] = field(default_factory=dict)  # L{i}.attn.h{j} (+ L{i}.attn.bias)
    closure: float = 0.0  # score - (sum(components) + sum(rest))
    tolerance: float = 0.0  # the closure allowed by the dtype's rounding (`closure_tolerance`)
    heads_closure: float = 0.0  # the largest |sum of a layer's heads (and bias) - its attention part|

    @property
    def rest_total(self) -> float:
        return float(sum(self.rest.values()))


def forward(stack: Stack, ids: Sequence[int] | Tensor, heads: bool = False) -> Captured:
    """One hooked forward of the backbone over whole sequences (a [b, L] tensor or one list of ids)."""
    x = ids if isinstance(ids, Tensor) else torch.tensor([list(ids)])
    dev = stack.backbone.get_input_embeddings().weight.device
    with torch.no_grad(), capture(stack, heads) as got:
        stack.backbone(input_ids=x.to(dev), use_cache=False)
    return got["captured"]


def closure_tolerance(abs_terms: float, n_terms: int, d: int, dtype: torch.dtype, others: float) -> float:
    """How far ``sum(parts) + rest`` may be from the score by rounding alone: the residual stream adds its
    ``n_terms`` parts in the model's dtype and each part is read by a length-``d`` dot product in float32, so the
    error is at most ``gamma_n * sum |terms|`` (Higham's bound, ``gamma_n = n u / (1 - n u)``, u the unit roundoff)
    for ``n = n_terms`` in the model's dtype plus ``n = d`` in float32, twice over for the norm's scale and the
    head's own reading; the rest items (log-sum-exp over the vocabulary) add 16 float32 roundings of their size."""
    def gamma(n: int, u: float) -> float:
        return n * u / max(1e-12, 1 - n * u)
    u_model, u32 = torch.finfo(dtype).eps / 2, torch.finfo(torch.float32).eps / 2
    return 2 * (gamma(n_terms, u_model) + gamma(d + 2, u32)) * abs_terms + 16 * u32 * others


def decompose(stack: Stack, rd: Reader, cap: Captured, row: int = 0, heads: bool = False) -> Decomposition:
    """The decomposition of batch row ``row`` of a captured forward read by ``rd``."""
    pos = torch.tensor(rd.positions, device=cap.resid.device)
    frozen = freeze(stack.final_norm, cap.resid[row, pos], cap.normed[row, pos])
    u = rd.directions.to(cap.resid.device)

    def part(t: Tensor) -> tuple[float, float]:
        y = frozen.apply(t[row, pos]) * u
        return float(y.sum()), float(y.abs().sum())

    components, abs_terms = {}, 0.0
    for name, t in [("embed", cap.embed), *[(f"L{i}.{k}", x) for i in range(len(cap.attn))
                                           for k, x in (("attn", cap.attn[i]), ("mlp", cap.mlp[i]))]]:
        components[name], a = part(t)
        abs_terms += a
    normed = cap.normed[row:row + 1]
    score = float(rd.score(normed)[0])
    rest = dict(rd.rest(normed))
    if frozen.bias is not None:
        rest["final_norm_bias"] = float((frozen.bias * u).sum())
    total = sum(components.values()) + sum(rest.values())
    out = Decomposition(score, components, rest, closure=score - total)
    out.tolerance = closure_tolerance(abs_terms, len(components), cap.resid.shape[-1], cap.resid.dtype,
                                      abs(score) + sum(abs(v) for v in rest.values()))
    if heads:
        out.heads, out.heads_closure = _heads(stack, cap, row, pos, frozen, u, components)
    return out


def _heads(stack: Stack, cap: Captured, row: int, pos: Tensor, frozen, u: Tensor, components: dict):
    parts, worst = {}, 0.0
    for b in stack.blocks:
        o_in = cap.o_in[b.index]
        if o_in is None or b.o_proj is None:
            continue
        x = o_in[row, pos].float()
        W = b.o_proj.weight.float()
        inner = None
        if b.post_attn_norm is not None:  # Gemma 2/3: the post-attention norm, frozen at its real scale
            inner = freeze(b.post_attn_norm, cap.attn_raw[b.index][row, pos], cap.attn[b.index][row, pos])
        dh, total = b.head_dim, 0.0
        items = [(f"L{b.index}.attn.h{h}", x[:, h * dh:(h + 1) * dh] @ W[:, h * dh:(h + 1) * dh].T)
                 for h in range(b.n_heads)]
        if b.o_proj.bias is not None:
            items.append((f"L{b.index}.attn.bias", b.o_proj.bias.float()[None].expand(len(pos), -1)))
        for name, t in items:
            if inner is not None:
                t = inner.apply(t)
            v = float((frozen.apply(t) * u).sum())
            parts[name] = v
            total += v
        worst = max(worst, abs(total - components[f"L{b.index}.attn"]))
    return parts, worst


def explain_ids(stack: Stack, rd: Reader, ids: Sequence[int], heads: bool = False) -> Decomposition:
    return decompose(stack, rd, forward(stack, ids, heads), 0, heads)


def math_check(dec: Decomposition) -> bool:
    return math.isfinite(dec.closure) and abs(dec.closure) <= dec.tolerance
