"""Several processes on one sweep (``torchrun --nproc_per_node N -m probe.commands.score ...``).

Rank r scores the checkpoint shards s with s % world == r and writes them into the shared run directory;
rank 0 creates (or resumes) the directory, broadcasts its path, and after a barrier assembles the results from
the shard files, exactly as a single process would. Batches never cross shard boundaries, so every score is
computed on the same batch as in a single-process run.

Devices: a rank that scores on CUDA makes ``cuda:{LOCAL_RANK}`` its *current* device before the process group
starts (``torch.cuda.set_device``). NCCL's collectives, ``broadcast_object_list`` among them, build their tensors
on the current device; without it every rank would use ``cuda:0`` ("Duplicate GPU detected", or a hang). NCCL
is the backend only when the ranks score on CUDA; ``--device cpu`` uses gloo even where CUDA is visible.
One rank per GPU: ``--device-map`` (one model over several GPUs) cannot be combined with torchrun.

A batch under torchrun (probe/commands/batch.py) starts no process group: each rank runs whole jobs as single
processes (``solo``), taking the next one from a counter in torchrun's own store (``JobQueue``).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass

from probe.errors import ProbeError


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def owns(self, shard: int) -> bool:
        return shard % self.world == self.rank


def deal(costs: list[float], world: int) -> list[list[int]]:
    """Work items (by index, with their estimated costs) dealt to ``world`` ranks, the costliest first, each to the
    rank with the least work so far (ties: the lowest rank); each rank's share in index order. Deterministic: every
    rank computes the same deal."""
    load, share = [0.0] * world, [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        load[r] += costs[i]
        share[r].append(i)
    return [sorted(s) for s in share]


def uses_cuda(requested: str) -> bool:
    """Whether ``--device`` puts the ranks on CUDA."""
    import torch  # here, not at import: `probe social --help` imports this module and must not load torch

    return requested.startswith("cuda") or (requested == "auto" and torch.cuda.is_available())


_solo = False


@contextmanager
def solo():
    """Inside it, ``init`` gives a single process even under torchrun: a rank that runs whole jobs of its own."""
    global _solo
    before, _solo = _solo, True
    try:
        yield
    finally:
        _solo = before


def launched() -> Dist:
    """torchrun's rank, world and local rank, read from its environment, with no process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    return Dist(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def init(requested: str = "auto", device_map: str | None = None) -> Dist:
    """The process group of a torchrun launch (a plain ``Dist()`` otherwise, or inside ``solo``), on the backend
    that fits ``requested`` (the ``--device`` the ranks score on)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or _solo:
        return Dist()
    if device_map is not None:
        raise ProbeError("--device-map spreads one model over several GPUs in one process; under torchrun each "
                         "rank holds a whole model on its own GPU. Use one or the other")
    import torch
    import torch.distributed as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = uses_cuda(requested)
    if cuda:
        if requested.startswith("cuda:"):
            raise ProbeError(f"--device {requested}: under torchrun each rank picks its GPU from LOCAL_RANK; "
                             "pass --device cuda")
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if cuda else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank)


def destroy(d: Dist) -> None:
    """Ends the process group ``init`` started (torch warns at exit about one left open, and NCCL may hang)."""
    if d.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def barrier(d: Dist) -> None:
    if d.enabled:
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[d.local_rank])
        else:
            dist.barrier()


def broadcast(d: Dist, obj):
    """``obj`` from rank 0 on every rank."""
    if not d.enabled:
        return obj
    import torch.distributed as dist

    box = [obj if d.main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(d: Dist, obj) -> list | None:
    """Every rank's ``obj`` on rank 0, in rank order (``None`` on the other ranks)."""
    if not d.enabled:
        return [obj]
    import torch.distributed as dist

    out = [None] * d.world if d.main else None
    dist.gather_object(obj, out, dst=0)
    return out


def device_for(d: Dist, requested: str) -> str:
    if d.enabled and uses_cuda(requested):
        return f"cuda:{d.local_rank}"
    return requested


class JobQueue:
    """Job numbers 0, 1, 2, ... handed out one at a time over torchrun's ranks, from a counter in torchrun's own
    store (MASTER_ADDR:MASTER_PORT, the rendezvous's TCPStore; on multi-node runs, ``--rdzv-endpoint``'s)."""

    def __init__(self, d: Dist, name: str = "probe-batch"):
        from datetime import timedelta

        import torch.distributed as dist

        host = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and d.main  # torch before the agent's store
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), d.world, is_master=host,
                              timeout=timedelta(minutes=5))
        self.store = dist.PrefixStore(f"{name}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        self.world = d.world

    def take(self) -> int:
        return self.store.add("next", 1) - 1

    def finish(self, poll_s: float = 1.0) -> None:
        """Waits until every rank has finished: torchrun stops all ranks when one exits with an error, so a rank
        whose job failed must not exit before the others' jobs are done."""
        self.store.add("finished", 1)
        while self.store.add("finished", 0) < self.world:
            time.sleep(poll_s)
