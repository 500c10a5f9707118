"""The memory plan: bytes a scoring batch needs, from a config alone (no weights). It picks the GPU batch size
and is what ``--dry-run`` prints.

Three paths run a batch, and they hold different things per row (``n`` new tokens per row, ``L`` prefix tokens):

* ``shared``: the shared-prefix attention (kernels/prefix_attention.py, the families it supports). Nothing of the
  prefix is copied per row. Each layer runs in turn with ``use_cache=False``, so a row holds, one layer at a
  time, the widest of its attention (float32 queries, keys and values of the new tokens, three float32
  ``heads x n x (L + n)`` score tensors: the scores, the masked scores and the probabilities, and float32
  partial outputs) and its MLP.
* ``cache``: the plain cache path (every other causal family). Each row gets a view of the prefix cache, and
  the model's cache update concatenates it with the row's new keys and values, so every layer keeps a
  ``(L + n)``-token copy per row until the forward ends; attention expands grouped keys and values to all heads.
  A model with recurrent state (linear attention, state-space and convolution layers: probe/core/cache.py) also
  copies that state per row, whatever ``L`` (51 MB a row for Qwen3.5-9B's layout in float32), and its layers' chunked
  kernels pad the new tokens to their chunk (Mamba-2's 256: a ``heads x 256 x 256`` float32 matrix per row and
  layer). For these the row is measured, not counted by hand: the continuation runs on the meta device (no memory,
  no weights) and every tensor it creates is added up (`measured_cache`; within 1.35x of the CPU's counted peak).
* ``full``: whole sequences through the model's own forward (encoders, remote code, pairwise encoders): the
  activations of ``L + n`` tokens and the ``heads x (L + n)^2`` attention scores.

The head adds per row, after the layers: the log-probability head, fused (kernels/fused_logprob.py, what sweeps
use), one ``chunk x positions`` product in the model's dtype and its float32 copy; unfused (GCG's soft rows), three
float32 vocabulary rows per position; a reward or judge head, nothing worth counting.

Fixed, once per prompt: the prefix cache in the model's dtype and, for the shared path in half precision, its
float32 working copy (``SharedPrefix``); a second model (``--ref``) or a pairwise model's second order holds its
own. On a GPU, whose products run in fixed tiles of token rows (probe/core/invariance.py), one tile's working set
whatever the batch (`tile_floor`). Weights are not counted here: a plan on a loaded model reads the free memory after they are loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FUSED_CHUNK = 4096  # kernels/fused_logprob.py's vocabulary chunk
MAX_BATCH = 4096
FREE_FRACTION = 0.7  # of the free memory: allocator fragmentation, cuBLAS workspaces, the other batch's leftovers
PATHS = ("shared", "cache", "full")


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def attention_heads(config) -> tuple[int, int, int]:
    """(query heads, key-value heads, head dimension) of any decoder or encoder config: GQA's
    ``num_key_value_heads``, Falcon's ``num_kv_heads`` (one head under its old multi-query layout), else MHA."""
    c = _text_config(config)
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or getattr(c, "num_kv_heads", None) or heads
    if getattr(c, "multi_query", False) and not getattr(c, "new_decoder_architecture", False):
        kv = 1
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    return heads, kv, head_dim


def mlp_width(config) -> int:
    """The MLP's inner width: ``intermediate_size`` (Llama, Gemma, Qwen, BERT), OPT's ``ffn_dim``, GPT-2's
    ``n_inner``, Falcon's ``ffn_hidden_size``, T5's ``d_ff``; GPT-2 and Falcon default to 4 x hidden."""
    c = _text_config(config)
    for name in ("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "d_ff"):
        if value := getattr(c, name, None):
            return int(value)
    return 4 * c.hidden_size


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Keys and values of one token over all layers."""
    _, kv, head_dim = attention_heads(config)
    return _text_config(config).num_hidden_layers * 2 * kv * head_dim * _elem(dtype)


@dataclass(frozen=True)
class RowCost:
    """Bytes one batch row needs. ``layers``: held until the forward ends, spread over the devices as the layers
    are (the plain cache path's per-row prefix copies); ``transient``: the widest single layer's working set,
    on every device that runs a layer; ``head``: on the device of the head, after the layers' transients are
    freed (so a device needs the larger of the two, not their sum)."""

    layers: int
    transient: int
    head: int

    @property
    def total(self) -> int:
        return self.layers + max(self.transient, self.head)  # the head runs after the last layer


def head_bytes(config, positions: int, dtype: torch.dtype, mode: str, fused: bool = True) -> int:
    if mode != "logprob" or positions <= 0:
        return 0
    vocab = _text_config(config).vocab_size
    if fused:  # one chunk's product in the model's dtype, and its float32 copy unless it is float32 already
        elem = _elem(dtype)
        return positions * min(FUSED_CHUNK, vocab) * (elem + (4 if elem != 4 else 0))
    return positions * 3 * vocab * 4


def _recurrent(config) -> bool:
    """Whether rows of this model copy a recurrent state or continue one token at a time (probe/core/cache.py)."""
    from probe.core.cache import UnsupportedCache, plan

    try:
        reuse = plan(config)
    except (UnsupportedCache, AttributeError, TypeError, ValueError):
        return False
    return reuse.path == "cache" and (reuse.recurrent or reuse.stepwise)


_META: dict = {}


def _meta_backbone(config, dtype: torch.dtype):
    """The decoder stack of ``config`` on the meta device (no memory), its MoE experts as one batched product (the
    grouped product needs real routing), once per config and dtype."""
    key = (id(config), dtype)
    if key not in _META:
        from transformers import AutoModel

        with torch.device("meta"):
            try:
                model = AutoModel.from_config(config, dtype=dtype, experts_implementation="batched_mm")
            except (TypeError, ValueError):  # a transformers without the experts' choice
                model = AutoModel.from_config(config, dtype=dtype)
        _META[key] = (config, model.eval())  # the config held: its id is not reused while cached
    return _META[key][1]


class _CountNew:
    """Bytes of every tensor an operation creates (not its views), alive at once at the peak: a dispatch mode that
    works on the meta device, where tensors have sizes but no storage."""

    def __init__(self):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        counter = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                returns = func._schema.returns
                for i, t in enumerate(tree_flatten(out)[0]):
                    if not isinstance(t, torch.Tensor) or (i < len(returns) and returns[i].alias_info is not None):
                        continue
                    n = t.numel() * t.element_size()
                    counter.live += n
                    counter.peak = max(counter.peak, counter.live)
                    weakref.finalize(t, counter.free, n)
                return out

        self.mode, self.live, self.peak = Mode(), 0, 0

    def free(self, n: int) -> None:
        self.live -= n


def measured_cache(config, n_prefix: int, n_in: int, dtype: torch.dtype) -> tuple[int, int] | None:
    """(bytes one row of ``n_in`` new tokens needs on the plain cache path, bytes of the ``n_prefix``-token prefix's
    cache), measured on the meta device: the peak of 2 rows minus that of 1. None where the model does not run
    there."""
    from probe.core.cache import check_replicable, continue_prefix, plan, row_state_bytes
    from probe.core.engine import cache_keyword, output_cache

    try:
        backbone = _meta_backbone(config, dtype)
        stepwise = plan(config).steps(n_in)
        with torch.no_grad():
            out = backbone(input_ids=torch.zeros(1, n_prefix, dtype=torch.long, device="meta"), use_cache=True)
            cache = output_cache(out)
            check_replicable(cache)
            peaks = []
            for rows in (1, 2):
                count = _CountNew()
                with count.mode:
                    continue_prefix(backbone, cache_keyword(backbone), cache, n_prefix,
                                    torch.zeros(rows, n_in, dtype=torch.long, device="meta"), stepwise=stepwise)
                peaks.append(count.peak)
    except Exception:  # noqa: BLE001 (a plan that cannot be measured falls back to the count by hand)
        return None
    keys_values = sum(t.numel() * t.element_size() for layer in cache.layers
                      for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                      if isinstance(t, torch.Tensor))
    return max(0, peaks[1] - peaks[0]), keys_values + row_state_bytes(cache)


def row_cost(config, n_prefix: int, n_new: int, dtype: torch.dtype, mode: str, path: str = "shared",
             fused: bool = True) -> RowCost:
    """What one row of ``n_new`` new tokens on an ``n_prefix``-token prefix needs on ``path`` (module doc)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, not {path!r}")
    c = _text_config(config)
    elem = _elem(dtype)
    heads, kv, head_dim = attention_heads(config)
    # the log-probability head never feeds the continuation's last token (LogprobHead.drops_last_input)
    n_in = max(1, n_new - 1) if mode == "logprob" else n_new
    positions = n_new - 1 if mode == "logprob" else 0
    if path == "cache" and _recurrent(config) and (found := measured_cache(config, n_prefix, n_in, dtype)):
        # what the head reads besides (a copy of the row's final hidden states, its score) is held with the layers'
        return RowCost(found[0] + n_in * c.hidden_size * elem, 0, head_bytes(config, positions, dtype, mode, fused))
    tokens = n_in if path != "full" else n_prefix + n_in
    keys = n_prefix + n_in  # what each new token attends to
    stream = tokens * 4 * c.hidden_size * elem  # the layer's input, its normed copy, projections, the residual sum
    mlp = stream + tokens * 3 * mlp_width(c) * elem  # gate, up and their product alive together
    if path == "shared":
        attn = (stream
                + 2 * 4 * (heads + 2 * kv) * n_in * head_dim  # float32 q, k, v and their rotated copies
                + 4 * 4 * heads * n_in * keys  # prefix scores, all scores, masked scores, probabilities (float32)
                + 3 * 4 * heads * n_in * head_dim)  # the two partial outputs and their sum (float32)
        held = 0
    elif path == "cache":
        # keys and values expanded to all heads (GQA's repeat_kv) and the float32 scores of an unfused kernel
        attn = stream + 2 * heads * head_dim * keys * elem + heads * n_in * keys * 4
        held = kv_bytes_per_token(config, dtype) * keys
    else:
        attn = stream + heads * tokens * tokens * 4 + 3 * heads * tokens * head_dim * elem
        held = 0
    return RowCost(held, max(attn, mlp), head_bytes(config, positions, dtype, mode, fused))


def fixed_bytes(config, n_prefix: int, dtype: torch.dtype, path: str = "shared") -> int:
    """Once per prompt: the prefix cache (with a recurrent model's state, measured: `measured_cache`), and for the
    shared path in half precision its float32 working copy."""
    if path == "full":
        return 0
    if path == "cache" and _recurrent(config) and (found := measured_cache(config, n_prefix, 1, dtype)):
        return found[1]
    cache = kv_bytes_per_token(config, dtype) * n_prefix
    if path == "shared" and dtype in (torch.float16, torch.bfloat16):
        cache += kv_bytes_per_token(config, torch.float32) * n_prefix
    return cache


def tile_floor(config, dtype: torch.dtype, mode: str, tile_rows: int | None, fused: bool = True) -> int:
    """What one forward holds whatever its batch where products run in fixed tiles of ``tile_rows`` token rows
    (probe/core/invariance.py: a GPU): a zero-padded tile's MLP (its input, gate, up and their product) or, for the
    fused log-probability head, a tile of positions' vocabulary chunk. 0 without tiles."""
    if not tile_rows:
        return 0
    c = _text_config(config)
    mlp = tile_rows * (c.hidden_size + 3 * mlp_width(c)) * _elem(dtype)
    return max(mlp, head_bytes(config, tile_rows + 1, dtype, mode, fused))


def batch_for(free: float | int, fixed: float | int, per_row: float | int, cap: int = MAX_BATCH) -> int:
    """The largest power of two of rows (at most ``cap``) whose cost fits in `FREE_FRACTION` of ``free`` after
    ``fixed``; 0 if not even one row fits."""
    room = FREE_FRACTION * free - fixed
    if per_row <= 0:
        return cap if room > 0 else 0
    rows = int(room // per_row)
    return 0 if rows < 1 else min(cap, 1 << (rows.bit_length() - 1))


@dataclass(frozen=True)
class Part:
    """One model's share of a batch on one device: the fraction of its layers there, and whether its head is."""

    cost: RowCost
    fixed: int
    layer_share: float
    has_head: bool

    def per_row(self) -> float:
        transient = self.cost.transient if self.layer_share > 0 else 0
        return self.layer_share * self.cost.layers + max(transient, self.cost.head if self.has_head else 0)


def plan_devices(free: dict, parts: dict) -> int:
    """The batch size that fits on every device: ``free[device]`` bytes, ``parts[device]`` the `Part`s of the
    models (the model, ``--ref``'s reference, a pairwise model's second order) placed there. Models that run one
    after the other on the same rows need their fixed costs together but their per-row costs one at a time."""
    sizes = []
    for device, here in parts.items():
        if not here:
            continue
        fixed = sum(p.layer_share * p.fixed for p in here)
        sizes.append(batch_for(free[device], fixed, max(p.per_row() for p in here)))
    return min(sizes) if sizes else MAX_BATCH
