"""Packed shared-prefix attention: rows of any length back to back in one forward of a fixed number of tokens.

A forward of the shared-prefix families (kernels/prefix_attention.py) runs on a *tile*: exactly ``TILE_ROWS``
token positions (probe/core/invariance.py), rows of any length packed one after another (a row never split), the
rest padding. Every linear layer, norm and activation then sees one shape whatever the batch, and a short row costs
its own tokens, not a whole padded row of the longest length (the tiles of the second GPU lease padded small forwards
to 4,096 rows: whole responses ran at 365 per second instead of 612).

Attention cannot be packed that way: a row attends to the prefix and to its own earlier tokens only. Here each row's
queries, keys and values are gathered into groups of rows of one length bucket (`probe.core.invariance.bucket_length`),
a fixed number of rows per group (``max(1, GROUP_ROWS // bucket)``, padded by repeating a row), and each group goes
through the shared-prefix kernel (`_attend`: the prefix's keys and values read once, the new tokens causal among
themselves, one softmax over both) exactly as a batch of equal rows does; the outputs go back to the rows' places. A
row's attention is then a call whose shape is set by the row alone. A row padded to its bucket is right-padded: its
real queries never see the padding (causal), and the padded keys' probabilities are exact zeros.

The plan (`Pack`) is built once per forward on the host and its index tensors moved to the device once; every layer
reuses it (no host sync inside the forward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from probe.kernels.prefix_attention import SharedPrefix, _attend, using_attention

NAME = "rm_packed_prefix"


@dataclass
class Group:
    """One attention call: ``index`` [g, S] tile positions of its rows' tokens (padding repeats a real position),
    ``src`` the flat places in [g * S] of the real tokens, ``dst`` their tile positions."""

    index: Tensor
    src: Tensor
    dst: Tensor


@dataclass
class Pack:
    """The rows of one tile: (start, length) per row, and the attention groups over them."""

    prefix: SharedPrefix
    length: int  # token positions in the tile
    rows: list[tuple[int, int]]
    groups: list[Group] = field(default_factory=list)


def plan(prefix: SharedPrefix, rows: list[tuple[int, int]], length: int, device: torch.device) -> Pack:
    """The attention groups of a tile holding ``rows`` ((start, n) each, n >= 1) in ``length`` positions."""
    from probe.core.invariance import bucket_length, fixed_groups, group_rows

    pack = Pack(prefix, length, rows)
    by_bucket: dict[int, list[int]] = {}
    for r, (_, n) in enumerate(rows):
        by_bucket.setdefault(bucket_length(n, device), []).append(r)
    for width, members in by_bucket.items():
        per = max(1, group_rows(device) // width)
        for group, real in fixed_groups(members, per):
            index, src, dst = [], [], []
            for slot, r in enumerate(group):
                start, n = rows[r]
                index.append([start + min(j, n - 1) for j in range(width)])
                if slot < real:
                    src += [slot * width + j for j in range(n)]
                    dst += [start + j for j in range(n)]
            pack.groups.append(Group(torch.tensor(index, device=device), torch.tensor(src, device=device),
                                     torch.tensor(dst, device=device)))
    return pack


def packed_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling=None,
                     dropout: float = 0.0, softcap=None, sliding_window=None, rm_pack: Pack | None = None, **kwargs):
    """query [1, H, T, d]; key/value [1, KVH, T, d] of the tile's tokens. Returns ([1, T, H, d], None); positions
    outside every row (the tile's padding) get zeros."""
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, heads, d]
    out = q.new_zeros(q.shape)
    for g in rm_pack.groups:
        rows = g.index.shape[0]
        o = _attend(module, q[g.index].transpose(1, 2), k[g.index].transpose(1, 2), v[g.index].transpose(1, 2),
                    scaling, softcap, sliding_window, rm_pack.prefix)  # [g, S, H, d]
        out[g.dst] = o.reshape(rows * g.index.shape[1], *o.shape[2:])[g.src]
    return out[None], None


_registered = False


def using_packed(backbone):
    """The backbone's attention switched to the packed one for the duration of one forward."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, packed_attention)
        _registered = True
    return using_attention(backbone, NAME)
