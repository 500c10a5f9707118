"""How a score head reads the final normed hidden states, as `probe explain` needs it: the read positions, one
linear direction per position (the part of the score that is linear in the normed state), what is left outside
(`rest`: the head's bias, the log-softmax normaliser, a soft-cap's bend), and the real score from normed states.

Exact (the parts plus `rest` are the score): a sequence classifier's linear head, a family's linear module head
(read off float32 copies of its own weights, so bf16 and fp16 heads are read as they are), the logit reader
(Nemotron), a Yes/No judge, the log-probability of the response, and a gated head (ArmoRM, QRM) with its gate held
at the value it really had, as the final norm's scale is. A soft-capped LM head (Gemma 2) is explained up to its
cap: the parts explain the logits before the cap and the cap's bend is an item of `rest`. Refused, with the
reason: process models' softmax, a rating judge's softmax, a family head that is not affine (an MLP), encoders' and
remote code's own forward, pairwise models, implicit rewards (--ref).

``magnitude`` sums the size of every value the model rounds to its own dtype between the final norm and the score
(the logits read, the log-sum-exp's largest logit, a gated head's objectives): the closure bound's share for the
head (probe/attribution/direct.py).
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from probe.core.heads import (DecoderLabelHead, GatedRewardHead, JudgeHead, LinearRewardHead, LogprobHead,
                              ModuleRewardHead, OwnForwardHead, RatingHead, StepRewardHead, logit_transform,
                              pool_positions)
from probe.errors import ProbeError


@dataclass
class Reader:
    kind: str
    positions: list[int]  # absolute positions in the full sequence the score reads
    directions: Tensor | None  # [n_read, d] float32 (None: read off the forward, `directions_of`)
    score: Callable[[Tensor], Tensor]  # normed [b, L, d] -> the real score [b] (float32), as the engine reads it
    rest: Callable[[Tensor], dict[str, float]]  # normed [1, L, d] -> the items outside the parts
    note: str  # what is exact
    magnitude: Callable[[Tensor], float]  # normed [1, L, d] -> sum of |values| the model rounds after the norm
    frozen: Callable[[Tensor], tuple[Tensor, dict]] | None = None  # normed -> (directions, what was frozen)

    def directions_of(self, normed: Tensor) -> Tensor:
        """The directions on one forward (row 0 of ``normed``): fixed, or with a gate frozen at its value there."""
        return self.directions if self.frozen is None else self.frozen(normed)[0]

    def held(self, normed: Tensor) -> dict:
        """What the reader held at its real value on this forward (a gated head's gate), for the record."""
        return {} if self.frozen is None else self.frozen(normed)[1]


def refusal(head, loaded) -> str | None:
    """Why ``head`` on ``loaded`` is not explained (one line), or None."""
    if loaded.ref is not None:
        return ("an implicit reward (--ref) is beta x the difference of two models' log-probabilities: explain each "
                "model's --score logprob alone")
    if loaded.pairwise is not None:
        return "a pairwise model's score compares two responses in one input: not decomposed here"
    if isinstance(head, StepRewardHead):
        return ("a process reward model's score is a softmax of its step head: not linear in the normed hidden "
                "state, so parts would not sum to it")
    if isinstance(head, RatingHead):
        return ("a rating judge's score is an expectation under a softmax over the rating tokens: not linear in the "
                "normed hidden state; explain it with --score judge (Yes minus No logits) instead")
    if isinstance(head, (OwnForwardHead, DecoderLabelHead)):
        return ("this family is scored by its own forward (an encoder's pair head, remote code, an encoder-decoder): "
                "its inside is not read by probe explain")
    return None


def _transform_parts(model):
    """(linear factor, whether a soft-cap follows) of the family's logit transform (`logit_transform`)."""
    cfg = model.config.get_text_config()
    scale, divide = getattr(cfg, "logit_scale", None), getattr(cfg, "logits_scaling", None)
    factor = (scale if scale is not None else 1.0) / (divide if divide is not None else 1.0)
    return float(factor), getattr(cfg, "final_logit_softcapping", None) is not None


def _float_head(model) -> Callable[[Tensor], Tensor]:
    """A family's head (``model.reward_head``) computed on float32 copies of its own modules: the bf16/fp16 weights
    upcast exactly, so its affine map is read off without the half dtype's rounding."""
    from probe.models.families import READ

    layout = model.layout
    parts = {name: copy.deepcopy(m).float() for name, m in model.named_children() if name != layout.backbone}
    proxy = types.SimpleNamespace(config=model.config, **parts)
    return lambda h: READ[layout.name](proxy, h.float())


def _affine(f: Callable[[Tensor], Tensor], d: int, device, what: str) -> tuple[Tensor, float]:
    """(u, b) with ``f(h) = u . h + b`` for a float32 function ``f`` of [n, d] rows, checked on random rows to
    float32's rounding (a bound of d + 2 roundings of every term); one line where ``f`` is not affine."""
    with torch.no_grad():
        b = f(torch.zeros(1, d, device=device)).float()
        u = f(torch.eye(d, device=device)).float() - b
        probe = torch.randn(4, d, generator=torch.Generator().manual_seed(0)).to(device)
        lin = probe @ u + b
        real = f(probe).float()
    u32 = torch.finfo(torch.float32).eps / 2
    bound = 4 * (d + 2) * u32 * (probe.abs() @ u.abs() + b.abs() + real.abs())
    if not bool(((lin - real).abs() <= bound).all()):
        raise ProbeError(f"probe explain: {what} is not affine (an MLP): its score is not a sum of parts of the "
                         f"normed hidden state (off by {float((lin - real).abs().max()):.3g} on random states)")
    return u[:, 0] if u.dim() == 2 and u.shape[1] == 1 else u, float(b.reshape(-1)[0])


def _gated(loaded, head: GatedRewardHead, ids: Sequence[int], n_prefix: int, pos: int) -> Reader:
    """ArmoRM/QRM: ``score = sum_j g_j (r(h) @ T)_j`` with ``r(h) = mean over quantiles of W h + b``; with the gate
    ``g`` held at its real value (the gating network on the real state at the gate position) the score is
    ``(W^T-average) (T g) . h + b . (T g)``: linear in the read position's normed state, exact given the gate."""
    model = head.model
    prefix = list(ids[:n_prefix])
    head.prefix_ids, head.prefix_gate = prefix, head._last_match(prefix)
    cont = torch.tensor([list(ids[n_prefix:])])
    gate_pos = int(head._gate_positions(cont, torch.tensor([len(ids) - n_prefix]))[0])
    reg = model.regression_layer
    W = reg.weight.float()
    bias = None if reg.bias is None else reg.bias.float()
    nq = head.n_quantiles or 1
    d = W.shape[1]
    W = W.reshape(-1, nq, d).mean(1)  # the quantiles' average, per objective
    bias = None if bias is None else bias.reshape(-1, nq).mean(1)
    T = getattr(model, "reward_transform_matrix", None)
    T = torch.eye(W.shape[0]) if T is None else T.float()

    def frozen(normed: Tensor) -> tuple[Tensor, dict]:
        gating = model.gating
        with torch.no_grad():
            g = gating(normed[:1, gate_pos].to(next(gating.parameters()).dtype)).float()[0].cpu()
        c = T.cpu() @ g  # each objective's weight in the score
        return (c @ W.cpu())[None], {"gate": g.tolist(), "gate_position": gate_pos, "objective_weights": c.tolist()}

    def score(normed):
        return head._combine(normed[:, pos], normed[:, gate_pos])

    def rest(normed):
        c = frozen(normed)[1]["objective_weights"]
        return {"head_bias": 0.0 if bias is None else float(torch.tensor(c) @ bias.cpu())}

    def magnitude(normed):
        g = torch.tensor(frozen(normed)[1]["gate"])
        with torch.no_grad():
            r = (normed[0, pos].float().cpu() @ W.cpu().T) + (0 if bias is None else bias.cpu())
        adjusted = r @ T.cpu()
        return float(r.abs().sum() + adjusted.abs().sum() + (g * adjusted).abs().sum())

    return Reader("gated", [pos], None, score, rest,
                  f"exact given the gate: the gating network's output held at its real value (position {gate_pos}), "
                  "as the final norm's scale is", magnitude, frozen)


def reader(loaded, head, ids: Sequence[int], n_prefix: int) -> Reader:
    """The reader of ``head`` on one full sequence ``ids`` whose first ``n_prefix`` ids are the prefix."""
    why = refusal(head, loaded)
    if why is not None:
        raise ProbeError(f"probe explain: {why}")
    model = loaded.model
    L = len(ids)
    cont = torch.tensor([list(ids[n_prefix:])])
    lengths = torch.tensor([L - n_prefix])
    if isinstance(head, GatedRewardHead):
        pos = int(pool_positions(list(ids[:n_prefix]), cont, lengths, head.pad_id, "before_first_pad")[0])
        return _gated(loaded, head, ids, n_prefix, pos)
    if isinstance(head, LinearRewardHead):
        pos = int(pool_positions(list(ids[:n_prefix]), cont, lengths, head.pad_id, head.pooling)[0])
        u = head.weight.float()
        b = 0.0 if head.bias is None else float(head.bias.float())

        def score(normed):
            return (normed[:, pos].float() * u.to(normed.device)).sum(-1) + b
        return Reader("linear", [pos], u[None].clone().cpu(), score, lambda normed: {"head_bias": b},
                      "exact: a linear head on the final normed state",
                      lambda normed: float(score(normed[:1]).abs()[0]) + abs(b))
    if isinstance(head, ModuleRewardHead):
        pos = int(pool_positions(list(ids[:n_prefix]), cont, lengths, head.pad_id, head.pooling)[0])
        d = model.config.get_text_config().hidden_size
        dev = next(model.parameters()).device
        f32 = _float_head(model)
        u, b = _affine(lambda h: head.sign * f32(h), d, dev, f"{model.layout.name}'s reward head")

        def score(normed):
            return head.sign * model.reward_head(normed[:, pos]).float()
        return Reader("linear", [pos], u[None].cpu(), score, lambda normed: {"head_bias": b},
                      "exact: the family's affine head (read off float32 copies of its weights) on the final normed "
                      "state", lambda normed: float(score(normed[:1]).abs()[0]) + abs(b))
    out = model.get_output_embeddings()
    W = out.weight
    factor, capped = _transform_parts(model)
    transform = logit_transform(model)

    def logits_of(h: Tensor, rows: Sequence[int]) -> tuple[Tensor, Tensor]:
        """(raw logits without bias, transformed logits with bias) of vocabulary ``rows`` at states ``h`` [n, d]."""
        w = W[list(rows)].float()
        raw = h.float() @ w.T
        full = raw + (out.bias[list(rows)].float() if out.bias is not None else 0)
        return raw, (full if transform is None else transform(full))

    note = ("exact" if not capped else
            "exact up to the soft-cap: the parts explain the logits before the cap, the cap's bend is in rest")
    if isinstance(head, JudgeHead):  # the judge and the logit reader (LogitRewardHead)
        rows = list(head.ids)
        u = factor * W[rows[0]].float()
        if len(rows) > 1:
            u = u - factor * W[rows[1]].float()

        def combine(v: Tensor) -> Tensor:
            return v[:, 0] - v[:, 1] if v.shape[1] > 1 else v[:, 0]

        def score(normed):
            from probe.core.heads import lm_logits
            return head._from_logits(lm_logits(model, normed[:, L - 1], rows=rows).float())

        def rest(normed):
            raw, tr = logits_of(normed[:, L - 1], rows)
            bias = factor * combine(out.bias[rows].float()[None]) if out.bias is not None else torch.zeros(1)
            items = {"lm_head_bias": float(bias[0])}
            if capped:
                items["softcap_bend"] = float(combine(tr)[0] - combine(factor * raw)[0] - bias[0])
            return items

        def magnitude(normed):
            raw, tr = logits_of(normed[:1, L - 1], rows)
            return float((factor * raw).abs().sum() + tr.abs().sum())
        kind = "judge" if type(head) is JudgeHead else "logit"
        return Reader(kind, [L - 1], u[None].cpu(), score, rest, note + (" (Yes minus No logits)" if kind == "judge"
                                                                         else ""), magnitude)
    if isinstance(head, LogprobHead):
        start = n_prefix - head.k_fixed
        pos = list(range(start - 1, L - 1))
        targets = list(ids[start:])
        n = len(targets) if head.reduce == "mean" else 1
        u = factor * W[targets].float() / n

        def score(normed):
            from probe.core.heads import lm_logits
            lp = torch.log_softmax(lm_logits(model, normed[:, pos]).float(), -1)
            t = torch.tensor(targets, device=lp.device)
            return lp.gather(-1, t[None, :, None].expand(lp.shape[0], -1, 1))[..., 0].sum(1) / n

        def rest(normed):
            from probe.core.heads import lm_logits
            h = normed[0, pos].float()
            logits = lm_logits(model, normed[:, pos])[0].float()
            lse = torch.logsumexp(logits, -1)
            raw = (h * W[targets].float()).sum(-1)
            t = torch.tensor(targets, device=logits.device)
            real_t = logits.gather(-1, t[:, None])[:, 0]
            bias = factor * out.bias[targets].float() if out.bias is not None else torch.zeros_like(raw)
            items = {"log_softmax_normaliser": float(-lse.sum() / n), "lm_head_bias": float(bias.sum() / n)}
            if capped:
                items["softcap_bend"] = float((real_t - factor * raw - bias).sum() / n)
            return items

        def magnitude(normed):
            from probe.core.heads import lm_logits
            logits = lm_logits(model, normed[:1, pos])[0].float()
            t = torch.tensor(targets, device=logits.device)
            return float((logits.gather(-1, t[:, None]).abs().sum() + logits.abs().amax(-1).sum()) / n)
        return Reader("logprob", pos, u.cpu(), score, rest,
                      note + "; the parts explain the response tokens' logits, rest holds minus each position's "
                      "log-sum-exp", magnitude)
    raise ProbeError(f"probe explain: {type(head).__name__} is not a head probe explain reads")
