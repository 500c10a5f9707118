"""The exhaustive sweep itself: every token id as the one-token response to a prompt, on the prefix cache.

`VocabSweep` owns the head, the verified template split of each prompt, the self-check and the batches; it
writes 4,096-token shards to a run directory when given one (what ``--resume`` continues from) and nothing
otherwise. The command (probe/commands/score.py) and the Python API (``probe.sweep``) both drive it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import polars as pl

from probe.config import ScoreVocabConfig, model_kind
from probe.core.prompts import Prompt
from probe.core.scoring import (
    AdaptiveBatcher,
    TemplateRows,
    conversation,
    default_batch_size,
    make_head,
    n_scorable,
    prompt_split,
    scored_in_prefix,
    self_check,
    build_scorer,
)
from probe.core.template import TemplateSplit
from probe.core.vocab_cache import VocabJob
from probe.errors import ProbeError
from probe.models.loading import LoadedModel, load_for_config
from probe.runs.distributed import Dist, gather
from probe.runs.rundir import RunDir
from probe.runs.timing import minutes, shard_timing


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
    """The model as the run reads it: under ``--score rating``, with the rating prompt it reads (a judge family's input
    call goes with its own prompt only)."""
    judge = config.scoring_options().judge_prompt if config.mode == "rating" else None
    return load_for_config(config, model_kind(config.mode), judge_prompt=judge)


class VocabSweep:
    """Owns one sweep: the head, per-prompt template splits and scorers, shards on disk, timing."""

    def __init__(self, loaded: LoadedModel, config: ScoreVocabConfig, prompts: list[Prompt]):
        self.loaded, self.config, self.prompts = loaded, config, prompts
        n = n_scorable(loaded)
        self.token_ids = np.arange(min(n, config.limit or n), dtype=np.int64)
        opts = config.scoring_options()
        self.splits = {p.key: prompt_split(loaded, config.mode, p.text, p.system_or(config.system), opts, n) for p in prompts}
        self.head = make_head(loaded, config.mode, opts, response_in_prefix=scored_in_prefix(self.splits.values()))
        first = self.splits[prompts[0].key]
        self.batch_size = config.batch_size or default_batch_size(
            loaded, len(first.prefix_ids), 1 + len(first.suffix_ids), config.mode, self.head)
        self.on_batch_size: Callable[[int], None] | None = None  # told when out-of-memory halves the batch
        self.checks: dict[str, dict] = {}
        self.paper_info: dict[str, dict] = {}
        self.timing: dict[str, dict] = {}

    def settings(self) -> dict:
        """Everything that changes a number; two runs with equal settings give identical scores."""
        from probe.runs.meta import model_settings

        c = self.config
        return {
            **model_settings(self.loaded, c.revision, c.mode, self.head), "n_tokens": int(self.token_ids.size),
            "prompts": {k: [list(s.prefix_ids), list(s.suffix_ids)] for k, s in self.splits.items()},
            "shard_size": c.shard_size, "batch_size": self.batch_size, "input_method": c.input_method,
            # the date changes a number only where a template writes it (its ids are in "prompts" too)
            "date": next((s.date_string for s in self.splits.values() if s.date_sensitive), None),
        }

    def _batch_size_changed(self, size: int) -> None:
        self.batch_size = size  # the next prompt starts at the size that fitted
        if self.on_batch_size:
            self.on_batch_size(size)

    def row_source(self, prompt: Prompt):
        split = self.splits[prompt.key]
        if self.config.input_method != "paper":  # ids, or rewardbench (its ids come from the split itself)
            return TemplateRows(split)
        from probe.core.paper_method import PaperRows

        if self.loaded.pairwise is not None:
            raise ProbeError("--input-method text re-tokenizes a chat template; a pairwise model's input is not one")
        # the model's own conversation (a principle model's question after the response, a card's system prompt)
        build = conversation(self.config.mode, prompt.text, prompt.system_or(self.config.system),
                             self.config.scoring_options(), self.loaded)
        source = PaperRows(self.loaded.tokenizer, build, self.token_ids, split)
        self.paper_info[prompt.key] = {"prefix_ids": source.prefix_ids,
                                       "prefix_text": self.loaded.tokenizer.decode(source.prefix_ids),
                                       **source.statistics}
        return source

    def score_prompt(self, prompt: Prompt, run: RunDir | None = None, dist: Dist = Dist(),
                     on_shard: Callable[[dict], None] | None = None, position: tuple[int, int] = (1, 1),
                     tokens_after: int = 0, on_check: Callable[[dict], None] | None = None) -> np.ndarray | None:
        """This prompt's scores for every token (None on ranks other than 0 of a multi-process sweep).
        ``on_shard(timing so far)`` is called after each shard is written (the run records its time, so that
        a killed session's work is still counted); ``on_check(self-check)`` once the self-check has run (the run
        records it before the sweep, so that an interrupted run keeps it). ``position`` (i, n) and ``tokens_after`` (still to score for
        later prompts) label the progress bar and its estimate for the whole run."""
        t0 = time.perf_counter()
        source = self.row_source(prompt)
        scorer = build_scorer(self.loaded, self.head, source.prefix_ids)
        if self.config.verify:
            rng = np.random.default_rng(self.config.seed)
            sample = rng.choice(self.token_ids, size=min(self.config.verify, self.token_ids.size), replace=False)
            self.checks[prompt.key] = self_check(self.loaded, self.head, source, scorer, sample.tolist()).to_json()
            if on_check:
                on_check(self.checks[prompt.key])
        batcher = AdaptiveBatcher(self.batch_size, on_change=self._batch_size_changed)
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
                bar.set_postfix_str(f"all prompts ~{minutes((n_todo - done_now + tokens_after) / rate)} left")
            if on_shard:
                on_shard(shard_timing(t0, t1, time.perf_counter(), done_now))
        bar.close()
        if dist.enabled:  # the other ranks' shards are on disk once every rank has sent its count
            counts = gather(dist, n_todo)
            if not dist.main:
                return None
            n_todo = sum(counts)  # the tokens every rank scored this session, not rank 0's share
            for s in range(n_shards):
                ids = self.token_ids[s * k : (s + 1) * k]
                shard = run.read_shard(prompt.key, s, ids.size)
                if shard is None:
                    raise ProbeError(f"shard {s} of {prompt.key} is missing after the barrier; resume the run")
                out[s * k : s * k + ids.size] = shard
        self.timing[prompt.key] = shard_timing(t0, t1, time.perf_counter(), n_todo)
        return out


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
    job = VocabJob(tokenizer, n_scorable(loaded))  # cached, or built beside the sweep
    scores = sweep.score_prompt(p)
    vocab = job.result()
    return VocabScores(p, sweep.splits[p.key], sweep.token_ids, scores, vocab)
