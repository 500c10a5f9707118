"""Greedy Coordinate Gradient against the reward: search n-token responses that maximise or minimise it.

    python -m probe.gcg --prompt "What, in one word, is the greatest thing ever?" --length 5 --direction max
    python -m probe.gcg --rm RLHFlow/ArmoRM-Llama3-8B-v0.1 --trust-remote-code --length 5 --direction min
    python -m probe.gcg --beam 8 --length 3         # exact beam: every vocabulary token after the 8 best

The response slot holds n optimised ids between the shared prompt prefix and the template suffix. Each step
takes the gradient of the objective (``+score`` for max, ``-score`` for min: one code path, opposite signs)
with respect to a one-hot encoding of the response, keeps the top-k tokens per position, samples
``search_width`` single-token swaps, scores them all through the prefix-cache engine and keeps the best.
The gradient goes through `PrefixScorer.score_embeds`, the differentiable twin of the scoring forward, and
candidates through `PrefixScorer.score`: no second copy of any model code. Gated heads find their gate in the
prefix ids, so they work with ``inputs_embeds`` too.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import polars as pl
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from probe.cliargs import config_from_args
from probe.engine import FullSequenceScorer, PrefixScorer
from probe.errors import ProbeError
from probe.models.loading import LoadedModel, load_for_config, weights_identity
from probe.models.options import ModelOptions, check_at_least
from probe.prompts import PAPER_PROMPTS
from probe.results import RunDir, atomic_write_json, environment, open_or_resume, writable_dir
from probe.scoring import (
    AdaptiveBatcher,
    ScoringOptions,
    ScoreMode,
    make_head,
    model_kind,
    n_scorable,
    prompt_split,
    resolve_score_mode,
    sweep_rows,
)
from probe.template import DEFAULT_DATE, TemplateSplit, resolve_date
from probe.vocab import build_vocab_table

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GCGConfig(ModelOptions):
    prompt: str = field(default=PAPER_PROMPTS["greatest"], metadata={"help": "the user prompt"})
    system: str | None = field(default=None, metadata={"help": "system prompt (default: the template's own)"})
    date: str = field(default=DEFAULT_DATE, metadata={
        "help": "date for chat templates that write one (Llama 3.1/3.2): '26 Jul 2024' (default), 2024-07-26 or today"})
    score: Literal["auto", "reward", "logprob", "judge"] = field(default="auto", metadata={
        "help": "objective: the RM's reward, or a causal LM's logprob/judge proxy (auto: logprob for the embedded "
                "model, reward otherwise)"})
    length: int = field(default=5, metadata={"help": "number of response tokens to optimise"})
    direction: Literal["max", "min"] = field(default="max", metadata={"help": "maximise or minimise the score"})
    steps: int = field(default=100, metadata={"help": "GCG steps per run"})
    search_width: int = field(default=512, metadata={"help": "candidate sequences scored per step"})
    topk: int = field(default=256, metadata={"help": "tokens kept per position from the gradient"})
    n_replace: int = field(default=1, metadata={"help": "positions swapped per candidate"})
    buffer_size: int = field(default=1, metadata={"help": "best sequences kept; each step starts from the best"})
    patience: int | None = field(default=None, metadata={"help": "stop a run after this many steps without gain"})
    seed: int = field(default=0, metadata={"help": "random seed (run k uses seed + k)"})
    runs: int = field(default=1, metadata={"help": "independent restarts"})
    init: str = field(default="random", metadata={
        "help": "initial response: random, a text (its tokens; sets --length), or sweep:DIR (the best tokens of a "
                "saved exhaustive run for this prompt; the worst ones for --direction min)"})
    allowed: Literal["all", "words", "ascii"] = field(default="all", metadata={
        "help": "tokens the search may use: all, word-like only, or printable-ASCII only"})
    allow_special: bool = field(default=False, metadata={"help": "let special and added tokens into the response"})
    filter_ids: bool = field(default=False, metadata={
        "help": "drop candidates whose decoded text does not re-encode to the same ids"})
    beam: int = field(default=0, metadata={
        "help": "instead of GCG: exact beam search keeping the K best prefixes, extending each by every allowed "
                "token, up to --length tokens (2 or 3 is practical)"})
    batch_size: int | None = field(default=None, metadata={"help": "rows per forward (default: 256 CPU; GPU by memory)"})
    output: str = field(default="results", metadata={"help": "root folder for run directories"})
    resume: str | None = field(default=None, metadata={
        "help": "continue an interrupted search: a run directory, or no value for the newest matching one (finished "
                "restarts, or finished beam depths, are kept)", "optional_value": "latest"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        check_at_least(self, 1, "length", "steps", "search_width", "topk", "n_replace", "buffer_size", "runs")
        check_at_least(self, 0, "beam")
        if self.n_replace > self.length:
            raise ValueError("--n-replace cannot exceed --length")
        resolve_date(self.date)

    def scoring_options(self) -> ScoringOptions:
        return ScoringOptions(date_string=resolve_date(self.date))

    @property
    def mode(self) -> ScoreMode:
        return resolve_score_mode(self.score, self.rm)

    @property
    def sign(self) -> float:
        return 1.0 if self.direction == "max" else -1.0


def allowed_tokens(vocab: pl.DataFrame, which: str, allow_special: bool) -> Bool[Tensor, " v"]:
    ok = np.ones(vocab.height, dtype=bool)
    if not allow_special:
        ok &= ~(vocab["is_special"].to_numpy() | vocab["is_added"].to_numpy())
    if which == "words":
        ok &= vocab["is_word"].to_numpy()
    elif which == "ascii":
        ok &= np.array([d.isascii() and d.isprintable() and d.strip() != "" for d in vocab["decoded"].to_list()])
    if not ok.any():
        raise ProbeError(f"--allowed {which}: no token of this vocabulary qualifies")
    return torch.from_numpy(ok)


def embedding_matrix(model: torch.nn.Module) -> tuple[Tensor, float]:
    """The input embedding matrix and the scale the embedding module applies (Gemma 3 scales inside it)."""
    emb = model.get_input_embeddings()
    weight = emb.weight
    probe = torch.arange(min(8, weight.shape[0]), device=weight.device)
    with torch.no_grad():
        looked_up, raw = emb(probe).float(), weight[probe].float()
    scale = float(getattr(emb, "embed_scale", 1.0))
    if not torch.allclose(looked_up, raw * scale, rtol=1e-2, atol=1e-3):
        raise ProbeError(f"{type(emb).__name__} is not a (scaled) lookup table; GCG cannot form one-hot gradients")
    return weight, scale


@dataclass
class GCGRun:
    seed: int
    init_ids: list[int]
    best_ids: list[int]
    best_objective: float
    trajectory: list[dict]
    seconds_per_step: float


class GCG:
    """One prompt, one model, one objective; `run` performs one restart from given initial ids."""

    def __init__(self, loaded: LoadedModel, head, split: TemplateSplit, config: GCGConfig, allowed: Tensor):
        self.loaded, self.config, self.split = loaded, config, split
        self.scorer = PrefixScorer(loaded.model, head, split.prefix_ids)
        self.device = self.scorer.device
        self.weight, self.scale = embedding_matrix(loaded.model)
        self.allowed = allowed.to(self.device)
        self.suffix = torch.tensor(list(split.suffix_ids), device=self.device, dtype=torch.long)
        self.batcher = AdaptiveBatcher(config.batch_size or (256 if self.device.type == "cpu" else 1024))
        self.tokenizer = loaded.tokenizer

    def rows(self, ids: Int[Tensor, "b n"]) -> Int[Tensor, "b m"]:
        return torch.cat([ids, self.suffix[None].expand(ids.shape[0], -1)], 1)

    def objective(self, ids: Int[Tensor, "b n"]) -> Float[Tensor, " b"]:
        """``sign * score`` of each row: GCG always maximises this."""
        scores = self.batcher.run(self.scorer.score, self.rows(ids.to(self.device)))
        return self.config.sign * torch.from_numpy(scores)

    def onehot(self, ids: Int[Tensor, " n"]) -> Float[Tensor, "n v"]:
        out = torch.zeros(len(ids), self.weight.shape[0], device=self.device, dtype=self.weight.dtype)
        out[torch.arange(len(ids)), ids.to(self.device)] = 1
        return out

    def relaxed_objective(self, onehot: Float[Tensor, "n v"], ids: Int[Tensor, " n"]) -> Float[Tensor, ""]:
        """The objective as a differentiable function of (relaxed) one-hot response rows; equals
        `objective(ids)` when ``onehot`` is exactly one-hot on ``ids``."""
        ids = ids.to(self.device)
        resp = (onehot @ self.weight) * self.scale
        inputs = torch.cat([resp, self.loaded.model.get_input_embeddings()(self.suffix).to(resp.dtype)], 0)[None]
        n_in = inputs.shape[1] - int(self.scorer.head.drops_last_input)
        score = self.scorer.score_embeds(inputs[:, :n_in], self.rows(ids[None]), onehot=onehot[None])
        return self.config.sign * score.sum()

    def token_gradient(self, ids: Int[Tensor, " n"]) -> Float[Tensor, "n v"]:
        """d objective / d one-hot(ids), through the same forward and head as `objective`."""
        onehot = self.onehot(ids).requires_grad_(True)
        self.relaxed_objective(onehot, ids).backward()
        return onehot.grad.float()

    def sample(self, ids: Int[Tensor, " n"], grad: Float[Tensor, "n v"], gen: torch.Generator) -> Int[Tensor, "w n"]:
        """``search_width`` copies of ids, each with ``n_replace`` positions set to one of their top-k tokens."""
        c = self.config
        grad = grad.masked_fill(~self.allowed[None, :], -float("inf"))
        k = min(c.topk, int(self.allowed.sum()))
        top = grad.topk(k, dim=1).indices.cpu()  # [n, k]: tokens that raise the objective most, per position
        n = ids.shape[0]
        pos = torch.argsort(torch.rand(c.search_width, n, generator=gen), dim=1)[:, : c.n_replace]
        choice = torch.randint(0, k, (c.search_width, c.n_replace), generator=gen)
        vals = top[pos, choice]
        return ids.cpu()[None].repeat(c.search_width, 1).scatter_(1, pos, vals)

    def roundtrips(self, cands: Int[Tensor, "w n"]) -> Bool[Tensor, " w"]:
        texts = self.tokenizer.batch_decode(cands.tolist())
        enc = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        return torch.tensor([e == c for e, c in zip(enc, cands.tolist())])

    def text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)

    def run(self, init_ids: list[int], seed: int, progress: bool = False) -> GCGRun:
        c = self.config
        gen = torch.Generator().manual_seed(seed)
        ids = torch.tensor(init_ids, dtype=torch.long)
        buffer = [(float(self.objective(ids[None])[0]), ids)]
        trajectory, since_gain = [], 0
        t_start = time.perf_counter()
        bar = _bar(c.steps, f"gcg seed {seed}", progress)
        for step in range(1, c.steps + 1):
            t0 = time.perf_counter()
            current = buffer[0][1]
            grad = self.token_gradient(current.to(self.device))
            cands = torch.unique(self.sample(current, grad, gen), dim=0)
            cands = cands[(cands != current[None]).any(1)]
            if c.filter_ids and len(cands):
                cands = cands[self.roundtrips(cands)]
            if len(cands):
                obj = self.objective(cands)
                order = torch.argsort(obj, descending=True)[: c.buffer_size]
                best_before = buffer[0][0]
                buffer = sorted(buffer + [(float(obj[i]), cands[i]) for i in order], key=lambda t: -t[0])
                buffer = buffer[: c.buffer_size]
                step_best = float(obj[order[0]])
                since_gain = 0 if buffer[0][0] > best_before else since_gain + 1
            else:
                step_best, since_gain = float("nan"), since_gain + 1
            best_obj, best_ids = buffer[0]
            trajectory.append({
                "step": step, "step_objective": step_best, "best_objective": best_obj,
                "best_score": c.sign * best_obj, "best_ids": best_ids.tolist(), "best_text": self.text(best_ids.tolist()),
                "candidates": int(len(cands)), "seconds": round(time.perf_counter() - t0, 4),
            })
            bar.update(1)
            bar.set_postfix(score=f"{c.sign * best_obj:.4g}")
            if c.patience is not None and since_gain >= c.patience:
                break
        bar.close()
        elapsed = time.perf_counter() - t_start
        return GCGRun(seed, list(init_ids), buffer[0][1].tolist(), buffer[0][0], trajectory, elapsed / len(trajectory))


def _bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, file=sys.stderr, dynamic_ncols=True)


def initial_ids(config: GCGConfig, loaded: LoadedModel, allowed: Tensor, run: int) -> list[int]:
    gen = torch.Generator().manual_seed(config.seed + 10_000 + run)
    pool = torch.nonzero(allowed).flatten()
    if config.init == "random":
        return pool[torch.randint(0, len(pool), (config.length,), generator=gen)].tolist()
    if config.init.startswith("sweep:"):
        return _init_from_sweep(config, allowed, run, gen)
    ids = loaded.tokenizer.encode(config.init, add_special_tokens=False)
    if len(ids) != config.length:
        raise ProbeError(f"--init {config.init!r} is {len(ids)} tokens but --length is {config.length}")
    return ids


def _init_from_sweep(config: GCGConfig, allowed: Tensor, run: int, gen: torch.Generator) -> list[int]:
    path = config.init.removeprefix("sweep:")
    rd = RunDir(path)
    meta = rd.read_meta()
    keys = [k for k, p in meta["prompts"].items() if p["text"] == config.prompt]
    if not keys:
        raise ProbeError(f"--init {config.init}: that run has no sweep of the prompt {config.prompt!r}")
    df = rd.read_table("scores.parquet").filter(pl.col("prompt_key") == keys[0])
    df = df.filter(pl.Series(allowed.numpy()[df["token_id"].to_numpy()]))
    ranked = df.sort("score", descending=config.direction == "max")["token_id"].to_list()
    if run == 0:
        return ranked[: config.length]
    top = torch.tensor(ranked[:100])
    return top[torch.randint(0, len(top), (config.length,), generator=gen)].tolist()


@dataclass
class GCGResult:
    direction: str
    best_ids: list[int]
    best_text: str
    best_score: float  # re-computed by the model's own full forward of best_ids (no re-tokenization)
    search_score: float  # the same ids through the cached engine
    runs: list[GCGRun]
    random_baseline: dict

    def summary(self) -> dict:
        return {
            "direction": self.direction, "best_ids": self.best_ids, "best_text": self.best_text,
            "best_score": self.best_score, "search_score": self.search_score, "random_baseline": self.random_baseline,
            "runs": [{"seed": r.seed, "init_ids": r.init_ids, "best_ids": r.best_ids,
                      "best_score": r.best_objective, "steps": len(r.trajectory),
                      "seconds_per_step": round(r.seconds_per_step, 4)} for r in self.runs],
        }


def reference_score(loaded: LoadedModel, head, split: TemplateSplit, ids: list[int]) -> float:
    """The plain full-sequence forward of prefix + ids + suffix through the model's own forward."""
    return float(FullSequenceScorer(loaded.model, head, split.prefix_ids).score([ids + list(split.suffix_ids)])[0])


def run(loaded: LoadedModel, config: GCGConfig, done: dict[int, GCGRun] | None = None,
        on_restart=None) -> GCGResult:
    """Front door: ``config.runs`` GCG restarts; returns the best response over all of them. ``done``: restarts
    already finished (a resumed search); ``on_restart(k, run)`` is called after each new one."""
    opts = config.scoring_options()
    split = prompt_split(loaded, config.mode, config.prompt, config.system, opts, len(loaded.tokenizer))
    vocab = build_vocab_table(loaded.tokenizer, n_scorable(loaded))
    allowed = allowed_tokens(vocab, config.allowed, config.allow_special)
    head = make_head(loaded, config.mode, opts)
    gcg = GCG(loaded, head, split, config, allowed)
    runs = []
    for k in range(config.runs):
        if done and k in done:
            runs.append(done[k])
            continue
        init = initial_ids(config, loaded, allowed, k)
        runs.append(gcg.run(init, config.seed + k, progress=config.progress))
        if on_restart:
            on_restart(k, runs[-1])
    best = max(runs, key=lambda r: r.best_objective)
    gen = torch.Generator().manual_seed(config.seed + 99)
    pool = torch.nonzero(allowed).flatten()
    rand = pool[torch.randint(0, len(pool), (256, config.length), generator=gen)]
    rand_scores = config.sign * gcg.objective(rand).numpy()
    return GCGResult(
        config.direction, best.best_ids, loaded.tokenizer.decode(best.best_ids),
        reference_score(loaded, make_head(loaded, config.mode, opts), split, best.best_ids),
        config.sign * best.best_objective, runs,
        {"n": 256, "mean": float(rand_scores.mean()), "std": float(rand_scores.std()),
         "max": float(rand_scores.max()), "min": float(rand_scores.min())},
    )


def beam_search(loaded: LoadedModel, config: GCGConfig, split: TemplateSplit, allowed: Tensor,
                done: list[pl.DataFrame] | None = None, on_level=None) -> list[pl.DataFrame]:
    """Exact beam: at each depth, every allowed token after each of the K best responses so far.

    Depth 1 scores every allowed token (an exhaustive sweep); depth d > 1 builds, for each kept response, a
    new prefix cache ending in it and scores every allowed token after it. Returns one table per depth with
    the K best responses (``ids``, ``text``, ``score``), best first for max, worst first for min. ``done``: the
    depths already finished (a resumed search); ``on_level(table)`` is called after each new depth. One
    progress bar with an estimate covers every depth still to run.
    """
    opts = config.scoring_options()
    cand = torch.nonzero(allowed).flatten()
    batcher = AdaptiveBatcher(config.batch_size or (256 if loaded.device.type == "cpu" else 1024))
    levels = list(done or [])
    beams: list[list[int]] = [list(x) for x in levels[-1]["ids"].to_list()] if levels else [[]]
    todo = range(len(levels) + 1, config.length + 1)
    n_rows = sum((1 if d == 1 else min(config.beam, len(cand) ** (d - 1))) * len(cand) for d in todo)
    bar = _bar(n_rows, "beam", config.progress)
    bar.unit = "resp"
    for depth in todo:
        ids_all, scores_all = [], []
        for beam in beams:
            head = make_head(loaded, config.mode, opts, response_in_prefix=len(beam))
            scorer = PrefixScorer(loaded.model, head, list(split.prefix_ids) + beam)
            scores_all.append(batcher.run(scorer.score, sweep_rows(cand.numpy(), split.suffix_ids),
                                          progress=bar.update))
            ids_all.extend(beam + [int(t)] for t in cand)
        scores = np.concatenate(scores_all)
        order = np.argsort(-config.sign * scores, kind="stable")[: config.beam]
        beams = [ids_all[i] for i in order]
        levels.append(pl.DataFrame({
            "depth": depth, "rank": np.arange(1, len(order) + 1), "ids": beams,
            "text": [loaded.tokenizer.decode(b) for b in beams], "score": scores[order],
        }))
        if on_level:
            on_level(levels[-1])
    bar.close()
    return levels


def load_for(config: GCGConfig) -> LoadedModel:
    return load_for_config(config, model_kind(config.mode))


def _settings(config: GCGConfig, loaded: LoadedModel) -> dict:
    """What changes a result: every option but the output folder, progress and resume; the weights by content."""
    skip = {"output", "progress", "resume", "batch_size"}
    return {**{k: v for k, v in asdict(config).items() if k not in skip}, "date": resolve_date(config.date),
            "model": loaded.model_id, "weights": weights_identity(loaded)}


def main_from_args(ns: argparse.Namespace) -> int:
    config = config_from_args(GCGConfig, ns)
    writable_dir(config.output, "--output")
    loaded = load_for(config)
    experiment = "beam" if config.beam else f"gcg_{config.direction}"
    settings = _settings(config, loaded)

    def new_meta(fp: str) -> dict:
        return {"schema": "rm-probe/gcg/1", "experiment": experiment, "status": "running", "fingerprint": fp,
                "settings": settings, "config": asdict(config), "environment": environment(),
                "model": {"id": loaded.model_id, "path": loaded.path, "source": loaded.source,
                          "spec": asdict(loaded.spec), "dtype": str(loaded.dtype), "device": str(loaded.device)}}

    run_dir, meta = open_or_resume(config.output, loaded.model_id, experiment, settings, config.resume, new_meta)
    if meta.get("status") == "complete":
        print(f"{run_dir.path} is already complete: {json.loads((run_dir.path / 'result.json').read_text())}")
        return 0
    checkpoints = run_dir.path / "checkpoints"
    t0 = time.perf_counter()
    if config.beam:
        opts = config.scoring_options()
        split = prompt_split(loaded, config.mode, config.prompt, config.system, opts, len(loaded.tokenizer))
        allowed = allowed_tokens(build_vocab_table(loaded.tokenizer, n_scorable(loaded)), config.allowed,
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


def _print_gcg(res: GCGResult, config: GCGConfig) -> None:
    print(f"\n{config.direction} over {config.length}-token responses to {config.prompt!r}")
    for k, r in enumerate(res.runs):
        print(f"  run {k} (seed {r.seed}): {config.sign * r.best_objective:.4f}  {res_text(r.best_ids, res)}  "
              f"[{len(r.trajectory)} steps, {r.seconds_per_step:.2f} s/step]")
    b = res.random_baseline
    print(f"best: {res.best_text!r} ids {res.best_ids}: score {res.best_score:.4f} (own forward), "
          f"{res.search_score:.4f} (cached); random {config.length}-token responses: mean {b['mean']:.4f}, "
          f"range [{b['min']:.4f}, {b['max']:.4f}]")


def res_text(ids: list[int], res: GCGResult) -> str:
    return repr(res.best_text) if ids == res.best_ids else str(ids)


def _print_beam(levels: list[pl.DataFrame], config: GCGConfig) -> None:
    for level in levels:
        print(f"\ndepth {level['depth'][0]}: {config.beam} {'best' if config.sign > 0 else 'worst'}")
        for row in level.head(10).iter_rows(named=True):
            print(f"  {row['rank']:>3} {row['score']:>10.4f}  {row['text']!r}  {row['ids']}")


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.cli import command_parser

    return command_parser(subparsers, "gcg", "multi-token search (GCG, exact beam)", "python -m probe.gcg", __doc__,
                          GCGConfig, main_from_args,
                          interrupted="finished restarts (or beam depths) are saved; run the same command with --resume "
                                      "to continue")


def main(argv: list[str] | None = None) -> int:
    from probe.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
