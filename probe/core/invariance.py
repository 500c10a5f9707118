"""Scores that depend only on what was asked: batch-invariant arithmetic for the engine.

A score must be a function of (model, input, dtype, device type, software stack), never of the batch it shared:
the batch size, an out-of-memory halving, a resume, a shard, torchrun's world size or the thread count change
speed, not numbers. Three things made a row's score move with its batch (measured, issue 62):

* **BLAS on the CPU.** MKL picks another code path and another split of the reduction over threads by the
  matrix's row count (float32 ``addmm`` of 4,096 x 4,096 weights differs at every row count below 300 from a
  1,024-row product; 1 and 2 threads differ at 64 and 256 rows). MKL's strict Conditional Numerical
  Reproducibility mode (``MKL_CBWR=AUTO,STRICT``, read once, at MKL's first call) makes each output row's sum
  the same at every row count and thread count (checked here on AVX-512 and on MKL's AVX2 path): the commands and
  the API set it before any product (`probe.runs.cpu.reproducible_blas`), and `blas_mode` reads back what is in
  effect for the run's record.
* **Matrix-vector products and reductions whose order follows the batch.** ``h @ w`` (a reward head's dot
  product) runs MKL's ``sgemv``, which splits rows by count: 1,122 of 3,200 sweep scores of a tiny reward model
  moved between batches of 256 and 7. The heads read every dot product and every sum over a row's tokens through
  `tree_sum`: a fixed pairwise tree of elementwise additions, the same for every row at every batch size, on every
  device and library, and the same for a row padded with zeros to any length (the folds past its own length add
  exact zeros).
* **Rows padded to the longest row beside them.** A whole response padded to the batch's longest row meets other
  kernel shapes (attention over more keys, more positions) than alone: the engine pads a row to a length set by
  the row alone (`bucket_length`: on a CPU none, each length its own forward; on a GPU a multiple of 8) and runs
  each length bucket as its own forward (probe/core/engine.py).

On a GPU, cuBLAS also picks its GEMM kernel by the row count (an H200 moved every bf16 score by up to 0.17 at one
batch size per shape). `row_tiles` computes every linear layer of the model, and the shared-prefix attention's
products, in tiles of a fixed number of token rows (`TILE_ROWS`, the last tile zero-padded), so every product has
one shape whatever the batch; whether a kernel of that shape gives a row the same bits at every position in the
tile (it does, unless cuBLAS splits the reduction across thread blocks) is what the GPU kit measures.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor

# token rows per product on a GPU (a multiple of every GEMM kernel's row tile; large enough to keep an H100/H200's
# tensor cores busy: Llama-3.1-8B's MLP at 4,096 rows is 0.48 TFLOP per product). RM_PROBE_TILE_ROWS overrides it
# (the GPU kit's variants; 0: no tiles), and the run records the value that ran.
TILE_ROWS = {"cuda": 4096}
# a row's padded length: its own length if at most this, else rounded up to a multiple of it. A CPU runs each exact
# length on its own (padding costs it more than the extra forwards: 512 whole responses of SmolLM2, 1.12x the time
# before invariance with buckets of 8, 0.93x with exact lengths); a GPU, whose products run in whole tiles, fewer and
# fuller forwards
BUCKET = {"cpu": 1, "cuda": 8}


def tree_sum(x: Tensor, dim: int = -1, inplace: bool = False) -> Tensor:
    """``x.sum(dim)`` in a fixed order: zero-padded to a power of two, then folded in halves (``x[:h] + x[h:]``).
    Elementwise additions only, so each output's bits do not depend on how many outputs there are, on the device's
    reduction kernels or on zeros padded after its terms. ``inplace``: fold into ``x`` itself (a scratch tensor;
    no memory beyond it where its length is a power of two)."""
    dim = dim % x.dim()
    n = x.shape[dim]
    if n == 0:
        return x.sum(dim)
    width = 1 << (n - 1).bit_length()
    if width != n:
        shape = list(x.shape)
        shape[dim] = width - n
        x = torch.cat([x, x.new_zeros(shape)], dim)
    while x.shape[dim] > 1:
        half = x.shape[dim] // 2
        if inplace:
            x = x.narrow(dim, 0, half).add_(x.narrow(dim, half, half))
        else:
            x = x.narrow(dim, 0, half) + x.narrow(dim, half, half)
    return x.squeeze(dim)


def running_sum(x: Tensor, dim: int = -1) -> Tensor:
    """``x.cumsum(dim)`` one term after another (elementwise additions), the same bits for a row whatever the
    batch (a GPU's scan kernel adds in a tree that follows the tensor's size)."""
    x = x.movedim(dim, -1)
    out = x.clone()
    for j in range(1, x.shape[-1]):
        out[..., j] = out[..., j - 1] + x[..., j]
    return out.movedim(-1, dim)


def dot_rows(h: Tensor, w: Tensor) -> Tensor:
    """Each row of ``h`` [..., d] dotted with ``w`` [d], in `tree_sum`'s order."""
    return tree_sum(h * w)


def bucket_length(n: int, device: torch.device | str = "cpu") -> int:
    """The length a row of ``n`` continuation ids is padded to on ``device``, a function of the row alone: ``n``
    itself up to the device's `BUCKET` (a sweep's rows: no padding), else ``n`` rounded up to a multiple of it."""
    step = BUCKET.get(torch.device(device).type, 8)
    return n if n <= step else -(-n // step) * step


def buckets(lengths: list[int], device: torch.device | str = "cpu") -> dict[int, list[int]]:
    """Row indices grouped by `bucket_length`, in order of first appearance."""
    out: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        out.setdefault(bucket_length(n, device), []).append(i)
    return out


def tile_rows(device: torch.device) -> int | None:
    """Token rows per product on ``device`` (None: the device's kernels are row-invariant as they are)."""
    import os

    rows = TILE_ROWS.get(torch.device(device).type)
    if rows is not None and os.environ.get("RM_PROBE_TILE_ROWS"):
        rows = int(os.environ["RM_PROBE_TILE_ROWS"]) or None
    return rows


def in_tiles(fn, rows: int, *tensors: Tensor) -> Tensor:
    """``fn(*tensors)`` (each tensor's first dimension the rows; ``fn`` row by row) computed ``rows`` rows at a
    time, the last tile zero-padded: every call of ``fn`` sees ``rows`` rows, laid out alike (contiguous: a kernel
    library picks its kernel by the strides too, and a slice of a transposed view is laid out otherwise than the
    zero-padded copy of the last tile; the first GPU run with tiles moved the shared path's scores so)."""
    tensors = tuple(t.contiguous() for t in tensors)
    n = tensors[0].shape[0]
    pad = (-n) % rows
    if pad:
        tensors = tuple(torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) for t in tensors)
    return torch.cat([fn(*(t[s : s + rows] for t in tensors)) for s in range(0, n + pad, rows)])[:n]


def tiled(fn, x: Tensor, rows: int) -> Tensor:
    """``fn(x)`` for ``x`` [..., k] (leading dimensions flattened to token rows), computed ``rows`` token rows at a
    time (`in_tiles`)."""
    out = in_tiles(fn, rows, x.reshape(-1, x.shape[-1]))
    return out.reshape(*x.shape[:-1], out.shape[-1])


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` in the device's fixed row tiles (`tile_rows`): for the heads' own products."""
    rows = tile_rows(x.device)
    fn = lambda t: torch.nn.functional.linear(t, weight, bias)  # noqa: E731
    return fn(x) if rows is None else tiled(fn, x, rows)


TILED = "rm_tiled_"  # + the model's own implementation: that implementation, a fixed number of rows at a time


def _own_attention(module, name: str):
    """The attention function the model's module would call under implementation ``name``: its own file's eager
    function (Gemma 2's caps its logits), else transformers' registered one."""
    import sys

    if name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers import AttentionInterface

    return AttentionInterface._global_mapping[name]


def _tiled_attention(name: str):
    def attend(module, query: Tensor, key: Tensor, value: Tensor, attention_mask, **kwargs):
        own = _own_attention(module, name)
        b = query.shape[0]
        batched_mask = attention_mask is not None and attention_mask.dim() == 4 and attention_mask.shape[0] == b > 1

        def call(q, k, v, *mask):
            return own(module, q, k, v, mask[0] if mask else attention_mask, **kwargs)[0]

        per = max(1, tile_rows(query.device) // query.shape[2])  # about TILE_ROWS query rows a group
        return in_tiles(call, per, query, key, value, *([attention_mask] if batched_mask else [])), None

    return attend


_registered: set[str] = set()


@contextmanager
def attention_tiles(backbone: torch.nn.Module, rows: int | None):
    """The backbone's own attention (SDPA, eager, ...) run on a fixed number of batch rows at a time for the
    duration of the block: the kernel a library picks for attention (FlashAttention splits the keys over thread
    blocks when a batch has few rows) is then the same whatever the batch. A no-op where ``rows`` is None."""
    config = backbone.config
    name = config._attn_implementation
    if rows is None or name is None or name.startswith(TILED) or name.startswith("rm_"):
        yield
        return
    tiled_name = TILED + name
    if tiled_name not in _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

        AttentionInterface.register(tiled_name, _tiled_attention(name))
        if name in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:  # the same mask as the implementation it wraps
            AttentionMaskInterface.register(tiled_name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[name])
        _registered.add(tiled_name)
    config._attn_implementation = tiled_name
    try:
        yield
    finally:
        config._attn_implementation = name


def _tiled_linear(module: torch.nn.Linear, rows: int):
    def forward(x: Tensor) -> Tensor:
        return tiled(lambda t: torch.nn.functional.linear(t, module.weight, module.bias), x, rows)

    return forward


# elements per call of an activation on a CPU: below ATen's grain size (32,768), so one thread runs each call, and a
# multiple of every vector width, so each call's vector loop starts aligned
PIECE = 16_384
NOT_ELEMENTWISE = (torch.nn.Softmax, torch.nn.Softmin, torch.nn.LogSoftmax, torch.nn.Softmax2d,
                   torch.nn.MultiheadAttention, torch.nn.GLU)


def in_pieces(fn, x: Tensor) -> Tensor:
    """``fn(x)`` for an elementwise ``fn`` on a CPU, ``PIECE`` elements of ``x`` at a time. ATen splits an elementwise
    op over its threads at element counts that follow the thread count, and the vector loop and its scalar tail
    round some functions differently (GELU's tanh form, SiLU, the sigmoid: 11 of 286,720 elements of Gemma 3's MLP
    differ between 1 and 3 threads, and torchrun's ``OMP_NUM_THREADS=1`` moved traces by 9.5e-7); in pieces below
    the grain size each call runs on one thread from an aligned start, the same bits at every thread count."""
    if x.device.type != "cpu" or x.numel() <= PIECE:
        return fn(x)
    return torch.cat([fn(p) for p in x.contiguous().view(-1).split(PIECE)]).view(x.shape)


def _elementwise_activation(m: torch.nn.Module) -> bool:
    return (type(m).__module__ in ("torch.nn.modules.activation", "transformers.activations")
            and not isinstance(m, NOT_ELEMENTWISE) and next(m.parameters(), None) is None)


@contextmanager
def cpu_activations(model: torch.nn.Module):
    """Every activation module of ``model`` on a CPU computed `in_pieces` for the duration of the block: the same
    bits at every thread count."""
    patched = [m for m in model.modules() if _elementwise_activation(m) and "forward" not in vars(m)]
    for m in patched:
        m.forward = (lambda f: lambda x, *a, **k: in_pieces(lambda t: f(t, *a, **k), x))(m.forward)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


@contextmanager
def row_tiles(model: torch.nn.Module, rows: int | None):
    """Every ``nn.Linear`` of ``model`` computed ``rows`` token rows at a time for the duration of the block (where
    ``rows`` is None, none); on a CPU every activation `in_pieces` (`cpu_activations`)."""
    if rows is None:
        with cpu_activations(model):
            yield
        return
    patched = [m for m in model.modules() if type(m) is torch.nn.Linear]
    for m in patched:
        m.forward = _tiled_linear(m, rows)
    try:
        yield
    finally:
        for m in patched:
            del m.forward  # the class's own forward again


_warned = False


def check_cpu(device: torch.device) -> None:
    """One warning per process where the CPU's BLAS is not in its reproducible mode (scores then move with the
    batch in their last bits)."""
    global _warned
    if _warned or torch.device(device).type != "cpu":
        return
    from probe.runs.cpu import blas_mode

    mode = blas_mode()
    if not mode["strict"]:
        import logging

        logging.getLogger(__name__).warning("scores may change in their last bits with the batch size: %s", mode["why"])
    _warned = True


def describe(device: torch.device) -> dict:
    """What this run's scores are invariant to, and how, for meta.json."""
    from probe.runs.cpu import blas_mode

    device = torch.device(device)
    step = BUCKET.get(device.type, 8)
    out = {"row_sums": "tree_sum (fixed pairwise order)",
           "padding": "none: each length its own forward" if step == 1 else f"per-row length buckets of {step}"}
    if device.type == "cpu":
        mode = blas_mode()
        out["cpu_blas"] = mode
        out["batch_invariant"] = mode.get("strict", False)
    else:
        out["tile_rows"] = tile_rows(device)
        out["batch_invariant"] = "measured by the GPU kit (experiments/results/gpu/)"
    return out
