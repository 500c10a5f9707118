"""The GPU paths, reached on a CPU: torchrun's process group (device and backend), out-of-memory recovery with
injected errors (no row lost, the halved size recorded and resumed with), the memory plan for every config family
against a hand count and a counted peak, device placement with part of a model elsewhere, the gated head without
a host round trip, and the half-precision tolerance of a CUDA forward."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from probe.commands.score import ScoreVocabConfig, run
from probe.core.scoring import AdaptiveBatcher, is_oom
from probe.errors import ProbeError
from probe.runs import distributed

PROMPTS = ("What, in one word, is the greatest thing ever?", "What, in one word, is the worst thing ever?")


# ---------------------------------------------------------------- 1. torchrun: device and backend of each rank


@pytest.fixture
def fake_torchrun(monkeypatch):
    """torchrun's environment for rank 1 of 2, with torch.cuda and torch.distributed replaced by recorders."""
    import torch.distributed as dist

    calls: list[tuple] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    state = {"up": False}

    def init_process_group(backend=None, **kw):
        calls.append(("init_process_group", backend))
        state["up"] = True

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "is_initialized", lambda: state["up"])
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append(("destroy_process_group",)))
    return calls


@pytest.mark.parametrize("requested", ["cuda", "auto"])
def test_a_cuda_rank_makes_its_own_gpu_current_before_nccl_starts(fake_torchrun, requested):
    d = distributed.init(requested)
    assert (d.rank, d.world, d.local_rank) == (1, 2, 1)
    # set_device first: NCCL's broadcast_object_list builds its tensors on the current device
    assert fake_torchrun == [("set_device", 1), ("init_process_group", "nccl")]
    assert distributed.device_for(d, requested) == "cuda:1"


def test_a_cpu_run_uses_gloo_even_where_cuda_is_visible(fake_torchrun):
    d = distributed.init("cpu")
    assert fake_torchrun == [("init_process_group", "gloo")]
    assert distributed.device_for(d, "cpu") == "cpu"


def test_torchrun_with_device_map_or_a_fixed_gpu_is_refused_before_the_group_starts(fake_torchrun):
    with pytest.raises(ProbeError, match="--device-map .* torchrun"):
        distributed.init("cuda", device_map="auto")
    with pytest.raises(ProbeError, match="LOCAL_RANK"):
        distributed.init("cuda:1")
    assert not any(c[0] == "init_process_group" for c in fake_torchrun)


def test_the_command_destroys_its_process_group_even_when_the_run_fails(fake_torchrun, monkeypatch, tmp_path):
    import probe.commands.score as score

    def boom(*a, **k):
        raise RuntimeError("scoring failed")

    monkeypatch.setattr(score, "_run", boom)
    with pytest.raises(RuntimeError, match="scoring failed"):
        score.run(ScoreVocabConfig(rm="x", device="cpu", output=str(tmp_path)))
    assert fake_torchrun == [("init_process_group", "gloo"), ("destroy_process_group",)]


def test_a_single_process_touches_no_process_group(fake_torchrun, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    d = distributed.init("cuda", device_map="auto")  # --device-map alone is fine
    distributed.destroy(d)
    assert not d.enabled and fake_torchrun == []


# ---------------------------------------------------------------- 4. what counts as out of memory


@pytest.mark.parametrize("err", [
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried ..."),
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
])
def test_allocation_failures_are_out_of_memory(err):
    assert is_oom(err)


@pytest.mark.parametrize("err", [RuntimeError("CUDA error: an illegal memory access was encountered"),
                                 ValueError("out of memory"), RuntimeError("shape mismatch")])
def test_other_errors_are_not(err):
    assert not is_oom(err)


def test_out_of_memory_is_recognised_on_torch_before_2_5(monkeypatch):
    """torch 2.4 (allowed by pyproject) has no torch.OutOfMemoryError, only torch.cuda.OutOfMemoryError: the check
    must neither fail with AttributeError nor miss the error."""
    monkeypatch.delattr(torch, "OutOfMemoryError")
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert not is_oom(KeyError("x"))

    calls = []

    def score(rows):
        calls.append(rows.shape[0])
        if rows.shape[0] > 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return rows[:, 0].float()

    out = AdaptiveBatcher(32).run(score, torch.arange(40)[:, None])
    np.testing.assert_array_equal(out, np.arange(40, dtype=np.float32))
    assert calls[:3] == [32, 16, 8]


def test_memory_is_released_after_the_failed_batch_is_gone(monkeypatch):
    """empty_cache() runs once the failed batch's exception (and the tensors its traceback holds) is released."""
    import gc
    import weakref

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    alive_at_release = []
    held: list[weakref.ref] = []

    def empty_cache():
        gc.collect()
        alive_at_release.append([r() is not None for r in held])

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)

    def score(rows):
        if rows.shape[0] > 4:
            activations = torch.zeros(rows.shape[0], 1000)  # what a failing forward had allocated
            held.append(weakref.ref(activations))
            raise torch.OutOfMemoryError("CUDA out of memory")
        return rows[:, 0].float()

    AdaptiveBatcher(16).run(score, torch.arange(20)[:, None])
    assert alive_at_release == [[False], [False, False]]


# ---------------------------------------------------------------- 7. an injected OOM inside a real sweep, resumed


def _config(tiny_dirs, out, **kw):
    base = dict(rm=tiny_dirs["rm"], prompt=PROMPTS, device="cpu", output=str(out), shard_size=128, batch_size=64,
                progress=False, verify=2, limit=640)
    return ScoreVocabConfig(**{**base, **kw})


def _inject(monkeypatch, error: Exception, at_call: int, sizes: list[int], crash_after_shards: int | None = None):
    """PrefixScorer.score raises ``error`` on its ``at_call``-th batch of more than 16 rows; every batch size is
    recorded in ``sizes``; with ``crash_after_shards``, the run dies after that many shards (a killed session)."""
    from probe.core.engine import PrefixScorer
    from probe.runs.rundir import RunDir

    original, write = PrefixScorer.score, RunDir.write_shard
    state = {"big": 0, "shards": 0}

    def score(self, cont, lengths=None):
        sizes.append(len(cont))
        if len(cont) > 16:
            state["big"] += 1
            if state["big"] == at_call:
                raise error
        return original(self, cont, lengths)

    def write_shard(self, *a):
        if crash_after_shards is not None and state["shards"] == crash_after_shards:
            raise KeyboardInterrupt
        state["shards"] += 1
        write(self, *a)

    monkeypatch.setattr(PrefixScorer, "score", score)
    monkeypatch.setattr(RunDir, "write_shard", write_shard)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"),
                                   RuntimeError("CUDA error: out of memory")])
def test_an_out_of_memory_batch_is_halved_recorded_and_loses_no_row(tiny_dirs, tmp_path, monkeypatch, error):
    want = run(_config(tiny_dirs, tmp_path / "plain")).read_table("scores.parquet")
    sizes: list[int] = []
    _inject(monkeypatch, error, at_call=3, sizes=sizes)
    got_dir = run(_config(tiny_dirs, tmp_path / "oom"))
    got = got_dir.read_table("scores.parquet")
    assert got.height == want.height and got["token_id"].to_list() == want["token_id"].to_list()
    np.testing.assert_allclose(got["score"].to_numpy(), want["score"].to_numpy(), rtol=1e-5, atol=1e-5)
    meta = got_dir.read_meta()
    assert meta["settings"]["batch_size"] == 32 and [h["batch_size"] for h in meta["oom_halvings"]] == [32]
    assert 64 in sizes and max(sizes[sizes.index(32):]) == 32  # after the failure, never back to 64


def test_resume_continues_with_the_halved_batch_size(tiny_dirs, tmp_path, monkeypatch):
    sizes: list[int] = []
    _inject(monkeypatch, torch.OutOfMemoryError("CUDA out of memory"), at_call=2, sizes=sizes, crash_after_shards=2)
    with pytest.raises(KeyboardInterrupt):
        run(_config(tiny_dirs, tmp_path))
    monkeypatch.undo()
    (broken,) = list(tmp_path.glob("*/exhaustive_*"))
    assert json.loads((broken / "meta.json").read_text())["settings"]["batch_size"] == 32

    from probe.core.engine import PrefixScorer

    resumed_sizes: list[int] = []
    original = PrefixScorer.score
    monkeypatch.setattr(PrefixScorer, "score", lambda self, c, l=None: resumed_sizes.append(len(c)) or original(self, c, l))
    resumed = run(_config(tiny_dirs, tmp_path, resume="latest"))
    assert resumed.path == broken and resumed.read_meta()["status"] == "complete"
    assert max(resumed_sizes) == 32  # not the 64 the run started with


def test_a_responses_run_records_its_halved_batch_size(tiny_dirs, tmp_path, monkeypatch):
    from probe.commands.responses import run_responses

    items = tmp_path / "items.txt"
    items.write_text("\n".join(f"{w} number {i}" for i in range(8) for w in ("Love", "Freedom", "a", "Peace")) + "\n")
    sizes: list[int] = []
    _inject(monkeypatch, RuntimeError("CUDA error: out of memory"), at_call=1, sizes=sizes)
    out = run_responses(_config(tiny_dirs, tmp_path / "runs", responses=str(items), batch_size=40, limit=None))
    meta = out.read_meta()
    assert meta["batch_size"] == 20 and meta["oom_halvings"][0]["batch_size"] == 20
    assert out.read_table("scores.parquet").height == 2 * 32
