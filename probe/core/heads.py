"""Score heads: turn the backbone's hidden states at the right positions into one float per row.

Each head has two readers that must agree:

* `score` (the fast path) reads the hidden states of a continuation computed on top of the shared prefix
  cache, plus what `prepare` kept from the prefix;
* `own_forward` (the reference path) runs the model's own ``forward`` on whole, unpadded sequences and reads
  the score where the model's authors put it.

The engine uses the first; tests, the per-run self-check and GCG's final re-score use the second.
Positions follow the model's own pooling rule (see `pool_positions`), so both readers look at the same token.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from probe.core.invariance import dot_rows, running_sum, tree_sum
from probe.errors import ProbeError

# rows x positions x vocabulary floats materialised at once by the log-probability head (1 GiB of float32)
LOGITS_BUDGET = 1 << 28


class ScoreHead(ABC):
    name: str = ""
    drops_last_input: bool = False  # the last continuation token need not go through the model

    def prepare(self, prefix_ids: Sequence[int], prefix_hidden: Float[Tensor, "p d"]) -> None:
        """Keep what every row needs from the prefix (computed once)."""

    @abstractmethod
    def score(
        self,
        hidden: Float[Tensor, "b n d"],
        cont: Int[Tensor, "b m"],
        lengths: Int[Tensor, " b"],
        onehot: Float[Tensor, "b k v"] | None = None,
    ) -> Float[Tensor, " b"]:
        """Scores of right-padded continuation rows. ``onehot`` (GCG) gives the first k continuation tokens as
        differentiable one-hot rows; heads whose score depends on a token only through the model's input
        ignore it, heads that also read tokens as targets (log-probabilities) use it there."""

    @abstractmethod
    def own_forward(
        self, model: torch.nn.Module, input_ids: Int[Tensor, "b L"], n_prefix: int
    ) -> Float[Tensor, " b"]:
        """The score read from the model's own forward over whole sequences whose first n_prefix ids are the prefix."""

    def describe(self) -> dict:
        return {"head": self.name}


def pool_positions(
    prefix_ids: Sequence[int], cont: Int[Tensor, "b m"], lengths: Int[Tensor, " b"], pad_id: int | None, rule: str
) -> Int[Tensor, " b"]:
    """Index (in prefix + continuation coordinates) of the token a classifier reads, per row.

    ``"last_non_pad"``: the rightmost token that is not the pad id (transformers' sequence classifiers);
    ``"before_first_pad"``: the token before the first pad id, or the last token (ArmoRM/QRM code).
    Rows are right-padded to ``m``; only the first ``lengths[i]`` continuation tokens are real.
    """
    p = len(prefix_ids)
    last = p + lengths - 1
    if pad_id is None:
        return last
    m = cont.shape[1]
    real = torch.arange(m, device=cont.device)[None, :] < lengths[:, None]
    is_pad = (cont == pad_id) & real
    prefix_pads = [i for i, t in enumerate(prefix_ids) if t == pad_id]
    if rule == "last_non_pad":
        idx = torch.arange(m, device=cont.device)[None, :].expand_as(cont)
        cand = torch.where(real & ~is_pad, idx + p, torch.full_like(idx, -1)).amax(1)
        # every continuation token is pad: fall back into the prefix (no host sync to test whether any row is)
        in_prefix = max((i for i, t in enumerate(prefix_ids) if t != pad_id), default=0)
        return torch.where(cand < 0, torch.full_like(cand, in_prefix), cand)
    if rule == "before_first_pad":
        if prefix_pads:
            first = torch.full_like(last, prefix_pads[0])
        else:
            first = torch.where(is_pad.any(1), is_pad.float().argmax(1).long() + p, last + 1)
        return (first - 1) % (p + lengths)
    raise ValueError(f"unknown pooling rule {rule!r}")


def gather_rows(
    prefix_hidden: Float[Tensor, "p d"], hidden: Float[Tensor, "b n d"], pos: Int[Tensor, " b"]
) -> Float[Tensor, "b d"]:
    """Hidden state at absolute position ``pos[i]`` of row i (prefix positions come from the shared prefix)."""
    p = prefix_hidden.shape[0]
    rel = (pos - p).clamp(min=0, max=hidden.shape[1] - 1)
    out = hidden[torch.arange(hidden.shape[0], device=hidden.device), rel]
    # rows read inside the prefix take its hidden state (always computed: no host sync to test whether any row does)
    return torch.where((pos < p)[:, None], prefix_hidden[pos.clamp(max=p - 1)].to(out.dtype), out)


class LinearRewardHead(ScoreHead):
    """A sequence classifier's linear head (``model.score``), column ``label_index``, at the pooled token."""

    name = "reward"

    def __init__(self, model: torch.nn.Module, label_index: int = 0, pooling: str = "last_non_pad"):
        head = getattr(model, "score", None)
        if not isinstance(head, torch.nn.Linear):
            raise ProbeError(
                f"{type(model).__name__} has no linear `score` head; choose a registry spec with another reader"
            )
        if label_index >= head.out_features:
            raise ProbeError(f"--label-index {label_index}: the head has only {head.out_features} outputs")
        self.weight = head.weight[label_index].detach()
        self.bias = None if head.bias is None else head.bias[label_index].detach()
        self.label_index = label_index
        self.pad_id = model.config.get_text_config().pad_token_id
        self.pooling = pooling

    def prepare(self, prefix_ids, prefix_hidden):
        self.prefix_ids = list(prefix_ids)
        self.prefix_hidden = prefix_hidden

    def score(self, hidden, cont, lengths, onehot=None):
        pos = pool_positions(self.prefix_ids, cont, lengths, self.pad_id, self.pooling)
        h = gather_rows(self.prefix_hidden, hidden, pos).float()
        out = dot_rows(h, self.weight.float().to(h.device))  # not h @ w: a GEMV's sums follow the batch
        return out if self.bias is None else out + self.bias.float().to(h.device)

    def own_forward(self, model, input_ids, n_prefix):
        logits = model(input_ids=input_ids).logits
        return logits[:, self.label_index].float()

    def describe(self):
        return {"head": self.name, "label_index": self.label_index, "pad_id": self.pad_id, "pooling": self.pooling}


class GatedRewardHead(ScoreHead):
    """ArmoRM/QRM: ``sum(gating(h[gate]) * (regression(h[last]) @ T))``, quantiles averaged where present
    (``config.num_quantiles``), ``T`` the identity where the model has no ``reward_transform_matrix``.

    The gate position is the first token of the last occurrence of ``pattern_ids`` (the end of the user
    turn); it lies in the shared prefix unless a multi-token response contains the pattern itself.
    """

    name = "reward"

    def __init__(self, model: torch.nn.Module, pattern_ids: Sequence[int], output: str = "score"):
        for attr in ("regression_layer", "gating"):
            if not hasattr(model, attr):
                raise ProbeError(f"{type(model).__name__} has no `{attr}`: it is not an ArmoRM/QRM-style gated model")
        self.model = model
        self.pattern = list(pattern_ids)
        self.output = output
        self.n_quantiles = getattr(model.config, "num_quantiles", None)
        self.pad_id = model.config.get_text_config().pad_token_id

    def prepare(self, prefix_ids, prefix_hidden):
        self.prefix_ids = list(prefix_ids)
        self.prefix_hidden = prefix_hidden
        self.prefix_gate = self._last_match(self.prefix_ids)

    def _last_match(self, ids: Sequence[int]) -> int | None:
        k = len(self.pattern)
        for j in range(len(ids) - k, -1, -1):
            if list(ids[j : j + k]) == self.pattern:
                return j
        return None

    def _gate_positions(self, cont: Tensor, lengths: Tensor) -> Tensor:
        """Per row, the start of the pattern's last occurrence that ends inside the row's real tokens (the last k-1
        prefix ids included, so an occurrence may straddle the boundary), else the prefix's own; on the rows' device,
        without copying them to the host."""
        k, p = len(self.pattern), len(self.prefix_ids)
        tail = torch.tensor(self.prefix_ids[max(0, p - k + 1) :], dtype=cont.dtype, device=cont.device)
        seq = torch.cat([tail[None].expand(cont.shape[0], -1), cont], 1)  # [b, t + m]
        fallback = -1 if self.prefix_gate is None else self.prefix_gate
        if seq.shape[1] < k:
            found = torch.full_like(lengths, -1)
        else:
            pattern = torch.tensor(self.pattern, dtype=cont.dtype, device=cont.device)
            match = (seq.unfold(1, k, 1) == pattern).all(-1)  # [b, t + m - k + 1]: an occurrence starts at j
            starts = torch.arange(match.shape[1], device=cont.device)[None]
            inside = starts + k <= tail.numel() + lengths[:, None]  # it ends within the real tokens
            found = torch.where(match & inside, starts, torch.full_like(starts, -1)).amax(1)
        out = torch.where(found >= 0, p - tail.numel() + found, torch.full_like(found, fallback))
        if self.prefix_gate is None and bool((out < 0).any()):
            raise ProbeError("the gating pattern does not occur in the templated conversation; check the chat template")
        return out

    def _combine(self, h_last: Tensor, h_gate: Tensor) -> Tensor:
        reg = self.model.regression_layer
        bias = None if reg.bias is None else reg.bias.float()
        # everything on the hidden states' device (the weights may sit elsewhere under --device-map)
        dev = h_last.device
        rewards = F.linear(h_last.float(), reg.weight.float().to(dev), None if bias is None else bias.to(dev))
        if self.n_quantiles:
            rewards = tree_sum(rewards.reshape(rewards.shape[0], -1, self.n_quantiles)) / self.n_quantiles
        transform = getattr(self.model, "reward_transform_matrix", None)  # ArmoRM, QRM-Llama; not QRM-Gemma
        if transform is not None:
            rewards = F.linear(rewards, transform.float().to(dev).t())
        gating = self.model.gating
        gate = gating(h_gate.to(next(gating.parameters()).dtype)).float().to(dev)
        return tree_sum(gate * rewards, 1)

    def score(self, hidden, cont, lengths, onehot=None):
        pos = pool_positions(self.prefix_ids, cont, lengths, self.pad_id, "before_first_pad")
        gate_pos = self._gate_positions(cont, lengths)
        return self._combine(gather_rows(self.prefix_hidden, hidden, pos), gather_rows(self.prefix_hidden, hidden, gate_pos))

    def own_forward(self, model, input_ids, n_prefix):
        out = getattr(model(input_ids=input_ids), self.output)
        return out.reshape(out.shape[0], -1)[:, 0].float()


class ModuleRewardHead(ScoreHead):
    """A family's own head on its backbone (probe/models/families.py): ``model.reward_head`` on the hidden state
    at the family's pooling position, times the spec's ``sign`` (a cost read as a reward)."""

    name = "reward"

    def __init__(self, model: torch.nn.Module, sign: float = 1.0):
        if not hasattr(model, "reward_head"):
            raise ProbeError(f"{type(model).__name__} is not one of rm-probe's family models; the module reader "
                             "needs one (loaded through a registry spec with a layout)")
        self.model, self.sign = model, sign
        self.pooling = "last_non_pad" if model.layout.pooling == "last" else "before_first_pad"
        self.pad_id = None if model.layout.pooling == "last" else model.pad_id

    def prepare(self, prefix_ids, prefix_hidden):
        self.prefix_ids = list(prefix_ids)
        self.prefix_hidden = prefix_hidden

    def score(self, hidden, cont, lengths, onehot=None):
        pos = pool_positions(self.prefix_ids, cont, lengths, self.pad_id, self.pooling)
        return self.sign * self.model.reward_head(gather_rows(self.prefix_hidden, hidden, pos))

    def own_forward(self, model, input_ids, n_prefix):
        return self.sign * model(input_ids=input_ids).logits[:, 0].float()

    def describe(self):
        return {"head": f"reward ({self.model.layout.name} head)", "pooling": self.pooling, "pad_id": self.pad_id,
                "sign": self.sign}


class StepRewardHead(ScoreHead):
    """A process reward model's step reward (Qwen2.5-Math-PRM's ``make_step_rewards``): its 2-way head
    (``model.score``, any module on the last hidden state) at the step separator, ``softmax(logits)[1]`` (the positive
    class). The separator read is the last one in the row's real tokens: the one appended after the response."""

    name = "reward"

    def __init__(self, model: torch.nn.Module, sep_id: int):
        if not isinstance(getattr(model, "score", None), torch.nn.Module):
            raise ProbeError(f"{type(model).__name__} has no `score` head: it is not a process reward model's class")
        self.model, self.sep_id = model, int(sep_id)

    def prepare(self, prefix_ids, prefix_hidden):
        self.prefix_ids = list(prefix_ids)
        self.prefix_hidden = prefix_hidden

    def positions(self, cont: Tensor, lengths: Tensor) -> Tensor:
        """Each row's last separator (prefix + continuation coordinates); one line where a row has none."""
        real = torch.arange(cont.shape[1], device=cont.device)[None, :] < lengths[:, None]
        idx = torch.arange(cont.shape[1], device=cont.device)[None, :].expand_as(cont)
        found = torch.where(real & (cont == self.sep_id), idx, torch.full_like(idx, -1)).amax(1)
        if bool((found < 0).any()):
            raise ProbeError("a row holds no step separator after its response: render it with the family's "
                             "conversation (probe/core/scoring.py: StepSeparated)")
        return len(self.prefix_ids) + found

    def _reward(self, h: Tensor) -> Tensor:
        head = self.model.score
        logits = head(h.to(next(head.parameters()).dtype)).float()
        return torch.softmax(logits, -1)[:, 1]

    def score(self, hidden, cont, lengths, onehot=None):
        pos = self.positions(cont, lengths)
        return self._reward(gather_rows(self.prefix_hidden, hidden, pos))

    def own_forward(self, model, input_ids, n_prefix):
        logits = model(input_ids=input_ids).logits.float()  # [b, L, 2]
        is_sep = input_ids == self.sep_id
        pos = torch.where(is_sep, torch.arange(input_ids.shape[1], device=input_ids.device), -1).amax(1)
        if bool((pos < 0).any()):
            raise ProbeError("a row holds no step separator after its response")
        return torch.softmax(logits[torch.arange(logits.shape[0], device=logits.device), pos], -1)[:, 1]

    def describe(self):
        return {"head": "reward (process reward model's step head)", "step_separator_id": self.sep_id,
                "score": "softmax(score(h[last separator]))[1], the positive class's probability"}


def logit_transform(model: torch.nn.Module):
    """The family's elementwise transform of LM-head logits, or None: Gemma 2/3/4 soft-cap
    (``final_logit_softcapping``), Cohere scales (``logit_scale``), Falcon-H1 too (``lm_head_multiplier``), Granite
    divides (``logits_scaling``)."""
    cfg = model.config.get_text_config()
    scale = getattr(cfg, "logit_scale", None) or getattr(cfg, "lm_head_multiplier", None)
    divide = getattr(cfg, "logits_scaling", None)
    cap = getattr(cfg, "final_logit_softcapping", None)
    if scale is None and divide is None and cap is None:
        return None

    def transform(logits: Tensor) -> Tensor:
        if scale is not None:
            logits = logits * scale
        if divide is not None:
            logits = logits / divide
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return transform


def lm_logits(model: torch.nn.Module, hidden: Tensor, rows: Sequence[int] | None = None) -> Tensor:
    """The causal LM's logits (all, or only vocabulary ``rows``) from final hidden states, with the family's
    output transform (`logit_transform`). The parity tests compare this with each family's own forward."""
    head = model.get_output_embeddings()
    if rows is None:
        logits = head(hidden)
    else:
        # one dot product per row and id in a fixed order (probe/core/invariance.py), rounded to the head's dtype as
        # its own product's output is: a product with 1-2 columns takes a path that follows the batch's row count
        w = head.weight[torch.tensor(list(rows), device=head.weight.device)].float()
        h = hidden.to(head.weight.device).float()
        logits = torch.stack([dot_rows(h, w[j]) for j in range(w.shape[0])], -1)
        if head.bias is not None:
            logits = logits + head.bias[list(rows)].float()
        logits = logits.to(head.weight.dtype).to(hidden.device)
    transform = logit_transform(model)
    return logits if transform is None else transform(logits)


class LogprobHead(ScoreHead):
    """Sum (or mean) of the log-probabilities of the continuation's tokens: response then end-of-turn tokens.

    The first token's distribution comes from the prefix's last position (computed once); the last token is
    only predicted, never fed in, so the model runs on ``m - 1`` new tokens per row. With
    ``response_in_prefix=k`` the last k prefix ids are already part of the response (beam extension): their
    log-probabilities, read from the prefix's own hidden states, are added to every row.
    """

    name = "logprob"
    drops_last_input = True

    def __init__(self, model: torch.nn.Module, reduce: str = "sum", logits_budget: int = LOGITS_BUDGET,
                 response_in_prefix: int = 0, fused: bool = False):
        if reduce not in ("sum", "mean"):
            raise ValueError(f"reduce must be sum or mean, not {reduce!r}")
        self.model = model
        self.reduce = reduce
        self.logits_budget = logits_budget
        self.k_fixed = response_in_prefix
        self.fused = fused  # kernels/fused_logprob: no rows x vocabulary logits (hard targets only)

    def prepare(self, prefix_ids, prefix_hidden):
        # on the hidden states' device, where the rows are read (the LM head may sit on another GPU)
        self.first = torch.log_softmax(lm_logits(self.model, prefix_hidden[-1:]).float(), -1)[0].to(prefix_hidden.device)
        self.offset = torch.zeros((), device=self.first.device)
        k = self.k_fixed
        if k:
            if k >= len(prefix_ids):
                raise ValueError("response_in_prefix must leave some prompt in the prefix")
            targets = torch.tensor(list(prefix_ids[-k:]), device=prefix_hidden.device)[None]
            self.offset = self._token_logprobs(prefix_hidden[None, -k - 1 : -1], targets).sum()

    def _token_logprobs(self, hidden: Tensor, targets: Tensor, onehot: Tensor | None = None) -> Tensor:
        """log p(targets[i, j]) from hidden[i, j], in row chunks that keep the logits within budget. Where
        ``onehot[i, j]`` is given (the first k target columns), the target is that soft row instead."""
        b, n = targets.shape
        head = self.model.get_output_embeddings()
        if self.fused and onehot is None:
            from probe.kernels.fused_logprob import fused_token_logprobs

            # on the head's device (tied embeddings may live on the first GPU), the result back where the rows are
            dev = head.weight.device
            transform = logit_transform(self.model)

            def fused(h: Tensor, t: Tensor) -> Tensor:
                return fused_token_logprobs(h, head.weight, t, head.bias, transform)

            h, t = hidden.reshape(b * n, -1).to(dev, head.weight.dtype), targets.reshape(-1).to(dev)
            flat = fused(h, t)  # a fixed group of rows (probe/core/invariance.py): one shape whatever the batch
            return flat.reshape(b, n).to(hidden.device)
        vocab = head.weight.shape[0]
        rows = max(1, self.logits_budget // max(1, n * vocab))
        out = []
        for s in range(0, b, rows):
            logp = torch.log_softmax(lm_logits(self.model, hidden[s : s + rows]).float(), -1).to(hidden.device)
            tok = logp.gather(-1, targets[s : s + rows, :, None])[..., 0]
            if onehot is not None and onehot.shape[1]:
                k = onehot.shape[1]
                soft = (logp[:, :k] * onehot[s : s + rows].float()).sum(-1)
                tok = torch.cat([soft, tok[:, k:]], 1)
            out.append(tok)
        return torch.cat(out)

    def score(self, hidden, cont, lengths, onehot=None):
        rest = None
        if cont.shape[1] > 1:
            soft = None if onehot is None else onehot[:, 1:]
            rest = self._token_logprobs(hidden[:, : cont.shape[1] - 1], cont[:, 1:], soft)
        return self.from_tokens(cont, lengths, rest, onehot)

    @property
    def reads_tokens(self) -> bool:
        """Whether a packed tile's positions can be read all at once (`tile_logprobs`): hard targets, fused."""
        return self.fused

    def tile_logprobs(self, hidden: Float[Tensor, "t d"], targets: Int[Tensor, " t"]) -> Float[Tensor, " t"]:
        """log p(targets[j]) from hidden[j] for every position of a packed tile at once (probe/core/packing.py): one
        call of the tile's fixed shape, whatever rows it holds."""
        return self._token_logprobs(hidden[None], targets[None])[0]

    def from_tokens(self, cont: Tensor, lengths: Tensor, rest: Tensor | None, onehot: Tensor | None = None) -> Tensor:
        """The score from the token log-probabilities ``rest`` [b, m - 1] (of the continuation's tokens after the
        first; past a row's length, ignored): the first token's, read at the prefix, plus ``rest`` summed in a
        fixed tree, plus the prefix's scored part; the mean per token under ``reduce='mean'``."""
        if onehot is None:
            total = self.first[cont[:, 0]]
        else:
            total = (self.first[None, :] * onehot[:, 0].float()).sum(-1)
        m = cont.shape[1]
        if m > 1:
            mask = torch.arange(1, m, device=cont.device)[None, :] < lengths[:, None]
            total = total + tree_sum(torch.where(mask, rest, torch.zeros_like(rest)), 1)  # padding adds exact zeros
        total = total + self.offset
        return total / (lengths.float() + self.k_fixed) if self.reduce == "mean" else total

    def prefix_scores(self, hidden, cont, lengths):
        """Every prefix's score of each row at once (row i, column k-1: its first k tokens), as `score` would give
        it for length k: the running sum (or mean) of the token log-probabilities, each read once."""
        rest = self._token_logprobs(hidden[:, : cont.shape[1] - 1], cont[:, 1:]) if cont.shape[1] > 1 else None
        return self.prefixes_from_tokens(cont, rest)

    def prefixes_from_tokens(self, cont: Tensor, rest: Tensor | None) -> Tensor:
        """`prefix_scores` from the token log-probabilities ``rest`` [b, m - 1]."""
        lp = self.first[cont[:, 0]][:, None]
        if rest is not None:
            lp = torch.cat([lp, rest], 1)
        total = running_sum(lp, 1) + self.offset  # not cumsum: a GPU's scan adds in an order that follows the batch
        if self.reduce == "mean":
            total = total / (torch.arange(1, cont.shape[1] + 1, device=total.device)[None] + self.k_fixed)
        return total

    def own_forward(self, model, input_ids, n_prefix):
        logits = model(input_ids=input_ids).logits.float()
        start = n_prefix - self.k_fixed
        logp = torch.log_softmax(logits[:, start - 1 : -1], -1)
        tok = logp.gather(-1, input_ids[:, start:, None])[..., 0]
        return tok.mean(1) if self.reduce == "mean" else tok.sum(1)

    def describe(self):
        return {"head": self.name, "reduce": self.reduce, "response_in_prefix": self.k_fixed, "fused": self.fused}


class JudgeHead(ScoreHead):
    """Logit of "Yes" minus logit of "No" at the last position, after a judging question (see template.py)."""

    name = "judge"

    def __init__(self, model: torch.nn.Module, yes_id: int, no_id: int):
        self.model = model
        self.yes_id, self.no_id = yes_id, no_id
        self.ids = (yes_id, no_id)

    def prepare(self, prefix_ids, prefix_hidden):
        self.prefix_hidden = prefix_hidden

    def _from_logits(self, logits: Tensor) -> Tensor:
        """The score from the logits of ``self.ids`` (rows x len(ids), float32)."""
        return logits[:, 0] - logits[:, 1]

    def score(self, hidden, cont, lengths, onehot=None):
        p = self.prefix_hidden.shape[0]
        last = gather_rows(self.prefix_hidden, hidden, p + lengths - 1)
        return self._from_logits(lm_logits(self.model, last, rows=self.ids).float())

    def own_forward(self, model, input_ids, n_prefix):
        logits = model(input_ids=input_ids).logits[:, -1].float()
        return self._from_logits(logits[:, list(self.ids)])

    def describe(self):
        return {"head": self.name, "yes_id": self.yes_id, "no_id": self.no_id}


class LogitRewardHead(JudgeHead):
    """A reward model shipped as a causal LM (registry reader ``"logit"``): the LM head's logit of vocabulary id
    ``index`` at the last input position, i.e. row ``index`` of ``lm_head`` on the final-normed hidden state, minus
    that of id ``minus`` where given; its own forward reads ``logits[:, -1, index]`` (``- logits[:, -1, minus]``),
    what ``generate(max_new_tokens=1, output_scores=True)`` returns as ``scores[0][:, index]`` where the generation
    config sets no sampling or penalty (NVIDIA's Nemotron reward cards)."""

    name = "reward"

    def __init__(self, model: torch.nn.Module, index: int = 0, minus: int | None = None):
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if head is None:
            raise ProbeError(f"{type(model).__name__} has no language-model head: the logit reader needs a causal LM")
        vocab = head.weight.shape[0]
        for i in (index, minus):
            if i is not None and not 0 <= i < vocab:
                raise ProbeError(f"--label-index {i}: the LM head has {vocab} rows (ids 0 to {vocab - 1})")
        self.model, self.ids = model, (index,) if minus is None else (index, minus)

    def _from_logits(self, logits: Tensor) -> Tensor:
        return logits[:, 0] if logits.shape[1] == 1 else logits[:, 0] - logits[:, 1]

    def describe(self):
        out = {"head": "reward (next-token logit)", "vocab_id": self.ids[0], "position": "last input id"}
        return out | ({"minus_vocab_id": self.ids[1]} if len(self.ids) > 1 else {})


class RatingHead(JudgeHead):
    """A judge's expected rating: the next-token distribution at the last position restricted to the rating tokens
    (``ids``, one per rating in ``values``), ``sum_r value_r * softmax(logits[ids])_r`` (probe/core/judges.py)."""

    name = "rating"

    def __init__(self, model: torch.nn.Module, ids: Sequence[int], values: Sequence[int], judge=None):
        self.model, self.judge = model, judge
        self.ids = tuple(int(i) for i in ids)
        self.values = torch.tensor([float(v) for v in values])
        self.top_k = getattr(judge, "top_logprobs", None)  # LMUnit's reading of vLLM's top-k (probe/core/judges.py)

    def _from_logits(self, logits: Tensor) -> Tensor:
        return dot_rows(torch.softmax(logits, -1), self.values.to(logits.device))

    def _top_k_rating(self, logits: Tensor) -> Tensor:
        """LMUnit's ``postprocess``: 0 where the most likely token is not a rating; else the expected rating over the
        ratings among the ``top_k`` most likely tokens, their probabilities renormalised (0 where none is)."""
        ids = torch.tensor(self.ids, device=logits.device)
        kth = logits.topk(min(self.top_k, logits.shape[-1]), -1).values[:, -1:]
        rated = logits[:, ids]
        kept = rated >= kth
        p = torch.softmax(rated.masked_fill(~kept, float("-inf")), -1).nan_to_num(0.0)
        out = dot_rows(p, self.values.to(logits.device))
        greedy = torch.isin(logits.argmax(-1), ids)
        return torch.where(greedy & kept.any(-1), out, torch.zeros_like(out))

    def score(self, hidden, cont, lengths, onehot=None):
        if self.top_k is None:
            return super().score(hidden, cont, lengths, onehot)
        p = self.prefix_hidden.shape[0]
        return self._top_k_rating(lm_logits(self.model, gather_rows(self.prefix_hidden, hidden, p + lengths - 1)).float())

    def own_forward(self, model, input_ids, n_prefix):
        if self.top_k is None:
            return super().own_forward(model, input_ids, n_prefix)
        return self._top_k_rating(model(input_ids=input_ids).logits[:, -1].float())

    def describe(self):
        rule = ("expected rating under the next-token distribution over the rating tokens" if self.top_k is None else
                f"expected rating over the rating tokens among the {self.top_k} most likely next tokens, renormalised; "
                "0 where the most likely token is not a rating (LMUnit's postprocess)")
        out = {"head": self.name, "rating_ids": list(self.ids), "ratings": [int(v) for v in self.values.tolist()],
               "score": rule}
        return out | (self.judge.describe() if self.judge is not None else {})


FIRST_OUTPUT = "[0]"  # an ``output`` read as ``outputs[0]`` (a model card's read of remote code's output: WorldPM's)


class OwnForwardHead(ScoreHead):
    """For models with no cached reader: only the model's own forward, ``getattr(out, output)[:, label_index]``.
    ``pair_sep_id``: an encoder that reads a text pair ([CLS] prompt [SEP] response [SEP]) with segment ids, which
    are given as the tokenizer gives them: 0 up to the first [SEP], 1 after it. ``attention_mask``: pass the (all
    ones: rows are never padded) mask the family's card passes, where its remote forward reads the score position
    from it (POLAR's ``InternLM2ForRewardModel``: the last id the mask covers)."""

    name = "reward"

    def __init__(self, output: str = "logits", label_index: int = 0, pair_sep_id: int | None = None,
                 attention_mask: bool = False):
        self.output, self.label_index, self.pair_sep_id = output, label_index, pair_sep_id
        self.attention_mask = attention_mask

    def score(self, hidden, cont, lengths, onehot=None):
        raise NotImplementedError("this model has no cached reader; use FullSequenceScorer")

    def own_forward(self, model, input_ids, n_prefix):
        kwargs = {}
        if self.pair_sep_id is not None:
            sep = (input_ids == self.pair_sep_id).long()
            kwargs["token_type_ids"] = ((torch.cumsum(sep, 1) - sep) >= 1).long()
        if self.attention_mask:
            kwargs["attention_mask"] = torch.ones_like(input_ids)
        out = model(input_ids=input_ids, **kwargs)
        out = out[0] if self.output == FIRST_OUTPUT else getattr(out, self.output)
        return out.reshape(out.shape[0], -1)[:, self.label_index].float()

    def describe(self):
        out = {"head": "reward (model's own forward)", "output": self.output, "label_index": self.label_index}
        out |= {"attention_mask": "all ones"} if self.attention_mask else {}
        return out | ({"text_pair_sep_id": self.pair_sep_id} if self.pair_sep_id is not None else {})


class DecoderLabelHead(OwnForwardHead):
    """An encoder-decoder that answers with a label (SteamSHP: "A" or "B"): the input through the encoder, the decoder
    given its start token alone (``generate``'s first step), the logit of ``first_id`` minus that of ``second_id``."""

    def __init__(self, first_id: int, second_id: int):
        super().__init__("logits", 0)
        self.first_id, self.second_id = first_id, second_id

    def own_forward(self, model, input_ids, n_prefix):
        start = model.generation_config.decoder_start_token_id
        if start is None:
            start = model.config.decoder_start_token_id
        decoder = torch.full((input_ids.shape[0], 1), int(start), dtype=input_ids.dtype, device=input_ids.device)
        logits = model(input_ids=input_ids, decoder_input_ids=decoder).logits[:, 0].float()
        return logits[:, self.first_id] - logits[:, self.second_id]

    def describe(self):
        return {"head": "decoder's first-step label logits", "first_id": self.first_id, "second_id": self.second_id}
