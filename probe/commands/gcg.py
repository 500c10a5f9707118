"""Greedy Coordinate Gradient against the reward: search n-token responses that maximise or minimise it.

    python -m probe.gcg --prompt "What, in one word, is the greatest thing ever?" --length 5 --direction max
    python -m probe.gcg --rm RLHFlow/ArmoRM-Llama3-8B-v0.1 --trust-remote-code --length 5 --direction min
    python -m probe.gcg --beam 8 --length 3         # exact beam: every vocabulary token after the 8 best

The search itself (GCG and the exact beam) is probe/core/gcg.py; this module is the command: options, the run
folder with its checkpoints (``--resume`` keeps finished restarts or beam depths), and the printed result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace

from probe.config import GCGConfig


def _settings(config: GCGConfig, loaded) -> dict:
    """What changes a result: every option but the output folder, progress and resume; the weights by content."""
    from probe.core.template import resolve_date
    from probe.models.loading import weights_identity
    from probe.core.scoring import fed_system
    from probe.runs.meta import device_setting, reference_settings, system_record

    skip = {"output", "progress", "resume", "batch_size"}
    skip |= {"ref", "beta"}  # the reference enters with its weights below, and only when set
    # "beam": 0 when off, as runs made before --beam took None recorded it (their fingerprints stay valid)
    return {**{k: v for k, v in asdict(config).items() if k not in skip}, "beam": config.beam or 0,
            "date": resolve_date(config.date), "model": loaded.model_id, "weights": weights_identity(loaded),
            # the system message fed (the card's where --system is not given: a process reward model's, WorldPM's)
            **system_record(fed_system(loaded, config.mode, config.system, config.scoring_options()), config.system),
            **reference_settings(loaded), **device_setting(loaded)}


def main_from_args(ns: argparse.Namespace) -> int:
    import polars as pl

    from probe.commands.args import config_from_args
    from probe.core.gcg import GCGRun, allowed_tokens, beam_search, load_for, reference_score, run
    from probe.core.scoring import make_head, n_scorable, prompt_split
    from probe.core.vocab_cache import vocab_table
    from probe.runs.meta import new_meta as build_meta
    from probe.runs.rundir import (atomic_write_json, check_resume_target, kept_batch_size, open_or_resume,
                                   writable_dir)

    config = config_from_args(GCGConfig, ns)
    writable_dir(config.output, "--output")
    experiment = "beam" if config.beam else f"gcg_{config.direction}"
    check_resume_target(config.resume, experiment)
    loaded = load_for(config)  # a random head (--allow-random-head) is drawn from --seed (load_for_config)
    settings = _settings(config, loaded)

    run_dir, meta = open_or_resume(config.output, loaded.model_id, experiment, settings, config.resume,
                                   lambda fp: build_meta(experiment, fp, settings, config, loaded,
                                                         revision=config.revision))
    if meta.get("status") == "complete":
        print(f"{run_dir.path} is already complete: {json.loads((run_dir.path / 'result.json').read_text())}")
        return 0
    config = replace(config, batch_size=kept_batch_size(config.batch_size, meta))  # a resume: the run's own
    checkpoints = run_dir.path / "checkpoints"
    t0 = time.perf_counter()
    if config.beam:
        opts = config.scoring_options()
        split = prompt_split(loaded, config.mode, config.prompt, config.system, opts, len(loaded.tokenizer))
        allowed = allowed_tokens(vocab_table(loaded.tokenizer, n_scorable(loaded)), config.allowed,
                                 config.allow_special)
        done = [pl.read_parquet(p) for p in sorted(checkpoints.glob("depth_*.parquet"))]
        levels = beam_search(loaded, config, split, allowed, done, on_level=lambda t: run_dir.write_table(
            f"checkpoints/depth_{int(t['depth'][0]):03d}.parquet", t))
        run_dir.write_table("beam.parquet", pl.concat(levels))
        top = levels[-1].row(0, named=True)
        result = {"best_ids": top["ids"], "best_text": top["text"], "best_score":
                  reference_score(loaded, make_head(loaded, config.mode, opts), split, top["ids"]),
                  "search_score": top["score"], "direction": config.direction}
        _print_beam(levels, config)
    else:
        done = {int(p.stem.split("_")[1]): GCGRun(**json.loads(p.read_text()))
                for p in sorted(checkpoints.glob("run_*.json"))}
        res = run(loaded, config, done, on_restart=lambda k, r: atomic_write_json(
            checkpoints / f"run_{k:03d}.json", asdict(r)))
        result = res.summary()
        traj = [{"run": k, **row} for k, r in enumerate(res.runs) for row in r.trajectory]
        run_dir.write_table("trajectory.parquet", pl.DataFrame(traj))
        _print_gcg(res, config)
    atomic_write_json(run_dir.path / "result.json", result)
    meta.update(status="complete", wall_s=round(time.perf_counter() - t0, 3))
    run_dir.write_meta(meta)
    print(f"wrote {run_dir.path}")
    return 0


def _print_gcg(res, config: GCGConfig) -> None:
    print(f"\n{config.direction} over {config.length}-token responses to {config.prompt!r}")
    for k, r in enumerate(res.runs):
        print(f"  run {k} (seed {r.seed}): {config.sign * r.best_objective:.4f}  {res_text(r.best_ids, res)}  "
              f"[{len(r.trajectory)} steps, {r.seconds_per_step:.2f} s/step]")
    b = res.random_baseline
    print(f"best: {res.best_text!r} ids {res.best_ids}: score {res.best_score:.4f} (own forward), "
          f"{res.search_score:.4f} (cached); random {config.length}-token responses: mean {b['mean']:.4f}, "
          f"range [{b['min']:.4f}, {b['max']:.4f}]")


def res_text(ids: list[int], res) -> str:
    return repr(res.best_text) if ids == res.best_ids else str(ids)


def _print_beam(levels: list, config: GCGConfig) -> None:
    for level in levels:
        print(f"\ndepth {level['depth'][0]}: {config.beam} {'best' if config.sign > 0 else 'worst'}")
        for row in level.head(10).iter_rows(named=True):
            print(f"  {row['rank']:>3} {row['score']:>10.4f}  {row['text']!r}  {row['ids']}")


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    return command_parser(subparsers, "gcg", "multi-token search (GCG, exact beam)", "python -m probe.gcg", __doc__,
                          GCGConfig, main_from_args)


def main(argv: list[str] | None = None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
