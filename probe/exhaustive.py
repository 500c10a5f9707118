"""Exhaustive single-token sweep: score every token id of the vocabulary as the one-token response.

    python -m probe.exhaustive                       # the embedded SmolLM2, log-probability proxy, 3 paper prompts
    python -m probe.exhaustive --rm Skywork/Skywork-Reward-Llama-3.1-8B-v0.2 --device cuda
    python -m probe.exhaustive --resume              # continue the newest unfinished run with these settings

For each prompt the templated prefix runs once (KV cache); each batch row is ``[token_id, *suffix_ids]``.
Results go to ``<output>/<model>/exhaustive_<time>/`` (see probe.results).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Literal

import numpy as np
import polars as pl
import torch

from probe.cliargs import config_from_args
from probe.distributed import Dist, barrier, broadcast, device_for, init
from probe.errors import ProbeError
from probe.models.loading import LoadedModel, load_for_config, weights_identity
from probe.models.options import ModelOptions, check_at_least
from probe.prompts import Prompt, resolve_prompts
from probe.results import RunDir, environment, open_or_resume, writable_dir
from probe.scoring import (
    AdaptiveBatcher,
    ScoringOptions,
    ScoreMode,
    build_scorer,
    default_batch_size,
    TemplateRows,
    conversation,
    make_head,
    model_kind,
    n_scorable,
    prompt_split,
    resolve_score_mode,
    self_check,
)
from probe.template import DEFAULT_DATE, JUDGE_QUESTION, TemplateSplit, resolve_date
from probe.vocab import build_vocab_table

log = logging.getLogger(__name__)
EXPERIMENT = "exhaustive"


@dataclass(frozen=True)
class ScoreVocabConfig(ModelOptions):
    prompt: tuple[str, ...] = field(default=(), metadata={
        "help": "a prompt to sweep (repeatable); default: the paper's greatest/best/worst prompts", "repeat": True})
    prompts: str | None = field(default=None, metadata={
        "help": "file of prompts: YAML (key: text, or a list) or text (one per line)", "metavar": "FILE"})
    system: str | None = field(default=None, metadata={"help": "system prompt (default: the template's own)"})
    date: str = field(default=DEFAULT_DATE, metadata={
        "help": "date for chat templates that write one into the conversation (Llama 3.1/3.2): '26 Jul 2024' "
                "(default: the templates' own fallback, as the paper rendered), 2024-07-26, or 'today'. Fixed by "
                "default so that runs on different days score identical inputs"})
    score: Literal["auto", "reward", "logprob", "judge"] = field(default="auto", metadata={
        "help": "reward: the RM's head; logprob: log-likelihood of response + end-of-turn tokens under a causal LM; "
                "judge: logit(Yes) - logit(No) after a judging question. auto: logprob for the embedded model, "
                "reward otherwise"})
    logprob_reduce: Literal["sum", "mean"] = field(default="sum", metadata={
        "help": "how --score logprob combines token log-probabilities"})
    judge_question: str = field(default=JUDGE_QUESTION, metadata={
        "help": "judging question for --score judge, with {prompt} and {response}"})
    batch_size: int | None = field(default=None, metadata={
        "help": "rows per forward (default: 256 on CPU, what fits on GPU); halved automatically on out-of-memory"})
    shard_size: int = field(default=4096, metadata={"help": "tokens per checkpoint file"})
    limit: int | None = field(default=None, metadata={"help": "score only the first N token ids (quick looks)"})
    input_method: Literal["ids", "paper"] = field(default="ids", metadata={
        "help": "ids: raw token ids in the verified template split; paper: the paper's decode-render-re-tokenize "
                "inputs (for comparison only; see probe/paper_method.py)"})
    verify: int = field(default=16, metadata={
        "help": "tokens re-scored through the model's own forward before each prompt's sweep (0: skip)"})
    output: str = field(default="results", metadata={"help": "root folder for run directories"})
    resume: str | None = field(default=None, metadata={
        "help": "continue an unfinished run: a run directory, or no value for the newest matching one",
        "optional_value": "latest"})
    top: int = field(default=20, metadata={"help": "how many best and worst tokens to print per prompt"})
    seed: int = field(default=0, metadata={"help": "seed for the verification samples"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
    dry_run: bool = field(default=False, metadata={
        "help": "build the model from its config on the meta device (no weights), print the memory per batch "
                "row and the batch size it would pick, and stop"})
    device_memory: float | None = field(default=None, metadata={
        "help": "GiB of device memory for --dry-run (default: the visible GPU's, else 80)"})

    def __post_init__(self) -> None:
        check_at_least(self, 1, "shard_size", "top", "batch_size", "limit")
        check_at_least(self, 0, "verify")
        resolve_date(self.date)  # a bad --date fails before any model loads

    @property
    def mode(self) -> ScoreMode:
        return resolve_score_mode(self.score, self.rm)

    def scoring_options(self) -> ScoringOptions:
        return ScoringOptions(self.logprob_reduce, self.judge_question, resolve_date(self.date))


@dataclass
class VocabScores:
    """Scores of every token id for one prompt, with the vocabulary table and the template split."""

    prompt: Prompt
    split: TemplateSplit
    token_ids: np.ndarray
    scores: np.ndarray
    vocab: pl.DataFrame

    def table(self) -> pl.DataFrame:
        return ranked_table(self.prompt, self.token_ids, self.scores, self.vocab)


def ranked_table(prompt: Prompt, token_ids: np.ndarray, scores: np.ndarray, vocab: pl.DataFrame) -> pl.DataFrame:
    df = pl.DataFrame({"prompt_key": prompt.key, "token_id": token_ids.astype(np.uint32), "score": scores})
    df = df.with_columns(pl.col("score").rank(method="min", descending=True).cast(pl.UInt32).alias("rank"))
    return df.join(vocab, on="token_id", how="left").sort("rank", "token_id")


def load_for(config: ScoreVocabConfig) -> LoadedModel:
    return load_for_config(config, model_kind(config.mode))


class VocabSweep:
    """Owns one sweep: the head, per-prompt template splits and scorers, shards on disk, timing."""

    def __init__(self, loaded: LoadedModel, config: ScoreVocabConfig, prompts: list[Prompt]):
        self.loaded, self.config, self.prompts = loaded, config, prompts
        n = n_scorable(loaded)
        self.token_ids = np.arange(min(n, config.limit or n), dtype=np.int64)
        self.head = make_head(loaded, config.mode, config.scoring_options())
        opts = config.scoring_options()
        self.splits = {p.key: prompt_split(loaded, config.mode, p.text, config.system, opts, n) for p in prompts}
        first = self.splits[prompts[0].key]
        self.batch_size = config.batch_size or default_batch_size(
            loaded, len(first.prefix_ids), 1 + len(first.suffix_ids), config.mode)
        self.checks: dict[str, dict] = {}
        self.paper_info: dict[str, dict] = {}
        self.timing: dict[str, dict] = {}

    def settings(self) -> dict:
        """Everything that changes a number; two runs with equal settings give identical scores."""
        c, lm = self.config, self.loaded
        return {
            "model": lm.model_id, "weights": weights_identity(lm), "revision": c.revision, "spec": lm.spec.name,
            "label_index": lm.spec.label_index, "dtype": str(lm.dtype), "device_type": lm.device.type,
            "mode": c.mode, "head": self.head.describe(), "n_tokens": int(self.token_ids.size),
            "prompts": {k: [list(s.prefix_ids), list(s.suffix_ids)] for k, s in self.splits.items()},
            "shard_size": c.shard_size, "batch_size": self.batch_size, "input_method": c.input_method,
            # the date changes a number only where a template writes it (its ids are in "prompts" too)
            "date": next((s.date_string for s in self.splits.values() if s.date_sensitive), None),
        }

    def row_source(self, prompt: Prompt):
        split = self.splits[prompt.key]
        if self.config.input_method == "ids":
            return TemplateRows(split)
        from probe.paper_method import PaperRows

        build = conversation(self.config.mode, prompt.text, self.config.system, self.config.scoring_options())
        source = PaperRows(self.loaded.tokenizer, build, self.token_ids, split)
        self.paper_info[prompt.key] = {"prefix_ids": source.prefix_ids,
                                       "prefix_text": self.loaded.tokenizer.decode(source.prefix_ids),
                                       **source.statistics}
        return source

    def score_prompt(self, prompt: Prompt, run: RunDir | None = None, dist: Dist = Dist(),
                     on_shard: Callable[[dict], None] | None = None, position: tuple[int, int] = (1, 1),
                     tokens_after: int = 0) -> np.ndarray | None:
        """This prompt's scores for every token (None on ranks other than 0 of a multi-process sweep).
        ``on_shard(timing so far)`` is called after each shard is written (the run records its time, so that
        a killed session's work is still counted). ``position`` (i, n) and ``tokens_after`` (still to score for
        later prompts) label the progress bar and its estimate for the whole run."""
        t0 = time.perf_counter()
        source = self.row_source(prompt)
        scorer = build_scorer(self.loaded, self.head, source.prefix_ids)
        if self.config.verify:
            rng = np.random.default_rng(self.config.seed)
            sample = rng.choice(self.token_ids, size=min(self.config.verify, self.token_ids.size), replace=False)
            self.checks[prompt.key] = self_check(self.loaded, self.head, source, scorer, sample.tolist()).to_json()
        batcher = AdaptiveBatcher(self.batch_size)
        k = self.config.shard_size
        n_shards = -(-self.token_ids.size // k)
        out = np.empty(self.token_ids.size, dtype=np.float32)
        todo = []
        for s in range(n_shards):
            ids = self.token_ids[s * k : (s + 1) * k]
            done = run.read_shard(prompt.key, s, ids.size) if run else None
            if done is None:
                if dist.owns(s):
                    todo.append(s)
            else:
                out[s * k : s * k + ids.size] = done
        n_todo = sum(min(k, self.token_ids.size - s * k) for s in todo)
        bar = _progress(n_todo, f"{prompt.key} ({position[0]}/{position[1]})", self.config.progress)
        t1 = time.perf_counter()
        done_now = 0
        for s in todo:
            ids = self.token_ids[s * k : (s + 1) * k]
            rows, lengths = source.rows(ids)
            scores = batcher.run(scorer.score, rows, progress=bar.update, lengths=lengths)
            if run:
                run.write_shard(prompt.key, s, scores)
            out[s * k : s * k + ids.size] = scores
            done_now += ids.size
            if tokens_after:
                rate = done_now / max(time.perf_counter() - t1, 1e-9)
                bar.set_postfix_str(f"all prompts ~{_minutes((n_todo - done_now + tokens_after) / rate)} left")
            if on_shard:
                on_shard(_timing(t0, t1, time.perf_counter(), done_now))
        bar.close()
        if dist.enabled:  # the other ranks' shards are on disk once everyone reaches the barrier
            barrier(dist)
            if not dist.main:
                return None
            for s in range(n_shards):
                ids = self.token_ids[s * k : (s + 1) * k]
                shard = run.read_shard(prompt.key, s, ids.size)
                if shard is None:
                    raise ProbeError(f"shard {s} of {prompt.key} is missing after the barrier; resume the run")
                out[s * k : s * k + ids.size] = shard
        self.batch_size = batcher.batch_size
        self.timing[prompt.key] = _timing(t0, t1, time.perf_counter(), n_todo)
        return out


def _minutes(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"


def _timing(t0: float, t1: float, t2: float, n: int) -> dict:
    return {"prefix_and_check_s": round(t1 - t0, 3), "sweep_s": round(t2 - t1, 3), "tokens_scored_now": n,
            "tokens_per_s": round(n / (t2 - t1), 2) if n and t2 > t1 else None}


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="tok", unit_scale=True, disable=not enabled, file=sys.stderr,
                dynamic_ncols=True, smoothing=0.1)


def score_vocab(model, tokenizer, prompt: str, config: ScoreVocabConfig | None = None, spec=None) -> VocabScores:
    """Front door: every token id of ``tokenizer`` as the one-token response to ``prompt``, in memory.

    ``model`` is a loaded sequence classifier (``config.score="reward"``) or causal LM (logprob/judge).
    """
    from probe.models.registry import lookup

    config = config or ScoreVocabConfig(score="reward", verify=0, progress=False)
    if spec is None:
        spec, _ = lookup(getattr(model.config, "name_or_path", ""), getattr(model.config, "architectures", None))
    loaded = LoadedModel(model, tokenizer, spec, model_kind(config.mode), model.config.name_or_path,
                         model.config.name_or_path, None, "front door")
    p = Prompt("prompt", prompt)
    sweep = VocabSweep(loaded, config, [p])
    scores = sweep.score_prompt(p)
    vocab = build_vocab_table(tokenizer, n_scorable(loaded))
    return VocabScores(p, sweep.splits[p.key], sweep.token_ids, scores, vocab)


def run(config: ScoreVocabConfig) -> RunDir:
    """The command: load, split, open (or resume) a run directory, sweep each prompt, write results.

    Under torchrun every rank loads the model and scores its share of the shards; rank 0 writes the results.
    """
    t_start, started = time.perf_counter(), _now()
    dist = init()
    if dist.enabled:
        config = replace(config, device=device_for(dist, config.device), progress=config.progress and dist.main)
    prompts = resolve_prompts(config.prompt, config.prompts)  # inputs and the output folder before the model
    if dist.main:
        writable_dir(config.output, "--output")
    loaded = load_for(config)
    t_loaded = time.perf_counter()
    sweep = VocabSweep(loaded, config, prompts)
    run_dir, meta = broadcast(dist, _open_run(config, sweep) if dist.main else None)
    if not dist.main:
        run_dir = RunDir(run_dir.path)
    sweep.batch_size = meta["settings"]["batch_size"]  # a resumed run keeps its batch size: identical batches
    if meta.get("status") == "complete":  # --resume on a finished run: nothing to do, nothing rewritten
        log.warning("%s is already complete; nothing to resume", run_dir.path)
        barrier(dist)
        return run_dir
    vocab = build_vocab_table(loaded.tokenizer, n_scorable(loaded))
    timing = SessionTiming(meta, started, round(t_loaded - t_start, 3), dist.world)
    if dist.main:
        from probe.report_text import model_label

        run_dir.write_table("vocab.parquet", vocab)
        print(f"rm-probe: {model_label(meta)} [{config.mode}, {loaded.dtype}, {loaded.device}]: "
              f"{sweep.token_ids.size:,} tokens x {len(prompts)} prompt(s) -> {run_dir.path}", file=sys.stderr)
    tables = []
    for i, p in enumerate(prompts):
        before = meta["timing"]["prompts"].get(p.key)

        def record(now: dict, key: str = p.key, before: dict | None = before) -> None:
            timing.record(key, before, now, t_start)
            run_dir.write_meta(meta)

        scores = sweep.score_prompt(p, run_dir, dist, on_shard=record if dist.main else None,
                                    position=(i + 1, len(prompts)),
                                    tokens_after=sweep.token_ids.size * (len(prompts) - i - 1))
        if not dist.main:
            continue
        meta["self_check"][p.key] = sweep.checks.get(p.key)
        if p.key in sweep.paper_info:
            meta["prompts"][p.key]["paper_method"] = sweep.paper_info[p.key]
        timing.finished[p.key] = sweep.timing[p.key]
        record(sweep.timing[p.key])
        tables.append(ranked_table(p, sweep.token_ids, scores, vocab))
    if dist.main:
        run_dir.write_table("scores.parquet", pl.concat(tables))
        timing.finish(t_start)
        meta["status"], meta["finished"] = "complete", _now()
        run_dir.write_meta(meta)
    barrier(dist)
    return run_dir


class SessionTiming:
    """This session's part of a run's timing in ``meta["timing"]``: per prompt (totals over every session, via
    `_accumulate`) and in ``sessions``, updated after every shard so that a killed session's work still counts,
    and the run's totals over all sessions at the end."""

    def __init__(self, meta: dict, started: str, load_s: float, processes: int):
        self.timing = meta["timing"]
        self.session = {"started": started, "load_s": load_s, "processes": processes, "sweep_s": 0.0,
                        "tokens_scored": 0, "wall_s": None}
        self.timing.setdefault("sessions", []).append(self.session)
        self.finished: dict[str, dict] = {}

    def record(self, key: str, before: dict | None, now: dict, t_start: float) -> None:
        self.timing["prompts"][key] = _accumulate(before, now)
        parts = {**self.finished, key: now}.values()
        self.session["sweep_s"] = round(sum(t["sweep_s"] for t in parts), 3)
        self.session["tokens_scored"] = sum(t["tokens_scored_now"] for t in parts)
        self.session["wall_s"] = round(time.perf_counter() - t_start, 3)

    def finish(self, t_start: float) -> None:
        self.session["wall_s"] = round(time.perf_counter() - t_start, 3)
        sessions = self.timing["sessions"]
        sweep_s = sum(x["sweep_s"] for x in sessions)
        scored = sum(x["tokens_scored"] for x in sessions)
        self.timing.update({
            "load_s": self.session["load_s"], "wall_s": round(sum(x["wall_s"] or 0 for x in sessions), 3),
            "sweep_s": round(sweep_s, 3), "tokens_per_s": round(scored / sweep_s, 2) if sweep_s else None,
            "processes": self.session["processes"],
        })


def _accumulate(before: dict | None, now: dict) -> dict:
    """One prompt's timing over every session of a run (an interrupted run resumed later): totals of sweep time
    and tokens, and this session's part."""
    before = before or {}
    sweep_s = before.get("sweep_s", 0.0) + now["sweep_s"]
    scored = before.get("tokens_scored", 0) + now["tokens_scored_now"]
    return {"prefix_and_check_s": now["prefix_and_check_s"], "sweep_s": round(sweep_s, 3), "tokens_scored": scored,
            "tokens_per_s": round(scored / sweep_s, 2) if sweep_s else None,
            "sweep_s_now": now["sweep_s"], "tokens_scored_now": now["tokens_scored_now"]}


def _now() -> str:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _open_run(config: ScoreVocabConfig, sweep: VocabSweep) -> tuple[RunDir, dict]:
    """A new run directory, or the one to resume. The batch size is stored but not fingerprinted: a resumed
    run adopts its stored batch size, so its remaining batches are the ones it would have run."""
    loaded = sweep.loaded
    settings = {k: v for k, v in sweep.settings().items() if k != "batch_size"}
    run_dir, meta = open_or_resume(config.output, loaded.model_id, EXPERIMENT, settings, config.resume,
                                   lambda fp: _new_meta(config, sweep, sweep.settings(), fp))
    stored = meta.get("settings", {}).get("batch_size")
    if config.resume and stored and stored != sweep.batch_size:
        if config.batch_size is not None:
            log.warning("--resume keeps the run's batch size %s (not %s) so that results stay identical",
                        stored, config.batch_size)
        sweep.batch_size = stored
    if config.resume:
        log.info("resuming %s", run_dir.path)
    return run_dir, meta


JOB_FIELDS = ("rm", "prompt", "prompts", "system", "score", "logprob_reduce", "judge_question", "dtype", "revision",
              "chat_template", "spec", "label_index", "limit", "input_method", "date")


def job_key(config: ScoreVocabConfig) -> dict:
    """The settings that define a job for the batch runner (what to compute, not how fast)."""
    return {f: getattr(config, f) for f in JOB_FIELDS} | {"prompt": list(config.prompt)}


def _new_meta(config: ScoreVocabConfig, sweep: VocabSweep, settings: dict, fp: str) -> dict:
    loaded = sweep.loaded
    tok, model = loaded.tokenizer, loaded.model
    return {
        "schema": "rm-probe/exhaustive/1",
        "experiment": EXPERIMENT,
        "status": "running",
        "job": job_key(config),
        "created": _now(),
        "fingerprint": fp,
        "settings": settings,
        "config": asdict(config),
        "model": {
            "id": loaded.model_id, "path": loaded.path, "revision": config.revision, "kind": loaded.kind,
            "source": loaded.source, "weights": weights_identity(loaded),
            "spec": asdict(loaded.spec), "spec_match": loaded.spec_match,
            "architecture": (getattr(model.config, "architectures", None) or [type(model).__name__])[0],
            "n_parameters": sum(p.numel() for p in model.parameters()),
            "dtype": str(loaded.dtype), "device": str(loaded.device),
            "embedding_rows": model.get_input_embeddings().num_embeddings, "tokenizer_len": len(tok),
            "special_tokens": {k: str(v) for k, v in tok.special_tokens_map.items()},
            "pad_token_id": model.config.get_text_config().pad_token_id, "bos_token_id": tok.bos_token_id,
        },
        "score": {"mode": config.mode, **settings["head"]},
        "prompts": {p.key: {"text": p.text, "system": config.system, **sweep.splits[p.key].to_json()}
                    for p in sweep.prompts},
        "self_check": {},
        "timing": {"prompts": {}},
        "environment": environment(),
    }


def print_summary(run_dir: RunDir, top: int) -> None:
    from probe.report_text import format_top_bottom

    df = run_dir.read_table("scores.parquet")
    meta = run_dir.read_meta()
    for key, info in meta["prompts"].items():
        print(format_top_bottom(df.filter(pl.col("prompt_key") == key), key, info["text"], meta, top))
    t = meta["timing"]
    print(f"wrote {run_dir.path}  ({t.get('sweep_s')} s sweeping, {t.get('tokens_per_s')} tokens/s)")


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.cli import command_parser

    return command_parser(subparsers, "score", "exhaustive single-token sweep", "python -m probe.exhaustive",
                          __doc__, ScoreVocabConfig, main_from_args,
                          interrupted="finished shards are saved; run the same command with --resume to continue")


def dry_run(config: ScoreVocabConfig) -> dict:
    """Plan for the named device type without needing it: GPU memory is the visible card's, else
    --device-memory, else 80 GiB; CPU plans against --device-memory (default 80)."""
    from probe.dryrun import describe, plan
    from probe.models.loading import resolve_dtype
    from probe.models.registry import lookup

    wants_gpu = config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available())
    memory = config.device_memory
    if memory is None:
        memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 80.0
    spec, _ = lookup(config.rm or "embedded")
    dtype = resolve_dtype(config.dtype, torch.device("cuda" if wants_gpu else "cpu"), spec)
    p = plan(config.rm, dtype, memory, config.mode, n_prompts=len(resolve_prompts(config.prompt, config.prompts)),
             device_type="cuda" if wants_gpu else "cpu")
    print(describe(p))
    return p


def main_from_args(ns: argparse.Namespace) -> int:
    config = config_from_args(ScoreVocabConfig, ns)
    if config.dry_run:
        dry_run(config)
        return 0
    run_dir = run(config)
    print_summary(run_dir, config.top)
    return 0


def main(argv: list[str] | None = None) -> int:
    from probe.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
