"""A hostile BLAS: a test double whose products and reductions round by the number of rows they are given.

No BLAS promises that a row's result is the same inside a product of 1 row and of 1,000: MKL's strict mode promises
the same bits for the same call; an AMD EPYC with AVX2 only gives a row other bits alone than among others (issue 70),
and cuBLAS picks its kernel by the row count. `HostileBLAS` keeps the one promise rm-probe relies on (the same call
on the same inputs gives the same bits) and breaks every other: each floating-point result of a product (``mm``,
``addmm``, ``bmm``, ``baddbmm``, ``mv``, ``dot``, scaled dot-product attention, convolution) and of a reduction
(sum, mean, softmax, log-softmax, log-sum-exp, norms, cumulative sums) is moved by 0 to 3 units in its last place,
the number set by a hash of the result's row count (its elements over its last dimension). Under it a score is
batch-invariant only if every call that computes it has a shape set by the row alone: by construction, never by the
CPU the test runs on. ``positions=True`` also keys the move on each row's place in the call: no design can hold
against that one (rm-probe's run-time `row_check` must then report the device as not invariant).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten


def _ops(*names: str) -> set:
    out = set()
    for name in names:
        packet = getattr(aten, name, None)
        if packet is not None:
            out.add(packet)
    return out


# the products (and the attention kernels that fuse them) a library may split by shape
PRODUCTS = _ops("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation",
                "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math",
                "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_fused_attention_overrideable",
                "convolution", "_convolution", "_int_mm", "_weight_int8pack_mm")
# reductions over a row's terms, which a kernel may split by the number of rows too
REDUCTIONS = _ops("sum", "mean", "_softmax", "_log_softmax", "logsumexp", "cumsum", "var_mean", "var", "std",
                  "linalg_vector_norm", "norm", "native_layer_norm", "_fused_rms_norm", "native_group_norm", "prod")


def rows_of(t: torch.Tensor) -> int:
    """A result's row count: its elements over its last dimension (a vector's length; 1 for a scalar)."""
    if t.dim() == 0:
        return 1
    if t.dim() == 1:
        return t.shape[0]
    return t.numel() // max(1, t.shape[-1])


def ulps(rows: int) -> int:
    """0 to 3 units in the last place: the top two bits of a multiplicative hash of the row count (Knuth's), so
    that neighbouring counts differ (1, 2, 3, 4 rows: 2, 0, 3, 1 units)."""
    return ((rows * 0x9E3779B1) & 0xFFFFFFFF) >> 30


def _nudge(t: torch.Tensor, k: int) -> torch.Tensor:
    up = torch.full_like(t, float("inf"))
    for _ in range(k):
        t = torch.nextafter(t, up)
    return t


def _by_position(t: torch.Tensor) -> torch.Tensor:
    """Each row moved by a number of units set by its place in the result."""
    flat = t.reshape(-1, t.shape[-1]) if t.dim() >= 2 else t.reshape(-1, 1)
    k = ((torch.arange(flat.shape[0], device=t.device) * 40503) >> 7) % 4
    up = torch.full_like(flat, float("inf"))
    for step in range(1, 4):
        flat = torch.where((k >= step)[:, None], torch.nextafter(flat, up), flat)
    return flat.reshape(t.shape)


class HostileBLAS(TorchDispatchMode):
    """``with HostileBLAS(): ...`` (see the module's docstring). ``calls`` counts the results moved, per op."""

    def __init__(self, positions: bool = False):
        super().__init__()
        self.positions = positions
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = func.overloadpacket
        if packet not in PRODUCTS and packet not in REDUCTIONS:
            return out
        first = out[0] if isinstance(out, tuple) else out
        if not isinstance(first, torch.Tensor) or not first.is_floating_point() or first.numel() == 0:
            return out
        moved = _by_position(first) if self.positions else _nudge(first, ulps(rows_of(first)))
        if moved is first:
            return out
        name = str(packet)
        self.calls[name] = self.calls.get(name, 0) + 1
        if func._schema.is_mutable or "out" in (kwargs or {}):  # an in-place or out= variant: its tensor, changed
            first.copy_(moved)
            return out
        return (moved, *out[1:]) if isinstance(out, tuple) else moved
