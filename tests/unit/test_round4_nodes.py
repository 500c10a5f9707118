"""Issue 57: every command that deals work over torchrun's ranks, run on two simulated nodes of one process each
(the environment torchrun gives the workers of ``--nnodes 2 --nproc-per-node 1``: RANK 0 and 1, LOCAL_RANK 0 on
both, GROUP_RANK the node; gloo on CPU). Work dealt by the local rank instead of the global one gives both nodes
node 0's share, so these runs fail or differ from one process; on one node (tests/unit/test_rows_torchrun.py) the
two ranks are the same numbers and nothing shows it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.unit.test_responses import _args as response_args
from tests.unit.test_rows_torchrun import one_thread, same_folder, social_args, trace_args  # noqa: F401

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(module: str, args: list[str], timeout: int = 600) -> list[str]:
    """``python -m module args`` as the one worker of each of two nodes; every worker's stdout. This process plays
    torchrun's agent on node 0: it hosts the store at MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE) until both workers
    have exited, as the agents' exit barrier keeps it. (Without it rank 0 hosts JobQueue's store and may exit while
    the other rank still polls it in ``finish``: "Failed to recv" on that rank, seen here; not torchrun's case.)"""
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 3, is_master=True, wait_for_workers=False)
    procs = []
    for node in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "RANK": str(node),
               "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": "2",
               "ROLE_RANK": str(node), "ROLE_WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "0",
               "TORCHELASTIC_USE_AGENT_STORE": "True"}
        procs.append(subprocess.Popen([sys.executable, "-m", module, *args], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, f"node {len(outs)}: exit {p.returncode}\n{err[-3000:]}"
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        del store
    return outs


def test_two_nodes_score_responses_into_one_folder(tiny_dirs, tmp_path, one_thread):
    """6 shards: node 1 scores 1, 3, 5; every shard once, the folder one process writes."""
    from probe.commands.score import main

    assert main(response_args(tiny_dirs, tmp_path, "one")) == 0
    two_nodes("probe.exhaustive", response_args(tiny_dirs, tmp_path, "two"))
    (a,), (b,) = (tmp_path / "one").glob("*/responses_*"), (tmp_path / "two").glob("*/responses_*")
    same_folder(a, b, ("scores.parquet",))
    meta = json.loads((b / "meta.json").read_text())
    assert meta["timing"]["sessions"][0]["processes"] == 2 and meta["timing"]["sessions"][0]["responses_scored"] == 24


def test_two_nodes_run_social_into_one_folder(tiny_dirs, tmp_path, one_thread):
    from probe.commands.social import main

    assert main(social_args(tmp_path, tiny_dirs, "one")) == 0
    two_nodes("probe.social", social_args(tmp_path, tiny_dirs, "two"))
    (a,), (b,) = (tmp_path / "one").glob("*/social_*"), (tmp_path / "two").glob("*/social_*")
    same_folder(a, b, ("scores.parquet", "summary.json"))
    assert json.loads((b / "meta.json").read_text())["timing"][-1]["processes"] == 2


def test_two_nodes_sweep_into_one_folder(tiny_dirs, tmp_path, one_thread):
    from probe.commands.score import main

    args = ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--prompt", "Best word?", "--limit", "70",
            "--shard-size", "20", "--batch-size", "8", "--verify", "2"]
    assert main([*args, "--output", str(tmp_path / "one")]) == 0
    two_nodes("probe.exhaustive", [*args, "--output", str(tmp_path / "two")])
    (a,), (b,) = (tmp_path / "one").glob("*/exhaustive_*"), (tmp_path / "two").glob("*/exhaustive_*")
    assert pl.read_parquet(a / "scores.parquet").equals(pl.read_parquet(b / "scores.parquet"))
    assert len(list((b / "checkpoints").rglob("shard_*.npy"))) == 4


def test_two_nodes_trace_into_one_folder(tiny_dirs, tmp_path, one_thread):
    from probe.commands.trace import main

    args = trace_args(tmp_path, tiny_dirs)
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    two_nodes("probe.trace", [*args, "--out", str(tmp_path / "two")])
    a, b = tmp_path / "one", tmp_path / "two"
    same_folder(a, b, ("trace.parquet", "trace.csv", "trace.html"), own="trace.json")
    ja, jb = (json.loads((p / "trace.json").read_text()) for p in (a, b))
    ja.pop("timing"), jb.pop("timing")
    assert ja == jb


def test_two_nodes_take_every_job_of_a_batch_once(tiny_dirs, tmp_path):
    """Three jobs from the counter in node 0's store: each run once, by either node, none skipped."""
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"defaults": {"device": "cpu", "output": str(tmp_path / "out"), "shard_size": 20,
                                                 "progress": False, "verify": 0},
                                    "prompts": ["Best word?"],
                                    "models": [{"rm": tiny_dirs["rm"], "limit": n} for n in (50, 30, 10)]}))
    outs = two_nodes("probe.batch", [str(jobs)])
    said = "".join(outs)
    assert said.count("[run]") == 3 and "rank 0: [run]" in outs[0] and "rank 1: [run]" in outs[1], said
    runs = sorted((tmp_path / "out").glob("*/exhaustive_*"))
    metas = [json.loads((r / "meta.json").read_text()) for r in runs]
    assert sorted(m["job"]["limit"] for m in metas) == [10, 30, 50]
    assert all(m["status"] == "complete" for m in metas)
