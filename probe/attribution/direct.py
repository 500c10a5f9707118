"""Direct decomposition: the score as the sum of what each component wrote into the residual stream, read
through the final norm frozen at the scale it really had, plus what lies outside (`rest`).

``resid = embed + sum_l scale_l (attn_l + mlp_l)`` at every read position, up to the rounding of each addition in
the model's dtype; ``normed = (resid - centre) * s * w (+ b)`` with ``s`` the real scale; the head's linear reader
``u`` gives ``u . normed`` = the sum of the parts ``u . ((part - centre) * s * w)`` (each part's centring is its
own mean: LayerNorm's centring is linear). Every part is the model's own activation (bf16 and fp16 ones upcast
exactly) and every sum is in float32. Two items of `rest` hold what the model's own dtype did on the way and make
the decomposition close in any dtype: ``residual_rounding`` (the residual stream minus the float32 sum of its
parts: the rounding of its additions, each position's vector checked against Higham's bound for that many
additions in the model's dtype) and ``final_norm_rounding`` (the model's own normed state minus the frozen norm's
float32 one, checked to 8 units of its dtype by `freeze`). In float32 both are rounding-sized (1e-7 relative).

What is left, ``closure = forward score - (sum(parts) + rest)``, is the head's own rounding: the forward decomposed
is the model's own (its head on its own states), so that closure is held to the bound of `closure_tolerance`,
which can fail in every dtype (probe/attribution/checks.py refuses an item that breaks it).

Per attention head: o_proj's input split into its heads' columns, each head's slice through its columns of o_proj
(and, for Gemma 2/3, through the post-attention norm frozen at its real scale); the heads plus o_proj's bias (an
item of its own) are the layer's attention part up to o_proj's own rounding (``heads_closure``, held to its bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from probe.attribution.model import Captured, Stack, capture, freeze
from probe.attribution.readers import Reader


@dataclass
class Decomposition:
    score: float  # the decomposed forward's own score (its head on its own states; float32)
    components: dict[str, float]  # embed, L{i}.attn, L{i}.mlp
    rest: dict[str, float]  # items outside the parts (head bias, -log-sum-exp, soft-cap bend, the dtype's rounding)
    heads: dict[str, float] = field(default_factory=dict)  # L{i}.attn.h{j} (+ L{i}.attn.bias)
    closure: float = 0.0  # score - (sum(components) + sum(rest))
    tolerance: float = 0.0  # the closure allowed by the dtype's rounding (`closure_tolerance`)
    heads_closure: float = 0.0  # the largest |sum of a layer's heads (and bias) - its attention part|
    heads_tolerance: float = 0.0  # ... allowed by the dtype's rounding
    stream_gap: float = 0.0  # the largest |residual_rounding| at any position and coordinate, over its bound (<= 1)
    stream_where: tuple = ()  # (position, coordinate, gap, bound) of that largest ratio
    dtype: str = "torch.float32"
    held: dict = field(default_factory=dict)  # what the reader held at its real value (a gated head's gate)

    @property
    def rest_total(self) -> float:
        return float(sum(self.rest.values()))


def forward(stack: Stack, ids: Sequence[int] | Tensor, heads: bool = False,
            own: Callable[[Tensor], Tensor] | None = None) -> Captured:
    """One hooked forward over whole sequences (a [b, L] tensor or one list of ids): the backbone's, or ``own``
    (the model's own forward and head on the ids, `ScoreHead.own_forward`), whose score is kept as
    ``Captured.own``."""
    x = ids if isinstance(ids, Tensor) else torch.tensor([list(ids)])
    dev = stack.backbone.get_input_embeddings().weight.device
    with torch.no_grad(), capture(stack, heads) as got:
        if own is None:
            stack.backbone(input_ids=x.to(dev), use_cache=False)
            score = None
        else:
            score = own(x.to(dev)).float().cpu()
    cap = got["captured"]
    cap.own = score
    return cap


def gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of ``n`` roundings of unit roundoff ``u``."""
    return n * u / max(1e-12, 1 - n * u)


def unit(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def closure_tolerance(abs_terms: float, readout: float, magnitude: float, n_terms: int, d: int, dtype: torch.dtype,
                      others: float, rounds: int = 1) -> float:
    """How far ``sum(parts) + rest`` may be from the forward's own score by rounding alone, the residual stream's
    and the final norm's rounding being items of ``rest``:

    * the float32 readout: each of ``n_terms`` parts read by a length-``d`` dot product and summed, and the model's
      own head reading ``d`` products: ``gamma_{d + n_terms + 3}(u32) (abs_terms + readout)`` (Higham's bound;
      ``abs_terms`` the sum of every |product| of the parts, ``readout`` that of the head on its own normed state);
    * the head's own rounding in the model's dtype: every value it rounds between the normed state and the score
      (``magnitude``: the logits read, the log-sum-exp's largest logit, a gated head's objectives) carries at most
      one unit, counted twice; where the device's kernels round more (``rounds`` > 1: a GPU's half-precision
      reductions, probe/core/precision.py) the head's dot products carry the extra units over ``readout``;
    * the rest items computed from logits in float32: 16 roundings of their size (``others``).

    Each term is a bound of what can happen, so a decomposition that misses a part of the score fails it in every
    dtype (a Granite stream read without its ``residual_multiplier`` is off by 0.054 against a bound of 1e-5)."""
    u_model, u32 = unit(dtype), unit(torch.float32)
    return (gamma(d + n_terms + 3, u32) * (abs_terms + readout) + 2 * u_model * magnitude
            + (rounds - 1) * u_model * readout + 16 * u32 * others)


def stream_bound(abs_parts: Tensor, n_parts: int, dtype: torch.dtype) -> Tensor:
    """Elementwise bound on ``resid - sum(parts)``: the model adds ``n_parts`` parts one after another in its dtype,
    each part itself rounded once where it is scaled (Granite), and the float32 sum here adds its own:
    ``(gamma_{2n}(u_model) + gamma_n(u32)) sum |parts|`` (plus the smallest normal number, for exact zeros)."""
    u_model, u32 = unit(dtype), unit(torch.float32)
    return (gamma(2 * n_parts, u_model) + gamma(n_parts + 1, u32)) * abs_parts + torch.finfo(torch.float32).tiny


def decompose(stack: Stack, rd: Reader, cap: Captured, row: int = 0, heads: bool = False,
              rounds: int = 1) -> Decomposition:
    """The decomposition of batch row ``row`` of a captured forward read by ``rd`` (its score: the forward's own,
    `forward` with ``own``, else the reader's on the forward's normed state). ``rounds``: roundings per output
    of the device's kernels (`probe.core.precision.roundings_per_output`)."""
    dev = cap.resid.device
    pos = torch.tensor(rd.positions, device=dev)
    dtype = cap.resid.dtype
    normed_row = cap.normed[row:row + 1]
    frozen = freeze(stack.final_norm, cap.resid[row, pos], cap.normed[row, pos])
    u = rd.directions_of(normed_row).to(dev)
    named = [("embed", cap.embed[row, pos].float())]
    for b in stack.blocks:
        named += [(f"L{b.index}.attn", b.scale * cap.attn[b.index][row, pos].float()),
                  (f"L{b.index}.mlp", b.scale * cap.mlp[b.index][row, pos].float())]
    total = torch.zeros_like(named[0][1])
    abs_parts = torch.zeros_like(total)
    for _, t in named:
        total += t
        abs_parts += t.abs()
    resid = cap.resid[row, pos].float()
    rounding = resid - total
    bound = stream_bound(abs_parts, len(named), dtype)
    ratio = rounding.abs() / bound
    worst = int(ratio.argmax())
    j, k = divmod(worst, ratio.shape[-1])

    def read(t: Tensor) -> tuple[float, float]:
        y = frozen.apply(t) * u
        return float(y.sum()), float(y.abs().sum())

    components, abs_terms = {}, 0.0
    for name, t in named:
        components[name], a = read(t)
        abs_terms += a
    rest = dict(rd.rest(normed_row))
    rest["residual_rounding"], a = read(rounding)
    abs_terms += a
    own_normed = (cap.normed[row, pos].float() - (frozen.bias if frozen.bias is not None else 0)) * u
    rest["final_norm_rounding"] = float(own_normed.sum()) - float((frozen.apply(resid) * u).sum())
    abs_terms += float(own_normed.abs().sum())
    if frozen.bias is not None:
        rest["final_norm_bias"] = float((frozen.bias * u).sum())
    score = float(cap.own[row]) if getattr(cap, "own", None) is not None else float(rd.score(normed_row)[0])
    readout = float((cap.normed[row, pos].float() * u).abs().sum())
    out = Decomposition(score, components, rest, dtype=str(dtype), held=rd.held(normed_row))
    out.closure = score - (sum(components.values()) + sum(rest.values()))
    out.tolerance = closure_tolerance(abs_terms, readout, rd.magnitude(normed_row), len(named) + 2,
                                      cap.resid.shape[-1], dtype, abs(score) + sum(abs(v) for v in rest.values()),
                                      rounds)
    out.stream_gap = float(ratio.max())
    out.stream_where = (int(rd.positions[j]), int(k), float(rounding[j, k]), float(bound[j, k]))
    if heads:
        out.heads, out.heads_closure, out.heads_tolerance = _heads(stack, cap, row, pos, frozen, u, components, rounds)
    return out


def _heads(stack: Stack, cap: Captured, row: int, pos: Tensor, frozen, u: Tensor, components: dict, rounds: int):
    """Each head's part; the largest gap of a layer's heads (and bias) from its attention part, and its bound: o_proj
    rounds its output once in the model's dtype (a frozen post-attention norm once more) and sums its ``H dh``
    products (``gamma_{H dh}`` of their sizes, in float32 on a CPU; a GPU's half-precision reductions: ``rounds``)."""
    parts, worst, allowed = {}, 0.0, 0.0
    u32 = unit(torch.float32)
    for b in stack.blocks:
        o_in = cap.o_in[b.index]
        if o_in is None or b.o_proj is None:
            continue
        x = o_in[row, pos].float()
        W = b.o_proj.weight.float()
        u_model = unit(o_in.dtype)
        inner = None
        if b.post_attn_norm is not None:  # Gemma 2/3: the post-attention norm, frozen at its real scale
            inner = freeze(b.post_attn_norm, cap.attn_raw[b.index][row, pos], cap.attn[b.index][row, pos])
        dh, total = b.head_dim, 0.0
        items = [(f"L{b.index}.attn.h{h}", x[:, h * dh:(h + 1) * dh] @ W[:, h * dh:(h + 1) * dh].T)
                 for h in range(b.n_heads)]
        if b.o_proj.bias is not None:
            items.append((f"L{b.index}.attn.bias", b.o_proj.bias.float()[None].expand(len(pos), -1)))
        terms = x.abs() @ W.abs().T  # every product's size, per output coordinate
        for name, t in items:
            if inner is not None:
                t = inner.apply(t)
            v = b.scale * float((frozen.apply(t) * u).sum())
            parts[name] = v
            total += v
        layer_terms = frozen.apply(cap.attn[b.index][row, pos].float()) * u
        size = abs(b.scale) * float(layer_terms.abs().sum())
        spread = abs(b.scale) * float(((inner.apply(terms).abs() if inner is not None else terms) *
                                       (frozen.scale * frozen.weight * u).abs()).sum())
        bound = ((2 + (inner is not None)) * u_model * size + (rounds - 1 + gamma(x.shape[-1] + 2, u32) / u_model)
                 * u_model * spread)
        gap = abs(total - components[f"L{b.index}.attn"])
        if bound > 0 and gap / bound >= (worst / allowed if allowed else 0):
            worst, allowed = gap, bound
    return parts, worst, allowed


def explain_ids(stack: Stack, rd: Reader, ids: Sequence[int], heads: bool = False) -> Decomposition:
    return decompose(stack, rd, forward(stack, ids, heads), 0, heads)


def math_check(dec: Decomposition) -> bool:
    return math.isfinite(dec.closure) and abs(dec.closure) <= dec.tolerance
