"""Shared-prefix attention: every row of a batch attends to one prefix's keys and values, read once.

The plain path (the reference, `probe.core.cache.replicate`) gives each row a view of the prefix cache and lets
the model's attention concatenate it with the row's new keys: per layer, a [rows, kv_heads, prefix + new, d]
copy of keys and values, which grouped-query attention then expands to all heads. Here, as in Hydragen or
FlashInfer's cascade attention, the new tokens' queries of all rows are stacked and multiplied with the
single prefix K/V (one matmul per key-value head, no copies), the new tokens attend to each other causally,
and one softmax spans both parts. Soft-capping (Gemma 2) and sliding windows are applied as the model would.

Half precision: scores, softmax and the weighted sum are computed in float32 and the output is rounded once,
as the fused attention kernels the model's own forward runs (SDPA's flash and memory-efficient kernels, CPU
and CUDA) accumulate. Rounding the scores to bf16 before the softmax, and the two partial outputs before their
sum, put the bf16 sweep 0.06-0.12 (on scores of about 1) away from the model's own bf16 forward on a tiny Llama,
where the model's own cache path is 0.002 away (tests/unit/test_kernels.py). The float32 part is small:
attention over a ~60-token prefix is under 1% of a real model's FLOPs per new token.

The model runs the new tokens with explicit position ids (prefix length onward) and no cache; transformers
builds no mask for an attention implementation it does not know, and hands extra forward keyword arguments
down to the attention function, which is how the prefix K/V arrive (``rm_shared_prefix``).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

NAME = "rm_shared_prefix"
# families whose attention modules are tested against the plain path (tests/unit/test_kernels.py; the newer decoders,
# tests/unit/test_shared_prefix_coverage.py: each module hands the attention function its new tokens' keys and values
# after RoPE or NoPE, its scaling, soft-cap and sliding window, and caches the same keys and values). Not: attention
# sinks (GPT-OSS), latent attention whose values differ in width from the keys (DeepSeek-V3, Mistral 4), chunked
# attention (Llama 4), layers that read another layer's keys and values (Gemma 4's shared key-value layers), and
# every hybrid with recurrent layers (probe/core/cache.py)
SUPPORTED_MODEL_TYPES = ("llama", "gemma2", "gemma3_text", "qwen2", "qwen3",
                         "cohere2", "exaone4", "gemma4_text", "glm4", "glm4_moe", "granite", "ministral", "ministral3",
                         "mixtral", "olmo2", "olmo3", "phi3", "qwen2_moe", "qwen3_moe", "seed_oss", "smollm3")


@dataclass
class SharedPrefix:
    """Per layer: prefix keys and values [1, kv_heads, L, d] (L < prefix length in sliding-window layers)."""

    keys: list[Tensor]
    values: list[Tensor]
    length: int  # tokens in the prefix (absolute position of the first new token)

    @classmethod
    def from_cache(cls, cache, length: int) -> SharedPrefix:
        """Keys and values in the attention's working precision (float32 for a half-precision cache), once."""
        return cls([_working(layer.keys) for layer in cache.layers],
                   [_working(layer.values) for layer in cache.layers], length)


def _working(x: Tensor) -> Tensor:
    """float32 for half-precision tensors (the accumulation dtype of fused attention kernels), else as is."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def shared_prefix_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling=None,
                            dropout: float = 0.0, softcap=None, sliding_window=None, rm_shared_prefix=None, **kwargs):
    """query [B, H, n, d]; key/value [B, KVH, n, d] of the new tokens only. Returns ([B, n, H, d], None). The
    scoring forwards call it through packed tiles (kernels/packed_attention.py), a fixed number of rows a call;
    called directly (GCG's gradient, one row) it takes the batch as it comes."""
    return _attend(module, query, key, value, scaling, softcap, sliding_window, rm_shared_prefix), None


def _attend(module, query: Tensor, key: Tensor, value: Tensor, scaling, softcap, sliding_window,
            prefix: SharedPrefix) -> Tensor:
    kp, vp = prefix.keys[module.layer_idx][0], prefix.values[module.layer_idx][0]  # [KVH, L, d], working dtype
    out_dtype = query.dtype
    query, key, value = _working(query), _working(key), _working(value)
    b, h, n, d = query.shape
    kvh, length = key.shape[1], kp.shape[1]
    g = h // kvh
    scaling = d**-0.5 if scaling is None else scaling
    # prefix scores for all rows at once: [KVH, B*G*n, d] @ [KVH, d, L]
    q_stack = query.reshape(b, kvh, g, n, d).permute(1, 0, 2, 3, 4).reshape(kvh, b * g * n, d)
    s_pre = torch.matmul(q_stack, kp.transpose(1, 2)).view(kvh, b, g, n, length).permute(1, 0, 2, 3, 4)
    s_new = torch.matmul(query.reshape(b, kvh, g * n, d), key.transpose(2, 3)).view(b, kvh, g, n, n)
    scores = torch.cat([s_pre, s_new], -1) * scaling  # [B, KVH, G, n, L + n]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    q_pos = prefix.length + torch.arange(n, device=query.device)
    k_pos = torch.cat([prefix.length - length + torch.arange(length, device=query.device), q_pos])
    visible = k_pos[None, :] <= q_pos[:, None]
    if sliding_window is not None:
        visible &= k_pos[None, :] > q_pos[:, None] - sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    p_pre, p_new = probs[..., :length], probs[..., length:]
    out_pre = torch.matmul(p_pre.permute(1, 0, 2, 3, 4).reshape(kvh, b * g * n, length), vp)  # [KVH, B*G*n, d]
    out_pre = out_pre.view(kvh, b, g, n, d).permute(1, 0, 2, 3, 4)
    out_new = torch.matmul(p_new.reshape(b, kvh, g * n, n), value).view(b, kvh, g, n, d)
    return (out_pre + out_new).reshape(b, h, n, d).transpose(1, 2).to(out_dtype).contiguous()


def supported(model) -> bool:
    return supported_config(model.config)


def supported_config(config) -> bool:
    """Whether the shared-prefix attention is exact for a model of ``config``: a family above, none of whose layers
    reads another's keys and values."""
    text = config.get_text_config()
    return getattr(text, "model_type", None) in SUPPORTED_MODEL_TYPES and not getattr(text, "num_kv_shared_layers", 0)


_registered = False


def ensure_registered() -> None:
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, shared_prefix_attention)
        _registered = True


@contextmanager
def using_attention(backbone, name: str):
    """The backbone's attention implementation switched to ``name`` for the duration of the block."""
    config = backbone.config
    before = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = before


def using_shared_prefix(backbone):
    """Switch the backbone's attention implementation to the shared-prefix one for the duration of one forward."""
    ensure_registered()
    return using_attention(backbone, NAME)
