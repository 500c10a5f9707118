"""Exhaustive single-token sweep: score every token id of the vocabulary as the one-token response.

    python -m probe.exhaustive                       # the embedded SmolLM2, log-probability proxy, 3 paper prompts
    python -m probe.exhaustive --rm Skywork/Skywork-Reward-Llama-3.1-8B-v0.2 --device cuda
    python -m probe.exhaustive --resume              # continue the newest unfinished run with these settings
    python -m probe.exhaustive --responses items.txt --prompts prompts.yaml    # whole responses, a prompt grid

For each prompt the templated prefix runs once (KV cache); each batch row is ``[token_id, *suffix_ids]``.
Results go to ``<output>/<model>/exhaustive_<time>/`` (see probe.runs.rundir).

With ``--responses FILE`` each line (or the --response-column of a CSV/Parquet file) is a whole assistant turn,
rendered by the tokenizer's own chat template; the shared prefix runs once per prompt, the rest of each rendering
(response + closing ids) in batches of similar length, with the same self-check, shards and --resume. Results go
to ``<output>/<model>/responses_<time>/`` (scores.parquet: prompt_key, response, n_tokens, score, rank).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import replace

from probe.config import ScoreVocabConfig
from probe.runs.rundir import RunDir

log = logging.getLogger(__name__)
EXPERIMENT = "exhaustive"


def run(config: ScoreVocabConfig) -> RunDir:
    """The command: load, split, open (or resume) a run directory, sweep each prompt, write results.

    Under torchrun every rank loads the model and scores its share of the shards; rank 0 writes the results.
    """
    from probe.runs.distributed import destroy, init
    from probe.runs.timing import now_iso

    t_start, started = time.perf_counter(), now_iso()
    dist = init(config.device, config.device_map)
    try:
        return _run(config, dist, t_start, started)
    finally:
        destroy(dist)


def _run(config: ScoreVocabConfig, dist, t_start: float, started: str) -> RunDir:
    import polars as pl

    from probe.core.prompts import grid_for
    from probe.core.scoring import n_scorable
    from probe.core.sweep import VocabSweep, load_for, ranked_table
    from probe.core.vocab_cache import VocabJob
    from probe.runs.distributed import barrier, broadcast, device_for
    from probe.runs.rundir import check_resume_target, writable_dir
    from probe.runs.timing import SessionTiming, now_iso

    if dist.enabled:
        config = replace(config, device=device_for(dist, config.device), progress=config.progress and dist.main)
    prompts = grid_for(config)  # inputs and the output folder before the model
    if dist.main:
        writable_dir(config.output, "--output")
        check_resume_target(config.resume, EXPERIMENT)
    loaded = load_for(config)
    t_loaded = time.perf_counter()
    sweep = VocabSweep(loaded, config, prompts)
    run_dir, meta = broadcast(dist, _open_run(config, sweep) if dist.main else None)
    if not dist.main:
        run_dir = RunDir(run_dir.path)
    sweep.batch_size = meta["settings"]["batch_size"]  # a resumed run keeps its batch size: identical batches
    if dist.main:
        from probe.runs.meta import batch_size_recorder

        sweep.on_batch_size = batch_size_recorder(run_dir, meta, meta["settings"])
    if meta.get("status") == "complete":  # --resume on a finished run: nothing to do, nothing rewritten
        log.warning("%s is already complete; nothing to resume", run_dir.path)
        barrier(dist)
        return run_dir
    if dist.main and config.resume:  # what a stopped session scored on ranks other than 0 is on disk, uncounted
        from probe.runs.timing import credit_unrecorded, rows_on_disk

        credit_unrecorded(meta["timing"], "tokens_scored", rows_on_disk(
            run_dir, [p.key for p in prompts], int(sweep.token_ids.size), config.shard_size))
    # the vocabulary table (rank 0 writes it): from the cache, or built by a child process beside the sweep and
    # joined when the results are written (probe/core/vocab_cache.py; a run that stops early stops the child)
    vocab_job = VocabJob(loaded.tokenizer, n_scorable(loaded)) if dist.main else None
    timing = SessionTiming(meta, started, round(t_loaded - t_start, 3), dist.world)
    if dist.main:
        from probe.report.text import model_label
        from probe.runs.meta import score_label

        print(f"rm-probe: {model_label(meta)} [{score_label(loaded, config.mode)}, {loaded.dtype}, {loaded.device}]: "
              f"{sweep.token_ids.size:,} tokens x {len(prompts)} prompt(s) -> {run_dir.path}", file=sys.stderr)
    swept = []
    for i, p in enumerate(prompts):
        before = meta["timing"]["prompts"].get(p.key)

        def record(now: dict, key: str = p.key, before: dict | None = before) -> None:
            timing.record(key, before, now, t_start)
            run_dir.write_meta(meta)

        def checked(check: dict, key: str = p.key) -> None:
            meta["self_check"][key] = check
            run_dir.write_meta(meta)

        scores = sweep.score_prompt(p, run_dir, dist, on_shard=record if dist.main else None,
                                    on_check=checked if dist.main else None,
                                    position=(i + 1, len(prompts)),
                                    tokens_after=sweep.token_ids.size * (len(prompts) - i - 1))
        if not dist.main:
            continue
        meta["self_check"][p.key] = sweep.checks.get(p.key)
        if p.key in sweep.paper_info:
            meta["prompts"][p.key]["paper_method"] = sweep.paper_info[p.key]
        timing.finished[p.key] = sweep.timing[p.key]
        record(sweep.timing[p.key])
        swept.append((p, scores))
    if dist.main:
        vocab = vocab_job.result()
        run_dir.write_table("vocab.parquet", vocab)
        run_dir.write_table("scores.parquet", pl.concat([ranked_table(p, sweep.token_ids, scores, vocab)
                                                         for p, scores in swept]))
        timing.finish(t_start)
        meta["status"], meta["finished"] = "complete", now_iso()
        run_dir.write_meta(meta)
    barrier(dist)
    return run_dir


def _open_run(config: ScoreVocabConfig, sweep):
    """A new run directory, or the one to resume. The batch size is stored but not fingerprinted: a resumed
    run adopts its stored batch size, so its remaining batches are the ones it would have run."""
    from probe.runs.rundir import open_or_resume, shards_kept

    loaded = sweep.loaded
    settings = {k: v for k, v in sweep.settings().items() if k != "batch_size"}
    run_dir, meta = open_or_resume(config.output, loaded.model_id, EXPERIMENT, settings, config.resume,
                                   lambda fp: _new_meta(config, sweep, sweep.settings(), fp),
                                   kept=lambda run: shards_kept(run, [p.key for p in sweep.prompts],
                                                                int(sweep.token_ids.size), config.shard_size, "token"))
    stored = meta.get("settings", {}).get("batch_size")
    if config.resume and stored and stored != sweep.batch_size:
        if config.batch_size is not None:
            log.warning("--resume keeps the run's batch size %s (not %s) so that results stay identical",
                        stored, config.batch_size)
        sweep.batch_size = stored
    if config.resume:
        log.info("resuming %s", run_dir.path)
    return run_dir, meta


def _new_meta(config: ScoreVocabConfig, sweep, settings: dict, fp: str) -> dict:
    from probe.core.prompts import persona_meta
    from probe.runs.meta import new_meta, system_record

    return new_meta(EXPERIMENT, fp, settings, config, sweep.loaded, revision=config.revision, job=config.job_key(),
                    score={"mode": config.mode, **settings["head"]},
                    prompts={p.key: {"text": p.text, **p.meta(), **sweep.splits[p.key].to_json(),
                                     **system_record(sweep.splits[p.key].system, p.system_or(config.system))}
                             for p in sweep.prompts},
                    self_check={}, timing={"prompts": {}},
                    **persona_meta(config, sweep.prompts, sweep.loaded.tokenizer, config.scoring_options().date_string,
                                   {k: s.system for k, s in sweep.splits.items()}))


def print_summary(run_dir, top: int) -> None:
    import polars as pl

    from probe.report.text import format_top_bottom

    df = run_dir.read_table("scores.parquet")
    meta = run_dir.read_meta()
    for key, info in meta["prompts"].items():
        print(format_top_bottom(df.filter(pl.col("prompt_key") == key), key, info["text"], meta, top))
    t = meta["timing"]
    print(f"wrote {run_dir.path}  ({t.get('sweep_s')} s sweeping, {t.get('tokens_per_s')} tokens/s)")


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    return command_parser(subparsers, "score", "exhaustive single-token sweep", "python -m probe.exhaustive",
                          __doc__, ScoreVocabConfig, main_from_args)


def dry_run(config: ScoreVocabConfig) -> dict:
    """Print the memory plan from the model's config alone (no weights) and return it."""
    from probe.models.dryrun import describe, plan_for_config

    p = plan_for_config(config)
    print(describe(p))
    return p


def main_from_args(ns: argparse.Namespace) -> int:
    from probe.commands.args import config_from_args
    from probe.runs.distributed import launched

    config = config_from_args(ScoreVocabConfig, ns)
    if config.dry_run:
        dry_run(config)
        return 0
    if config.responses:
        from probe.commands.responses import print_response_summary, run_responses

        run_dir = run_responses(config)
        if launched().main:
            print_response_summary(run_dir, config.top)
        return 0
    run_dir = run(config)
    if launched().main:  # under torchrun the results table once, from rank 0
        print_summary(run_dir, config.top)
    return 0


def main(argv: list[str] | None = None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
