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
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from probe.core.cache import UnsupportedCache, architecture, check_replicable, continue_prefix, plan
from probe.core.heads import ScoreHead
from probe.core.invariance import (buckets, check_device, cpu_activations, fixed_groups, rows_per_forward, tail_rows,
                                   tile_rows)
from probe.core.packing import (Tiles, TileFill, _as_batch, _on, gather_hidden, layout, pad_rows,  # noqa: F401
                                run_tiles, token_table)
from probe.models.attention import require_trained_attention, softcap_of


def fit(cont: Tensor, width: int) -> Tensor:
    """Right-padded rows cut or padded (repeating each row's last column) to ``width`` columns."""
    m = cont.shape[1]
    if width <= m:
        return cont[:, :width]
    return torch.cat([cont, cont[:, -1:].expand(-1, width - m)], 1)


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
    there, to be removed in 5.40), ``cache_params`` in the state-space models (Mamba) before that, and
    ``past_key_values`` elsewhere (older releases and remote code)."""
    import inspect

    params = inspect.signature(module.forward).parameters
    return next((k for k in ("cache", "cache_params") if k in params), "past_key_values")


def output_cache(out):
    """The cache a forward with ``use_cache=True`` returned, under whichever name this transformers and this model
    give it (`cache_keyword`'s three)."""
    for key in ("cache", "past_key_values", "cache_params"):
        if out.get(key) is not None:
            return out[key]
    raise TypeError(f"{type(out).__name__} returned no cache (fields: {', '.join(out.keys())})")


def _assemble(parts: list[tuple[list[int], Tensor]], n: int) -> Tensor:
    """Per-group results (row indices, scores) as one tensor in row order, on the first group's device."""
    if not parts:
        return torch.empty(0, dtype=torch.float32)
    dev = parts[0][1].device
    out = torch.empty(n, dtype=torch.float32, device=dev)
    for rows, part in parts:
        out[torch.tensor(rows, device=dev)] = part.to(dev)
    return out


class PrefixScorer:
    """Scores continuations of one prefix: ``score([[t, *suffix], ...]) -> scores``.

    Every forward, attention call and head call has a shape set by the row alone (probe/core/invariance.py): on the
    shared-prefix attention's families rows are packed into tiles of ``TILE_ROWS`` tokens (kernels/packed_attention.py),
    elsewhere a fixed number of rows of one length go through each forward. The scores are then the same bits at
    every batch size, order and split of the rows."""

    def __init__(self, model: torch.nn.Module, head: ScoreHead, prefix_ids: Sequence[int], use_cache: bool = True,
                 shared_attention: bool = True):
        """``shared_attention`` (default): read the prefix K/V once per attention call (kernels/prefix_attention.py)
        with the rows packed into full tiles, for the families that kernel supports (measured 1.49x on the CPU
        sweep, experiments/results/bench_sweep.md); other families, and ``False``, take the plain cache path."""
        if not prefix_ids:
            raise ValueError("empty prefix")
        require_trained_attention(model)
        self.reuse = plan(model.config)  # how rows continue the prefix (probe/core/cache.py)
        if self.reuse.path != "cache":
            raise UnsupportedCache(f"{architecture(model.config)}: {self.reuse.why}; GCG, the beam and traces read a "
                                   "continuation of the prefix: not supported for it (sweeps, whole responses, judges "
                                   "and social items run each sequence through the model's own forward)")
        self.model, self.head, self.use_cache = model, head, use_cache
        self.backbone = backbone_of(model)
        self.device = input_device(model)
        self.tiles = tile_rows(self.device)  # token rows per forward (probe/core/invariance.py)
        self.row_check = check_device(model, self.device)
        self.prefix = torch.tensor(list(prefix_ids), device=self.device)[None]
        with torch.no_grad(), cpu_activations(model):  # not inference_mode: GCG back-propagates through this cache
            out = self.backbone(input_ids=self.prefix, use_cache=True)
        self.cache = output_cache(out)
        check_replicable(self.cache)
        self.prefix_hidden: Float[Tensor, "p d"] = out.last_hidden_state[0]
        head.prepare(list(prefix_ids), self.prefix_hidden)
        self.shared = None
        if shared_attention and use_cache:
            from probe.kernels.prefix_attention import SharedPrefix, supported

            if supported(model):
                self.shared = SharedPrefix.from_cache(self.cache, self.n_prefix)
        self.packed = self.shared is not None and self.tiles is not None
        self.softcap = softcap_of(model.config) is not None  # attention groups padded past a tanh's tail (CPU)
        self.layout = "packed" if self.packed else "rows"
        self.fill = TileFill()
        self._layouts: dict = {}  # tile layouts by the rows' lengths, most recent last

    @property
    def n_prefix(self) -> int:
        return self.prefix.shape[1]

    def hidden(
        self, input_ids: Int[Tensor, "b n"] | None = None, inputs_embeds: Float[Tensor, "b n d"] | None = None
    ) -> Float[Tensor, "b n d"]:
        """Final hidden states of the new tokens (ids or embeddings) on top of the shared prefix, the rows as given
        (the scoring methods give a fixed number of rows of one length; GCG's gradient one row)."""
        x = input_ids if input_ids is not None else inputs_embeds
        b, n = x.shape[0], x.shape[1]
        if n == 0:
            return self.prefix_hidden.new_zeros(b, 0, self.prefix_hidden.shape[-1])
        if self.shared is not None and self.use_cache:
            return self._hidden_shared(input_ids, inputs_embeds, b, n)
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

    def _packed(self, cont: Tensor, n_in: list[int]) -> Tiles:
        """The rows' first ``n_in[i]`` ids through packed tiles (probe/core/packing.py), in a layout kept per set of
        lengths (a sweep's batches share one)."""
        key = tuple(n_in)
        where = self._layouts.pop(key, None)
        if where is None:
            where = layout(n_in, [self.n_prefix] * len(n_in), self.tiles, self.device, cont.device, prefix=self.shared,
                           softcap=self.softcap)
        self._layouts[key] = where  # the most recent last
        while len(self._layouts) > 8:
            self._layouts.pop(next(iter(self._layouts)))
        return run_tiles(self.backbone, self.device, cont, where, self.fill)

    def _in_groups(self, cont: Tensor, lengths: Tensor, sizes: list[int], fn,
                   tiles: Tiles | None = None) -> list[tuple[list[int], Any]]:
        """``fn(hidden, rows, lengths)`` on fixed groups of rows of one length bucket, as (row indices, results);
        packed, from ``tiles`` (`_packed`'s, computed here where not given)."""
        n_drop = int(self.head.drops_last_input)
        if self.packed and tiles is None:
            tiles = self._packed(cont, [max(0, n - n_drop) for n in sizes])
        out = []
        for width, idx in buckets(sizes, self.device).items():
            n_in = width - n_drop
            # a packed tile's rows are read by the head a tile's worth at a time; a forward of rows holds as many
            per = rows_per_forward(n_in + (0 if self.use_cache else self.n_prefix), self.device)
            if per is not None and not self.packed:
                self.fill.add(len(idx) * n_in, -(-len(idx) // per) * per * n_in)
            # rows after the group's so that no scored row ends an elementwise tensor (`tail_rows`; the plain cache
            # path's continuation adds its own)
            tail = tail_rows(n_in if self.packed else n_in + (0 if self.use_cache else self.n_prefix), self.device) \
                if (self.packed or not self.use_cache) else 0
            for group, real in fixed_groups(idx, per, tail):
                sel = torch.tensor(group, device=cont.device)
                rows, n = fit(cont[sel], width), lengths[sel]
                hidden = (gather_hidden(tiles, group, n_in, self.prefix_hidden) if self.packed
                          else self.hidden(input_ids=rows[:, :n_in]))
                out.append((group[:real], fn(hidden, rows, n)[:real]))
        return out

    def read(self, cont: Tensor, lengths: Tensor, sizes: list[int], tiles: Tiles | None = None) -> Tensor:
        """The head's scores of the rows (packed: from ``tiles`` where given, e.g. a CUDA graph's replay)."""
        if self.packed and getattr(self.head, "reads_tokens", False):
            tiles = tiles if tiles is not None else self._packed(cont, [max(0, n - 1) for n in sizes])
            table = token_table(tiles, self.head, cont)
            c, n = (cont, lengths) if table is None else _on(table, cont, lengths)
            return self.head.from_tokens(c, n, table).float()
        parts = self._in_groups(cont, lengths, sizes, lambda h, c, n: self.head.score(h, *_on(h, c, n)).float(), tiles)
        return _assemble(parts, cont.shape[0])

    def score(
        self, cont: Int[Tensor, "b m"] | Sequence[Sequence[int]], lengths: Int[Tensor, " b"] | None = None,
        sizes: list[int] | None = None,
    ) -> Float[Tensor, " b"]:
        """One float32 score per row; rows are right-padded continuations with true ``lengths`` (``sizes``: the same
        on the host, where the caller has them: no device sync)."""
        cont, lengths = _as_batch(cont, lengths, self.device)
        sizes = lengths.tolist() if sizes is None else sizes
        with torch.inference_mode(), cpu_activations(self.model):
            return self.read(cont, lengths, sizes)

    def score_prefixes(self, responses: Sequence[Sequence[int]], chunk: int = 256) -> list[Float[Tensor, " m"]]:
        """For each response, the score of every prefix ``ids[:k]`` (k = 1..m) as the continuation, from its forward
        (in a causal model the hidden state at position k is that of ``prefix + ids[:k]`` alone, so the head reads
        each prefix's score there: a reward head at its k-th token, the log-probability summed over the first k).
        The head runs on ``chunk`` prefixes of one response at a time (the last chunk padded)."""
        cont, lengths = _as_batch([list(r) for r in responses], None, self.device)
        out: list = [None] * cont.shape[0]
        with torch.inference_mode(), cpu_activations(self.model):
            sizes = lengths.tolist()
            if self.packed and getattr(self.head, "reads_tokens", False):
                table = token_table(self._packed(cont, [max(0, n - 1) for n in sizes]), self.head, cont)
                c = cont if table is None else _on(table, cont)[0]
                scores = self.head.prefixes_from_tokens(c, table).float()
                return [scores[b, :n] for b, n in enumerate(sizes)]
            for rows, part in self._in_groups(cont, lengths, sizes,
                                              lambda h, c, n: self._prefix_scores(h, c, n, chunk)):
                for i, scores in zip(rows, part):
                    out[i] = scores
        return out

    def _prefix_scores(self, hidden: Tensor, cont: Tensor, lengths: Tensor, chunk: int) -> list[Float[Tensor, " m"]]:
        sizes = lengths.tolist()
        if hasattr(self.head, "prefix_scores"):  # the log-probabilities: each token's read once, then summed
            table = self.head.prefix_scores(hidden, *_on(hidden, cont, lengths)).float()
            return [table[b, :n] for b, n in enumerate(sizes)]
        rows, upto_all = _on(hidden, cont, torch.arange(1, cont.shape[1] + 1))
        out = []
        for b, n in enumerate(sizes):  # one virtual row per prefix of row b, ``chunk`` of them a call
            parts = []
            for group, real in fixed_groups(range(n), min(chunk, n), tail_rows(cont.shape[1], self.device)):
                upto = upto_all[torch.tensor(group, device=upto_all.device)]
                k = len(group)
                parts.append(self.head.score(hidden[b : b + 1].expand(k, -1, -1), rows[b : b + 1].expand(k, -1),
                                             upto).float()[:real])
            out.append(torch.cat(parts))
        return out

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


def takes_rows(model: torch.nn.Module) -> bool:
    """Whether the model's own forward takes several rows of one length at once: not a transformers sequence
    classifier without a pad id ("Cannot handle batch sizes > 1 if no padding token is defined")."""
    config = getattr(model, "config", None)
    return not (type(model).__name__.endswith("ForSequenceClassification") and config is not None
                and config.get_text_config().pad_token_id is None)


class FullSequenceScorer:
    """Reference path: ``prefix + continuation`` through the model's own forward, no cache, no padding. Rows of one
    length run together, a fixed number per forward (``TILE_ROWS`` tokens' worth, probe/core/invariance.py: the last
    group padded by repeating a row), whatever the model's code does inside (encoders, T5, remote code); the scores
    stay on the device until one copy to the host per call. ``batch_size``: at most this many rows per forward (None:
    a tile's worth; where tiles are off, ``RM_PROBE_TILE_ROWS=0``, all rows of a length); a sequence classifier
    without a pad id takes one row a forward (transformers refuses more)."""

    def __init__(self, model: torch.nn.Module, head: ScoreHead, prefix_ids: Sequence[int],
                 batch_size: int | None = 1):
        require_trained_attention(model)
        self.model, self.head, self.batch_size = model, head, batch_size
        self.prefix_ids = list(prefix_ids)
        self.device = input_device(model)
        self.row_check = check_device(model, self.device)
        self.layout = "rows"
        self.fill = TileFill()

    def score(self, cont, lengths=None) -> Float[Tensor, " b"]:
        cont, lengths = _as_batch(cont, lengths, self.device)
        if cont.shape[0] == 0:
            return torch.empty(0, dtype=torch.float32)
        prefix = torch.tensor(self.prefix_ids, device=self.device, dtype=torch.long)
        sizes = lengths.tolist()
        by_len: dict[int, list[int]] = {}
        for i, n in enumerate(sizes):
            by_len.setdefault(n, []).append(i)
        parts = []
        with torch.inference_mode(), cpu_activations(self.model):
            for n, idx in by_len.items():
                per = rows_per_forward(len(self.prefix_ids) + n, self.device)
                if per is None:
                    per = self.batch_size or len(idx)
                elif self.batch_size:
                    per = min(per, self.batch_size)
                tail = tail_rows(len(self.prefix_ids) + n, self.device)
                if not takes_rows(self.model):
                    per, tail = 1, 0  # one row alone: no other row's place to take
                self.fill.add(len(idx) * n, -(-len(idx) // per) * per * n)
                for group, real in fixed_groups(idx, per, tail):
                    rows = cont[torch.tensor(group, device=self.device), :n]
                    ids = torch.cat([prefix[None].expand(len(group), -1), rows], 1)
                    parts.append((group[:real], self.head.own_forward(self.model, ids, len(self.prefix_ids))
                                  .float()[:real]))
        return _assemble(parts, len(sizes)).cpu()  # one copy to the host
