"""Integrated gradients over the prompt's input embeddings: which words of the prompt put the score there.

The input embeddings of the prompt's positions (the whole templated prefix: system turn, user prompt, the
template's own ids) move on a straight line from a baseline (zero embeddings, or every position holding one
baseline token's embedding) to their real values, the response's embeddings held; the attribution of position
``p`` is ``(x_p - x0_p) . integral over the path of d score / d x_p``. The integral runs over ``alpha = t**3``, the
midpoint rule in ``t`` over ``steps`` points, ``batch`` of them per forward and backward: the first RMSNorm makes
the score scale-invariant in the embeddings except near the zero baseline, where it changes fast (measured on the
tiny Llama reward model: residual 7.3 at 64 evenly spaced steps, 0.003 at 32 steps in ``t**3``). Completeness: the
attributions sum to ``score - baseline score`` up to the rule's error, which shrinks as ``1 / steps**2`` on a
smooth path (``residual`` reports it: the sum of the attributions minus that difference).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from probe.attribution.model import Stack
from probe.attribution.readers import Reader


@dataclass
class IGResult:
    positions: list[int]
    attributions: list[float]
    score: float  # at the real embeddings
    baseline_score: float  # at the baseline embeddings
    residual: float  # sum(attributions) - (score - baseline_score)
    steps: int
    baseline: str


def integrated_gradients(stack: Stack, rd: Reader, ids: Sequence[int], positions: Sequence[int], steps: int = 32,
                         batch: int = 8, baseline_id: int | None = None, power: float = 3.0) -> IGResult:
    emb_layer = stack.backbone.get_input_embeddings()
    dev = emb_layer.weight.device
    row = torch.tensor([list(ids)], device=dev)
    with torch.no_grad():
        x = emb_layer(row).float()  # [1, L, d]
        x0 = x.clone()
        pos = torch.tensor(list(positions), device=dev)
        if baseline_id is None:
            x0[:, pos] = 0
        else:
            x0[:, pos] = emb_layer(torch.full((1, len(pos)), baseline_id, device=dev)).float()
    dtype = emb_layer.weight.dtype

    def scores(alphas: torch.Tensor, grad: bool):
        e = x0 + alphas[:, None, None] * (x - x0)  # [b, L, d]; positions outside `pos` are equal in both
        e = e.to(dtype).detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            normed = stack.backbone(inputs_embeds=e, use_cache=False).last_hidden_state
            s = rd.score(normed).float()
        return e, s

    total = torch.zeros_like(x[0])
    t = (torch.arange(steps, dtype=torch.float64, device=dev) + 0.5) / steps
    alphas, weights = (t ** power).float(), (power * t ** (power - 1) / steps).float()
    for s in range(0, steps, batch):
        e, out = scores(alphas[s:s + batch], True)
        (g,) = torch.autograd.grad(out.sum(), e)
        total += (g.float() * weights[s:s + batch, None, None]).sum(0)
    attr = ((x - x0)[0] * total).sum(-1)[pos]
    with torch.no_grad():
        _, ends = scores(torch.tensor([1.0, 0.0], device=dev), False)
    score, base = float(ends[0]), float(ends[1])
    return IGResult(list(map(int, positions)), attr.tolist(), score, base,
                    float(attr.sum()) - (score - base), steps, "zero" if baseline_id is None else f"id {baseline_id}")
