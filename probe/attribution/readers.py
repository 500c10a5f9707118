"""How a score head reads the final normed hidden states, as `probe explain` needs it: the read positions, one
linear direction per position (the part of the score that is linear in the normed state), what is left outside
(`rest`: the head's bias, the log-softmax normaliser, a soft-cap's bend), and the real score from normed states.

Exact (the parts plus `rest` are the score): a sequence classifier's linear head, a family's linear module head,
the logit reader (Nemotron), a Yes/No judge and the log-probability of the response. A soft-capped LM head (Gemma
2) is explained up to its cap: the parts explain the logits before the cap and the cap's bend is an item of
`rest`. Refused, with the reason: gated heads (ArmoRM, QRM), process models' softmax, a rating judge's softmax,
encoders' and remote code's own forward, pairwise models, implicit rewards (--ref).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from probe.core.heads import (DecoderLabelHead, GatedRewardHead, JudgeHead, LinearRewardHead, LogitRewardHead,
                              LogprobHead, ModuleRewardHead, OwnForwardHead, RatingHead, StepRewardHead,
                              logit_transform, pool_positions)
from probe.errors import ProbeError


@dataclass
class Reader:
    kind: str
    positions: list[int]  # absolute positions in the full sequence the score reads
    directions: Tensor  # [n_read, d] float32: the score's linear part is sum_j directions[j] . normed[positions[j]]
    score: Callable[[Tensor], Tensor]  # normed [b, L, d] -> the real score [b] (float32)
    rest: Callable[[Tensor], dict[str, float]]  # normed [1, L, d] -> the items outside the parts
    note: str  # what is exact


def refusal(head, loaded) -> str | None:
    """Why ``head`` on ``loaded`` is not explained (one line), or None."""
    if loaded.ref is not None:
        return ("an implicit reward (--ref) is the difference of two models' log-probabilities: explain each model's "
                "--score logprob alone")
    if loaded.pairwise is not None:
        return "a pairwise model's score compares two responses in one input: not decomposed here"
    if isinstance(head, GatedRewardHead):
        return ("a gated reward head (ArmoRM, QRM) multiplies the objectives by a gating network's softmax of another "
                "position's state: the score is not linear in one normed hidden state, so parts would not sum to it")
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


def reader(loaded, head, ids: Sequence[int], n_prefix: int) -> Reader:
    """The reader of ``head`` on one full sequence ``ids`` whose first ``n_prefix`` ids are the prefix."""
    why = refusal(head, loaded)
    if why is not None:
        raise ProbeError(f"probe explain: {why}")
    model = loaded.model
    L = len(ids)
    cont = torch.tensor([list(ids[n_prefix:])])
    lengths = torch.tensor([L - n_prefix])
    if isinstance(head, LinearRewardHead):
        pos = int(pool_positions(list(ids[:n_prefix]), cont, lengths, head.pad_id, head.pooling)[0])
        u = head.weight.float()
        b = 0.0 if head.bias is None else float(head.bias.float())

        def score(normed):
            return (normed[:, pos].float() * u.to(normed.device)).sum(-1) + b
        return Reader("linear", [pos], u[None].clone(), score, lambda normed: {"head_bias": b},
                      "exact: a linear head on the final normed state")
    if isinstance(head, ModuleRewardHead):
        pos = int(pool_positions(list(ids[:n_prefix]), cont, lengths, head.pad_id, head.pooling)[0])

        def f(h):
            return head.sign * model.reward_head(h)
        d = model.config.get_text_config().hidden_size
        dev = next(model.parameters()).device
        with torch.no_grad():
            b = f(torch.zeros(1, d, device=dev)).float()
            u = (f(torch.eye(d, device=dev)).float() - b)
            probe = torch.randn(2, d, generator=torch.Generator().manual_seed(0)).to(dev)
            lin = probe @ u + b
            real = f(probe).float()
        if not torch.allclose(lin, real, rtol=1e-3, atol=1e-4 * float(real.abs().max() + 1)):
            raise ProbeError(f"probe explain: {model.layout.name}'s reward head is not linear (an MLP): its score is not "
                             "a sum of parts of the normed hidden state")

        def score(normed):
            return f(normed[:, pos]).float()
        return Reader("linear", [pos], u[None].cpu(), score, lambda normed: {"head_bias": float(b[0])},
                      "exact: the family's linear head on the final normed state")
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
        kind = "judge" if type(head) is JudgeHead else "logit"
        return Reader(kind, [L - 1], u[None].cpu(), score, rest, note + (" (Yes minus No logits)" if kind == "judge"
                                                                         else ""))
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
        return Reader("logprob", pos, u.cpu(), score, rest,
                      note + "; the parts explain the response tokens' logits, rest holds minus each position's "
                      "log-sum-exp")
    raise ProbeError(f"probe explain: {type(head).__name__} is not a head probe explain reads")
