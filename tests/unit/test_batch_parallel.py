"""A batch spread over processes: ``--shard I/N`` parts and torchrun's ranks write the folders and scores of one
process; torchrun refuses what one model per rank cannot run."""

import json
import os
import subprocess
import sys
import time

import polars as pl
import pytest
import yaml

from probe.commands.batch import main

PROMPT = "What, in one word, is the greatest thing ever?"


def _jobs(tmp_path, tiny_dirs, out: str, **extra) -> str:
    """Three jobs of three sizes, in the file's order 100, 300, 200 rows: largest first is models[2], [3], [1]."""
    data = {"defaults": {"device": "cpu", "output": str(tmp_path / out), "shard_size": 64, "progress": False,
                         "verify": 2, "batch_size": 32},
            "prompts": [PROMPT],
            "models": [{"rm": tiny_dirs["rm"], "limit": 100}, {"rm": tiny_dirs["rm3"], "label_index": 1, "limit": 300},
                       {"rm": tiny_dirs["rm"], "limit": 200, **extra}]}
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _runs(root) -> dict:
    """Each run folder by its model and limit: its files and its scores."""
    runs = {}
    for run in sorted(root.glob("*/exhaustive_*")):
        meta = json.loads((run / "meta.json").read_text())
        assert meta["status"] == "complete"
        files = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())
        runs[(run.parent.name, meta["job"]["limit"])] = (files, pl.read_parquet(run / "scores.parquet"))
    return runs


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and len(a) == 3
    for key in a:
        assert a[key][0] == b[key][0], key
        assert a[key][1].equals(b[key][1]), key  # bitwise: the same scores, ranks and tokens


def test_shard_parts_together_are_the_whole_batch(tmp_path, tiny_dirs, capsys):
    assert main([_jobs(tmp_path, tiny_dirs, "one")]) == 0
    capsys.readouterr()
    parts = _jobs(tmp_path, tiny_dirs, "parts")
    assert main([parts, "--shard", "1/2"]) == 0
    first = capsys.readouterr().out
    assert main([parts, "--shard", "2/2"]) == 0
    second = capsys.readouterr().out
    # dealt largest first: 300 and 100 rows to part 1, 200 to part 2, disjoint
    assert first.count("[run]") == 2 and "tiny-rm3" in first and second.count("[run]") == 1 and "tiny-rm3" not in second
    _same(_runs(tmp_path / "one"), _runs(tmp_path / "parts"))
    assert main([parts, "--shard", "1/2"]) == 0  # a part run again skips its complete jobs
    assert capsys.readouterr().out.count("[skip]") == 2


@pytest.mark.parametrize("bad", ["0/2", "3/2", "1/0", "x", "1/"])
def test_bad_shard_is_one_line(tmp_path, tiny_dirs, capsys, bad):
    assert main([_jobs(tmp_path, tiny_dirs, "out"), "--shard", bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --shard {bad}: expected I/N") and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.fixture
def rank0_of_2(monkeypatch):
    for k, v in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)


@pytest.mark.parametrize("extra, says", [
    ({"device_map": "auto"}, r"models\[3\] \(.*tiny-rm\): device_map .* without torchrun"),
    ({"device": "cuda:1"}, "device cuda:1: .* LOCAL_RANK; write device: cuda")])
def test_torchrun_refuses_a_job_it_cannot_run_before_any_runs(tmp_path, tiny_dirs, capsys, rank0_of_2, extra, says):
    import re

    assert main([_jobs(tmp_path, tiny_dirs, "out", **extra)]) == 2
    err = capsys.readouterr().err.strip()
    assert re.search(says, err) and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_torchrun_refuses_shard(tmp_path, tiny_dirs, capsys, rank0_of_2):
    assert main([_jobs(tmp_path, tiny_dirs, "out"), "--shard", "1/2"]) == 2
    assert "use one or the other" in capsys.readouterr().err


@pytest.mark.slow
def test_two_ranks_write_what_one_process_writes_and_skip_on_a_rerun(tmp_path, tiny_dirs):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # same threads per process in both runs
    one, two = _jobs(tmp_path, tiny_dirs, "one"), _jobs(tmp_path, tiny_dirs, "two")
    t0 = time.perf_counter()
    single = subprocess.run([sys.executable, "-m", "probe.batch", one], capture_output=True, text=True, env=env,
                            timeout=600)
    t1 = time.perf_counter()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                "-m", "probe.batch", two]
    multi = subprocess.run(torchrun, capture_output=True, text=True, env=env, timeout=600)
    t2 = time.perf_counter()
    print(f"batch of 3 jobs: 1 process {t1 - t0:.1f} s, torchrun 2 ranks {t2 - t1:.1f} s")
    assert single.returncode == 0, single.stderr[-3000:]
    assert multi.returncode == 0, multi.stderr[-3000:]
    assert multi.stdout.count("[run]") == 3 and "rank 0: [run]" in multi.stdout and "rank 1: [run]" in multi.stdout
    _same(_runs(tmp_path / "one"), _runs(tmp_path / "two"))
    again = subprocess.run(torchrun, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0 and again.stdout.count("[skip]") == 3 and "[run]" not in again.stdout


def test_a_rank_takes_whole_jobs_largest_first_on_its_own_gpu_without_a_process_group(tmp_path, tiny_dirs,
                                                                                       monkeypatch):
    from probe.commands import batch
    from probe.runs import distributed

    for k, v in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(k, v)
    taken, calls = iter([0, 2, 3]), []  # this rank gets the queue's 1st and 3rd jobs; the other rank the 2nd

    class Queue:
        def __init__(self, d):
            calls.append(("queue", d.rank, d.world))

        def take(self):
            return next(taken)

        def finish(self):
            calls.append("finish")

    monkeypatch.setattr(distributed, "JobQueue", Queue)
    monkeypatch.setattr("torch.cuda.set_device", lambda i: calls.append(("set_device", i)))
    monkeypatch.setattr(batch, "_run_job", lambda job, tag: calls.append(
        (job.limit, job.device, job.progress, distributed.init(job.device).enabled, tag)) or True)
    path = _jobs(tmp_path, tiny_dirs, "out")
    path_cuda = path.replace(".yaml", "_cuda.yaml")
    data = yaml.safe_load(open(path))
    data["defaults"] |= {"device": "cuda", "progress": True}
    open(path_cuda, "w").write(yaml.safe_dump(data))
    assert main([path_cuda]) == 0
    assert calls == [("queue", 1, 2), ("set_device", 1), (300, "cuda:1", False, False, "rank 1: "),
                     ("set_device", 1), (100, "cuda:1", False, False, "rank 1: "), "finish"]


def test_job_size_is_rows_times_prompts(tmp_path):
    from probe.commands.batch import job_size, largest_first
    from probe.config import ScoreVocabConfig

    answers = tmp_path / "answers.txt"
    answers.write_text("yes\nno\nmaybe\nlater\nnever\n")
    jobs = [ScoreVocabConfig(prompt=("a", "b"), limit=4), ScoreVocabConfig(prompt=("a", "b"), responses=str(answers)),
            ScoreVocabConfig(prompt=("a",), responses=str(answers), limit=3), ScoreVocabConfig(prompt=("a",))]
    assert [job_size(j) for j in jobs] == [8, 10, 3, float("inf")]
    assert largest_first(jobs) == [3, 1, 0, 2]


def test_deal_balances_costs_and_gives_every_item_once():
    """`deal` (social chunks under torchrun): every item to exactly one rank, the same deal on every rank, and on a
    skewed list the heaviest rank carries less than round robin gives it (one long chunk, many short ones)."""
    from probe.runs.distributed import deal

    costs = [100.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 60.0, 1.0, 1.0, 1.0]
    for world in (1, 2, 3):
        shares = deal(costs, world)
        assert sorted(i for s in shares for i in s) == list(range(len(costs)))
        assert all(s == sorted(s) for s in shares) and shares == deal(costs, world)
    rr = max(sum(costs[i::2]) for i in range(2))
    dealt = max(sum(costs[i] for i in s) for s in deal(costs, 2))
    assert dealt < rr and dealt == 100.0
    assert deal([], 2) == [[], []] and deal([5.0], 3) == [[0], [], []]
