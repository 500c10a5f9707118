"""The shared-prefix KV cache: computed once per prompt, replicated over each batch as a view.

`replicate` returns a new `DynamicCache` whose layers hold ``prefix.expand(batch, ...)`` (no copy). The
forward then appends the continuation's keys and values per layer, so the prefix itself is never recomputed.
Only the plain dynamic layer types are supported (full and sliding window); anything else raises, and the
callers fall back to the full-sequence path.
"""

from __future__ import annotations

import copy

from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

SUPPORTED_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer)


class UnsupportedCache(NotImplementedError):
    pass


def check_replicable(cache) -> None:
    if not isinstance(cache, DynamicCache):
        raise UnsupportedCache(f"the model returned a {type(cache).__name__}, not a DynamicCache")
    for layer in cache.layers:
        if type(layer) not in SUPPORTED_LAYERS:
            raise UnsupportedCache(f"cache layer {type(layer).__name__} is not supported for prefix sharing")
        if layer.is_initialized and layer.keys.shape[0] != 1:
            raise UnsupportedCache("the prefix cache must have batch size 1")


def replicate(cache: DynamicCache, batch: int) -> DynamicCache:
    """A fresh cache over ``batch`` rows that all start with the cached prefix; ``cache`` is left untouched."""
    out = copy.copy(cache)
    out.layers = []
    for layer in cache.layers:
        new = copy.copy(layer)  # keeps per-layer state such as the sliding window's cumulative length
        if layer.is_initialized:
            new.keys = layer.keys.expand(batch, -1, -1, -1)
            new.values = layer.values.expand(batch, -1, -1, -1)
        out.layers.append(new)
    return out
