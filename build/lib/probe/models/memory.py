"""Memory estimates per batch row, from a config alone (no weights): used to pick the GPU batch size and by
``--dry-run``."""

from __future__ import annotations

import torch


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    c = _text_config(config)
    heads = c.num_attention_heads
    kv = getattr(c, "num_key_value_heads", None) or heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    elem = torch.empty((), dtype=dtype).element_size()
    return c.num_hidden_layers * 2 * kv * head_dim * elem


def row_bytes(config, n_prefix: int, n_new: int, dtype: torch.dtype, mode: str) -> int:
    """Peak bytes one continuation row adds: its copy of the prefix KV plus its own, the transient activations
    of one layer (the widest of attention scores and MLP), and the head's logits."""
    c = _text_config(config)
    elem = torch.empty((), dtype=dtype).element_size()
    kv = kv_bytes_per_token(config, dtype) * (n_prefix + n_new)
    # GQA repeat_kv expands keys/values to all heads inside attention, one layer at a time
    heads = c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    attn = 2 * heads * head_dim * (n_prefix + n_new) * elem + heads * n_new * (n_prefix + n_new) * 4
    mlp = n_new * (4 * c.hidden_size + 3 * c.intermediate_size) * elem
    head = 3 * n_new * c.vocab_size * 4 if mode == "logprob" else 0
    return kv + attn + mlp + head
