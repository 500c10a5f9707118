"""The scoring engine: one prefix forward, then batches of continuations on top of its KV cache.

`PrefixScorer` is the fast path every feature uses (sweeps, GCG, beams, the social benchmark). Rows of a
batch are continuations of the shared prefix (response ids + template suffix ids); rows of different
lengths are right-padded and carry their true length, which is safe without an attention mask because
attention is causal: a real token never sees the padding after it.

`FullSequenceScorer` is the plain reference: each whole sequence through the model's own forward, grouped
by length. Tests compare the two; every sweep re-checks a sample with it before trusting the fast path.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from probe.core.cache import UnsupportedCache, architecture, check_replicable, continue_prefix, plan
from probe.core.heads import ScoreHead
from probe.core.invariance import attention_tiles, buckets, check_cpu, cpu_activations, row_tiles, tile_rows
from probe.models.attention import require_trained_attention


def pad_rows(rows: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """Rows of different lengths as one right-padded tensor and their true lengths. The padding repeats each
    row's last id: a real token never attends to what comes after it, so any id would do."""
    rows = [list(r) for r in rows]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("empty continuation")
    m = max(len(r) for r in rows)
    return torch.tensor([r + [r[-1]] * (m - len(r)) for r in rows]), torch.tensor([len(r) for r in rows])


def _as_batch(cont: Tensor | Sequence[Sequence[int]], lengths, device) -> tuple[Tensor, Tensor]:
    if not isinstance(cont, Tensor):
        cont, lengths = pad_rows(cont)
    cont = cont.to(device=device, dtype=torch.long)
    if lengths is None:
        lengths = torch.full((cont.shape[0],), cont.shape[1])
    return cont, torch.as_tensor(lengths, device=device, dtype=torch.long)


def fit(cont: Tensor, width: int) -> Tensor:
    """Right-padded rows cut or padded (repeating each row's last column) to ``width`` columns."""
    m = cont.shape[1]
    if width <= m:
        return cont[:, :width]
    return torch.cat([cont, cont[:, -1:].expand(-1, width - m)], 1)


def by_bucket(cont: Tensor, lengths: Tensor, fn) -> list[tuple[Tensor, Any]]:
    """``fn(rows, lengths)`` on each length bucket of the rows (probe/core/invariance.py: a row is padded to a
    length set by itself alone, never to the longest row beside it), as (row indices, result) pairs."""
    groups = buckets(lengths.tolist(), cont.device)
    if len(groups) == 1:
        (width, _), = groups.items()
        return [(torch.arange(cont.shape[0], device=cont.device), fn(fit(cont, width), lengths))]
    out = []
    for width, idx in groups.items():
        sel = torch.tensor(idx, device=cont.device)
        out.append((sel, fn(fit(cont[sel], width), lengths[sel])))
    return out


def _on(hidden: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """``tensors`` on the device of the final hidden states: the last layers' device when ``--device-map`` spread
    the model over several GPUs (the backbone's outputs stay where its last layer ran), where the heads read."""
    return tuple(t.to(hidden.device) for t in tensors)


def input_device(model: torch.nn.Module) -> torch.device:
    return model.get_input_embeddings().weight.device


def backbone_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder (or encoder) stack under the head: the attribute ``base_model_prefix`` names, else ``model``
    (Llama 4's text model names ``language_model``, which only its multimodal parent has; its own stack is
    ``model``)."""
    for name in (model.base_model_prefix, "model"):
        found = getattr(model, name, None)
        if isinstance(found, torch.nn.Module):
            return found
    raise AttributeError(f"{type(model).__name__} has neither {model.base_model_prefix!r} nor 'model'")


def cache_keyword(module: torch.nn.Module) -> str:
    """The forward's name for a KV cache: ``cache`` from transformers 5.2x on (``past_key_values`` is deprecated
    there, to be removed in 5.40), ``past_key_values`` before and in remote code."""
    import inspect

    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


class PrefixScorer:
    """Scores continuations of one prefix: ``score([[t, *suffix], ...]) -> scores``."""

    def __init__(self, model: torch.nn.Module, head: ScoreHead, prefix_ids: Sequence[int], use_cache: bool = True,
                 shared_attention: bool = True):
        """``shared_attention`` (default): read the prefix K/V once per batch (kernels/prefix_attention.py) instead
        of a per-row view of the cache, for the families that kernel supports (measured 1.49x on the CPU sweep,
        experiments/results/bench_sweep.md); other families, and ``False``, take the plain cache path."""
        if not prefix_ids:
            raise ValueError("empty prefix")
        require_trained_attention(model)
        self.reuse = plan(model.config)  # how rows continue the prefix (probe/core/cache.py)
        if self.reuse.path != "cache":
            raise UnsupportedCache(f"{architecture(model.config)}: {self.reuse.why}; GCG, the beam and traces read a "
                                   "continuation of the prefix: not supported for it (sweeps, whole responses, judges "
                                   "and social items run each sequence through the model's own forward)")
        self.model, self.head, self.use_cache = model, head, use_cache
        self.tiles = tile_rows(input_device(model))  # fixed product shapes on a GPU (probe/core/invariance.py)
        check_cpu(input_device(model))
        self.backbone = backbone_of(model)
        self.device = input_device(model)
        self.prefix = torch.tensor(list(prefix_ids), device=self.device)[None]
        with torch.no_grad(), cpu_activations(model):  # not inference_mode: GCG back-propagates through this cache
            out = self.backbone(input_ids=self.prefix, use_cache=True)
        self.cache = out.cache if "cache" in out else out.past_key_values  # renamed in transformers 5.2x
        check_replicable(self.cache)
        self.prefix_hidden: Float[Tensor, "p d"] = out.last_hidden_state[0]
        head.prepare(list(prefix_ids), self.prefix_hidden)
        self.shared = None
        if shared_attention and use_cache:
            from probe.kernels.prefix_attention import SharedPrefix, supported

            if supported(model):
                self.shared = SharedPrefix.from_cache(self.cache, self.n_prefix)

    @property
    def n_prefix(self) -> int:
        return self.prefix.shape[1]

    def hidden(
        self, input_ids: Int[Tensor, "b n"] | None = None, inputs_embeds: Float[Tensor, "b n d"] | None = None
    ) -> Float[Tensor, "b n d"]:
        """Final hidden states of the new tokens (ids or embeddings) on top of the shared prefix."""
        x = input_ids if input_ids is not None else inputs_embeds
        b, n = x.shape[0], x.shape[1]
        if n == 0:
            return self.prefix_hidden.new_zeros(b, 0, self.prefix_hidden.shape[-1])
        if self.shared is not None and self.use_cache:
            return self._hidden_shared(input_ids, inputs_embeds, b, n)
        with attention_tiles(self.backbone, self.tiles if input_ids is not None else None):  # not GCG's gradient
            if not self.use_cache:
                return self._hidden_uncached(input_ids, inputs_embeds)
            return continue_prefix(self.backbone, cache_keyword(self.backbone), self.cache, self.n_prefix, input_ids,
                                   inputs_embeds, self.reuse)

    def _hidden_shared(self, input_ids, inputs_embeds, b: int, n: int):
        from probe.kernels.prefix_attention import using_shared_prefix

        pos = torch.arange(self.n_prefix, self.n_prefix + n, device=self.device)[None].expand(b, n)
        with using_shared_prefix(self.backbone):
            out = self.backbone(input_ids=input_ids, inputs_embeds=inputs_embeds, position_ids=pos, use_cache=False,
                                rm_shared_prefix=self.shared)
        return out.last_hidden_state

    def _hidden_uncached(self, input_ids, inputs_embeds):
        b = (input_ids if input_ids is not None else inputs_embeds).shape[0]
        prefix = self.prefix.expand(b, -1)
        if input_ids is not None:
            out = self.backbone(input_ids=torch.cat([prefix, input_ids], 1), use_cache=False)
        else:
            emb = self.backbone.get_input_embeddings()(prefix)
            out = self.backbone(inputs_embeds=torch.cat([emb, inputs_embeds.to(emb.dtype)], 1), use_cache=False)
        return out.last_hidden_state[:, self.n_prefix :]

    def score(
        self, cont: Int[Tensor, "b m"] | Sequence[Sequence[int]], lengths: Int[Tensor, " b"] | None = None
    ) -> Float[Tensor, " b"]:
        """One float32 score per row; rows are right-padded continuations with true ``lengths``."""
        cont, lengths = _as_batch(cont, lengths, self.device)
        with torch.inference_mode(), row_tiles(self.model, self.tiles):
            parts = by_bucket(cont, lengths, self._score_rows)
            if len(parts) == 1:
                return parts[0][1]
            out = parts[0][1].new_empty(cont.shape[0])
            for sel, part in parts:
                out[sel.to(out.device)] = part
            return out

    def _score_rows(self, cont: Tensor, lengths: Tensor) -> Tensor:
        n_in = cont.shape[1] - int(self.head.drops_last_input)
        hidden = self.hidden(input_ids=cont[:, :n_in])
        return self.head.score(hidden, *_on(hidden, cont, lengths)).float()

    def score_prefixes(self, responses: Sequence[Sequence[int]], chunk: int = 256) -> list[Float[Tensor, " m"]]:
        """For each response, the score of every prefix ``ids[:k]`` (k = 1..m) as the continuation, from one
        batched forward over the responses (right-padded): in a causal model the hidden state at position k is
        that of ``prefix + ids[:k]`` alone, so the head reads each prefix's score there (a reward head at its k-th
        token, the log-probability summed over the first k). The head runs on ``chunk`` prefixes at a time."""
        cont, lengths = _as_batch([list(r) for r in responses], None, self.device)
        out: list = [None] * cont.shape[0]
        with torch.inference_mode(), row_tiles(self.model, self.tiles):
            for sel, part in by_bucket(cont, lengths, lambda c, n: self._prefix_scores(c, n, chunk)):
                for i, scores in zip(sel.tolist(), part):
                    out[i] = scores
        return out

    def _prefix_scores(self, cont: Tensor, lengths: Tensor, chunk: int) -> list[Float[Tensor, " m"]]:
        n_in = cont.shape[1] - int(self.head.drops_last_input)
        sizes = lengths.tolist()
        hidden = self.hidden(input_ids=cont[:, :n_in])
        if hasattr(self.head, "prefix_scores"):  # the log-probabilities: each token's read once, then summed
            table = self.head.prefix_scores(hidden, *_on(hidden, cont, lengths)).float()
            return [table[b, :n] for b, n in enumerate(sizes)]
        # one virtual row per prefix: row ``which[i]`` of the batch, its first ``upto[i]`` ids
        which = torch.cat([torch.full((n,), b) for b, n in enumerate(sizes)])
        upto = torch.cat([torch.arange(1, n + 1) for n in sizes])
        rows, which, upto = _on(hidden, cont, which, upto)
        flat = torch.cat([self.head.score(hidden[which[s : s + chunk]], rows[which[s : s + chunk]],
                                          upto[s : s + chunk]).float() for s in range(0, len(which), chunk)])
        return list(flat.split(sizes))

    def score_embeds(
        self,
        embeds: Float[Tensor, "b n d"],
        cont: Int[Tensor, "b m"],
        lengths: Int[Tensor, " b"] | None = None,
        onehot: Float[Tensor, "b k v"] | None = None,
    ) -> Float[Tensor, " b"]:
        """Differentiable twin of `score`: the model's input given as embeddings (its first ``n`` rows are the
        continuation's first ``n`` tokens; GCG passes ``onehot @ W_E`` for the optimised ones). Families outside
        the shared-prefix attention run eager attention here, whose backward is deterministic."""
        cont, lengths = _as_batch(cont, lengths, self.device)
        if self.shared is None and self.use_cache:
            # the model's own attention (SDPA) has a non-deterministic backward on CUDA (same-seed GCG runs would
            # differ); eager attention's matmuls and softmax are deterministic
            from probe.kernels.prefix_attention import using_attention

            with using_attention(self.backbone, "eager"):
                hidden = self.hidden(inputs_embeds=embeds)
        else:
            hidden = self.hidden(inputs_embeds=embeds)
        cont, lengths = _on(hidden, cont, lengths)
        return self.head.score(hidden, cont, lengths, onehot=None if onehot is None else onehot.to(hidden.device)).float()


class FullSequenceScorer:
    """Reference path: ``prefix + continuation`` through the model's own forward, no cache, no padding. Rows of one
    length run together, ``batch_size`` at a time (None: all of them, the batch the caller planned: the fast path of
    the families scored by their own forward, encoders and PairRM); the scores stay on the device until one copy to
    the host per call."""

    def __init__(self, model: torch.nn.Module, head: ScoreHead, prefix_ids: Sequence[int],
                 batch_size: int | None = 1):
        require_trained_attention(model)
        self.model, self.head, self.batch_size = model, head, batch_size
        self.prefix_ids = list(prefix_ids)
        self.device = input_device(model)

    def score(self, cont, lengths=None) -> Float[Tensor, " b"]:
        cont, lengths = _as_batch(cont, lengths, self.device)
        if cont.shape[0] == 0:
            return torch.empty(0, dtype=torch.float32)
        prefix = torch.tensor(self.prefix_ids, device=self.device, dtype=torch.long)
        sizes = lengths.tolist()
        by_len: dict[int, list[int]] = {}
        for i, n in enumerate(sizes):
            by_len.setdefault(n, []).append(i)
        step = self.batch_size or len(sizes)
        parts, order = [], []
        from probe.kernels.prefix_attention import supported

        tiles = tile_rows(self.device)
        # the model's own attention in fixed row groups, for the decoder families whose modules call transformers'
        # attention interface (encoders, T5 and remote code keep theirs)
        attention = attention_tiles(backbone_of(self.model), tiles) if supported(self.model) else nullcontext()
        with torch.inference_mode(), row_tiles(self.model, tiles), attention:
            for n, idx in by_len.items():
                for s in range(0, len(idx), step):
                    part = idx[s : s + step]
                    rows = cont[torch.tensor(part, device=self.device), :n]
                    ids = torch.cat([prefix[None].expand(len(part), -1), rows], 1)
                    parts.append(self.head.own_forward(self.model, ids, len(self.prefix_ids)).float())
                    order += part
        out = torch.empty(len(sizes), dtype=torch.float32)
        out[torch.tensor(order)] = torch.cat([p.to(parts[0].device) for p in parts]).cpu()  # one copy to the host
        return out
