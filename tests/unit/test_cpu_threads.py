"""CPU threads: from the CPUs this process may use (affinity mask, cgroup quota), OpenMP spin kept short so that a
run sharing the CPU slows in proportion (experiments/results/bench_shared_cpu.md), the user's own settings kept,
and what was in effect recorded in the run's meta.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from probe.runs import cpu


def _cgroup(tmp_path, v2=None, v1=None):
    root = tmp_path / "cg"
    root.mkdir(parents=True)
    if v2 is not None:
        (root / "cpu.max").write_text(v2 + "\n")
    if v1 is not None:
        (root / "cpu").mkdir()
        (root / "cpu" / "cpu.cfs_quota_us").write_text(f"{v1[0]}\n")
        (root / "cpu" / "cpu.cfs_period_us").write_text(f"{v1[1]}\n")
    return root


def test_cgroup_quota_v1_v2_and_none(tmp_path):
    assert cpu.cgroup_quota(_cgroup(tmp_path / "a", v2="150000 100000")) == pytest.approx(1.5)
    assert cpu.cgroup_quota(_cgroup(tmp_path / "b", v2="max 100000")) is None
    assert cpu.cgroup_quota(_cgroup(tmp_path / "c", v1=(300000, 100000))) == pytest.approx(3.0)
    assert cpu.cgroup_quota(_cgroup(tmp_path / "d", v1=(-1, 100000))) is None
    assert cpu.cgroup_quota(_cgroup(tmp_path / "e")) is None


def test_usable_cpus_takes_the_tighter_of_affinity_and_quota(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert cpu.usable_cpus(_cgroup(tmp_path / "a", v2="150000 100000")) == (2, "cgroup CPU quota")
    assert cpu.usable_cpus(_cgroup(tmp_path / "b", v2="max 100000")) == (8, "affinity mask")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert cpu.usable_cpus(_cgroup(tmp_path / "c", v2="400000 100000")) == (1, "affinity mask")


def test_prepare_sets_only_what_the_user_has_not(monkeypatch):
    monkeypatch.setattr(cpu, "usable_cpus", lambda root=cpu.CGROUP: (3, "affinity mask"))
    env: dict = {}
    assert cpu.prepare(env) == {"OMP_NUM_THREADS": "3", "GOMP_SPINCOUNT": cpu.SPINCOUNT, "MKL_CBWR": "AUTO,STRICT"}
    env = {"OMP_NUM_THREADS": "1", "GOMP_SPINCOUNT": "0", "MKL_CBWR": "AVX2,STRICT"}
    assert cpu.prepare(env) == {} and env == {"OMP_NUM_THREADS": "1", "GOMP_SPINCOUNT": "0", "MKL_CBWR": "AVX2,STRICT"}


@pytest.mark.parametrize("user", [{}, {"OMP_NUM_THREADS": "1", "GOMP_SPINCOUNT": "300000"}])
def test_a_command_runs_with_them_and_records_them(tiny_dirs, tmp_path, user):
    """A fresh process, as a user starts one: the command sets the threads before torch loads (or keeps the
    user's), and meta.json says what was in effect."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "GOMP_SPINCOUNT", "MKL_CBWR")} | user
    subprocess.run([sys.executable, "-m", "probe.exhaustive", "--rm", tiny_dirs["rm"], "--prompt", "What is best?",
                    "--limit", "16", "--verify", "0", "--device", "cpu", "--no-progress", "--output", str(tmp_path)],
                   env=env, check=True, capture_output=True, timeout=300)
    meta = json.loads(next(Path(tmp_path).rglob("meta.json")).read_text())
    got = meta["environment"]["cpu"]
    usable = cpu.usable_cpus()[0]
    want_threads = int(user.get("OMP_NUM_THREADS", usable))
    assert got["usable_cpus"] == usable and got["torch_threads"] == want_threads
    assert got["GOMP_SPINCOUNT"] == user.get("GOMP_SPINCOUNT", cpu.SPINCOUNT)
    assert meta["environment"]["cpu_threads"] == want_threads
    # the command put MKL in its reproducible mode before any product (probe/core/invariance.py), and says so
    blas = meta["model"]["batch_invariance"]["cpu_blas"]
    assert blas["strict"] is True and blas["MKL_CBWR"] == "AUTO,STRICT", blas
