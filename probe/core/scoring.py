"""Glue between a loaded model and the engine: pick the head, split the template, build the scorer,
score many rows in OOM-adaptive batches, and self-check the fast path against the model's own forward."""

from __future__ import annotations

import copy
import math
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from probe.config import (ScoreMode, ScoringOptions, check_rewardbench_dpo, model_kind,  # noqa: F401 (re-exported)
                          resolve_score_mode)
from probe.core.engine import FullSequenceScorer, PrefixScorer, takes_rows
from probe.core.pairwise import OWN_FORWARD, PAIRRM_CLASS, OrderedPair, PairwiseConversation, second_prefix
from probe.errors import ProbeError, TemplateError
from probe.core.precision import HALF_TOLERANCE, is_half, rounding_noise, tolerance
from probe.core.invariance import whole_tiles
from probe.core.heads import (GatedRewardHead, JudgeHead, LinearRewardHead, LogitRewardHead, LogprobHead,
                              ModuleRewardHead, OwnForwardHead, RatingHead, ScoreHead, StepRewardHead)
from probe.models.loading import LoadedModel
from probe.core.template import (
    REWARDBENCH_DPO,
    ConversationBuilder,
    TemplateSplit,
    WrappedConversation,
    fill,
    input_call,
    judge_conversation,
    render,
    response_conversation,
    split_template,
)

log = logging.getLogger(__name__)


class PairScorer:
    """An implicit reward (DPO's): ``beta * (policy.score(rows) - reference.score(rows))``, each model on its own
    copy of the path (the shared-prefix cache for the fast path, the model's own forward for the reference)."""

    def __init__(self, policy, reference, beta: float):
        self.policy, self.reference, self.beta = policy, reference, beta

    def score(self, cont, lengths=None):
        a = self.policy.score(cont, lengths)
        return self.beta * (a - self.reference.score(cont, lengths).to(a.device))


Scorer = PrefixScorer | FullSequenceScorer | PairScorer | OrderedPair


def reference_head(loaded: LoadedModel, head: ScoreHead) -> ScoreHead:
    """The reference model's log-probability head, reduced as the model's is."""
    if not isinstance(head, LogprobHead):
        raise ProbeError("--ref compares log-probabilities: the model must be scored by --score logprob")
    return LogprobHead(loaded.ref.model, head.reduce, response_in_prefix=head.k_fixed, fused=head.fused)


def make_head(loaded: LoadedModel, mode: ScoreMode, opts: ScoringOptions = ScoringOptions(),
              response_in_prefix: int = 0) -> ScoreHead:
    """A fresh head (heads keep per-prefix state). ``response_in_prefix``: the last k prefix ids are already
    response tokens (beam extension; RewardBench's DPO route, whose labels start at the assistant header: the
    split's ``scored_in_prefix``); only the log-probability head needs to know."""
    model, spec, tok = loaded.model, loaded.spec, loaded.tokenizer
    if input_call(tok) == REWARDBENCH_DPO:
        try:
            check_rewardbench_dpo(mode, loaded.ref is not None, loaded.beta, opts.logprob_reduce)
        except ValueError as err:
            raise ProbeError(str(err)) from None
    if mode in ("reward", "judge-pair") and loaded.pairwise is not None:
        return pairwise_head(loaded)
    if mode == "judge-pair":
        raise ProbeError("--score judge-pair: load the model as a pairwise judge (probe.load(..., score='judge-pair'))")
    if mode == "reward":
        if loaded.kind != "reward":
            raise ProbeError("--score reward needs a sequence-classification model")
        if spec.reader == "linear":
            return LinearRewardHead(model, spec.label_index)
        if spec.reader == "gated":
            pattern = tok.encode(spec.gating_pattern, add_special_tokens=False)
            return GatedRewardHead(model, pattern, spec.output)
        if spec.reader == "module":
            return ModuleRewardHead(model, spec.sign)
        if spec.reader == "logit":
            return LogitRewardHead(model, spec.label_index, spec.logit_minus)
        if spec.reader == "step":
            return StepRewardHead(model, step_id(loaded))
        # a text pair's segment ids (the model card's call); RewardBench's route reads encoders through the "raw"
        # format (probe/models/loading.py), one segment, as its pipeline passes return_token_type_ids=False
        segments = getattr(model.config, "type_vocab_size", 0) > 1 and spec.chat_template == "text-pair"
        return OwnForwardHead(spec.output, spec.label_index, tok.sep_token_id if segments else None)
    if loaded.kind != "causal":
        raise ProbeError(f"--score {mode} needs a causal language model")
    if mode == "rating":
        from probe.core.judges import rating_prompt, single_ids

        judge = rating_prompt(opts)
        values = judge.rating_values()
        ids = single_ids(tok, [str(v) for v in values], f"--score rating ({judge.name})",
                         "use a --judge-prompt whose ratings are single tokens (e.g. ratings: [1, 9])")
        return RatingHead(model, ids, values, judge)
    if mode == "logprob":
        # the fused head (vocabulary-chunked GEMMs in the faster orientation, online log-sum-exp, no rows x
        # vocabulary logits) is faster than the plain one at 49k and 262k tokens of vocabulary on CPU and needs far
        # less memory (experiments/results/bench_kernels_cpu_float32.md); GCG's soft one-hot rows use the plain one
        return LogprobHead(model, opts.logprob_reduce, response_in_prefix=response_in_prefix, fused=True)
    return label_head(loaded, "Yes", "No", "the judge")


def scored_in_prefix(splits) -> int:
    """The prefix ids every split scores with the response (`TemplateSplit.scored_in_prefix`): one number for the
    head that serves them all."""
    found = {s.scored_in_prefix for s in splits}
    if len(found) > 1:
        raise ProbeError(f"the prompts' templates score {sorted(found)} ids before the response; run them apart")
    return found.pop() if found else 0


def label_head(loaded: LoadedModel, first: str, second: str, who: str, fix: str = "") -> JudgeHead:
    """The LM's logit of ``first`` minus that of ``second`` at the last position; both must be single tokens."""
    from probe.core.judges import single_ids

    return JudgeHead(loaded.model, *single_ids(loaded.tokenizer, [first, second], who, fix))


def pairwise_head(loaded: LoadedModel) -> ScoreHead:
    """One order's output of a pairwise model (probe/core/pairwise.py): PairRM's (and POLAR's) own forward (its logit), or the
    LM's logit of "A" minus that of "B" at the last position (SlicPairPM)."""
    if loaded.pairwise.format in PAIRRM_CLASS:
        return OwnForwardHead("logits", 0)
    if loaded.pairwise.format == "polar":  # its card passes the mask its forward reads the score position from
        return OwnForwardHead("logits", 0, attention_mask=True)
    if loaded.pairwise.format == "shp":
        from probe.core.heads import DecoderLabelHead
        from probe.core.judges import single_ids

        return DecoderLabelHead(*single_ids(loaded.tokenizer, ["A", "B"], "SteamSHP's labels"))
    if loaded.pairwise.format == "judge":
        return label_head(loaded, *loaded.pairwise.judge.labels, f"the pairwise judge ({loaded.pairwise.judge.name})",
                          "use a --judge-prompt whose labels are single tokens")
    return label_head(loaded, "A", "B", "the pairwise model")


def step_id(loaded: LoadedModel) -> int:
    """The id of a process reward model's step separator (registry ``step_token``), as its card finds it
    (``tokenizer.encode("<extra_0>")[0]``); one line where the tokenizer does not hold it as one token."""
    ids = loaded.tokenizer.encode(loaded.spec.step_token, add_special_tokens=False)
    if len(ids) != 1:
        raise ProbeError(f"{loaded.model_id}: the step separator {loaded.spec.step_token!r} is not one token of its "
                         f"tokenizer ({ids}): it is not this family's tokenizer")
    return ids[0]


def conversation(mode: ScoreMode, prompt: str, system: str | None, opts: ScoringOptions,
                 loaded: LoadedModel | None = None) -> ConversationBuilder:
    """The conversation around the response slot; a pairwise model's (``loaded.pairwise``) holds its reference. A
    reward model whose card writes a system prompt (registry ``system_prompt``: WorldPM's empty one, Qwen2.5-Math-PRM's)
    gets it where the run gives none, on the card's route (RewardBench's run writes none)."""
    if mode == "reward" and system is None and loaded is not None and loaded.kind == "reward" \
            and loaded.spec.system_prompt is not None and input_call(loaded.tokenizer) != "rewardbench":
        system = loaded.spec.system_prompt
    if mode in ("reward", "judge-pair") and loaded is not None and loaded.pairwise is not None:
        return PairwiseConversation(prompt, loaded.pairwise, system, 0, opts.date_string)
    if mode == "reward" and loaded is not None and loaded.principle is not None:
        question = fill(loaded.spec.principle_question, principle=loaded.principle)
        return FollowUpQuestion(response_conversation(prompt, system, opts.date_string), question)
    if mode == "rating":
        from probe.core.judges import rating_conversation, rating_prompt

        return rating_conversation(rating_prompt(opts), prompt, system, opts.date_string)
    if mode == "reward" and loaded is not None and loaded.spec.append_token is not None:
        token = getattr(loaded.model.config, loaded.spec.append_token, None)
        if not isinstance(token, int):
            raise ProbeError(f"{loaded.model_id}: its config has no {loaded.spec.append_token} (the id the family "
                             "appends after the chat template)")
        return AppendedToken(response_conversation(prompt, system, opts.date_string), token)
    if mode == "reward" and loaded is not None and loaded.spec.reader == "step":
        return StepSeparated(response_conversation(prompt, system, opts.date_string), step_id(loaded))
    if mode == "judge":
        return judge_conversation(prompt, system, opts.judge_question, opts.date_string)
    return response_conversation(prompt, system, opts.date_string)  # an empty system turn kept (WorldPM's card)


def fed_system(loaded: LoadedModel, mode: ScoreMode, system: str | None, opts: ScoringOptions) -> str | None:
    """The system message ``loaded`` is fed under ``mode`` where the run gives ``system`` (the card's or the judge
    prompt's where it gives none): what a run records (`runs.meta.system_record`)."""
    from probe.core.template import conversation_system

    return conversation_system(conversation(mode, "x", system, opts, loaded))


@dataclass(frozen=True)
class AppendedToken(WrappedConversation):
    """A conversation whose rendering ends with one more id, unless it ends with it already (InternLM2's reward
    token, as its ``get_score`` and RewardBench's InternLMPipeline append it)."""

    token_id: int = 0

    def render_ids(self, tokenizer, response: str) -> list[int]:
        ids = render(tokenizer, self.build, response)
        return ids if ids and ids[-1] == self.token_id else ids + [self.token_id]


@dataclass(frozen=True)
class FollowUpQuestion(WrappedConversation):
    """A question asked after the response (Nemotron's principle model, registry ``principle_question``): the
    response conversation, then a user turn holding ``question``, then the assistant's turn opens."""

    question: str = ""

    def __call__(self, response: str):
        messages, _ = self.build(response)
        return messages + [{"role": "user", "content": self.question}], True


@dataclass(frozen=True)
class StepSeparated(WrappedConversation):
    """A process reward model's input: the response as one step, its ids followed by the separator id (the card's
    assistant content ``step + "<extra_0>"``, whose separator the card's ``tokenizer.encode`` reads as the token), then
    the template's end of turn. The separator goes in by ids before the ids every rendering ends with (found from two
    renderings), so that the response's own text, control tokens included, stays text."""

    sep_id: int = 0

    def render_ids(self, tokenizer, response: str) -> list[int]:
        ids = render(tokenizer, self.build, response)
        tails = [render(tokenizer, self.build, w)[::-1] for w in ("0", "1")]
        n = next((i for i, (a, b) in enumerate(zip(*tails)) if a != b), min(map(len, tails)))
        if ids[len(ids) - n:] != tails[0][:n][::-1]:
            raise TemplateError("the response merges with the chat template's end of turn: the step separator cannot "
                                "be placed after it by ids")
        return ids[: len(ids) - n] + [self.sep_id] + ids[len(ids) - n:]


def build_scorer(loaded: LoadedModel, head: ScoreHead, prefix_ids: Sequence[int], use_cache: bool = True) -> Scorer:
    """The fast path for ``head`` on ``prefix_ids``; with a reference model (``--ref``), the pair of them; for a
    pairwise model, both orders of candidate and reference response."""
    if loaded.pairwise is not None and loaded.pairwise.two_orders:
        return _ordered_pair(loaded, head, prefix_ids, lambda *a: build_scorer(*a, use_cache))
    if loaded.ref is not None:
        ref = replace(loaded.ref, ref=None)
        return PairScorer(build_scorer(replace(loaded, ref=None), head, prefix_ids, use_cache),
                          build_scorer(ref, reference_head(loaded, head), prefix_ids, use_cache), loaded.beta)
    if isinstance(head, OwnForwardHead) or not use_cache or prefix_plan(loaded.model).path == "full":
        return FullSequenceScorer(loaded.model, head, prefix_ids, batch_size=None)  # the planned batch, whole
    return PrefixScorer(loaded.model, head, prefix_ids)


def prefix_plan(model):
    """How rows of ``model`` continue a shared prefix (probe/core/cache.py `plan`, from its config)."""
    from probe.core.cache import plan

    return plan(model.config)


def full_sequence_scorer(loaded: LoadedModel, head: ScoreHead, prefix_ids: Sequence[int],
                         batch_size: int | None = 1) -> Scorer:
    """The reference path of `build_scorer`: each model's own forward, rows of one length at most ``batch_size`` at a
    time (None: a tile's worth; one sequence at a time unless asked)."""
    if loaded.pairwise is not None and loaded.pairwise.two_orders:
        return _ordered_pair(loaded, head, prefix_ids, lambda *a: full_sequence_scorer(*a, batch_size))
    own = FullSequenceScorer(loaded.model, head, prefix_ids, batch_size=batch_size)
    if loaded.ref is None:
        return own
    ref_own = FullSequenceScorer(loaded.ref.model, reference_head(loaded, head), prefix_ids, batch_size=batch_size)
    return PairScorer(own, ref_own, loaded.beta)


# token rows per forward of the self-check's reference at most (rows of one length together, at least one row): a
# GPU's tile; a forward holds at most a tile's worth anyway (probe/core/engine.py's FullSequenceScorer)
REFERENCE_TOKENS = 4096


def takes_a_batch(model: torch.nn.Module) -> bool:
    """Whether the self-check's reference may score several rows of one length in one of the model's own forwards
    (a tile's worth, probe/core/engine.py's `FullSequenceScorer`) as it scores each alone: transformers' own classes
    do (no padding, no mask: rows of one length; a sequence classifier only with a pad id, `takes_rows`); any other
    class (remote code, a family's own module) runs one sequence at a time, as it was checked. Measured on SmolLM2
    on this CPU, one thread: 16 rows 8.3 s one at a time, 5.1 s together, the same bits."""
    return type(model).__module__.startswith("transformers.") and takes_rows(model)


def _ordered_pair(loaded: LoadedModel, head: ScoreHead, prefix_ids: Sequence[int], make) -> OrderedPair:
    """A pairwise model's two orders, each through ``make(loaded, head, prefix)`` (the fast or the reference path)
    with its own head (heads keep per-prefix state)."""
    plain = replace(loaded, pairwise=None)
    prefix2, suffix1, suffix2 = second_prefix(loaded.pairwise, prefix_ids)
    return OrderedPair(loaded.pairwise.format, make(plain, head, prefix_ids), make(plain, copy.copy(head), prefix2),
                       suffix1, suffix2, loaded.pairwise.rendered)


class TemplateRows:
    """rm-probe's inputs: ``prefix`` then ``[token_id, *suffix]`` per row, all of one length."""

    def __init__(self, split: TemplateSplit):
        self.prefix_ids = list(split.prefix_ids)
        self.suffix_ids = list(split.suffix_ids)

    def rows(self, token_ids) -> tuple[torch.Tensor, torch.Tensor]:
        rows = sweep_rows(token_ids, self.suffix_ids)
        return rows, torch.full((rows.shape[0],), rows.shape[1])


def prompt_split(loaded: LoadedModel, mode: ScoreMode, prompt: str, system: str | None, opts: ScoringOptions,
                 n_ids: int) -> TemplateSplit:
    build = conversation(mode, prompt, system, opts, loaded)
    return split_template(loaded.tokenizer, build, candidates=range(n_ids))


# what an allocation failure says when it reaches Python as a plain RuntimeError: the CPU allocator, a CUDA kernel
# launch or cuBLAS/cuDNN workspace that failed to allocate ("CUDA error: out of memory", CUBLAS_STATUS_ALLOC_FAILED)
_OOM_MESSAGES = ("can't allocate memory", "out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED",
                 "CUDNN_STATUS_NOT_ENOUGH_WORKSPACE")


def is_oom(err: BaseException) -> bool:
    """Whether ``err`` is an allocation failure that a smaller batch may avoid."""
    # torch.OutOfMemoryError is torch >= 2.5; torch.cuda.OutOfMemoryError (its alias since) exists from 1.13 on
    types = tuple(t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None))
                  if t is not None)
    if isinstance(err, types):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err) for m in _OOM_MESSAGES)


class AdaptiveBatcher:
    """Scores rows in batches; on out-of-memory, halves the batch and retries the same rows.

    The batch size stays halved for the rest of the run; ``on_change(new size)`` is told (the commands record it
    in meta.json, and ``--resume`` continues with it). Memory is released once per failure, after the failed
    batch's exception (and the tensors its traceback holds) is gone, not after every batch.
    """

    def __init__(self, batch_size: int, on_change: Callable[[int], None] | None = None):
        if batch_size < 1:
            raise ValueError("batch size must be >= 1")
        self.batch_size = batch_size
        self.on_change = on_change

    def run(self, score: Callable[..., torch.Tensor], rows: torch.Tensor,
            progress: Callable[[int], None] | None = None, lengths: torch.Tensor | None = None) -> np.ndarray:
        """``score(rows[i:j])`` (or ``score(rows[i:j], lengths[i:j])``) over all rows, in batches."""
        out = np.empty(rows.shape[0], dtype=np.float32)
        start = 0
        while start < rows.shape[0]:
            stop = min(start + self.batch_size, rows.shape[0])
            try:
                part = score(rows[start:stop]) if lengths is None else score(rows[start:stop], lengths[start:stop])
                out[start:stop] = part.cpu().numpy()
            except Exception as err:
                if not is_oom(err):
                    raise
                if self.batch_size == 1:
                    raise ProbeError("out of memory even at batch size 1: use a smaller dtype, "
                                     "--device-map auto over several GPUs, or a bigger device") from None
            else:
                if progress:
                    progress(stop - start)
                start = stop
                continue
            self._halve()  # outside the except block: the traceback's frames (and the failed batch) are freed
        return out

    def _halve(self) -> None:
        self.batch_size //= 2
        log.warning("out of memory: batch size halved to %d", self.batch_size)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if self.on_change:
            self.on_change(self.batch_size)


def sweep_rows(token_ids: Sequence[int] | np.ndarray, suffix_ids: Sequence[int]) -> torch.Tensor:
    """``[[t, *suffix] for t in token_ids]`` as one tensor."""
    ids = torch.as_tensor(np.asarray(token_ids), dtype=torch.long)[:, None]
    suffix = torch.tensor(list(suffix_ids), dtype=torch.long)[None, :].expand(ids.shape[0], -1)
    return torch.cat([ids, suffix], 1)


@dataclass(frozen=True)
class SelfCheck:
    token_ids: tuple[int, ...]
    max_abs_diff: float
    tolerance: float
    rounding_noise: float | None = None  # half precision: what the tolerance was measured from (core/precision.py)

    def to_json(self) -> dict:
        out = {"token_ids": list(self.token_ids), "max_abs_diff": self.max_abs_diff, "tolerance": self.tolerance}
        if self.rounding_noise is not None:
            out["rounding_noise"] = self.rounding_noise
            out["tolerance_rule"] = f"{HALF_TOLERANCE:g} x rounding_noise (a score's largest change under simulated rounding)"
        return out


def self_check(loaded: LoadedModel, head: ScoreHead, source, fast: Scorer, token_ids: Sequence[int]) -> SelfCheck:
    """Score ``token_ids`` through the fast path and through the model's own forward; raise if they differ."""
    rows, lengths = source.rows(token_ids)
    return check_rows(loaded, head, source.prefix_ids, fast, rows, lengths, [f"token {t}" for t in token_ids],
                      token_ids=token_ids)


def check_rows(loaded: LoadedModel, head: ScoreHead, prefix_ids: Sequence[int], fast: Scorer, rows: torch.Tensor,
               lengths: torch.Tensor, names: Sequence[str], token_ids: Sequence[int] = (),
               got: np.ndarray | None = None) -> SelfCheck:
    """The self-check every command runs: ``rows`` (continuations of ``prefix_ids``) through the fast path as a first
    batch and a later one (`first_and_later`), or its scores ``got`` already computed in the run's own batches, and
    through the model's own forward (rows of one length together, at most `REFERENCE_TOKENS` token rows a forward,
    where it `takes_a_batch`; else one sequence at a time); raises naming the first row (``names``) outside
    `precision.tolerance` (in half precision measured from the model's rounding noise on these rows)."""
    models = (loaded.model,) if loaded.ref is None else (loaded.model, loaded.ref.model)
    batch = max(1, REFERENCE_TOKENS // (len(prefix_ids) + rows.shape[1])) if all(map(takes_a_batch, models)) else 1
    own = full_sequence_scorer(loaded, head, prefix_ids, batch)

    def reference() -> np.ndarray:
        return own.score(rows, lengths).cpu().numpy()

    ref = reference()
    if got is None:
        got = first_and_later(fast, rows, lengths, ref)
    diff = np.abs(np.asarray(got, dtype=np.float64) - ref)
    noise = rounding_noise(models, reference, ref) if is_half(loaded.dtype) else None
    tol = tolerance(ref, loaded.dtype, noise)
    check = SelfCheck(tuple(int(t) for t in token_ids), float(diff.max()), float(tol.max()), noise)
    if (diff > tol).any():
        worst = int(np.argmax(diff - tol))
        raise ProbeError(
            f"self-check failed: the cached scores disagree with the model's own forward ({names[worst]}: "
            f"{got[worst]:.5g} vs {ref[worst]:.5g}); the registry spec {loaded.spec.name!r} does not fit this model. "
            "Pass --spec/--label-index, or --verify 0 to skip the check at your own risk"
        )
    return check


def first_and_later(fast: Scorer, rows: torch.Tensor, lengths: torch.Tensor, ref: np.ndarray) -> np.ndarray:
    """The fast path's scores of ``rows`` as a first batch and again as a later one (the rows reversed, each at
    another position), whichever is farther from ``ref`` per row: a scorer that carried state from one batch to the
    next (MiniMax's shared lightning states: its first batch right, later ones up to 2.3e-2 off) cannot pass."""
    first = fast.score(rows, lengths).cpu().numpy()
    back = torch.arange(rows.shape[0] - 1, -1, -1)
    later = fast.score(rows[back], lengths[back]).cpu().numpy()[back.numpy()]
    return np.where(np.abs(later.astype(np.float64) - ref) > np.abs(first.astype(np.float64) - ref), later, first)


def n_scorable(loaded: LoadedModel) -> int:
    """Token ids that both the tokenizer can name and the embedding matrix holds."""
    return min(len(loaded.tokenizer), loaded.model.get_input_embeddings().num_embeddings)


def scoring_path(loaded: LoadedModel, head: ScoreHead | None = None) -> str:
    """Which path `build_scorer` takes for this model, as the memory plan names it (probe/models/memory.py)."""
    from probe.kernels.prefix_attention import supported

    if isinstance(head, OwnForwardHead) or (loaded.pairwise is not None and loaded.pairwise.format in OWN_FORWARD):
        return "full"
    if loaded.kind == "reward" and loaded.spec.reader == "forward":
        return "full"
    if prefix_plan(loaded.model).path == "full":
        return "full"
    return "shared" if supported(loaded.model) else "cache"


def path_record(loaded: LoadedModel) -> dict:
    """What meta.json says of the path a run's rows take (`scoring_path`) and why: the prefix's cache layers by type
    and how each row continues them (probe/core/cache.py)."""
    path = scoring_path(loaded)
    out = {"path": path, "kernel": {"shared": "shared-prefix attention (kernels/prefix_attention.py)",
                                    "cache": "the model's own layers on a per-row copy of the prefix's cache",
                                    "full": "each whole sequence through the model's own forward"}[path]}
    reuse = prefix_plan(loaded.model)
    if reuse.path == "full" or path != "full":
        out.update(reuse.to_json())
    return out


def device_shares(model: torch.nn.Module) -> tuple[dict[torch.device, float], torch.device]:
    """The fraction of ``model``'s parameters on each device (one device unless ``--device-map`` spread it) and
    the device of its head (the output embeddings, else the last parameter: where the final hidden states are
    read)."""
    count: dict[torch.device, int] = {}
    last = None
    for param in model.parameters():
        count[param.device] = count.get(param.device, 0) + param.numel()
        last = param.device
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head = out.weight.device if out is not None and getattr(out, "weight", None) is not None else last
    total = sum(count.values())
    return {d: n / total for d, n in count.items()}, head


def batch_parts(loaded: LoadedModel, n_prefix: int, n_new: int, mode: ScoreMode,
                head: ScoreHead | None = None) -> dict:
    """Per device, the memory plan's `Part` of each model that runs on a batch: the model, its ``--ref``
    reference, a pairwise model's second order (each with its own prefix cache)."""
    from probe.core.invariance import tile_rows
    from probe.models.memory import Part, fixed_bytes, row_cost, tile_floor

    fused = not isinstance(head, LogprobHead) or head.fused
    parts: dict = {}
    floors: dict = {}
    models = [loaded] + ([loaded.ref] if loaded.ref is not None else [])
    models += [loaded] if loaded.pairwise is not None and loaded.pairwise.two_orders else []
    for m in models:
        path = scoring_path(m, head if m is loaded else None)
        cost = row_cost(m.model.config, n_prefix, n_new, m.dtype, mode, path, fused)
        fixed = fixed_bytes(m.model.config, n_prefix, m.dtype, path)
        shares, head_device = device_shares(m.model)
        for device, share in shares.items():
            parts.setdefault(device, []).append(Part(cost, fixed, share, device == head_device))
            floors[device] = max(floors.get(device, 0), tile_floor(m.model.config, m.dtype, mode, tile_rows(device), fused))
    for device, floor in floors.items():  # one tile's working set whatever the batch, once: the models run in turn
        if floor:
            first = parts[device][0]
            parts[device][0] = replace(first, fixed=first.fixed + math.ceil(floor / first.layer_share))
    return parts


def default_batch_size(loaded: LoadedModel, n_prefix: int, n_new: int, mode: ScoreMode,
                       head: ScoreHead | None = None) -> int:
    """Rows per scoring call, in whole tiles (a call's rows fill its fixed-shape forwards, probe/core/invariance.py):
    CPU about 256 (measured best on 2 cores for SmolLM2); GPU what fits in 70% of the free memory of every GPU the
    model (and its reference) is on, at most 4096 (probe/models/memory.py)."""
    path = scoring_path(loaded, head)
    drop = int(head.drops_last_input) if head is not None else int(mode == "logprob")
    per_row = n_new - drop if path in ("shared", "cache") else n_prefix + n_new
    if loaded.device.type != "cuda":
        return whole_tiles(256, per_row, loaded.device, nearest=True)
    from probe.models.memory import plan_devices

    parts = batch_parts(loaded, n_prefix, n_new, mode, head)
    free = {d: torch.cuda.mem_get_info(d)[0] for d in parts if d.type == "cuda"}
    return whole_tiles(max(1, plan_devices(free, {d: p for d, p in parts.items() if d in free})), per_row,
                       loaded.device)
