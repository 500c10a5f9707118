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

import sys
import time
from dataclasses import dataclass

import numpy as np
import polars as pl
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from probe.config import GCGConfig, model_kind
from probe.core.engine import PrefixScorer
from probe.core.scoring import (AdaptiveBatcher, PairScorer, build_scorer, full_sequence_scorer, make_head, n_scorable,
                                prompt_split, reference_head, sweep_rows)
from probe.core.template import TemplateSplit
from probe.core.vocab_cache import vocab_table
from probe.errors import ProbeError
from probe.models.loading import LoadedModel, load_for_config
from probe.runs.rundir import RunDir


def batch_size(config: GCGConfig, device: torch.device) -> int:
    """Candidate rows per forward: --batch-size, else 256 on CPU and 1024 on GPU (halved on out-of-memory)."""
    return config.batch_size or (256 if device.type == "cpu" else 1024)


def allowed_tokens(vocab: pl.DataFrame, which: str, allow_special: bool) -> Bool[Tensor, " v"]:
    ok = np.ones(vocab.height, dtype=bool)
    if not allow_special:
        ok &= ~(vocab["is_special"].to_numpy() | vocab["is_added"].to_numpy())
    if which == "words":
        if vocab["is_word"].null_count() == vocab.height:
            raise ProbeError("--allowed words: the W flag is empty here (wordfreq is not installed: pip install "
                             "wordfreq), so no token is known to be a word; or use --allowed ascii or all")
        ok &= vocab["is_word"].fill_null(False).to_numpy()
    elif which == "ascii":
        ok &= np.array([d.isascii() and d.isprintable() and d.strip() != "" for d in vocab["decoded"].to_list()])
    if not ok.any():
        raise ProbeError(f"--allowed {which}: no token of this vocabulary qualifies")
    return torch.from_numpy(ok)


# families whose decoder scales the embeddings it looks up itself, and not embeddings it is given (Falcon-H1's
# muP ``embedding_multiplier``): a one-hot row must carry the scale
SCALED_LOOKUP = {"falcon_h1": "embedding_multiplier"}


def embedding_matrix(model: torch.nn.Module) -> tuple[Tensor, float]:
    """The input embedding matrix and the scale the embedding module applies (Gemma 3 scales inside it), times the
    one the decoder applies to looked-up ids alone (`SCALED_LOOKUP`)."""
    emb = model.get_input_embeddings()
    weight = emb.weight
    probe = torch.arange(min(8, weight.shape[0]), device=weight.device)
    with torch.no_grad():
        looked_up, raw = emb(probe).float(), weight[probe].float()
    scale = float(getattr(emb, "embed_scale", 1.0))
    if not torch.allclose(looked_up, raw * scale, rtol=1e-2, atol=1e-3):
        raise ProbeError(f"{type(emb).__name__} is not a (scaled) lookup table; GCG cannot form one-hot gradients")
    text = model.config.get_text_config()
    if (field := SCALED_LOOKUP.get(getattr(text, "model_type", None))) is not None:
        scale *= float(getattr(text, field, 1.0))
    return weight, scale


class OneHotEmbedding(torch.autograd.Function):
    """``(onehot @ weight) * scale`` in the weight's dtype, with the gradient for ``onehot`` computed in float32:
    ``(grad * scale) @ weight.T`` over vocabulary chunks (no float32 copy of the whole matrix). Autograd's own
    backward would compute it in the weight's dtype and round each of the vocabulary's gradients to bf16."""

    CHUNK = 16384

    @staticmethod
    def forward(ctx, onehot: Tensor, weight: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(weight)
        ctx.scale = scale
        return (onehot.to(weight.dtype) @ weight) * scale

    @staticmethod
    def backward(ctx, grad: Tensor):
        (weight,) = ctx.saved_tensors
        g = grad.float() * ctx.scale
        out = torch.empty(g.shape[0], weight.shape[0], device=g.device, dtype=torch.float32)
        for start in range(0, weight.shape[0], OneHotEmbedding.CHUNK):
            out[:, start : start + OneHotEmbedding.CHUNK] = g @ weight[start : start + OneHotEmbedding.CHUNK].float().T
        return out, None, None


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
        policy = PrefixScorer(loaded.model, head, split.prefix_ids)
        self.weight, self.scale = embedding_matrix(loaded.model)
        # the objective's terms: (scorer, model, embedding matrix, its scale, factor); an implicit reward adds the
        # reference with -beta
        self.terms = [(policy, loaded.model, self.weight, self.scale, 1.0 if loaded.ref is None else loaded.beta)]
        self.scorer = policy
        if loaded.ref is not None:
            ref = PrefixScorer(loaded.ref.model, reference_head(loaded, head), split.prefix_ids)
            ref_weight, ref_scale = embedding_matrix(loaded.ref.model)
            if ref_weight.shape != self.weight.shape:
                raise ProbeError("--ref: the reference's embedding matrix is not the model's shape; GCG needs one "
                                 "one-hot space for both")
            self.terms.append((ref, loaded.ref.model, ref_weight, ref_scale, -loaded.beta))
            self.scorer = PairScorer(policy, ref, loaded.beta)
        self.device = policy.device
        self.allowed = allowed.to(self.device)
        self.suffix = torch.tensor(list(split.suffix_ids), device=self.device, dtype=torch.long)
        self.batcher = AdaptiveBatcher(batch_size(config, self.device))
        self.tokenizer = loaded.tokenizer

    def rows(self, ids: Int[Tensor, "b n"]) -> Int[Tensor, "b m"]:
        return torch.cat([ids, self.suffix[None].expand(ids.shape[0], -1)], 1)

    def objective(self, ids: Int[Tensor, "b n"]) -> Float[Tensor, " b"]:
        """``sign * score`` of each row: GCG always maximises this."""
        scores = self.batcher.run(self.scorer.score, self.rows(ids.to(self.device)))
        return self.config.sign * torch.from_numpy(scores)

    def onehot(self, ids: Int[Tensor, " n"]) -> Float[Tensor, "n v"]:
        """float32 whatever the model's dtype: its gradient ranks the whole vocabulary (top-k), and bf16 would round
        it to 8 bits and tie many candidates."""
        out = torch.zeros(len(ids), self.weight.shape[0], device=self.device, dtype=torch.float32)
        out[torch.arange(len(ids)), ids.to(self.device)] = 1
        return out

    def relaxed_objective(self, onehot: Float[Tensor, "n v"], ids: Int[Tensor, " n"]) -> Float[Tensor, ""]:
        """The objective as a differentiable function of (relaxed) one-hot response rows; equals
        `objective(ids)` when ``onehot`` is exactly one-hot on ``ids``."""
        ids = ids.to(self.device)
        total = None  # on the device of the first term's score (the last GPU under --device-map)
        for scorer, model, weight, scale, factor in self.terms:
            resp = OneHotEmbedding.apply(onehot.to(weight.device), weight, scale)
            inputs = torch.cat([resp, model.get_input_embeddings()(self.suffix).to(resp.dtype)], 0)[None]
            n_in = inputs.shape[1] - int(scorer.head.drops_last_input)
            score = scorer.score_embeds(inputs[:, :n_in], self.rows(ids[None]), onehot=onehot[None])
            term = factor * score.sum()
            total = term if total is None else total + term.to(total.device)
        return self.config.sign * total

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
        return _shown(self.tokenizer, ids)

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
    """The plain full-sequence forward of prefix + ids + suffix through the model's own forward (both models'
    for an implicit reward)."""
    return float(full_sequence_scorer(loaded, head, split.prefix_ids).score([ids + list(split.suffix_ids)])[0])


def run(loaded: LoadedModel, config: GCGConfig, done: dict[int, GCGRun] | None = None,
        on_restart=None) -> GCGResult:
    """Front door: ``config.runs`` GCG restarts; returns the best response over all of them. ``done``: restarts
    already finished (a resumed search); ``on_restart(k, run)`` is called after each new one."""
    opts = config.scoring_options()
    if loaded.pairwise is not None and config.mode == "reward":
        why = ("a pairwise score takes two (both orders)" if loaded.pairwise.two_orders else
               "POLAR's is read through its remote class's own forward only, which has no differentiable twin")
        raise ProbeError(f"{loaded.model_id} is a pairwise preference model: GCG's gradients need one sequence per "
                         f"candidate through a differentiable twin of the forward, and {why}; score responses with "
                         "--responses or a sweep instead")
    split = prompt_split(loaded, config.mode, config.prompt, config.system, opts, len(loaded.tokenizer))
    vocab = vocab_table(loaded.tokenizer, n_scorable(loaded))
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
    batcher = AdaptiveBatcher(batch_size(config, loaded.device))
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
            scorer = build_scorer(loaded, head, list(split.prefix_ids) + beam)
            scores_all.append(batcher.run(scorer.score, sweep_rows(cand.numpy(), split.suffix_ids),
                                          progress=bar.update))
            ids_all.extend(beam + [int(t)] for t in cand)
        scores = np.concatenate(scores_all)
        order = np.argsort(-config.sign * scores, kind="stable")[: config.beam]
        beams = [ids_all[i] for i in order]
        levels.append(pl.DataFrame({
            "depth": depth, "rank": np.arange(1, len(order) + 1), "ids": beams,
            "text": [_shown(loaded.tokenizer, b) for b in beams], "score": scores[order],
        }))
        if on_level:
            on_level(levels[-1])
    bar.close()
    return levels


def load_for(config: GCGConfig) -> LoadedModel:
    return load_for_config(config, model_kind(config.mode))


def _shown(tokenizer, ids: list[int]) -> str:
    """The ids as text, byte fragments shown as ``<0x88>`` as every table shows them (never U+FFFD)."""
    from probe.report.text import shown_ids

    return shown_ids(tokenizer, ids)
