"""Integrated gradients over the prompt's input embeddings: which words of the prompt put the score there.

The input embeddings of the prompt's positions (the whole templated prefix: system turn, user prompt, the
template's own ids) move on a straight line from a baseline (zero embeddings, or every position holding one
baseline token's embedding) to their real values, the response's embeddings held; the attribution of position
``p`` is ``(x_p - x0_p) . integral over alpha in [0, 1] of d score / d x_p``. Along the path the attributions sum
to ``score - baseline score`` (completeness), so the quadrature's error is measured, not assumed.

The path is not smooth near the zero baseline: the first norm makes the score scale-invariant in the embeddings
except where ``alpha^2 |x|^2`` is near the norm's epsilon, and below that the model's arithmetic itself moves (a
tiny Gemma 2 moves by 0.12 between alpha = 1e-16 and 1e-14, and by 0.45 between 1e-12 and 1e-3, on a gap of 0.42;
the t^3 midpoints never sampled that, and their residual swung from -0.66 to +0.37 as the steps grew). The rule
here: from the zero baseline, panels graded in decades from 1 down to where ``alpha |x - x0|`` reaches the square
root of the dtype's smallest normal number, plus ``[0, that]`` (wider panels where ``steps`` cannot pay for one per
decade), Gauss-Legendre with 2 nodes per panel in ``log alpha`` (in ``alpha`` on the first); from a token's
embeddings (``--ig-baseline``), whose path never nears a vanishing state, 8 even panels in ``alpha``. On every
panel ``[a, b]`` the completeness residual ``Q - (F(b) - F(a))`` is measured (``F`` by a forward at the
breakpoints), and the panel with the largest one is halved (in ``log alpha`` or ``alpha`` as it was made), again
and again, until the sum of the panels' |residuals| is under the target (``target`` x the gap, by default 1%: met,
with no cancellation between panels to hide an unresolved one) or the points run out. The record holds the
residual reached, that sum, the target, whether it was met and each round's residual: no rate is claimed.
Measured: the tiny Gemma 2 and Llama models meet 1% within 38 to 196 points from zero, 16 from a token. A deep
model's zero baseline is a singular point: each layer's norm multiplies a vanishing state by up to
``1 / sqrt(eps)``, so on SmolLM2 (30 layers) the score at alpha = 1e-20 is already 5 nats from the score at 0 and
moves by up to 14.5 nats from one decade to the next down there; no quadrature meets 1% from it in 128 points (the
record says so), and a token baseline is the usable one (experiments/results/explain_cost_smollm2_cpu.md).

Every forward holds rows of the one explained item, ``batch`` rows per call (the last call padded by repeating a
row, whose result is dropped): a call's shape is a function of the item alone.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from probe.attribution.model import Stack
from probe.attribution.readers import Reader

GL2 = (np.array([-1.0, 1.0]) / math.sqrt(3.0), np.array([1.0, 1.0]))  # Gauss-Legendre, 2 nodes on [-1, 1]


@dataclass
class IGResult:
    positions: list[int]
    attributions: list[float]
    score: float  # at the real embeddings
    baseline_score: float  # at the baseline embeddings
    residual: float  # sum(attributions) - (score - baseline_score)
    target: float  # the residual aimed at (target fraction x |score - baseline_score|, or the rounding floor)
    met: bool  # the panels' |residuals| sum to at most the target (so |residual| <= target, with no cancellation)
    panel_residuals: float  # that sum
    points: int  # gradient evaluations
    panels: int
    baseline: str
    history: list[dict] = field(default_factory=list)  # per round: points so far, sum of |panel residuals|, residual
    rule: str = ("Gauss-Legendre, 2 nodes per panel in log alpha, panels graded in decades down to the dtype's "
                 "underflow, the panel with the largest completeness residual halved until the target is met")


@dataclass
class _Panel:
    a: float
    b: float
    log: bool  # nodes in log alpha (a > 0)
    q: torch.Tensor | None = None  # sum of weight x gradient at its nodes, [L, d]
    dq: float = 0.0  # its quadrature of dF/dalpha
    df: float = 0.0  # F(b) - F(a)

    def nodes(self) -> tuple[np.ndarray, np.ndarray]:
        """(alphas, weights in alpha) of its 2 Gauss-Legendre nodes."""
        t, w = GL2
        if not self.log:
            return self.a + (t + 1) / 2 * (self.b - self.a), w * (self.b - self.a) / 2
        la, lb = math.log(self.a), math.log(self.b)
        s = la + (t + 1) / 2 * (lb - la)
        alphas = np.exp(s)
        return alphas, w * (lb - la) / 2 * alphas  # d alpha = alpha d s

    @property
    def residual(self) -> float:
        return self.dq - self.df

    def halves(self) -> tuple[_Panel, _Panel]:
        mid = math.sqrt(self.a * self.b) if self.log else (self.a + self.b) / 2
        return _Panel(self.a, mid, self.log), _Panel(mid, self.b, self.log)


def integrated_gradients(stack: Stack, rd: Reader, ids: Sequence[int], positions: Sequence[int],
                         steps: int = 128, batch: int = 8, baseline_id: int | None = None,
                         target: float = 0.01) -> IGResult:
    """``steps``: the most gradient evaluations; ``target``: the completeness residual aimed at, as a fraction of
    ``|score - baseline score|``."""
    emb_layer = stack.backbone.get_input_embeddings()
    dev = emb_layer.weight.device
    dtype = emb_layer.weight.dtype
    row = torch.tensor([list(ids)], device=dev)
    pos = torch.tensor(list(positions), device=dev)
    with torch.no_grad():
        x = emb_layer(row).float()  # [1, L, d]
        x0 = x.clone()
        if baseline_id is None:
            x0[:, pos] = 0
        else:
            x0[:, pos] = emb_layer(torch.full((1, len(pos)), baseline_id, device=dev)).float()
    span = float((x - x0).abs().max()) or 1.0
    batch = max(1, batch)

    def run(alphas: list[float], grad: bool) -> tuple[list[float], list[torch.Tensor | None]]:
        """Scores (and gradients wrt the embeddings) at ``alphas``, ``batch`` rows per call."""
        scores, grads = [], []
        for s in range(0, len(alphas), batch):
            chunk = alphas[s:s + batch]
            padded = chunk + [chunk[-1]] * (batch - len(chunk))
            a = torch.tensor(padded, dtype=torch.float32, device=dev)
            e = (x0 + a[:, None, None] * (x - x0)).to(dtype).detach().requires_grad_(grad)
            with torch.set_grad_enabled(grad):
                normed = stack.backbone(inputs_embeds=e, use_cache=False).last_hidden_state
                out = rd.score(normed).float()
            if grad:
                (g,) = torch.autograd.grad(out.sum(), e)
                grads += [g[i].float() for i in range(len(chunk))]
            scores += [float(v) for v in out[:len(chunk)].detach()]
        return scores, grads

    if baseline_id is not None:  # a token's embeddings: no norm sees a vanishing state, the path is even
        n = max(1, min(8, steps // 2))
        panels = [_Panel(k / n, (k + 1) / n, False) for k in range(n)]
    else:  # [0, lo], then decades up to 1 (lo: where alpha |x - x0| is the square root of the smallest normal)
        lo = min(0.1, math.sqrt(torch.finfo(dtype).tiny) / span)
        n_log = min(math.ceil(-math.log10(lo)), steps // 2 - 1)  # a decade each, fewer (wider) within the points
        if n_log < 1:
            panels = [_Panel(0.0, 1.0, False)]
        else:
            edges = [0.0] + np.geomspace(lo, 1.0, n_log + 1).tolist()
            edges[-1] = 1.0
            panels = [_Panel(a, b, a > 0) for a, b in zip(edges[:-1], edges[1:])]
    f_at: dict[float, float] = {}

    def evaluate(new: list[_Panel]) -> int:
        ends = sorted(e for e in {p.a for p in new} | {p.b for p in new} if e not in f_at)
        if ends:
            for e, v in zip(ends, run(ends, False)[0]):
                f_at[e] = v
        alphas, weights = [], []
        for p in new:
            a, w = p.nodes()
            alphas += a.tolist()
            weights += w.tolist()
        _, grads = run(alphas, True)
        for k, p in enumerate(new):
            p.q = sum(w * g for w, g in zip(weights[2 * k:2 * k + 2], grads[2 * k:2 * k + 2]))
            p.dq = float(((x - x0)[0] * p.q).sum())
            p.df = f_at[p.b] - f_at[p.a]
        return len(alphas)

    points = evaluate(panels)
    gap = f_at[1.0] - f_at[0.0]
    floor = 64 * torch.finfo(dtype).eps * (abs(f_at[1.0]) + abs(f_at[0.0]))  # the scores' own rounding
    goal = max(target * abs(gap), floor)
    history = []
    while True:
        total = sum(abs(p.residual) for p in panels)
        history.append({"points": points, "panels": len(panels), "sum_abs_panel_residuals": total,
                        "residual": sum(p.residual for p in panels)})
        if total <= goal or points + 4 > steps:
            break
        worst = max(panels, key=lambda p: abs(p.residual))
        i = panels.index(worst)
        halves = list(worst.halves())
        points += evaluate(halves)
        panels[i:i + 1] = halves
    q = sum(p.q for p in panels)
    attr = ((x - x0)[0] * q).sum(-1)[pos]
    residual = float(attr.sum()) - gap
    total = sum(abs(p.residual) for p in panels)
    return IGResult(list(map(int, positions)), attr.tolist(), f_at[1.0], f_at[0.0], residual, goal,
                    total <= goal and abs(residual) <= goal, total, points, len(panels),
                    "zero" if baseline_id is None else f"id {baseline_id}", history)
