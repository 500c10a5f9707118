"""Packed shared-prefix attention: rows of any length back to back in one forward of a fixed number of tokens.

A forward of the shared-prefix families (kernels/prefix_attention.py) runs on a *tile*: exactly ``TILE_ROWS``
token positions (probe/core/invariance.py), rows of any length packed one after another (a row never split), the
rest padding (probe/core/packing.py). Every linear layer, norm and activation then sees one shape whatever the batch,
and a short row costs its own tokens, not a whole padded row of the longest length (the tiles of the second GPU lease
padded small forwards to 4,096 rows: whole responses ran at 365 per second instead of 612).

Attention cannot be packed that way: a row attends to its prefix and to its own earlier tokens only. Here each row's
queries, keys and values are gathered into groups of rows of one length bucket (rows up to 8 tokens each of its own
length, longer ones padded to a multiple of 8: `attention_bucket`), a fixed number of rows per group (``max(1,
GROUP_ROWS // bucket)``, padded by repeating a row), and each group is one attention call; the outputs go back to the
rows' places. A row's attention is then a call whose shape is set by the row alone. A row padded to its bucket is
right-padded: its real queries never see the padding (causal), and the padded keys' probabilities are exact zeros.
Two variants, one per command (never chosen by the
batch, which would make a row's bits depend on its neighbours):

* **one prefix** (a sweep, whole responses): every row continues the same prefix; a group goes through `_attend`,
  which reads the prefix's keys and values once for all its rows;
* **a prefix per row** (social items: each its own prompt): rows of one length bucket and one prefix-length bucket
  (`PREFIX_BUCKET`) share a group; each row's prefix keys and values are gathered from a pool (`PrefixPool`), padded
  to the bucket, the padding masked (`_attend_rows`).

The plan (`Pack`) is built once per forward on the host and its index tensors moved to the device once; every layer
reuses it (no host sync inside the forward).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from probe.kernels.prefix_attention import SharedPrefix, _attend, _working, using_attention

NAME = "rm_packed_prefix"
PREFIX_BUCKET = {"cpu": 32, "cuda": 64}  # a row's prefix keys padded to a multiple of this (a prefix per row)


ATTENTION_BUCKET = 8  # a row's queries padded to a multiple of this in its attention call (up to it: its own length)


def attention_bucket(n: int) -> int:
    """The length a row of ``n`` new tokens is padded to in its attention call, on every device: the padding costs
    only attention (the tile's linear layers see the row's own tokens), fewer calls cost less."""
    return n if n <= ATTENTION_BUCKET else -(-n // ATTENTION_BUCKET) * ATTENTION_BUCKET


def prefix_bucket(n: int, device: torch.device | str) -> int:
    step = PREFIX_BUCKET.get(torch.device(device).type, 64)
    return -(-n // step) * step


class PrefixPool:
    """The prefixes of one batch of rows (a prefix per row), per layer stacked and zero-padded to the longest's
    bucket: ``keys[layer]`` [prefixes, KVH, P, d]; ``first[layer]``/``count[layer]`` [prefixes] the position of each
    prefix's first kept key and how many it keeps (a sliding-window layer keeps the last ``window`` only)."""

    def __init__(self, prefixes: list[SharedPrefix], device: torch.device):
        self.prefixes = prefixes
        n_layers = len(prefixes[0].keys)
        width = max(prefix_bucket(p.length, device) for p in prefixes)
        self.keys, self.values, self.first, self.count = [], [], [], []
        for layer in range(n_layers):
            ks = [p.keys[layer][0] for p in prefixes]  # [KVH, L, d]
            vs = [p.values[layer][0] for p in prefixes]
            keys = ks[0].new_zeros(len(ks), ks[0].shape[0], width, ks[0].shape[2])
            values = vs[0].new_zeros(len(vs), vs[0].shape[0], width, vs[0].shape[2])
            for i, (k, v) in enumerate(zip(ks, vs)):
                keys[i, :, : k.shape[1]] = k
                values[i, :, : v.shape[1]] = v
            self.keys.append(keys)
            self.values.append(values)
            self.count.append(torch.tensor([k.shape[1] for k in ks], device=keys.device))
            self.first.append(torch.tensor([p.length - k.shape[1] for p, k in zip(prefixes, ks)], device=keys.device))
        self.length = torch.tensor([p.length for p in prefixes], device=self.keys[0].device)


@dataclass
class Group:
    """One attention call: ``index`` [g, S] tile positions of its rows' tokens (padding repeats a real position),
    ``src`` the flat places in [g * S] of the real tokens, ``dst`` their tile positions; a prefix per row: ``which``
    [g] each row's prefix in the pool and ``width`` the padded prefix length."""

    index: Tensor
    src: Tensor
    dst: Tensor
    which: Tensor | None = None
    width: int = 0


@dataclass
class Pack:
    """The rows of one tile and the attention groups over them: ``prefix`` (one prefix) or ``pool`` (one per row)."""

    length: int  # token positions in the tile
    prefix: SharedPrefix | None = None
    pool: PrefixPool | None = None
    groups: list[Group] = field(default_factory=list)
    moved: dict = field(default_factory=dict)  # device -> the groups there (a model spread by --device-map)

    def groups_on(self, device: torch.device) -> list[Group]:
        """The groups' index tensors on ``device`` (a layer's own), moved once per device and forward."""
        if not self.groups or self.groups[0].index.device == device:
            return self.groups
        if device not in self.moved:
            self.moved[device] = [Group(g.index.to(device), g.src.to(device), g.dst.to(device),
                                        None if g.which is None else g.which.to(device), g.width)
                                  for g in self.groups]
        return self.moved[device]


def plan(rows: list[tuple[int, int, int]], length: int, device: torch.device, prefix: SharedPrefix | None = None,
         pool: PrefixPool | None = None, softcap: bool = True) -> Pack:
    """The attention groups of a tile holding ``rows`` ((start, n, prefix index in ``pool``) each, n >= 1) in
    ``length`` positions: one ``prefix`` for all, or a ``pool`` of prefixes. ``softcap``: the model caps its attention
    logits (a tanh over the whole scores tensor, whose scalar tail on a CPU no scored row may sit in: `tail_rows`
    padding rows after each group's); the softmax and the products are row by row, and need none."""
    from probe.core.invariance import fixed_groups, group_rows, tail_rows

    pack = Pack(length, prefix, pool)
    by_key: dict[tuple[int, int], list[int]] = {}
    for r, (_, n, p) in enumerate(rows):
        width = 0 if pool is None else prefix_bucket(pool.prefixes[p].length, device)
        by_key.setdefault((attention_bucket(n), width), []).append(r)
    for (size, width), members in by_key.items():
        per = max(1, group_rows(device) // size)
        for group, real in fixed_groups(members, per, tail_rows(size, device) if softcap else 0):
            index, src, dst = [], [], []
            for slot, r in enumerate(group):
                start, n, _ = rows[r]
                index.append([start + min(j, n - 1) for j in range(size)])
                if slot < real:
                    src += [slot * size + j for j in range(n)]
                    dst += [start + j for j in range(n)]
            which = None if pool is None else torch.tensor([rows[r][2] for r in group], device=device)
            pack.groups.append(Group(torch.tensor(index, device=device), torch.tensor(src, device=device),
                                     torch.tensor(dst, device=device), which, width))
    return pack


def _attend_rows(module, query: Tensor, key: Tensor, value: Tensor, scaling, softcap, sliding_window,
                 pool: PrefixPool, which: Tensor, width: int) -> Tensor:
    """`_attend` with a prefix per row: row i attends to prefix ``which[i]`` of the pool (its keys padded to
    ``width``, the padding masked) and causally to its own new tokens. Returns [b, n, H, d]."""
    layer = module.layer_idx
    kept_on = pool.keys[layer].device  # the layer's own device (a model spread by --device-map)
    w = which.to(kept_on)
    kp, vp = _working(pool.keys[layer][w, :, :width]), _working(pool.values[layer][w, :, :width])
    first, count = pool.first[layer][w].to(query.device), pool.count[layer][w].to(query.device)
    start = pool.length.to(which.device)[which].to(query.device)
    out_dtype = query.dtype
    query, key, value = _working(query), _working(key), _working(value)
    b, h, n, d = query.shape
    kvh = key.shape[1]
    g = h // kvh
    scaling = d**-0.5 if scaling is None else scaling
    q = query.reshape(b, kvh, g * n, d)
    s_pre = torch.matmul(q, kp.transpose(2, 3)).view(b, kvh, g, n, width)
    s_new = torch.matmul(q, key.transpose(2, 3)).view(b, kvh, g, n, n)
    scores = torch.cat([s_pre, s_new], -1) * scaling  # [b, KVH, G, n, width + n]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    steps = torch.arange(width, device=query.device)
    q_pos = start[:, None] + torch.arange(n, device=query.device)  # [b, n]
    k_pos = torch.cat([first[:, None] + steps, q_pos], 1)  # [b, width + n]
    kept = torch.cat([steps[None] < count[:, None], torch.ones_like(q_pos, dtype=torch.bool)], 1)
    visible = kept[:, None, :] & (k_pos[:, None, :] <= q_pos[:, :, None])  # [b, n, width + n]
    if sliding_window is not None:
        visible &= k_pos[:, None, :] > q_pos[:, :, None] - sliding_window
    scores = scores.masked_fill(~visible[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = (torch.matmul(probs[..., :width].reshape(b, kvh, g * n, width), vp)
           + torch.matmul(probs[..., width:].reshape(b, kvh, g * n, n), value))
    return out.view(b, kvh, g, n, d).reshape(b, h, n, d).transpose(1, 2).to(out_dtype).contiguous()


def packed_attention(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, scaling=None,
                     dropout: float = 0.0, softcap=None, sliding_window=None, rm_pack: Pack | None = None, **kwargs):
    """query [1, H, T, d]; key/value [1, KVH, T, d] of the tile's tokens. Returns ([1, T, H, d], None); positions
    outside every row (the tile's padding) get zeros."""
    q, k, v = query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1)  # [T, heads, d]
    out = q.new_zeros(q.shape)
    for g in rm_pack.groups_on(q.device):
        qg, kg, vg = q[g.index].transpose(1, 2), k[g.index].transpose(1, 2), v[g.index].transpose(1, 2)
        if rm_pack.pool is None:
            o = _attend(module, qg, kg, vg, scaling, softcap, sliding_window, rm_pack.prefix)  # [g, S, H, d]
        else:
            o = _attend_rows(module, qg, kg, vg, scaling, softcap, sliding_window, rm_pack.pool, g.which, g.width)
        out[g.dst] = o.reshape(-1, *o.shape[2:])[g.src]
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
