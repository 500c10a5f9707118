"""Time to result (issue 75): the self-check's reference in one forward per tile of rows, and the split that this
CPU's report and the GPU kit's ``e2e`` step measure (experiments/time_to_result.py)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from probe.config import ScoringOptions
from probe.core import scoring
from probe.core.scoring import TemplateRows, build_scorer, conversation, make_head, self_check
from probe.core.template import split_template


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-lm", "logprob")])
def test_the_self_checks_reference_runs_its_rows_together_with_the_same_numbers(tiny_models, monkeypatch, name, mode):
    """16 checked ids of a sweep: one forward of the model's own (not 16, each of which a GPU pads to a whole tile),
    and the check's numbers those of the reference one sequence at a time."""
    lm = tiny_models[name]
    opts = ScoringOptions()
    head = make_head(lm, mode, opts)
    split = split_template(lm.tokenizer, conversation(mode, "What is best?", None, opts, lm), n_verify=0)
    source = TemplateRows(split)
    ids = np.random.default_rng(0).choice(len(lm.tokenizer), 16, replace=False).tolist()
    fast = build_scorer(lm, head, source.prefix_ids)
    calls = []
    own = head.own_forward

    def counted(model, ids_, n_prefix):
        calls.append(ids_.shape[0])
        return own(model, ids_, n_prefix)

    monkeypatch.setattr(head, "own_forward", counted)
    together = self_check(lm, head, source, fast, ids)
    from probe.core.invariance import rows_per_forward, tail_rows

    # one forward of a tile's worth of rows (probe/core/invariance.py): the 16 rows and copies of one to fill it, and
    # on a CPU `tail_rows` more (no scored row in a transcendental kernel's scalar tail)
    tokens = len(split.prefix_ids) + 1 + len(split.suffix_ids)
    assert calls == [rows_per_forward(tokens, "cpu") + tail_rows(tokens, "cpu")] and calls[0] >= 16
    calls.clear()
    monkeypatch.setattr(scoring, "REFERENCE_TOKENS", 1)  # one sequence a forward, as before issue 75
    alone = self_check(lm, head, source, fast, ids)
    assert calls == [1 + tail_rows(tokens, "cpu")] * 16
    assert together == alone and together.max_abs_diff > 0


def test_a_classifier_without_a_pad_id_or_a_class_of_its_own_is_checked_one_sequence_at_a_time(tiny_models,
                                                                                                 monkeypatch):
    """transformers' sequence classifiers refuse a batch without a pad id (the GPU kit's random Llama-shape model has
    none); a class that is not transformers' own was checked one sequence at a time and stays so."""
    lm = tiny_models["llama-rm"]
    opts = ScoringOptions()
    head = make_head(lm, "reward", opts)
    split = split_template(lm.tokenizer, conversation("reward", "What is best?", None, opts, lm), n_verify=0)
    source = TemplateRows(split)
    fast = build_scorer(lm, head, source.prefix_ids)
    calls = []
    own = head.own_forward
    monkeypatch.setattr(head, "own_forward", lambda m, ids, n: calls.append(ids.shape[0]) or own(m, ids, n))
    monkeypatch.setattr(lm.model.config, "pad_token_id", None)
    assert not scoring.takes_a_batch(lm.model)
    self_check(lm, head, source, fast, list(range(40, 56)))
    assert calls == [1] * 16
    monkeypatch.undo()
    assert scoring.takes_a_batch(lm.model)
    own_class = type("OwnClassifier", (type(lm.model),), {"__module__": "transformers_modules.someone.modeling"})
    monkeypatch.setattr(lm.model, "__class__", own_class)
    assert not scoring.takes_a_batch(lm.model)


def test_the_reference_keeps_a_forward_within_one_tile_of_token_rows(tiny_models, monkeypatch):
    lm = tiny_models["llama-rm"]
    head = make_head(lm, "reward", ScoringOptions())
    prefix = list(range(5, 45))
    rows = scoring.sweep_rows(np.arange(100, 140), [7, 8])  # 40 rows of 3 ids after a 40-id prefix: 43 tokens each
    calls = []
    own = head.own_forward
    monkeypatch.setattr(head, "own_forward", lambda m, ids, n: calls.append(ids.shape[0]) or own(m, ids, n))
    monkeypatch.setattr(scoring, "REFERENCE_TOKENS", 430)  # ten rows of 43 tokens a forward
    lengths = torch.full((40,), 3)
    scoring.check_rows(lm, head, prefix, build_scorer(lm, head, prefix), rows, lengths, [str(i) for i in range(40)])
    from probe.core.invariance import tail_rows

    assert calls == [10 + tail_rows(43, "cpu")] * 4  # (on a CPU, two rows of padding after the ten: `tail_rows`)


def test_split_clock_puts_each_part_of_a_sweep_where_it_belongs(tiny_models, tmp_path):
    import polars as pl

    import probe
    from experiments.time_to_result import PARTS, serial_vocabulary, split_clock
    from probe.core.scoring import AdaptiveBatcher

    lm = tiny_models["llama-rm"]
    run = AdaptiveBatcher.run
    for job in (None, serial_vocabulary):
        with split_clock(job) as clock:
            t = time.perf_counter()
            df = probe.sweep(lm, None, "What is best?", limit=300, verify=4)
            df.write_parquet(tmp_path / "scores.parquet")
            split = clock.split(time.perf_counter() - t)
        assert all(split[p] > 0 for p in PARTS), split
        assert split["the rest"] >= 0 and split["time to result"] == pytest.approx(
            sum(split[p] for p in (*PARTS, "the rest")), abs=0.01)
        # the ratio is of the unrounded seconds; the split's are rounded to 1 ms (half of it either way)
        t, e, h = split["time to result"], split["engine loop"], 0.0005
        assert (t - h) / (e + h) - h <= split["ratio to the engine loop"] <= (t + h) / (e - h) + h, split
    assert AdaptiveBatcher.run is run and pl.DataFrame.write_parquet.__name__ == "write_parquet"  # put back
    assert probe.core.vocab_cache.VocabJob.__module__ == "probe.core.vocab_cache"


def test_the_kit_page_shows_the_time_to_result_split():
    from experiments import gpu_kit

    run = {"engine loop": 9.3, "vocabulary table": 0.05, "self-check": 0.6, "Parquet": 0.2, "the rest": 0.9,
           "time to result": 11.05, "vocabulary from": "child"}
    e2e = {"ids": 128256, "seconds_total": 11.05, "seconds_engine_loop": 9.2, "overhead_s": 1.85,
           "split": {"first run": run, "cached": {**run, "vocabulary from": "cache"}}}
    page = gpu_kit.markdown({"command": "x", "environment": {}, "seconds": 1.0, "small": False, "tests": {},
                             "bench": {"results": {"e2e": e2e}, "dtype": "bfloat16", "matmul_flops_per_s": 1e15}})
    for text in ("128,256 ids in 11.05 s (1.20x the engine loop alone, 9.20 s;",
                 "| first run | 9.30 | 0.05 | 0.60 | 0.20 | 0.90 | 11.05 | 1.20 | child |",
                 "| cached | 9.30 | 0.05 | 0.60 | 0.20 | 0.90 | 11.05 | 1.20 | cache |"):
        assert text in page, text
