"""CPU threads for a command: as many as this process may use, and OpenMP threads that stop spinning soon.

A torch process on a CPU runs each parallel operation on a team of OpenMP threads that meet at a barrier. GNU
OpenMP (the runtime PyTorch's wheels ship) lets a thread that reaches the barrier first spin for 300,000 rounds
before it sleeps. Alone, that is fast. With a second busy process on the same cores, the thread it waits for is
often descheduled, so the spinning one burns its whole time slice, and every operation costs a slice instead of
microseconds: a BBQ run of a tiny reward model took 60 s instead of 4 s beside another torch process on 2 cores
(experiments/results/bench_shared_cpu.md). A spin of 10,000 rounds (``GOMP_SPINCOUNT``) keeps the run alone as
fast as before and makes it share the CPU in proportion (6 s). Threads default to the CPUs this process may use
(its affinity mask and, in a container, the cgroup's CPU quota), where torch would count every core of the host.

`prepare` must run before torch is imported (the commands call it first); it only sets environment variables
the user has not set. `describe` says what is in effect, for the run's meta.json.

MKL (the BLAS of PyTorch's x86 wheels) splits a product's reduction by its row count and thread count, so a row's
float32 score changed with the batch it shared (probe/core/invariance.py). Its strict Conditional Numerical
Reproducibility mode gives each row the same bits at every row count and thread count; MKL reads the mode once, at
its first call, from ``MKL_CBWR``. `reproducible_blas` sets it where the user has not (the commands in `prepare`,
the Python API when it is first used); `blas_mode` reads back what MKL runs with.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

SPINCOUNT = "10000"
MKL_CBWR = "AUTO,STRICT"  # the instruction set MKL picks for this CPU, every result bitwise at any row/thread count
_CBWR_STRICT, _CBWR_ALL = 0x10000, -1
CGROUP = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP) -> float | None:
    """CPUs the cgroup's quota allows (``cpu.max`` of cgroup v2, ``cpu.cfs_quota_us`` of v1), or None."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def usable_cpus(root: Path = CGROUP) -> tuple[int, str]:
    """(CPUs this process may use, where that number comes from)."""
    if hasattr(os, "sched_getaffinity"):
        n, source = len(os.sched_getaffinity(0)), "affinity mask"
    else:
        n, source = os.cpu_count() or 1, "cpu_count"
    quota = cgroup_quota(root)
    if quota is not None and math.ceil(quota) < n:
        n, source = max(1, math.ceil(quota)), "cgroup CPU quota"
    return n, source


def prepare(environ: dict | None = None) -> dict[str, str]:
    """Set ``OMP_NUM_THREADS`` (usable CPUs) and ``GOMP_SPINCOUNT`` where the user has not (only before torch is
    imported, which it checks), and ``MKL_CBWR`` (`reproducible_blas`); returns what was set."""
    env = os.environ if environ is None else environ
    if "torch" in sys.modules and environ is None:
        return reproducible_blas(env)
    wanted = {"OMP_NUM_THREADS": str(usable_cpus()[0]), "GOMP_SPINCOUNT": SPINCOUNT}
    set_now = {k: v for k, v in wanted.items() if k not in env}
    env.update(set_now)
    return set_now | reproducible_blas(env)


def reproducible_blas(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set ``MKL_CBWR`` (strict reproducibility) where the user has not; returns what was set. It takes effect if
    MKL has not run a product yet in this process (`blas_mode` says whether it did)."""
    env = os.environ if environ is None else environ
    if "MKL_CBWR" in env:
        return {}
    env["MKL_CBWR"] = MKL_CBWR
    return {"MKL_CBWR": MKL_CBWR}


def _mkl_cbwr_get():
    """MKL's ``mkl_cbwr_get`` as exported by the torch library that carries MKL (None where there is none)."""
    import ctypes

    import torch

    lib_dir = Path(torch.__file__).parent / "lib"
    for name in ("libtorch_cpu.so", "libtorch_cpu.dylib", "torch_cpu.dll"):
        try:
            lib = ctypes.CDLL(str(lib_dir / name))
        except OSError:
            continue
        for symbol in ("mkl_serv_cbwr_get", "mkl_cbwr_get", "MKL_CBWR_Get"):
            fn = getattr(lib, symbol, None)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_int
                return fn
    return None


def blas_mode() -> dict:
    """The CPU BLAS's reproducibility mode in effect: ``strict`` True where MKL runs in strict CNR mode (every
    row's result independent of the row count and the thread count); ``why`` where not."""
    import torch

    if not torch.backends.mkl.is_available():
        return {"blas": "not MKL", "strict": False,
                "why": "this torch has no MKL: its BLAS's results may change with the batch's row count"}
    get = _mkl_cbwr_get()
    if get is None:
        return {"blas": "MKL", "strict": False, "why": "MKL's reproducibility mode cannot be read from this torch"}
    mode = get(_CBWR_ALL)
    strict = mode > 0 and bool(mode & _CBWR_STRICT)
    out = {"blas": "MKL", "strict": strict, "MKL_CBWR": os.environ.get("MKL_CBWR"), "cbwr_mode": hex(mode)}
    if not strict:
        out["why"] = ("MKL_CBWR was set to another mode" if os.environ.get("MKL_CBWR") not in (None, MKL_CBWR)
                      else "MKL ran a product before rm-probe could set MKL_CBWR (import probe before other torch "
                      "work, or set MKL_CBWR=AUTO,STRICT)")
    return out


def describe() -> dict:
    """The CPU threading in effect: torch's threads, the usable CPUs and their source, the OpenMP settings."""
    import torch

    n, source = usable_cpus()
    return {"torch_threads": torch.get_num_threads(), "usable_cpus": n, "usable_cpus_from": source,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT")}
