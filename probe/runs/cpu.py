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
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

SPINCOUNT = "10000"
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
    """Set ``OMP_NUM_THREADS`` (usable CPUs) and ``GOMP_SPINCOUNT`` where the user has not; returns what was
    set. Has an effect only before torch is imported, which it checks."""
    env = os.environ if environ is None else environ
    if "torch" in sys.modules and environ is None:
        return {}
    wanted = {"OMP_NUM_THREADS": str(usable_cpus()[0]), "GOMP_SPINCOUNT": SPINCOUNT}
    set_now = {k: v for k, v in wanted.items() if k not in env}
    env.update(set_now)
    return set_now


def describe() -> dict:
    """The CPU threading in effect: torch's threads, the usable CPUs and their source, the OpenMP settings."""
    import torch

    n, source = usable_cpus()
    return {"torch_threads": torch.get_num_threads(), "usable_cpus": n, "usable_cpus_from": source,
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "GOMP_SPINCOUNT": os.environ.get("GOMP_SPINCOUNT")}
