"""Scores that depend only on what was asked: batch invariance by construction.

A score must be a function of (model, input, dtype, device type, software stack), never of the batch it shared:
the batch size, an out-of-memory halving, a resume, a shard, torchrun's world size or the thread count change
speed, not numbers. No library promises that a row's result is independent of how many rows share a product:
MKL's strict reproducibility mode promises the same bits for the same call (rows, threads), yet on an AMD EPYC
with AVX2 only ``F.linear`` over 1-3 rows differs from the same rows inside a larger product (issue 70), and
cuBLAS picks its GEMM kernel by the row count. So rm-probe asks a library for one thing only: **the same call on
the same inputs gives the same bits**. Four rules make every row's work such a call:

* **Every forward has a fixed shape** (`TILE_ROWS` token rows per device type). Where the engine runs rm-probe's
  own attention (the shared-prefix families, kernels/packed_attention.py), rows are *packed*: each forward holds
  exactly ``TILE_ROWS`` token rows, rows of any length back to back (a row never split), the rest padding; every
  linear layer, norm and activation of the model sees that one shape. Elsewhere (the plain cache path, the
  uncached path, the model's own forward: encoders, remote code, recurrent layers) a forward holds a fixed number
  of rows of one length, ``max(1, TILE_ROWS // tokens per row)``, the last group padded by repeating a row: its
  shape is a function of the row's own length (`rows_per_forward`).
* **Every attention and head call has a fixed shape.** In a packed tile, attention runs per group of rows of one
  length bucket, ``max(1, GROUP_ROWS // bucket)`` rows a call (padded by repeating a row); the heads read the rows
  in the same fixed groups (`fixed_groups`). A row's length bucket is set by the row alone (`bucket_length`).
* **Sums over a row's terms in a fixed order** (`tree_sum`: elementwise additions in a pairwise tree, the same on
  every device and library and for a row padded with zeros to any length).
* **Activations in fixed pieces on a CPU** (`in_pieces`): ATen splits an elementwise op over its threads at element
  counts that follow the thread count, and its vector loop and scalar tail round some functions differently.

What the construction cannot give is checked: within one call of a fixed shape, a row's result must not depend on
where in the call it sits or what sits beside it (a row-wise property of every GEMM kernel known, but promised by
none). `row_check` computes a few of the model's own products with a row alone in its tile and inside tiles of
other rows at other places, and compares them bit for bit (and, on a CPU, at one thread against all); the run
records what it found, and ``batch_invariant`` is true only where the design holds and that check passed
(`describe`). MKL's strict mode (``MKL_CBWR=AUTO,STRICT``, which does promise the same bits for one call at any
thread count) is still set by the commands and the API for the thread-count part, and recorded.

tests/unit/test_hostile_blas.py proves the construction with a test double whose products round by their row count:
under it every path's scores stay bitwise the same at every batch size, after a halving, a resume, a shard, over
torchrun's world size and thread counts, on any CPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import contextmanager

import torch
from torch import Tensor

# token rows per forward (a tile). A GPU: a multiple of every GEMM kernel's row tile and large enough to keep an
# H100/H200's tensor cores busy (Llama-3.1-8B's MLP at 4,096 rows is 0.48 TFLOP per product). A CPU: where the
# embedded SmolLM2's sweep costs what unbounded batches did (experiments/results/bench_invariance_cpu.md).
# RM_PROBE_TILE_ROWS overrides it (the GPU kit's variants; 0: no tiles, not batch-invariant) and the run records it.
TILE_ROWS = {"cpu": 512, "cuda": 4096}
# query rows per attention call and rows' tokens per head call inside a packed tile: the larger, the fewer calls;
# the smaller, the less padding where a tile holds few rows of a length
GROUP_ROWS = {"cpu": 64, "cuda": 2048}
# a row's padded length: its own length if at most this, else rounded up to a multiple of it. A CPU runs each exact
# length (padding costs it more than the extra calls); a GPU fewer, fuller calls
BUCKET = {"cpu": 1, "cuda": 8}
DEFAULT_TILE, DEFAULT_GROUP = 4096, 2048  # a device type not listed (mps, xpu, ...)


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


def _setting(table: dict, device: torch.device | str, default: int) -> int:
    return table.get(torch.device(device).type, default)


def bucket_length(n: int, device: torch.device | str = "cpu") -> int:
    """The length a row of ``n`` continuation ids is padded to on ``device``, a function of the row alone: ``n``
    itself up to the device's `BUCKET` (a sweep's rows: no padding), else ``n`` rounded up to a multiple of it."""
    step = _setting(BUCKET, device, 8)
    return n if n <= step else -(-n // step) * step


def buckets(lengths: Sequence[int], device: torch.device | str = "cpu") -> dict[int, list[int]]:
    """Row indices grouped by `bucket_length`, in order of first appearance."""
    out: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        out.setdefault(bucket_length(n, device), []).append(i)
    return out


def tile_rows(device: torch.device | str) -> int | None:
    """Token rows per forward on ``device`` (None: ``RM_PROBE_TILE_ROWS=0``, forwards as large as the batch, which is
    then not batch-invariant)."""
    rows = _setting(TILE_ROWS, device, DEFAULT_TILE)
    if os.environ.get("RM_PROBE_TILE_ROWS"):
        rows = int(os.environ["RM_PROBE_TILE_ROWS"])
    return rows or None


def group_rows(device: torch.device | str) -> int:
    """Query rows per attention call and token rows per head call in a packed tile (at most a tile)."""
    rows = tile_rows(device)
    group = _setting(GROUP_ROWS, device, DEFAULT_GROUP)
    return min(group, rows) if rows else group


def rows_per_forward(tokens_per_row: int, device: torch.device | str) -> int | None:
    """Rows of ``tokens_per_row`` tokens in one fixed-shape forward on ``device`` (None: no tiles)."""
    rows = tile_rows(device)
    return None if rows is None else max(1, rows // max(1, tokens_per_row))


def whole_tiles(batch: int, tokens_per_row: int, device: torch.device | str, nearest: bool = False) -> int:
    """``batch`` rows rounded to whole tiles of rows of ``tokens_per_row`` tokens (down, or to the ``nearest``
    multiple; at least one tile's rows where ``nearest``), so that a call's last tile is as full as its others."""
    per = rows_per_forward(tokens_per_row, device)
    if per is None or (batch < per and not nearest):
        return batch
    k = round(batch / per) if nearest else batch // per
    return max(1, k) * per


# A CPU's elementwise kernels for transcendental functions (SiLU, the sigmoid, softplus, tanh, GELU's tanh form, exp;
# measured on AVX-512) run a tensor's last numel % (2 x the vector width) elements in a scalar loop that rounds
# otherwise than the vector body. A row that ends a call's tensor then gets other bits than the same row anywhere else
# in that call, wherever its elements are not a multiple of 32 (a hybrid's per-head gates: OLMo hybrid's 30 linear
# heads; a soft-capped attention's scores). TAIL trailing elements of padding rows take the tail on the CPU: no row
# scored is ever in it (64 floats: the widest scalar tail, bfloat16's on AVX-512). A packed tile needs none: its
# positions are a multiple of 64.
TAIL = 64


def tail_rows(n_tokens: int, device: torch.device | str) -> int:
    """Padding rows after a call's rows of ``n_tokens`` tokens so that every elementwise tensor of at least one element
    per token and row ends in `TAIL` elements of padding (none off the CPU)."""
    return -(-TAIL // max(1, n_tokens)) if torch.device(device).type == "cpu" else 0


def fixed_groups(indices: Sequence[int], per: int | None, tail: int = 0) -> list[tuple[list[int], int]]:
    """``indices`` in groups of exactly ``per`` (None: one group of all) and then ``tail`` more (`tail_rows`), padded
    by repeating each group's first index; each as (the group's indices, how many are real: its first ones)."""
    indices = list(indices)
    if per is None:
        return [(indices + indices[:1] * tail, len(indices))] if indices else []
    out = []
    for s in range(0, len(indices), per):
        part = indices[s : s + per]
        out.append((part + [part[0]] * (per + tail - len(part)), len(part)))
    return out


def in_tiles(fn, rows: int, *tensors: Tensor) -> Tensor:
    """``fn(*tensors)`` (each tensor's first dimension the rows; ``fn`` row by row) computed ``rows`` rows at a
    time, the last tile zero-padded: every call of ``fn`` sees ``rows`` rows, laid out alike (contiguous: a kernel
    library picks its kernel by the strides too)."""
    tensors = tuple(t.contiguous() for t in tensors)
    n = tensors[0].shape[0]
    pad = (-n) % rows
    if pad:
        tensors = tuple(torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) for t in tensors)
    return torch.cat([fn(*(t[s : s + rows] for t in tensors)) for s in range(0, n + pad, rows)])[:n]


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
    if x.device.type != "cpu":
        return fn(x)
    x = x.contiguous()  # a strided input rounds otherwise in some kernels (exact GELU on Zamba2's chunked gate)
    if x.numel() <= PIECE:
        return fn(x)
    return torch.cat([fn(p) for p in x.view(-1).split(PIECE)]).view(x.shape)


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


# ---------------------------------------------------------------------------------------------------------------
# What the construction cannot give: a row's bits the same wherever it sits in a call of one shape


def _product_shapes(model: torch.nn.Module, limit: int = 6) -> list[tuple[str, Tensor]]:
    """The model's distinct linear products (by weight shape and dtype), the output embedding's first vocabulary
    chunk among them: (name, weight [out, in])."""
    seen, out = set(), []
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    named = [(n, m.weight) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and m is not head]
    if head is not None and getattr(head, "weight", None) is not None:
        named.append(("output embedding (first 4,096 rows)", head.weight[:4096]))
    for name, w in named:
        if w.dim() != 2 or w.device.type == "meta":
            continue
        key = (tuple(w.shape), w.dtype, w.device)
        if key not in seen:
            seen.add(key)
            out.append((name, w.detach()))
    return out[:limit] if len(out) <= limit else out[: limit - 1] + out[-1:]  # the output embedding always


def row_check(model: torch.nn.Module, device: torch.device | str | None = None) -> dict:
    """Whether a row's result is the same wherever it sits in a product of one shape, on this device: for each of
    the model's distinct linear products, a row alone in a zero tile and inside tiles of other rows at the first,
    a middle and the last place, compared bit for bit; on a CPU also at one thread against the process's threads;
    and a softmax and a mean over rows of the model's width the same way. Cached on the model per device and tile.
    Returns ``{"row_stable", "thread_stable", "checked", "first_difference"}``."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    rows = tile_rows(device) or DEFAULT_TILE
    cache = getattr(model, "_rm_row_check", {})
    key = (str(device), rows)
    if key in cache:
        return cache[key]
    gen = torch.Generator(device="cpu").manual_seed(20261128)
    checked, first, thread_first = [], None, None
    places = (0, rows // 2 + 1, rows - 1)
    with torch.no_grad():
        for name, w in _product_shapes(model):
            if w.device != device:
                continue
            x = torch.randn(rows, w.shape[1], generator=gen).to(device, w.dtype)
            row = x[1].clone()
            alone = torch.zeros_like(x)
            alone[0] = row
            want = torch.nn.functional.linear(alone, w)[0]
            got = []
            for p in places:
                y = torch.randn(rows, w.shape[1], generator=gen).to(device, w.dtype)
                y[p] = row
                got.append((p, torch.nn.functional.linear(y, w)[p]))
            checked.append(f"{name} {tuple(w.shape)} {str(w.dtype).removeprefix('torch.')}")
            for p, g in got:
                if first is None and not torch.equal(g, want):
                    first = f"{name}: a row at place {p} of {rows} differs from the row alone"
            if device.type == "cpu" and torch.get_num_threads() > 1 and thread_first is None:
                before = torch.get_num_threads()
                torch.set_num_threads(1)
                try:
                    one = torch.nn.functional.linear(alone, w)[0]
                finally:
                    torch.set_num_threads(before)
                if not torch.equal(one, want):
                    thread_first = f"{name}: one thread differs from {before}"
        width = getattr(model.config.get_text_config(), "hidden_size", 64) if hasattr(model, "config") else 64
        x = torch.randn(rows, width, generator=gen).to(device)
        alone = torch.zeros_like(x)
        alone[0] = x[1]
        for label, fn in (("softmax", lambda t: torch.softmax(t, -1)), ("mean", lambda t: t.pow(2).mean(-1))):
            want = fn(alone)[0]
            for p in places:
                y = torch.randn(rows, width, generator=gen).to(device)
                y[p] = x[1]
                if first is None and not torch.equal(fn(y)[p], want):
                    first = f"{label} over {width}: a row at place {p} of {rows} differs from the row alone"
        checked += [f"softmax and mean over {width}"]
    out = {"row_stable": first is None, "checked": checked, "tile_rows": rows,
           "thread_stable": None if device.type != "cpu" else thread_first is None}
    if first is not None:
        out["first_difference"] = first
    if thread_first is not None:
        out["first_thread_difference"] = thread_first
    cache[key] = out
    try:
        model._rm_row_check = cache
    except AttributeError:
        pass
    return out


_warned: set[str] = set()


def check_device(model: torch.nn.Module, device: torch.device | str) -> dict:
    """`row_check` of ``model`` on ``device`` (once per model and device), and one warning where the run's scores
    are not batch-invariant (`warn_once`)."""
    device = torch.device(device)
    check = row_check(model, device)
    blas = None
    if device.type == "cpu":
        from probe.runs.cpu import blas_mode

        blas = blas_mode()
    warn_once(device, check, blas, model)
    return check


def warn_once(device: torch.device, check: dict, blas: dict | None, model: torch.nn.Module | None = None) -> None:
    """One line per process and device where scores may move with the batch or the thread count, naming the device
    and why (the run's meta.json says the same)."""
    why = not_invariant_because(device, check, blas, model)
    if why and str(device) not in _warned:
        import logging

        logging.getLogger(__name__).warning("scores may change in their last bits with the batch on %s: %s",
                                            device_name(device), why)
        _warned.add(str(device))


def device_name(device: torch.device | str) -> str:
    """The device in words: the CPU's model name or the GPU's."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        try:
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        import platform

        return platform.processor() or platform.machine() or "cpu"
    return str(device)


EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
DENSE_EXPERTS = ("llama4_text",)  # every expert over every row (a batched product of one shape): no routed counts


def routed_experts(model: torch.nn.Module | None) -> str | None:
    """A mixture-of-experts model whose expert products hold only the tokens routed to them: why that is not batch-
    invariant by construction (None for a dense model)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = config.get_text_config()
    experts = max((getattr(text, k, None) or 0 for k in EXPERT_COUNTS if isinstance(getattr(text, k, None), int)),
                  default=0)
    if experts <= 1 or getattr(text, "model_type", None) in DENSE_EXPERTS:
        return None
    return (f"a mixture of {experts} experts: each expert's product holds the tile's tokens routed to it, a count that "
            "follows the other rows of the tile (checked on this device's kernels only by its own tests)")


def not_invariant_because(device: torch.device | str, check: dict | None, blas: dict | None,
                          model: torch.nn.Module | None = None) -> str | None:
    """Why this run's scores are not batch-invariant (None where they are)."""
    if tile_rows(device) is None:
        return "RM_PROBE_TILE_ROWS=0: forwards as large as the batch"
    if routed_experts(model):
        return routed_experts(model)
    if check is not None and not check.get("row_stable", True):
        return "a product's row changes with its place in the product: " + check.get("first_difference", "")
    if check is not None and check.get("thread_stable") is False:
        return "a product's row changes with the thread count: " + check.get("first_thread_difference", "")
    if blas is not None and not blas.get("strict", True) and torch.device(device).type == "cpu":
        return "the thread count: " + blas.get("why", "the CPU BLAS is not in a reproducible mode")
    return None


def describe(device: torch.device | str, model: torch.nn.Module | None = None) -> dict:
    """What this run's scores are invariant to, how, and what was checked, for meta.json."""
    device = torch.device(device)
    out = {"design": "every forward, attention call and head call of a fixed shape set by the row alone "
                     "(probe/core/invariance.py)",
           "tile_rows": tile_rows(device), "group_rows": group_rows(device),
           "row_sums": "tree_sum (fixed pairwise order)",
           "padding": ("none: each length its own calls" if _setting(BUCKET, device, 8) == 1
                       else f"per-row length buckets of {_setting(BUCKET, device, 8)}"),
           "device": device_name(device)}
    blas = None
    if device.type == "cpu":
        from probe.runs.cpu import blas_mode

        blas = out["cpu_blas"] = blas_mode()
    check = row_check(model, device) if model is not None else None
    if check is not None:
        out["row_check"] = check
    why = not_invariant_because(device, check, blas, model)
    out["batch_invariant"] = why is None and check is not None
    if why:
        out["why_not"] = why
    elif check is None:
        out["why_not"] = "the row check did not run"
    return out
