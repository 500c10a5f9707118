"""``probe score --responses FILE``: whole responses (any length) scored under each prompt, as a run folder.

The run layout of a sweep: ``<output>/<model>/responses_<time>/`` with ``scores.parquet`` (``prompt_key,
response, n_tokens, score, rank``, rank 1 = best within the prompt, and what the chat template did to each
response: ``slot_text``, ``change``), ``meta.json`` (settings, the template split per prompt, the self-check
against the model's own forward, timing) and ``checkpoints/<prompt>/shard_*.npy`` for ``--resume``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from probe.config import ScoreVocabConfig
from probe.runs.rundir import RunDir

log = logging.getLogger(__name__)
EXPERIMENT = "responses"


def _settings(config: ScoreVocabConfig, loaded, responses: list[str], rows: dict, head) -> dict:
    """Everything that changes a number (the batch size is stored beside, so a resume keeps it)."""
    from probe.core.response_files import responses_digest
    from probe.runs.meta import model_settings

    digest = responses_digest(responses)
    return {
        **model_settings(loaded, config.revision, config.mode, head), "n_responses": len(responses), "responses_sha256": digest, "shard_size": config.shard_size,
        "prompts": {k: [list(r.prefix_ids), list(r.suffix_ids)] for k, r in rows.items()},
        "date": config.scoring_options().date_string,
        # set only when not the default, so that runs made before the option existed keep their fingerprints
        **({"input_method": config.input_method} if config.input_method != "ids" else {}),
    }


def _prompt_meta(prompt, rows, tokenizer, system) -> dict:
    changes: dict[str, int] = {}
    for c in rows.change:
        if c:
            changes[c] = changes.get(c, 0) + 1
    from probe.runs.meta import system_record

    fed = rows.split.system if rows.split is not None else system
    return {"text": prompt.text, **system_record(fed, system), **prompt.meta(), "prefix_ids": list(rows.prefix_ids),
            "prefix_text": tokenizer.decode(list(rows.prefix_ids)), "suffix_ids": list(rows.suffix_ids),
            "suffix_text": tokenizer.decode(list(rows.suffix_ids)),
            "rows_with_another_prefix": sum(p != rows.prefix_ids for p in rows.prefixes),
            "template_changes": changes,
            "template_change_examples": [[r, s] for r, s, c in zip(rows.responses, rows.slot_text, rows.change)
                                         if c][:10]}


def run_responses(config: ScoreVocabConfig) -> RunDir:
    """Load, render every response under every prompt, open (or resume) the run, score shard by shard, write.

    Under torchrun every rank loads the model and scores every world-th of the shards left to score (each shard's
    batches exactly as one process cuts them), writing them into the run folder rank 0 opened; rank 0 then
    assembles scores.parquet from the shard files, as one process does."""
    from probe.runs.distributed import destroy, init

    dist = init(config.device, config.device_map)
    try:
        return _run(config, dist)
    finally:
        destroy(dist)


def _run(config: ScoreVocabConfig, dist) -> RunDir:
    from dataclasses import replace

    from probe.core.prompts import grid_for
    from probe.core.response_files import read_responses
    from probe.core.responses import prepare, response_batch_size
    from probe.core.scoring import make_head, scored_in_prefix
    from probe.core.sweep import load_for
    from probe.runs.distributed import barrier, broadcast, device_for
    from probe.runs.rundir import check_resume_target, writable_dir
    from probe.runs.timing import now_iso

    t_start, started = time.perf_counter(), now_iso()
    if dist.enabled:
        config = replace(config, device=device_for(dist, config.device), progress=config.progress and dist.main)
    prompts = grid_for(config)  # every input before the model loads
    responses = read_responses(config.responses, config.response_column)[: config.limit]
    if dist.main:
        writable_dir(config.output, "--output")
        check_resume_target(config.resume, EXPERIMENT)
    loaded = load_for(config)
    t_loaded = time.perf_counter()
    opts = config.scoring_options()
    rows = {p.key: prepare(loaded, config.mode, p.key, p.text, responses, opts, p.system_or(config.system))
            for p in prompts}
    head = make_head(loaded, config.mode, opts, response_in_prefix=scored_in_prefix(rows.values()))
    batch_size = config.batch_size or response_batch_size(loaded, config.mode, list(rows.values()))
    path, meta, todo = broadcast(dist, _open(config, loaded, prompts, responses, rows, head, batch_size)
                                 if dist.main else None)
    run_dir = RunDir(path)
    if meta.get("status") == "complete":
        barrier(dist)
        return run_dir
    session = {"started": started, "load_s": round(t_loaded - t_start, 3), "responses_scored": 0, "score_s": 0.0,
               **({"processes": dist.world} if dist.enabled else {})}
    meta["timing"].setdefault("sessions", []).append(session)
    _score_shards(config, dist, loaded, rows, len(responses), todo, run_dir, meta, session, t_start)
    if dist.main:
        _finish(run_dir, meta, [rows[p.key] for p in prompts], len(responses), config.shard_size)
    barrier(dist)
    return run_dir


def _open(config, loaded, prompts, responses, rows, head, batch_size) -> tuple[str, dict, list]:
    """Rank 0: the new run folder, or the one to resume, and the (prompt, shard) pairs left to score."""
    from probe.core.prompts import persona_meta
    from probe.runs.meta import new_meta, score_label
    from probe.runs.rundir import open_or_resume, shards_kept

    mode = config.mode
    settings = _settings(config, loaded, responses, rows, head)
    run_dir, meta = open_or_resume(
        config.output, loaded.model_id, EXPERIMENT, settings, config.resume,
        kept=lambda run: shards_kept(run, [p.key for p in prompts], len(responses), config.shard_size, "response"),
        new_meta=lambda fp: new_meta(EXPERIMENT, fp, settings, config, loaded, revision=config.revision, job=config.job_key(),
                            score={"mode": mode, **head.describe()}, batch_size=batch_size,
                            prompts={p.key: _prompt_meta(p, rows[p.key], loaded.tokenizer, p.system_or(config.system))
                                     for p in prompts},
                            self_check={}, timing={"sessions": []},
                            **persona_meta(config, prompts, loaded.tokenizer, config.scoring_options().date_string,
                                           {k: r.split.system for k, r in rows.items() if r.split is not None})))
    if meta.get("status") == "complete":
        log.warning("%s is already complete; nothing to resume", run_dir.path)
    else:
        meta.setdefault("batch_size", batch_size)  # a resumed run keeps its batches
        print(f"rm-probe: {loaded.model_id} [{score_label(loaded, mode)}, {loaded.dtype}, {loaded.device}]: "
              f"{len(responses):,} responses x {len(prompts)} prompt(s) -> {run_dir.path}", file=sys.stderr)
    k, n = config.shard_size, len(responses)
    todo = [(p.key, s) for p in prompts for s in range(-(-n // k))
            if run_dir.read_shard(p.key, s, min(k, n - s * k)) is None]
    if config.resume and meta.get("status") != "complete":  # a stopped session's other ranks' shards: uncounted
        from probe.runs.timing import credit_unrecorded, rows_on_disk

        credit_unrecorded(meta["timing"], "responses_scored", rows_on_disk(run_dir, [p.key for p in prompts], n, k))
    if meta.get("status") != "complete" and _kept_checks(run_dir, meta, todo):
        run_dir.write_meta(meta)
    return str(run_dir.path), meta, todo


def _check_path(run_dir: RunDir, key: str) -> Path:
    """Where a rank other than 0 keeps the self-check it ran until rank 0 records it in meta.json (`_finish` removes
    it): a killed run's kept shard keeps its self-check."""
    return run_dir.path / "checkpoints" / key / "self_check.json"


def _kept_checks(run_dir: RunDir, meta: dict, todo: list) -> bool:
    """A resumed run records the self-checks that another rank ran on a shard it kept before the kill (one process
    records its own in meta.json beside each shard); whether any was added."""
    added = False
    for path in sorted((run_dir.path / "checkpoints").glob("*/self_check.json")):
        key, saved = path.parent.name, json.loads(path.read_text())
        if key in meta["prompts"] and key not in meta["self_check"] and (key, saved["shard"]) not in todo:
            meta["self_check"][key] = saved["checks"]
            added = True
    return added


def _score_shards(config, dist, loaded, rows: dict, n: int, todo: list, run_dir: RunDir, meta: dict, session: dict,
                  t_start: float) -> None:
    """Scores this rank's share of the shards ``todo`` (every world-th, in order), one shard file each; the
    first shard left of a prompt not yet self-checked runs the self-check, on whichever rank scores it. Rank 0
    records every rank's self-checks and counts."""
    from tqdm.auto import tqdm

    from probe.core.responses import score_rows
    from probe.core.scoring import AdaptiveBatcher
    from probe.runs.distributed import gather
    from probe.runs.meta import batch_size_recorder
    from probe.runs.rundir import atomic_write_json

    k = config.shard_size
    first = {key: next(s for kk, s in todo if kk == key) for key in {kk for kk, _ in todo} - set(meta["self_check"])}
    mine = todo[dist.rank :: dist.world]
    batcher = AdaptiveBatcher(meta["batch_size"], on_change=batch_size_recorder(run_dir, meta, meta)
                              if dist.main else None)
    checks = {}
    with tqdm(total=sum(min(k, n - s * k) for _, s in mine), desc="responses", unit="resp", disable=not config.progress,
              file=sys.stderr, dynamic_ncols=True, smoothing=0.1) as bar:
        for key, s in mine:
            idx = list(range(s * k, min((s + 1) * k, n)))
            t0 = time.perf_counter()
            verify = config.verify if first.get(key) == s else 0
            scores = score_rows(loaded, config.mode, rows[key], idx, config.scoring_options(), verify=verify,
                                progress=bar.update, batcher=batcher)
            if verify:
                checks[key] = rows[key].checks
                if not dist.main:  # rank 0 records it at the end: until then it is kept beside the shard, before it
                    atomic_write_json(_check_path(run_dir, key), {"shard": s, "checks": rows[key].checks})
            run_dir.write_shard(key, s, scores)
            session["responses_scored"] += len(idx)
            session["score_s"] = round(session["score_s"] + time.perf_counter() - t0, 3)
            session["wall_s"] = round(time.perf_counter() - t_start, 3)
            if dist.main:
                meta["self_check"].update(checks)
                run_dir.write_meta(meta)
    ranks = gather(dist, (checks, session["responses_scored"], session["score_s"], batcher.batch_size))
    if dist.enabled and dist.main:  # the scoring time of the slowest rank: responses per second of all ranks together
        for c, _, _, _ in ranks:
            meta["self_check"].update(c)
        session.update(responses_scored=sum(r[1] for r in ranks), score_s=max(r[2] for r in ranks),
                       wall_s=round(time.perf_counter() - t_start, 3))
        meta["batch_size"] = min(meta["batch_size"], *(r[3] for r in ranks))


def _finish(run_dir: RunDir, meta: dict, rows: list, n: int, k: int) -> None:
    """scores.parquet from the shard files, in the prompts' order; timing over all sessions; complete."""
    import numpy as np
    import polars as pl

    from probe.core.responses import ranked_responses
    from probe.runs.timing import now_iso

    tables = [ranked_responses(r, np.concatenate([run_dir.read_shard(r.prompt_key, s, min(k, n - s * k))
                                                  for s in range(-(-n // k))])) for r in rows]
    run_dir.write_table("scores.parquet", pl.concat(tables))
    sessions = meta["timing"]["sessions"]
    scored, score_s = sum(x["responses_scored"] for x in sessions), sum(x["score_s"] for x in sessions)
    meta["timing"].update(score_s=round(score_s, 3), responses_per_s=round(scored / score_s, 2) if score_s else None,
                          wall_s=round(sum(x.get("wall_s") or 0 for x in sessions), 3))
    meta["status"], meta["finished"] = "complete", now_iso()
    run_dir.write_meta(meta)
    for path in (run_dir.path / "checkpoints").glob("*/self_check.json"):  # recorded in meta.json now
        path.unlink()


def print_response_summary(run_dir: RunDir, top: int) -> None:
    import polars as pl

    from probe.analysis.sweeps import mode_name
    from probe.report.text import plural

    df = run_dir.read_table("scores.parquet")
    meta = run_dir.read_meta()
    for key, info in meta["prompts"].items():
        part = df.filter(pl.col("prompt_key") == key).sort("rank")
        print(f"\n== {key}: {info['text']!r}  [{meta['model']['id']}, {mode_name(meta)}, "
              f"{plural(part.height, 'response')}] ==")
        changes = info.get("template_changes") or {}
        if changes:
            print("the chat template changed some responses: " + ", ".join(f"{c} {n}" for c, n in changes.items()))
        # few responses: one table of all of them, not a best and a worst table that repeat each other
        tables = ((f"all {part.height}", part),) if part.height <= 2 * top else (
            (f"best {top}", part.head(top)), (f"worst {top}", part.tail(top).reverse()))
        for title, rows in tables:
            print(title)
            for row in rows.iter_rows(named=True):
                print(f"  {row['rank']:>7} {row['score']:>11.4f} {row['n_tokens']:>3} tok  {row['response']!r}")
    t = meta["timing"]
    print(f"wrote {run_dir.path}  ({t.get('score_s')} s scoring, {t.get('responses_per_s')} responses/s)")
