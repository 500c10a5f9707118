"""Time to result, split: where a sweep's wall time goes beside the engine loop (issue 75: within 1.3x of it).

    python -m experiments.time_to_result --limit 2048 --repeats 3   # the embedded SmolLM2 on this CPU
    -> experiments/results/time_to_result_cpu.md (and .json)

`split_clock` times, on the calling thread, what a sweep does between loading the model and holding its results:

* engine loop: the scorer's batches (``AdaptiveBatcher.run``);
* vocabulary table: this process's part of it: building it (the tree before issue 75, or a small table), or the
  cache key, a cache read, starting the child that builds it and waiting for that child (`VocabJob`);
* self-check: the fast path against the model's own forward on the sampled ids;
* Parquet: the ranked result tables (``ranked_table``: the scores joined to the vocabulary's columns) and the files;
* the rest: everything else (template split, prefix forward, batch plan, shards and meta.json, progress);

and the model's loading, left out of the time to result. Calls inside a timed call count once, to the outer one.

This CPU run drives ``probe.exhaustive``'s own ``run`` (the embedded SmolLM2, its log-probability proxy, the three
paper prompts, the first ``--limit`` ids of each) in this process, in three ways per repeat, in turn:

* before: as the tree before issue 75: the table built here before the sweep loop and not kept (`serial_vocabulary`),
  the self-check's reference one sequence a forward;
* first run: the cache entry of this tokenizer removed first, so the table is built by the child beside the sweep;
* cached: the entry there, read.

and checks that the three runs wrote the same vocab.parquet and scores.parquet, byte for byte. The GPU kit's
``e2e`` step (`bench_e2e`, experiments/gpu_bench.py) reports the same split for ``probe.sweep`` over Llama 3.1's
128,256 ids.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = ("engine loop", "vocabulary table", "self-check", "Parquet")


class SplitClock:
    """Seconds per part (``PARTS``, and ``model load``), on the thread that made the clock."""

    def __init__(self):
        self.seconds = dict.fromkeys((*PARTS, "model load"), 0.0)
        self.thread = threading.current_thread()
        self.inside = False
        self.jobs: list = []  # the vocabulary jobs started inside (their key, and where the table came from)

    def wrap(self, part: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            if self.inside or threading.current_thread() is not self.thread:
                return fn(*args, **kwargs)
            self.inside = True
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - t
                self.inside = False

        return timed

    def split(self, total: float) -> dict:
        """``total`` (seconds from the start to the results, the model's loading included) split into the parts, the
        rest, and the time to result (``total`` less the loading) over the engine loop."""
        out = {k: round(v, 3) for k, v in self.seconds.items()}
        to_result = total - self.seconds["model load"]
        out["the rest"] = round(to_result - sum(self.seconds[p] for p in PARTS), 3)
        out["time to result"] = round(to_result, 3)
        out["ratio to the engine loop"] = round(to_result / self.seconds["engine loop"], 3) if self.seconds["engine loop"] else None
        out["vocabulary from"] = ", ".join(getattr(j, "source", "built here") for j in self.jobs)
        return out


@contextmanager
def split_clock(vocab_job=None):
    """A `SplitClock` over every sweep started inside (``vocab_job``: a stand-in for `VocabJob`, as `serial_vocabulary`)."""
    import polars as pl

    import probe.core.sweep
    import probe.core.vocab_cache
    from probe.core.scoring import AdaptiveBatcher
    from probe.runs.rundir import RunDir

    clock = SplitClock()
    job = vocab_job or probe.core.vocab_cache.VocabJob
    start = clock.wrap("vocabulary table", job.__init__)

    def started(self, *args, **kwargs):
        start(self, *args, **kwargs)
        clock.jobs.append(self)

    # the job's own methods, on a subclass: the clock times its start and its result, the class itself untouched
    timed_job = type(job.__name__, (job,), {"__init__": started, "result": clock.wrap("vocabulary table", job.result)})
    patches = [(AdaptiveBatcher, "run", clock.wrap("engine loop", AdaptiveBatcher.run)),
               (probe.core.sweep, "self_check", clock.wrap("self-check", probe.core.sweep.self_check)),
               (probe.core.sweep, "load_for", clock.wrap("model load", probe.core.sweep.load_for)),
               (probe.core.sweep, "ranked_table", clock.wrap("Parquet", probe.core.sweep.ranked_table)),
               (RunDir, "write_table", clock.wrap("Parquet", RunDir.write_table)),
               (pl.DataFrame, "write_parquet", clock.wrap("Parquet", pl.DataFrame.write_parquet)),
               (probe.core.vocab_cache, "VocabJob", timed_job)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, new in patches:
        setattr(owner, name, new)
    try:
        yield clock
    finally:
        for owner, name, old in saved:
            setattr(owner, name, old)


class serial_vocabulary:  # noqa: N801 (it stands in for the class VocabJob)
    """The tree before issue 75: the table built in this process where the job starts (before the sweep loop), never
    kept."""

    def __init__(self, tokenizer, n_ids=None, background=None):
        from probe.core.vocab import build_vocab_table

        self.table = build_vocab_table(tokenizer, n_ids)

    def result(self):
        return self.table

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


# ------------------------------------------------------------------------------------------------ the GPU kit's
def bench_e2e(device, dtype, small: bool) -> dict:
    """A whole-vocabulary sweep through ``probe.sweep`` (the API the commands share: vocabulary table and flags,
    self-check), written to Parquet as the command writes it, of a random-weight Llama-3.1-8B-shape reward model with the
    real Llama 3.1 tokenizer the kit carries (and Llama 3.1's padding token as its pad id, so that the self-check's
    reference takes a batch, as on the paper's Llama reward models), model loading left out, split as `split_clock`
    splits it: first with an
    empty vocabulary cache (a first run: the table built beside the sweep), then with the table cached; beside them,
    the engine loop alone over the same ids."""
    import dataclasses
    import os

    import numpy as np
    from transformers import AutoTokenizer

    import probe
    from experiments.gpu_common import PROMPT, _free, random_model, say, sync
    from probe.core.engine import PrefixScorer
    from probe.core.heads import LinearRewardHead
    from probe.core.scoring import AdaptiveBatcher, default_batch_size, sweep_rows
    from probe.core.template import response_conversation, split_template

    kit_tokenizer = Path(__file__).resolve().parents[1] / ".gpu-kit" / "tokenizers" / "llama3.1"
    if not (kit_tokenizer / "tokenizer.json").is_file():
        raise RuntimeError(f"{kit_tokenizer} is missing: `make gpu-kit` writes it")
    tok = AutoTokenizer.from_pretrained(kit_tokenizer)
    if tok.pad_token is None:  # a pad id as the paper's Llama 3.1 reward models set one (Skywork's v0.2: [PAD])
        tok.pad_token = "<|finetune_right_pad_id|>"
    lm = random_model("llama-3.1-8b", device, dtype, small)
    if lm.model.get_input_embeddings().num_embeddings < len(tok):  # --small: the reduced vocabulary
        lm.model.resize_token_embeddings(len(tok))
    lm = dataclasses.replace(lm, tokenizer=tok)
    lm.model.config.pad_token_id = tok.pad_token_id
    limit = 4096 if small else None
    runs, before = {}, os.environ.get("RM_PROBE_CACHE")
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RM_PROBE_CACHE"] = str(Path(tmp) / "cache")  # empty: the first run builds the table
        try:
            for name in ("first run", "cached"):
                with split_clock() as clock:
                    sync(device)
                    t = time.perf_counter()
                    df = probe.sweep(lm, None, PROMPT, limit=limit)
                    df.write_parquet(Path(tmp) / "scores.parquet")  # the command's file: scores with the vocabulary's flags
                    sync(device)
                    runs[name] = clock.split(time.perf_counter() - t)
        finally:
            if before is None:
                os.environ.pop("RM_PROBE_CACHE", None)
            else:
                os.environ["RM_PROBE_CACHE"] = before
        parquet_bytes = (Path(tmp) / "scores.parquet").stat().st_size
    n = df.height
    split = split_template(tok, response_conversation(PROMPT), n_verify=0)
    rows = sweep_rows(np.arange(n), split.suffix_ids).to(device)
    head = LinearRewardHead(lm.model, 0)
    batch = default_batch_size(lm, len(split.prefix_ids), rows.shape[1], "reward", head)
    sc = PrefixScorer(lm.model, head, split.prefix_ids)
    sync(device)
    t = time.perf_counter()
    AdaptiveBatcher(batch).run(sc.score, rows)
    sync(device)
    engine = time.perf_counter() - t
    first = runs["first run"]
    say(f"time to result: {n:,} ids in {first['time to result']:.2f} s through probe.sweep (cached table: "
        f"{runs['cached']['time to result']:.2f} s), {engine:.2f} s in the engine loop alone; first run: "
        + ", ".join(f"{k} {first[k]:.2f} s" for k in (*PARTS, "the rest")))
    del lm, sc
    _free(device)
    return {"ids": n, "seconds_total": first["time to result"], "seconds_engine_loop": engine,
            "overhead_s": first["time to result"] - engine, "split": runs, "parquet_bytes": {"scores.parquet": parquet_bytes},
            "batch": batch}


# ------------------------------------------------------------------------------------------------ this CPU
def _run_once(config, mode: str) -> tuple[dict, Path, list]:
    from probe.commands.score import run
    from probe.core import scoring

    tokens = scoring.REFERENCE_TOKENS
    if mode == "before":
        scoring.REFERENCE_TOKENS = 1  # the self-check's reference one sequence a forward, as before issue 75
    try:
        with split_clock(serial_vocabulary if mode == "before" else None) as clock:
            t = time.perf_counter()
            run_dir = run(config)
            return clock.split(time.perf_counter() - t), run_dir.path, clock.jobs
    finally:
        scoring.REFERENCE_TOKENS = tokens


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=2048, help="ids per prompt (of SmolLM2's 49,152)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own)")
    ap.add_argument("--out", default=str(RESULTS / "time_to_result_cpu.md"))
    args = ap.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from probe.config import ScoreVocabConfig
    from probe.runs.cpu import reproducible_blas

    reproducible_blas()
    import os

    load_before = os.getloadavg()[0]
    modes = ("before", "first run", "cached")
    results: dict[str, list[dict]] = {m: [] for m in modes}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        config = ScoreVocabConfig(limit=args.limit, output=tmp, progress=False)
        # a short run first: the imports, and the cache entry's name (the key of this tokenizer's table)
        _, _, jobs = _run_once(ScoreVocabConfig(limit=64, output=tmp, progress=False, prompt=("Warm up.",)), "cached")
        from probe.core.vocab_cache import cache_dir

        entry = cache_dir() / f"{jobs[0].key}.table"
        for r in range(args.repeats):
            files = {}
            for mode in modes[r % 3 :] + modes[: r % 3]:  # each mode first once: the host's drift shared out
                if mode == "first run":
                    entry.unlink(missing_ok=True)  # the next run builds the table
                split, path, _ = _run_once(config, mode)
                results[mode].append(split)
                files[mode] = {n: (path / n).read_bytes() for n in ("vocab.parquet", "scores.parquet")}
                print(f"repeat {r + 1} {mode}: " + ", ".join(f"{k} {v}" for k, v in split.items()), flush=True)
            same &= all(files[m] == files["before"] for m in modes)
    median = {m: {k: statistics.median(x[k] for x in rows) for k in rows[0] if k != "vocabulary from"}
              for m, rows in results.items()}
    host = {"python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "machine": platform.machine(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "load_average_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps({"limit": args.limit, "repeats": args.repeats, "host": host,
                                                   "runs": results, "median": median, "files_equal": same},
                                                  indent=1) + "\n")
    out.write_text(markdown(args, median, results, same, host))
    print(out.read_text())
    return 0 if same else 1


def markdown(args, median: dict, results: dict, same: bool, host: dict) -> str:
    rows = (*PARTS, "the rest", "time to result", "ratio to the engine loop", "model load")
    threads = f" --threads {args.threads}" if args.threads else ""
    lines = ["# Time to result on this CPU: the embedded SmolLM2 sweep, split", "",
             f"`python -m experiments.time_to_result --limit {args.limit} --repeats {args.repeats}{threads}`: "
             f"`probe.exhaustive`'s `run` on the embedded SmolLM2 (log-probability proxy, float32, "
             f"{host['threads']} thread{'s' if host['threads'] != 1 else ''}), the three paper prompts, the first "
             f"{args.limit:,} ids each, in one process; {args.repeats} runs of each column, taken in turn, each row the "
             f"median of its own values (the rows of a column need not add up). Seconds. The host: {host['cpus']} "
             f"cores shared with other work (load average {host['load_average_1min'][0]} at the start, "
             f"{host['load_average_1min'][1]} at the end), whose speed drifts between runs: compare the ratios, "
             "each taken within one run.", "",
             "| | " + " | ".join(median) + " |", "|---" * (len(median) + 1) + "|"]
    for k in rows:
        cells = [("-" if median[m][k] is None else f"{median[m][k]:.2f}" + ("x" if k.startswith("ratio") else ""))
                 for m in median]
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    lines += ["", "- before: as the tree before issue 75: the vocabulary table built in the process before the sweep "
              "loop, every run, and the self-check's reference one sequence a forward.",
              "- first run: no cached table: a child process builds it beside the sweep (probe/core/vocab_cache.py); "
              "the vocabulary row is this process's part (the cache key, starting the child, waiting for it).",
              "- cached: the table read from rm-probe's cache under the tokenizer's content hash.",
              "- model load is left out of the time to result; the rest is the template split, the prefix forward, "
              "the batch plan, shards, meta.json and progress.", "",
              f"vocab.parquet and scores.parquet of the three kinds of run: {'byte for byte equal' if same else 'DIFFERENT'} "
              "in every repeat.", "",
              "Every run (seconds):", "", "| run | " + " | ".join(rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for m, runs in results.items():
        for i, x in enumerate(runs):
            lines.append(f"| {m} {i + 1} | " + " | ".join("-" if x[k] is None else f"{x[k]:.2f}" for k in rows) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
