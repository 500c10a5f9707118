"""Two processes (torchrun, gloo on CPU) shard the vocabulary; the merged result equals a single-process run."""

import os
import subprocess
import sys

import polars as pl
import pytest

pytestmark = pytest.mark.slow


def test_two_process_sweep_equals_single_process(tiny_dirs, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # same threads per process in both runs
    args = ["--rm", tiny_dirs["rm"], "--prompt", "What, in one word, is the greatest thing ever?", "--prompt",
            "What, in one word, is the worst thing ever?", "--device", "cpu", "--shard-size", "100",
            "--batch-size", "32", "--no-progress"]
    single = subprocess.run([sys.executable, "-m", "probe.exhaustive", *args, "--output", str(tmp_path / "one")],
                            capture_output=True, text=True, env=env, timeout=600)
    assert single.returncode == 0, single.stderr
    multi = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                            "-m", "probe.exhaustive", *args, "--output", str(tmp_path / "two")],
                           capture_output=True, text=True, env=env, timeout=600)
    assert multi.returncode == 0, multi.stderr[-3000:]
    (a,) = list((tmp_path / "one").glob("*/exhaustive_*"))
    (b,) = list((tmp_path / "two").glob("*/exhaustive_*"))  # one run directory, shared by both ranks
    assert pl.read_parquet(a / "scores.parquet").equals(pl.read_parquet(b / "scores.parquet"))
    import json

    meta = json.loads((b / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["timing"]["processes"] == 2
    assert len(list((b / "checkpoints").rglob("shard_*.npy"))) == 2 * 15  # 1500 tokens / 100 per shard x 2 prompts
