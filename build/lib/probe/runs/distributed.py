"""Several processes on one sweep (``torchrun --nproc_per_node N -m probe.commands.score ...``).

Rank r scores the checkpoint shards s with s % world == r and writes them into the shared run directory;
rank 0 creates (or resumes) the directory, broadcasts its path, and after a barrier assembles the results from
the shard files, exactly as a single process would. Batches never cross shard boundaries, so every score is
computed on the same batch as in a single-process run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


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


def init() -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


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


def device_for(d: Dist, requested: str) -> str:
    if d.enabled and requested in ("auto", "cuda") and torch.cuda.is_available():
        return f"cuda:{d.local_rank}"
    return requested
