"""``probe score --responses``, ``probe social`` and ``probe trace`` under torchrun (2 ranks, gloo on CPU): the run
folder one process writes (same files, same rows, bitwise scores), fresh and resumed after a kill (a kill: files
deleted from a finished run, or a rank that dies at its N-th write). One torchrun launch per test, or two."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from tests.unit.test_responses import _args as response_args

pytestmark = pytest.mark.slow
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # one thread per process, as in the test process


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def torchrun(module: str, args: list[str]) -> None:
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          "-m", module, *args], capture_output=True, text=True, env=ENV, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]


def killed_torchrun(tmp_path: Path, module: str, args: list[str], rank: int, call: int, target: str,
                    setup: str = "") -> None:
    """torchrun in which rank ``rank`` dies (as a kill: no cleanup) at its ``call``-th call of ``target``
    ("module:Class.method"), before that call runs; torchrun then stops the other rank. ``setup``: lines run first."""
    where, attr = target.split(":")
    owner, method = attr.split(".")
    script = tmp_path / "dying.py"
    script.write_text(f"""import os, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from {where} import {owner} as owner
{setup}
original, calls = owner.{method}, []
def dying(*args, **kwargs):
    calls.append(1)
    if os.environ["RANK"] == "{rank}" and len(calls) == {call}:
        os._exit(9)
    return original(*args, **kwargs)
owner.{method} = dying
from {module} import main
sys.exit(main(sys.argv[1:]))
""")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(script), *args], capture_output=True, text=True, env=ENV, timeout=600)
    assert out.returncode != 0, out.stderr[-3000:]


def files(run: Path) -> dict[str, Path]:
    return {str(p.relative_to(run)): p for p in sorted(run.rglob("*")) if p.is_file()}


def same_folder(a: Path, b: Path, tables: tuple[str, ...], own: str = "meta.json") -> None:
    """Same files; the tables equal (scores bitwise); every other file byte for byte, ``own`` aside (timing)."""
    fa, fb = files(a), files(b)
    assert fa.keys() == fb.keys()
    for name in fa:
        if name.endswith(".parquet"):
            assert pl.read_parquet(fa[name]).equals(pl.read_parquet(fb[name])), name
        elif name != own:
            assert fa[name].read_bytes() == fb[name].read_bytes(), name
    assert set(tables) <= fa.keys()


def killed_copy(run: Path, root: Path, lost: list[str]) -> tuple[Path, dict]:
    """``run`` as a kill would have left it: ``lost`` checkpoints and the results missing, status running; the
    kept files' (inode, mtime) to show they are not written again."""
    cut = root / run.parent.name / run.name
    shutil.copytree(run, cut)
    for name in lost + ["scores.parquet", "summary.json"]:
        (cut / name).unlink(missing_ok=True)
    meta = json.loads((cut / "meta.json").read_text())
    meta["status"] = "running"
    meta.pop("finished", None)
    (cut / "meta.json").write_text(json.dumps(meta))
    kept = {n: (p.stat().st_ino, p.stat().st_mtime_ns) for n, p in files(cut).items() if n.startswith("checkpoints")}
    return cut, kept


# --- probe score --responses: 12 responses x 2 prompts in shards of 5 (6 shards, 3 per rank) ---------------------
def test_two_ranks_score_responses_into_one_folder(tiny_dirs, tmp_path, one_thread):
    from probe.commands.score import main

    assert main(response_args(tiny_dirs, tmp_path, "one")) == 0
    torchrun("probe.exhaustive", response_args(tiny_dirs, tmp_path, "two"))
    (a,), (b,) = (tmp_path / "one").glob("*/responses_*"), (tmp_path / "two").glob("*/responses_*")
    same_folder(a, b, ("scores.parquet",))
    assert len(list((b / "checkpoints").rglob("shard_*.npy"))) == 6
    meta = json.loads((b / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["timing"]["sessions"][0]["processes"] == 2
    assert meta["timing"]["sessions"][0]["responses_scored"] == 24
    assert meta["self_check"].keys() == json.loads((a / "meta.json").read_text())["self_check"].keys()


def test_two_ranks_resume_a_killed_response_run(tiny_dirs, tmp_path, one_thread):
    from probe.commands.score import main

    assert main(response_args(tiny_dirs, tmp_path, "one")) == 0
    (a,) = (tmp_path / "one").glob("*/responses_*")
    lost = ["checkpoints/greatest_ever_one/shard_000002.npy", "checkpoints/worst_ever_one/shard_000000.npy",
            "checkpoints/worst_ever_one/shard_000001.npy"]
    cut, kept = killed_copy(a, tmp_path / "cut", lost)
    torchrun("probe.exhaustive", response_args(tiny_dirs, tmp_path, "cut", "--resume"))
    same_folder(a, cut, ("scores.parquet",))
    now = {n: (p.stat().st_ino, p.stat().st_mtime_ns) for n, p in files(cut).items() if n in kept}
    assert now == kept  # the finished shards were kept, not scored again
    sessions = json.loads((cut / "meta.json").read_text())["timing"]["sessions"]
    assert sessions[-1]["responses_scored"] == 5 + 2 + 5  # the lost shards only: 2 of greatest, 5 + 5 of worst


def test_a_self_check_on_rank_1_survives_a_kill(tiny_dirs, tmp_path, one_thread):
    """Rank 1 self-checks worst_ever_one's first shard, writes it and dies before its last shard: the resumed run
    records that self-check (of the shard it kept), as one process would have, and does not run another."""
    from probe.commands.score import main

    assert main(response_args(tiny_dirs, tmp_path, "one")) == 0
    (a,) = (tmp_path / "one").glob("*/responses_*")
    # rank 1's shards: greatest 1, worst 0 (self-checked), worst 2; it dies writing the third
    killed_torchrun(tmp_path, "probe.commands.score", response_args(tiny_dirs, tmp_path, "cut"), 1, 3,
                    "probe.runs.rundir:RunDir.write_shard")
    (cut,) = (tmp_path / "cut").glob("*/responses_*")
    kept = {n: (p.stat().st_ino, p.stat().st_mtime_ns) for n, p in files(cut).items() if n.endswith(".npy")}
    assert "checkpoints/worst_ever_one/shard_000000.npy" in kept
    assert "checkpoints/worst_ever_one/shard_000002.npy" not in kept
    torchrun("probe.exhaustive", response_args(tiny_dirs, tmp_path, "cut", "--resume"))
    same_folder(a, cut, ("scores.parquet",))
    assert {n: (p.stat().st_ino, p.stat().st_mtime_ns) for n, p in files(cut).items() if n in kept} == kept
    one, resumed = (json.loads((p / "meta.json").read_text()) for p in (a, cut))
    assert resumed["self_check"] == one["self_check"]  # worst_ever_one's on its first shard's rows, as one process


# --- probe social: one prompt's 280 rows (chunks of 256 and 24) and 10 items with prompts of their own ------------
def social_args(tmp_path, tiny_dirs, out: str, *extra) -> list[str]:
    crows = tmp_path / "crows.csv"
    with crows.open("w", newline="") as f:
        w = csv.DictWriter(f, ["sent_more", "sent_less", "stereo_antistereo", "bias_type"])
        w.writeheader()
        w.writerows({"sent_more": f"Group {i} people are lazy{'!' * (i % 7)}", "sent_less": f"Group {i} people work.",
                     "stereo_antistereo": "stereo", "bias_type": "race"} for i in range(140))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Question {i}?", "chosen": "Yes" * (1 + i % 3), "rejected": "No",
                                         "subset": "hh"}) + "\n" for i in range(10)))
    return ["--rm", tiny_dirs["rm"], "--device", "cpu", "--no-progress", "--batch-size", "16", "--output",
            str(tmp_path / out), "--dataset", "crows_pairs", "--data", str(crows), "--dataset", "pairs", "--data",
            str(pairs), *extra]


def test_two_ranks_run_social_into_one_folder(tiny_dirs, tmp_path, one_thread):
    from probe.commands.social import main

    assert main(social_args(tmp_path, tiny_dirs, "one")) == 0
    torchrun("probe.social", social_args(tmp_path, tiny_dirs, "two"))
    (a,), (b,) = (tmp_path / "one").glob("*/social_*"), (tmp_path / "two").glob("*/social_*")
    same_folder(a, b, ("scores.parquet", "summary.json", "checkpoints/000.parquet", "checkpoints/001.parquet"))
    assert pl.read_parquet(b / "scores.parquet").height == 2 * 140 + 2 * 10
    meta = json.loads((b / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["timing"][-1]["processes"] == 2


def test_two_ranks_resume_a_killed_social_run(tiny_dirs, tmp_path, one_thread):
    from probe.commands.social import main

    assert main(social_args(tmp_path, tiny_dirs, "one")) == 0
    (a,) = (tmp_path / "one").glob("*/social_*")
    cut, kept = killed_copy(a, tmp_path / "cut", ["checkpoints/001.parquet"])
    torchrun("probe.social", social_args(tmp_path, tiny_dirs, "cut", "--resume"))
    same_folder(a, cut, ("scores.parquet", "summary.json"))
    assert {n: (p.stat().st_ino, p.stat().st_mtime_ns) for n, p in files(cut).items() if n in kept} == kept


def test_two_ranks_resume_a_social_run_killed_mid_data_set(tiny_dirs, tmp_path, one_thread):
    """Rank 1 dies before its third chunk of the pairs (10 prompts: a chunk each; every chunk kept as it finishes
    here): the resumed run scores only the chunks no rank kept, and its folder is one process's, bitwise."""
    from probe.commands.social import main

    assert main(social_args(tmp_path, tiny_dirs, "one")) == 0
    (a,) = (tmp_path / "one").glob("*/social_*")
    # rank 1 scores crows chunk 1, then the pairs' chunks 1, 3, 5, ... (one window of rows packed together), keeping
    # each chunk as it finishes: it dies before it keeps chunk 5 (its 4th write)
    killed_torchrun(tmp_path, "probe.commands.social", social_args(tmp_path, tiny_dirs, "cut"), 1, 4,
                    "probe.runs.rundir:RunDir.write_chunks", "import probe.social.scoring as s; s.FLUSH_ROWS = 1")
    (cut,) = (tmp_path / "cut").glob("*/social_*")
    chunks = {n: p for n, p in files(cut).items() if n.startswith("checkpoints/001/")}
    assert {"checkpoints/001/chunks_000001.npz", "checkpoints/001/chunks_000003.npz"} <= chunks.keys()
    assert "checkpoints/001/chunks_000005.npz" not in chunks and "checkpoints/000.parquet" in files(cut)
    kept_rows = sum(len(np.load(p)["scores"]) for p in chunks.values())
    torchrun("probe.social", social_args(tmp_path, tiny_dirs, "cut", "--resume"))
    same_folder(a, cut, ("scores.parquet", "summary.json", "checkpoints/000.parquet", "checkpoints/001.parquet"))
    session = json.loads((cut / "meta.json").read_text())["timing"][-1]
    assert session["rows_scored"] == 2 * 10 - kept_rows and session["processes"] == 2


# --- probe trace: a social run's picks (a prompt each), a GCG run's best ids and responses under the paper prompt --
def trace_args(tmp_path, tiny_dirs) -> list[str]:
    """The inputs of one trace: every kind of piece, several prompts, so that each rank traces several."""
    from probe.commands.gcg import main as gcg_main
    from probe.commands.social import main as social_main

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Question {i}?", "chosen": "Yes" * (1 + i % 3), "rejected":
                                         f"No{'!' * i}", "subset": "hh"}) + "\n" for i in range(12)))
    quiet = ["--device", "cpu", "--no-progress"]
    assert social_main(["--rm", tiny_dirs["rm"], *quiet, "--output", str(tmp_path / "s"), "--dataset", "pairs",
                        "--data", str(pairs)]) == 0
    assert gcg_main(["--rm", tiny_dirs["rm"], "--length", "2", "--steps", "1", "--search-width", "8", "--topk", "4",
                     *quiet, "--output", str(tmp_path / "g")]) == 0
    responses = tmp_path / "responses.txt"
    responses.write_text("Love and peace\nThe Beatles\nI do not know what it is.\nMusic\n")
    (social,), (gcg,) = (tmp_path / "s").glob("*/social_*"), (tmp_path / "g").glob("*/gcg_max_*")
    return ["--social", str(social), "--limit", "3", "--gcg", str(gcg), "--responses", str(responses), "--response",
            "Peace", "--device", "cpu"]


def test_two_ranks_trace_into_one_folder(tiny_dirs, tmp_path, one_thread):
    """Each rank traces every second piece of work (a prompt's responses, a GCG result); rank 0 writes the folder
    one process writes: the same files, plots and pages byte for byte, the same numbers bitwise."""
    from probe.commands.trace import main

    args = trace_args(tmp_path, tiny_dirs)
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    torchrun("probe.trace", [*args, "--out", str(tmp_path / "two")])
    a, b = tmp_path / "one", tmp_path / "two"
    same_folder(a, b, ("trace.parquet", "trace.csv", "trace.html", "trace_01.png"), own="trace.json")
    ja, jb = (json.loads((p / "trace.json").read_text()) for p in (a, b))
    assert "processes" not in ja.pop("timing") and jb.pop("timing")["processes"] == 2
    assert ja == jb  # every setting, each trace's prompt, the run scores
    assert len(ja["traces"]) >= 6 and {t["source"] for t in ja["traces"]} == {"--response", "--gcg", "--social"}
