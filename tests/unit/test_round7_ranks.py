"""torchrun's gathered counts in one process (issue 74): two ranks run as two threads of this process, each with its
own ``Dist``, the process group's three collectives (broadcast, gather, barrier) replaced by thread-safe ones that
pickle what they pass, as torch.distributed does. The commands' own code runs unchanged: each rank scores its share,
rank 0 adds up what the others send. A run takes seconds, where a torchrun launch takes a minute
(tests/unit/test_rows_torchrun.py, marked slow), so the counts of a two-rank run are checked in ``make test``:
tokens_scored, tokens/s, responses_scored, the slowest rank's time, the batch size, rows_scored."""

from __future__ import annotations

import json
import pickle
import threading
import time
from pathlib import Path

import polars as pl
import pytest

from probe.runs.distributed import Dist


class TwoRanks:
    """The collectives of a 2-rank process group between two threads. Whatever a rank sends is pickled and read
    back (each rank gets its own copy, as over gloo); ``sent`` keeps what each rank gave to each gather."""

    def __init__(self, world: int = 2):
        self.world = world
        self.bar = threading.Barrier(world, timeout=120)
        self.slots: dict = {}
        self.sent: list[list] = []  # per gather call: [rank 0's object, rank 1's object]

    def _wait(self):
        self.bar.wait()

    def barrier(self, d: Dist) -> None:
        if d.enabled:
            self._wait()

    def broadcast(self, d: Dist, obj):
        if not d.enabled:
            return obj
        if d.main:
            self.slots["b"] = pickle.dumps(obj)
        self._wait()
        out = pickle.loads(self.slots["b"])
        self._wait()
        return out

    def gather(self, d: Dist, obj):
        if not d.enabled:
            return [obj]
        self.slots[("g", d.rank)] = pickle.dumps(obj)
        self._wait()
        out = None
        if d.main:
            out = [pickle.loads(self.slots[("g", r)]) for r in range(self.world)]
            self.sent.append(out)
        self._wait()
        return out

    def patch(self, monkeypatch) -> None:
        """The collectives wherever the commands look them up: probe.runs.distributed's, and the names modules
        imported from it at their own import (imported here first, so that they hold the real ones to replace)."""
        import importlib

        for name in ("probe.runs.distributed", "probe.core.sweep", "probe.social.scoring", "probe.commands.social",
                     "probe.commands.score", "probe.commands.responses"):
            module = importlib.import_module(name)
            for fn in ("barrier", "broadcast", "gather"):
                if hasattr(module, fn):
                    monkeypatch.setattr(module, fn, getattr(self, fn))

    def run(self, body) -> list:
        """``body(Dist(rank, world, rank))`` on each rank, in threads; the ranks' results. A rank that fails
        breaks the barrier, so the other stops too, and the first error is raised here."""
        results, errors = [None] * self.world, []

        def one(rank: int):
            try:
                results[rank] = body(Dist(rank, self.world, rank))
            except BaseException as err:  # noqa: BLE001 (handed to the test's thread)
                errors.append(err)
                self.bar.abort()

        threads = [threading.Thread(target=one, args=(r,), name=f"rank{r}") for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        if errors:
            raise errors[0]
        return results


@pytest.fixture
def two(monkeypatch):
    ranks = TwoRanks()
    ranks.patch(monkeypatch)
    return ranks


def _sweep_config(tiny_dirs, out: Path, **kw):
    from probe.config import ScoreVocabConfig

    return ScoreVocabConfig(rm=tiny_dirs["rm"], device="cpu", prompt=("What is best?", "What is worst?"), limit=7,
                            shard_size=2, batch_size=3, verify=2, progress=False, output=str(out), **kw)


def test_two_ranks_count_every_token_of_an_odd_sized_sweep(tiny_dirs, tmp_path, two):
    """7 tokens in shards of 2, 2, 2 and 1: rank 0 scores shards 0 and 2 (4 tokens), rank 1 shards 1 and 3 (3).
    meta.json counts the 7 of each prompt (14 in the session), not rank 0's 4 or 4 shards x 2, and tokens/s is
    those tokens over the recorded seconds; the scores are one process's."""
    from probe.commands import score
    from probe.runs.timing import now_iso

    one = score.run(_sweep_config(tiny_dirs, tmp_path / "one"))
    config = _sweep_config(tiny_dirs, tmp_path / "two")
    dirs = two.run(lambda d: score._run(config, d, time.perf_counter(), now_iso()))
    assert dirs[0].path == dirs[1].path
    run = dirs[0].path
    assert pl.read_parquet(run / "scores.parquet").equals(pl.read_parquet(one.path / "scores.parquet"))
    assert [sorted(x) for x in two.sent] == [[3, 4], [3, 4]]  # each prompt: the tokens each rank scored
    meta = json.loads((run / "meta.json").read_text())
    t = meta["timing"]
    for key, entry in t["prompts"].items():
        assert entry["tokens_scored"] == entry["tokens_scored_now"] == 7, key
        assert entry["tokens_per_s"] == round(7 / entry["sweep_s"], 2), key
    (session,) = t["sessions"]
    assert session["tokens_scored"] == 14 and session["processes"] == 2 and t["processes"] == 2
    assert session["sweep_s"] == round(sum(e["sweep_s"] for e in t["prompts"].values()), 3)
    assert t["tokens_per_s"] == round(14 / t["sweep_s"], 2)


def _response_config(tiny_dirs, tmp_path: Path, out: str, **kw):
    from probe.config import ScoreVocabConfig

    items = tmp_path / "items.txt"
    items.write_text("".join(f"answer {'word ' * (i % 4)}{i}\n" for i in range(11)))
    return ScoreVocabConfig(rm=tiny_dirs["rm"], device="cpu", responses=str(items),
                            prompt=("What is best?", "What is worst?"), shard_size=3, batch_size=4, verify=2,
                            progress=False, output=str(tmp_path / out), **kw)


def test_two_ranks_count_every_response_the_slowest_ranks_time_and_the_smallest_batch(tiny_dirs, tmp_path, two,
                                                                                      monkeypatch):
    """11 responses x 2 prompts in shards of 3 (8 shards; rank 0: 12 responses, rank 1: 10): the session counts the
    22 both ranks scored; its scoring time is the slower rank's (the ranks work at once: here rank 1, which waits
    250 ms a shard), not the sum nor rank 0's; responses/s is 22 over it. Rank 1 runs out of memory at once (its
    batch halved to 2): a resume must cut the batches it cut, so meta.json keeps the smallest batch of any rank.
    The scores are one process's."""
    from probe.commands import responses
    import probe.core.responses

    one = responses.run_responses(_response_config(tiny_dirs, tmp_path, "one"))
    real_score, real_shards = probe.core.responses.score_rows, responses._score_shards

    def slower_on_rank_1(*args, **kw):
        if threading.current_thread().name == "rank1":
            time.sleep(0.25)
        return real_score(*args, **kw)

    def halved_on_rank_1(config, dist, loaded, rows, n, todo, run_dir, meta, *rest):
        return real_shards(config, dist, loaded, rows, n, todo, run_dir,
                           {**meta, "batch_size": 2} if dist.rank == 1 else meta, *rest)

    monkeypatch.setattr(probe.core.responses, "score_rows", slower_on_rank_1)
    monkeypatch.setattr(responses, "_score_shards", halved_on_rank_1)
    config = _response_config(tiny_dirs, tmp_path, "two")
    dirs = two.run(lambda d: responses._run(config, d))
    run_dir = dirs[0].path
    assert pl.read_parquet(run_dir / "scores.parquet").equals(pl.read_parquet(one.path / "scores.parquet"))
    (sent,) = two.sent  # (self-checks, responses scored, scoring seconds, batch size) of each rank
    assert [r[1] for r in sent] == [12, 10] and [r[3] for r in sent] == [4, 2]
    assert sent[1][2] > sent[0][2]
    meta = json.loads((run_dir / "meta.json").read_text())
    (session,) = meta["timing"]["sessions"]
    assert session["responses_scored"] == 22 and session["processes"] == 2
    assert session["score_s"] == sent[1][2]
    assert meta["timing"]["score_s"] == session["score_s"]
    assert meta["timing"]["responses_per_s"] == round(22 / session["score_s"], 2)
    assert meta["batch_size"] == 2
    assert meta["self_check"].keys() == json.loads((one.path / "meta.json").read_text())["self_check"].keys()


def _social_config(tiny_dirs, tmp_path: Path, out: str):
    import csv

    from probe.config import SocialConfig

    crows = tmp_path / "crows.csv"
    with crows.open("w", newline="") as f:
        w = csv.DictWriter(f, ["sent_more", "sent_less", "stereo_antistereo", "bias_type"])
        w.writeheader()
        w.writerows({"sent_more": f"Group {i} people are lazy{'!' * (i % 5)}", "sent_less": f"Group {i} people work.",
                     "stereo_antistereo": "stereo", "bias_type": "race"} for i in range(9))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": f"Question {i}?", "chosen": "Yes" * (1 + i % 3), "rejected": "No",
                                         "subset": "hh"}) + "\n" for i in range(5)))
    return SocialConfig(rm=(tiny_dirs["rm"],), device="cpu", progress=False, batch_size=4,
                        output=str(tmp_path / out), dataset=("crows_pairs", "pairs"), data=(str(crows), str(pairs)))


def test_two_ranks_count_every_social_row(tiny_dirs, tmp_path, two):
    """9 CrowS-Pairs items (one prompt: 18 rows in one chunk) and 5 pairs with prompts of their own (10 rows in 5
    chunks), dealt over two ranks: the session counts the 28 rows, the summary and scores are one process's."""
    from probe.commands.social import load_datasets, run_model, suite_models

    def go(cfg, d: Dist):
        return run_model(cfg, suite_models(cfg)[0], load_datasets(cfg), d)

    one_run, one_summary = go(_social_config(tiny_dirs, tmp_path, "one"), Dist())
    cfg = _social_config(tiny_dirs, tmp_path, "two")
    (run0, summary0), (run1, summary1) = two.run(lambda d: go(cfg, d))
    assert summary1 is None and run0.path == run1.path
    assert summary0 == one_summary
    assert pl.read_parquet(run0.path / "scores.parquet").equals(pl.read_parquet(one_run.path / "scores.parquet"))
    rows = [sum(len(p) for p in sent) for sent in two.sent]  # per data set: the rows each rank sent, together
    assert rows == [18, 10]
    assert all(len(p) for sent in two.sent[1:] for p in sent)  # the 5 chunks of pairs: both ranks had some
    meta = json.loads((run0.path / "meta.json").read_text())
    (session,) = meta["timing"]
    assert session["rows_scored"] == 28 and session["processes"] == 2
