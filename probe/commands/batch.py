"""Run many sweeps from one file: models x prompts, in sequence; skip what is complete, resume what is not.
A job with ``responses: FILE`` (and ``response_column``) scores those whole responses instead of every token.

    python -m probe.batch experiments/paper_ten_rms.yaml [--dry-run]

The file has ``defaults`` (any exhaustive-sweep setting), ``prompts`` (a list of texts, or ``paper`` for the
paper's three) and ``models`` (a list of settings, at least ``rm``). A model's job is done when a complete run
under the output root records the same job (model, prompts, score mode, dtype, ...); an unfinished one with
the same job is resumed; otherwise a new run starts. A job that fails is reported and the next one runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

from probe.errors import DataFormatError, ProbeError
from probe.textfile import read_yaml
from probe.models.embedded import model_id_for
from probe.commands.responses import EXPERIMENT as RESPONSES
from probe.commands.responses import run_responses
from probe.commands.score import EXPERIMENT, ScoreVocabConfig, dry_run, run
from probe.core.prompts import PAPER_PROMPTS
from probe.runs.rundir import model_runs_dir, run_metas

FIELDS = {f.name for f in fields(ScoreVocabConfig)}


def read_jobs(path: str | Path) -> list[ScoreVocabConfig]:
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    data = read_yaml(path, "YAML job file") or {}
    if not isinstance(data, dict) or not isinstance(data.get("models"), list):
        raise DataFormatError(f"{path}: expected a mapping with a 'models' list")
    defaults = data.get("defaults") or {}
    prompts = data.get("prompts", "paper")
    prompts = tuple(PAPER_PROMPTS.values()) if prompts == "paper" else tuple(prompts)
    jobs = []
    for k, entry in enumerate(data["models"], start=1):
        if isinstance(entry, str):
            entry = {"rm": entry}
        unknown = sorted(set(entry) - FIELDS) + sorted(set(defaults) - FIELDS)
        if unknown:
            raise DataFormatError(f"{path} models[{k}]: unknown settings {unknown}")
        try:
            jobs.append(ScoreVocabConfig(**{"prompt": prompts, **defaults, **entry}))
        except (TypeError, ValueError) as err:
            raise DataFormatError(f"{path} models[{k}]: {err}") from None
    return jobs


def state(config: ScoreVocabConfig) -> tuple[str, Path | None]:
    """('complete' | 'partial' | 'new', the run directory found)."""
    base = model_runs_dir(config.output, model_id_for(config.rm))
    key = json.dumps(config.job_key(), sort_keys=True, default=str)
    partial = None
    for run_path, meta in run_metas(base, RESPONSES if config.responses else EXPERIMENT):
        if json.dumps(meta.get("job"), sort_keys=True, default=str) != key:
            continue
        if meta.get("status") == "complete":
            return "complete", run_path
        partial = partial or run_path
    return ("partial", partial) if partial else ("new", None)


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    parser = command_parser(subparsers, "batch", "many sweeps from one file (models x prompts)", "python -m probe.batch",
                            __doc__, func=main_from_args, verbose=False,
                            positional=(("jobs", {"help": "YAML file of defaults, prompts and models"}),),
                            interrupted="finished jobs are kept; running the batch again resumes the unfinished one")
    parser.add_argument("--dry-run", action="store_true", help="print each job's state and memory plan; run nothing")
    return parser


def main(argv=None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


def main_from_args(args: argparse.Namespace) -> int:
    jobs = read_jobs(args.jobs)
    failed = 0
    for config in jobs:
        status, where = state(config)
        name = config.rm or "embedded"
        if args.dry_run:
            print(f"[{status}] {name}" + (f" ({where})" if where else ""))
            try:
                dry_run(config)
            except ProbeError as err:
                print(f"  error: {err}")
            continue
        if status == "complete":
            print(f"[skip] {name}: complete in {where}")
            continue
        if status == "partial":
            config = ScoreVocabConfig(**{**{f: getattr(config, f) for f in FIELDS}, "resume": str(where)})
            print(f"[resume] {name}: {where}")
        else:
            print(f"[run] {name}")
        try:
            rd = run_responses(config) if config.responses else run(config)
            print(f"  done: {rd.path}")
        except ProbeError as err:
            failed += 1
            print(f"  error: {err}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
