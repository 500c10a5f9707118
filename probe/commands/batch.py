"""Run many sweeps from one file: models x prompts, in sequence (or over processes: below); skip what is
complete, resume what is not.
A job with ``responses: FILE`` (and ``response_column``) scores those whole responses instead of every token.

    python -m probe.batch experiments/paper_ten_rms.yaml [--dry-run]

The file has ``defaults`` (any exhaustive-sweep setting), ``prompts`` (a list of texts, or ``paper`` for the
paper's three; without it the paper's three, or only the prompts of a ``prompts`` file where a job names one; not
together with a ``prompt`` in ``defaults``) and ``models`` (a list of settings, at least ``rm``; a model's own
``prompt`` replaces the file's prompts for that model). A model's job is done when a complete run
under the output root records the same job (model, prompts, score mode, dtype, ...); an unfinished one with
the same job is resumed; otherwise a new run starts. A job that fails is reported and the next one runs.

Several GPUs or machines: ``torchrun --nproc_per_node N -m probe.batch FILE`` gives each rank one whole job at a
time, the largest first, from a queue in torchrun's store; each job runs exactly as one process runs it (same
folder, same numbers) on the rank's GPU (cuda:LOCAL_RANK), with no process group. Largest: rows x prompts, rows
being the job's limit, else its number of responses, else a whole vocabulary (counted above any limited job: the
vocabulary is not known before loading); equal sizes keep the file's order. A job with device_map (one model over
several GPUs) is refused under torchrun. A scheduler's job array: ``--shard I/N`` runs the I-th of N disjoint
parts (every N-th job in that order, from the I-th).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from probe.commands.args import _shown, blame, checked_settings, setting_actions, setting_value
from probe.errors import DataFormatError, ProbeError
from probe.textfile import read_yaml
from probe.models.embedded import model_id_for
from probe.commands.responses import EXPERIMENT as RESPONSES
from probe.commands.responses import run_responses
from probe.commands.score import EXPERIMENT, ScoreVocabConfig, dry_run, run
from probe.core.prompts import PAPER_PROMPTS
from probe.runs.rundir import model_runs_dir, run_metas



def read_jobs(path: str | Path) -> list[ScoreVocabConfig]:
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"{path}: no such file")
    data = read_yaml(path, "YAML job file") or {}
    if not isinstance(data, dict) or not isinstance(data.get("models"), list) or not data["models"]:
        raise DataFormatError(f"{path}: expected a mapping with a 'models' list (each entry a model id, or a "
                              "mapping with at least rm)")
    unknown = sorted(set(map(str, data)) - {"defaults", "prompts", "models"})
    if unknown:
        raise DataFormatError(f"{path}: unknown keys {unknown}; a job file has defaults, prompts and models")
    defaults = checked_settings(ScoreVocabConfig, data.get("defaults") or {}, f"{path} defaults")
    if "prompts" in data and "prompt" in defaults:  # the defaults' prompt silently replaced the file's prompts
        raise DataFormatError(f"{path}: prompts and defaults: prompt both name the prompts to score (the defaults' "
                              "would replace the others): keep one")
    prompts = data.get("prompts", "paper")
    if prompts == "paper":
        prompts = tuple(PAPER_PROMPTS.values())
    else:  # texts, as --prompt takes them: one text is one prompt
        prompts = setting_value(setting_actions(ScoreVocabConfig)["prompt"], "prompts", prompts, str(path))
    jobs = []
    for k, entry in enumerate(data["models"], start=1):
        where = f"{path} models[{k}]"
        if isinstance(entry, str):
            entry = {"rm": entry}
        if not isinstance(entry, dict):
            raise DataFormatError(f"{where}: {_shown(entry)}: a model id, or a mapping of settings with at least rm")
        entry = checked_settings(ScoreVocabConfig, entry, where)
        if "rm" not in entry and "rm" not in defaults:
            raise DataFormatError(f"{where}: no rm: name the model (rm: smollm2 for the embedded SmolLM2)")
        # without a prompts key, a job with a prompts file scores that file's prompts, as --prompts FILE alone does
        # (not the paper's three as well); without either, the paper's three (their texts: the job keys of runs
        # made before stay the same)
        implicit = "prompts" not in data and ("prompts" in defaults or "prompts" in entry)
        try:
            jobs.append(ScoreVocabConfig(**{**({} if implicit else {"prompt": prompts}), **defaults, **entry}))
        except (TypeError, ValueError) as err:
            raise DataFormatError(blame(err, {where: set(entry), f"{path} defaults": set(defaults)}, where)) from None
    return jobs


def inputs_now(config: ScoreVocabConfig) -> dict:
    """What the files a job names hold now (its job key names them by path): each prompt's text and system prompt,
    and the responses' digest, as a run's meta.json records them."""
    from probe.core.prompts import grid_for
    from probe.core.response_files import read_responses, responses_digest

    out: dict = {"prompts": {p.key: [p.text, p.system_or(config.system)] for p in grid_for(config)}}
    if config.responses:
        responses = read_responses(config.responses, config.response_column)[: config.limit]
        out["responses_sha256"] = responses_digest(responses)
    return out


def _inputs_of(meta: dict, responses: bool) -> dict:
    from probe.runs.meta import given_system

    out: dict = {"prompts": {k: [v.get("text"), given_system(v)] for k, v in (meta.get("prompts") or {}).items()}}
    if responses:
        out["responses_sha256"] = (meta.get("settings") or {}).get("responses_sha256")
    return out


def state(config: ScoreVocabConfig) -> tuple[str, Path | None]:
    """('complete' | 'partial' | 'new', the run directory found): a run of this job (its key) whose prompts and
    responses are the ones the job's files hold now (a prompts or responses file edited since is another job)."""
    base = model_runs_dir(config.output, model_id_for(config.rm))
    key = json.dumps(config.job_key(), sort_keys=True, default=str)
    partial, now = None, None
    for run_path, meta in run_metas(base, RESPONSES if config.responses else EXPERIMENT):
        if json.dumps(meta.get("job"), sort_keys=True, default=str) != key:
            continue
        now = now or inputs_now(config)
        if _inputs_of(meta, bool(config.responses)) != now:
            continue
        if meta.get("status") == "complete":
            return "complete", run_path
        partial = partial or run_path
    return ("partial", partial) if partial else ("new", None)


def job_size(config: ScoreVocabConfig) -> float:
    """Rows x prompts: the limit, else the responses, else a whole vocabulary (unknown before loading: infinite)."""
    from probe.core.prompts import grid_for
    from probe.core.response_files import read_responses

    rows = float("inf")
    if config.responses:
        rows = len(read_responses(config.responses, config.response_column))
    if config.limit is not None:
        rows = min(rows, config.limit)
    return float(rows * len(grid_for(config)))


def largest_first(jobs: list[ScoreVocabConfig]) -> list[int]:
    sizes = [job_size(j) for j in jobs]
    return sorted(range(len(jobs)), key=lambda k: -sizes[k])


def parse_shard(text: str) -> tuple[int, int]:
    i, _, n = text.partition("/")
    if not (i.isdigit() and n.isdigit() and 1 <= int(i) <= int(n)):
        raise ProbeError(f"--shard {text}: expected I/N with 1 <= I <= N, e.g. --shard 1/4 (Slurm: "
                         "--shard $((SLURM_ARRAY_TASK_ID + 1))/$SLURM_ARRAY_TASK_COUNT with --array 0-3)")
    return int(i), int(n)


def check_torchrun(path: str, jobs: list[ScoreVocabConfig], shard: str | None) -> None:
    """What torchrun's one-whole-model-per-rank cannot run, refused before any job starts."""
    if shard:
        raise ProbeError("--shard splits a batch over separate processes, torchrun over its ranks: "
                         "use one or the other")
    for k, job in enumerate(jobs, start=1):
        where = f"{path} models[{k}] ({job.rm or 'embedded'})"
        if job.device_map is not None:
            raise ProbeError(f"{where}: device_map spreads one model over several GPUs in one process; run that job "
                             f"without torchrun (python -m probe.batch with the job in a file of its own)")
        if job.device.startswith("cuda:"):
            raise ProbeError(f"{where}: device {job.device}: under torchrun each rank takes its GPU from LOCAL_RANK; "
                             "write device: cuda")


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    parser = command_parser(subparsers, "batch", "many sweeps from one file (models x prompts)", "python -m probe.batch",
                            __doc__, func=main_from_args, verbose=False,
                            positional=(("jobs", {"help": "YAML file of defaults, prompts and models"}),),
                            interrupted="finished jobs are kept; running the batch again resumes the unfinished one")
    parser.add_argument("--dry-run", action="store_true", help="print each job's state and memory plan; run nothing")
    parser.add_argument("--shard", metavar="I/N", help="run only the I-th of N disjoint parts of the batch (a job "
                        "array: Slurm's --array), with the folders one run would write; parts are dealt from the "
                        "jobs largest first (see above)")
    return parser


def main(argv=None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


def main_from_args(args: argparse.Namespace) -> int:
    from probe.runs.distributed import JobQueue, device_for, launched, solo

    jobs = read_jobs(args.jobs)
    d = launched()
    if d.enabled:
        check_torchrun(args.jobs, jobs, args.shard)
    order = range(len(jobs))
    if args.shard:
        i, n = parse_shard(args.shard)
        order = largest_first(jobs)[i - 1::n]
    elif d.enabled:
        order = largest_first(jobs)
    if args.dry_run:
        for k in order if d.main else ():
            _dry_run(jobs[k])
        return 0
    tag = f"rank {d.rank}: " if d.enabled else ""
    failed = 0
    if not d.enabled:
        for k in order:
            failed += not _run_job(jobs[k], tag)
        return 1 if failed else 0
    queue = JobQueue(d)
    with solo():
        while (taken := queue.take()) < len(order):
            job = jobs[order[taken]]
            job = replace(job, device=device_for(d, job.device), progress=job.progress and d.main)
            if job.device.startswith("cuda"):
                import torch

                torch.cuda.set_device(d.local_rank)  # kernels launch on the current device
            failed += not _run_job(job, tag)
    queue.finish()
    return 1 if failed else 0


def _dry_run(config: ScoreVocabConfig) -> None:
    status, where = state(config)
    print(f"[{status}] {config.rm or 'embedded'}" + (f" ({where})" if where else ""))
    try:
        dry_run(config)
    except ProbeError as err:
        print(f"  error: {err}")


def _run_job(config: ScoreVocabConfig, tag: str = "") -> bool:
    """One job as a single ``probe batch`` runs it: skipped when complete, resumed when unfinished.
    False if it failed."""
    status, where = state(config)
    name = config.rm or "embedded"
    if status == "complete":
        print(f"{tag}[skip] {name}: complete in {where}")
        return True
    if status == "partial":
        config = replace(config, resume=str(where))
        print(f"{tag}[resume] {name}: {where}")
    else:
        print(f"{tag}[run] {name}")
    try:
        rd = run_responses(config) if config.responses else run(config)
        print(f"{tag}  done: {rd.path}")
        return True
    except ProbeError as err:
        print(f"{tag}  error: {err}", file=sys.stderr)
        return False


if __name__ == "__main__":
    sys.exit(main())
