"""Peak memory of a computation on the CPU, counted tensor by tensor (no ``torch.cuda`` needed): every storage an
operation creates is added when it appears and subtracted when it is freed; the peak is the most alive at once.
A view of an existing storage (a weight sliced inside the computation) may be counted once as new; differences
between two batch sizes cancel it."""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class PeakBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            storage = t.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self._sizes:
                continue
            self._sizes[key] = size
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._free, key)
        return out


def peak_bytes(fn) -> int:
    with PeakBytes() as counter:
        fn()
    return counter.peak
