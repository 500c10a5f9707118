"""rm-probe's Python API: the commands' science on a model and tokenizer you already hold, in memory.

    >>> import probe
    >>> lm = probe.load("smollm2", score="logprob")                    # or your own model and tokenizer
    >>> df = probe.sweep(lm.model, lm.tokenizer, "What, in one word, is the greatest thing ever?", limit=500)
    >>> df.select("rank", "score", "token_id", "decoded").head(3)      # doctest: +SKIP
    >>> probe.score_responses(lm.model, lm.tokenizer, "What is the greatest thing ever?",
    ...                       ["Love", "Black people", "The Beatles"])  # doctest: +SKIP

Each function scores exactly as the corresponding command does (the same template split, engine, heads and
self-check against the model's own forward) and writes nothing to disk unless asked (``output=``: a run
folder as the command writes it). ``score="auto"`` reads a sequence classifier's reward head and scores a
causal language model by its log-probability (``"logprob"``) proxy; ``"judge"`` asks it a Yes/No question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import polars as pl

from probe.config import (GCGConfig, ScoreMode, ScoreVocabConfig, ScoringOptions, judge_prompt_for,
                          model_kind)
from probe.core.prompts import CONTROL, persona_grid, prompts_from, systems_from
from probe.core.template import DEFAULT_DATE, JUDGE_QUESTION, resolve_date
from probe.errors import ProbeError
from probe.runs.cpu import reproducible_blas

# MKL's strict reproducibility (probe/core/invariance.py), read at MKL's first product: set when the API is first
# used, before it loads anything; a process that ran a float32 product before is told so when it scores on the CPU
reproducible_blas()


def _check_score(score: str) -> None:
    """A misspelt score mode is an error, never a silent other score (it fell through to another head)."""
    import typing

    modes = ("auto", *typing.get_args(ScoreMode))
    if score not in modes:
        raise ProbeError(f"score={score!r}: not a score mode (use {', '.join(modes)})")


def _responses(responses: str | Sequence[str]) -> list[str]:
    """A lone string is one response (as a lone prompt is one prompt), not a list of its characters."""
    return [responses] if isinstance(responses, str) else list(responses)


def load(rm: str | None = None, *, score: str = "auto", device: str = "auto", dtype: str = "auto",
         revision: str | None = None, trust_remote_code: bool = False, chat_template: str | None = None,
         spec: str | None = None, label_index: int | None = None, device_map: str | None = None,
         allow_random_head: bool = False, ref: str | None = None, beta: float = 1.0,
         reference_response: str | None = None, input_method: str = "ids", judge_prompt: str | None = None,
         principle: str | None = None, seed: int = 0):
    """Load a model as the commands do (Hugging Face id, local folder, cache snapshot, or a packaged model:
    ``None``/``"smollm2"``, ``"gemma3-270m"``), with its registry spec. Returns a ``LoadedModel``
    (``.model``, ``.tokenizer``, ``.spec``, ...), which every other function here also accepts as ``model``.
    ``ref``: a reference model; every score is then ``beta * (log p_rm - log p_ref)`` of the same response ids.
    ``reference_response``: a pairwise model's (PairRM, ...) fixed response each candidate is compared with.
    ``principle``: what a principle reward model (Nemotron-70B-Reward-Principle) scores each response against
    (default: its model card's).
    ``input_method="rewardbench"``: the ids RewardBench 0.1.4's run script gives this family (see the README), for
    every function that scores with the returned model; ``"ids"``: the family's own (its model card's).
    ``score="judge-pair"``: a language model as a pairwise judge against ``reference_response`` under
    ``judge_prompt`` (a shipped name or a YAML file, probe/core/judges.py); pass ``score="judge-pair"`` again when
    scoring with it. ``spec``: the registry entry to read the model as, whatever its path says (its reader, input,
    judge prompt, default score mode and system turn: ``spec="ContextualAI/LMUnit-llama3.1-70b"`` is read as LMUnit).
    A generative judge (LMUnit) is loaded for one reading: ``score="rating"`` under its own prompt (the default) with
    its family's input, or another ``judge_prompt``/score with the chat template's ids; score it the way it was
    loaded (another way is one line). ``allow_random_head``: a head the checkpoint lacks is drawn from ``seed`` (a null model; the
    seed is in ``weights_identity`` and ``.random_head``), as the commands draw it from ``--seed``.

    >>> lm = probe.load("smollm2")                   # doctest: +SKIP
    >>> lm.spec.name, lm.kind                        # doctest: +SKIP
    """
    from probe.config import ModelOptions, check_rewardbench_dpo, resolve_score_mode
    from probe.models.loading import load_for_config, with_judge_pair

    _check_score(score)
    try:
        mode = resolve_score_mode(score, rm, ref, spec)  # spec=: its family's default mode (LMUnit's: rating)
    except ValueError as err:
        raise ProbeError(str(err)) from None
    judge_pair = mode == "judge-pair"

    options = ModelOptions(rm=rm, device=device, dtype=dtype, revision=revision, trust_remote_code=trust_remote_code,
                           chat_template=chat_template, spec=spec, label_index=label_index, device_map=device_map,
                           allow_random_head=allow_random_head, ref=ref, beta=beta,
                           reference_response=None if judge_pair else reference_response, principle=principle)
    options.check_reference()
    if input_method not in ("ids", "rewardbench"):
        raise ProbeError(f"input_method={input_method!r}: 'ids' (the model card's inputs) or 'rewardbench'")
    if input_method == "rewardbench" and mode != "reward":  # the reduction is checked where the scores are made
        try:
            check_rewardbench_dpo(mode, ref is not None, beta, "sum")
        except ValueError as err:
            raise ProbeError(str(err)) from None
    judge = _judge_prompt(mode, judge_prompt, None, rm, spec) if mode == "rating" else None
    loaded = load_for_config(options, model_kind(mode), input_method=input_method, seed=seed, judge_prompt=judge)
    return with_judge_pair(loaded, reference_response, judge_prompt) if judge_pair else loaded


def _loaded(model, tokenizer, score: str):
    """(LoadedModel, score mode) for a model the caller holds (or a LoadedModel from `load`)."""
    from probe.models.loading import LoadedModel
    from probe.models.registry import lookup, structural_spec

    from probe.models.attention import use_trained_attention
    from probe.versions import check_versions

    _check_score(score)
    check_versions()
    if isinstance(model, LoadedModel):
        loaded = model if tokenizer is None else replace(model, tokenizer=tokenizer)
        for held in (loaded, loaded.ref):
            if held is not None:
                use_trained_attention(held.model)
        mode = score if score != "auto" else ("reward" if loaded.kind == "reward" else
                                              "rating" if loaded.spec.judge_prompt is not None else "logprob")
        return loaded, mode
    if tokenizer is None:
        raise ProbeError("pass the model's tokenizer (or a LoadedModel from probe.load)")
    use_trained_attention(model)  # e.g. Gemma 2 loaded with SDPA, which ignores its soft-cap: switched, with a warning
    causal = model.get_output_embeddings() is not None
    kind = "causal" if causal else "reward"
    mode = score if score != "auto" else ("logprob" if causal else "reward")
    if model_kind(mode) != kind:  # type: ignore[arg-type]
        raise ProbeError(f"score={mode!r} needs a {'causal language model' if mode != 'reward' else 'sequence classifier'}"
                         f"; this model is a {'causal LM' if causal else 'sequence classifier'}")
    name = getattr(model.config, "name_or_path", "") or type(model).__name__
    spec, match = lookup(name, getattr(model.config, "architectures", None))
    if kind == "reward" and (found := structural_spec(model, spec)) is not None:
        spec, match = found, "structure"
    return LoadedModel(model, tokenizer, spec, kind, name, name, None, f"api ({match})"), mode


def sweep(model, tokenizer, prompt: str | Sequence[str] | Mapping[str, str], *, score: str = "auto",
          limit: int | None = None, batch_size: int | None = None, verify: int = 16, system: str | None = None,
          date: str = DEFAULT_DATE, logprob_reduce: str = "sum", judge_question: str = JUDGE_QUESTION,
          progress: bool = False, seed: int = 0, systems=None, control: str = CONTROL,
          judge_prompt: str | None = None, unit_test: str | None = None) -> pl.DataFrame:
    """Every token id of the vocabulary as the one-token response to ``prompt`` (a text, a list, or a mapping
    key: text). Returns one row per prompt x token: ``prompt_key, token_id, score, rank`` (1 = best) and the
    vocabulary's columns (``decoded``, ``is_special``, ``is_word``, ``leading_space``, ``roundtrips``, ...),
    exactly as the command's ``scores.parquet``. ``limit``: the first N ids only. ``systems``: a persona grid (a
    mapping key -> system prompt, or a YAML file), every prompt under every persona as ``<prompt>@<persona>``.

    >>> import probe
    >>> lm = probe.load("smollm2")                                          # doctest: +SKIP
    >>> df = probe.sweep(lm, None, "What, in one word, is the greatest thing ever?", limit=300)  # doctest: +SKIP
    >>> df.filter(pl.col("is_word")).head(5)                                # doctest: +SKIP
    """
    from probe.core.scoring import n_scorable
    from probe.core.sweep import VocabSweep, ranked_table
    from probe.core.vocab_cache import VocabJob

    loaded, mode = _loaded(model, tokenizer, score)
    prompts = _grid(prompt, systems, control, system)
    rm, spec = _named(loaded)
    _check_reading(loaded, mode, _judge_prompt(mode, judge_prompt, unit_test, rm, spec))
    config = ScoreVocabConfig(rm=rm, spec=spec, score=mode, limit=limit, batch_size=batch_size, verify=verify,
                              system=system, date=date, logprob_reduce=logprob_reduce,  # type: ignore[arg-type]
                              judge_question=judge_question, progress=progress, seed=seed,
                              judge_prompt=judge_prompt, unit_test=unit_test)
    vs = VocabSweep(loaded, config, prompts)
    job = VocabJob(loaded.tokenizer, n_scorable(loaded))  # cached, or built beside the sweep (probe/core/vocab_cache.py)
    scores = [vs.score_prompt(p) for p in prompts]
    vocab = job.result()
    return pl.concat([ranked_table(p, vs.token_ids, s, vocab) for p, s in zip(prompts, scores)])


def score_responses(model, tokenizer, prompt: str | Sequence[str] | Mapping[str, str],
                    responses: str | Sequence[str], *,
                    score: str = "auto", batch_size: int | None = None, verify: int = 4, system: str | None = None,
                    date: str = DEFAULT_DATE, logprob_reduce: str = "sum",
                    judge_question: str = JUDGE_QUESTION, systems=None, control: str = CONTROL,
                    judge_prompt: str | None = None, unit_test: str | None = None) -> pl.DataFrame:
    """Each response (a whole assistant turn, any length) scored under each prompt: ``prompt_key, response,
    n_tokens, score, rank`` (1 = best within the prompt), and what the chat template did to the response
    (``slot_text``, ``change``). The logprob of a multi-token response is the sum (``logprob_reduce="mean"``:
    the mean) over its tokens and the template's closing tokens. ``systems``: a persona grid, as for `sweep`.

    >>> probe.score_responses(lm, None, "What is the greatest thing ever?", ["Love", "Black people"])  # doctest: +SKIP
    """
    from probe.core.responses import prepare, ranked_responses, response_batch_size, score_rows

    if batch_size is not None and (isinstance(batch_size, bool) or batch_size < 1):  # 0 was read as not given
        raise ProbeError(f"batch_size={batch_size!r}: rows per forward, >= 1 (None: by memory)")
    loaded, mode = _loaded(model, tokenizer, score)
    judge = _judge_prompt(mode, judge_prompt, unit_test, *_named(loaded))
    _check_reading(loaded, mode, judge)
    opts = ScoringOptions(logprob_reduce, judge_question, resolve_date(date), judge)  # type: ignore[arg-type]
    prepared = [prepare(loaded, mode, p.key, p.text, _responses(responses), opts, p.system_or(system))
                for p in _grid(prompt, systems, control, system)]
    size = batch_size or response_batch_size(loaded, mode, prepared)
    return pl.concat([ranked_responses(rows, score_rows(loaded, mode, rows, opts=opts, batch_size=size, verify=verify))
                      for rows in prepared])


def _judge_prompt(mode, judge_prompt, unit_test, rm, spec=None):
    """`judge_prompt_for` with its one-line errors as the API's."""
    try:
        return judge_prompt_for(mode, judge_prompt, unit_test, rm, spec)
    except ValueError as err:
        raise ProbeError(str(err)) from None


def _named(loaded) -> tuple[str, str | None]:
    """(rm, spec) that name a loaded model's family as it was loaded: its registry entry where that is one (found by
    id, path, ``spec=`` or class), else its id (an id prefix's entry is found from it again)."""
    from probe.models.registry import REGISTRY

    return loaded.model_id, loaded.spec.name if loaded.spec.name in REGISTRY else None


def _check_reading(loaded, mode: str, judge) -> None:
    """A generative judge (LMUnit) is loaded for one reading: under its own judge prompt its family's input call
    applies (vLLM's ``tokenizer(text)``), under any other reading the chat template's ids; scoring it another way
    than it was loaded for would feed the other input: one line."""
    own = loaded.spec.judge_prompt
    if loaded.kind != "causal" or own is None or loaded.spec.input_call is None:
        return
    reads_own = mode == "rating" and judge is not None and judge.name == own
    if reads_own != (loaded.own_judge is not None):
        was = f"under its judge prompt {own}" if loaded.own_judge else f"otherwise than under its judge prompt {own}"
        how = f"score={mode!r}" + (", judge_prompt=..." if mode == "rating" and not reads_own else "")
        raise ProbeError(f"{loaded.model_id} was loaded to be read {was} (its input follows the reading): load it "
                         f"again to score it this way, probe.load(..., {how})")


def _grid(prompt, systems, control: str, system: str | None):
    """The API's prompts, crossed with a persona grid where ``systems`` is given."""
    if systems is not None and system is not None:
        raise ProbeError("system and systems: a persona grid gives each persona its own system prompt")
    grid, control = systems_from(systems, control)
    prompts = prompts_from(prompt)
    return prompts if grid is None else persona_grid(prompts, grid, control, "systems")


def trace(model, tokenizer, prompt: str, responses: str | Sequence[str], *, score: str = "auto",
          system: str | None = None, date: str = DEFAULT_DATE, logprob_reduce: str = "sum") -> pl.DataFrame:
    """Per-token reward traces (probe/core/trace.py): for each response, the score of every prefix of it (the
    assistant turn cut after each token), one forward per response for reward heads and log-probabilities, and the
    complete response's score: ``response, position, token_id, token, text_so_far, score, kind, method``.

    >>> probe.trace(lm, None, "What is the greatest thing ever?", ["Love and peace"])  # doctest: +SKIP
    """
    from probe.core.trace import trace as run_trace

    loaded, mode = _loaded(model, tokenizer, score)
    opts = ScoringOptions(logprob_reduce, JUDGE_QUESTION, resolve_date(date))  # type: ignore[arg-type]
    return run_trace(loaded, mode, prompt, _responses(responses), opts, system)[0]


def gcg(model, tokenizer, prompt: str, *, score: str = "auto", config: GCGConfig | None = None, **settings):
    """Greedy Coordinate Gradient over n-token responses (``length=5, direction="max", steps=100, ...``: any
    field of `probe.config.GCGConfig`, or a whole ``config``). Returns a ``GCGResult``: ``best_ids``,
    ``best_text``, ``best_score`` (the model's own forward), ``search_score`` (the cached engine), each
    restart's trajectory, and the random baseline.

    >>> res = probe.gcg(lm, None, "What is the greatest thing ever?", length=3, steps=10)  # doctest: +SKIP
    >>> res.best_text, res.best_score                                                     # doctest: +SKIP
    """
    from probe.core.gcg import run

    loaded, mode = _loaded(model, tokenizer, score)
    base = config or GCGConfig(progress=False)
    cfg = replace(base, rm=loaded.model_id, prompt=prompt, score=mode, **settings)
    return run(loaded, cfg)


def explain(model, tokenizer, prompt: str, responses: str | Sequence[str], *, score: str = "auto",
            baseline: str | None = None, heads: bool = False, patch: bool = True, atp: bool = True,
            ig_steps: int = 128, ig_target: float = 0.01, ig_baseline: str = "zero", system: str | None = None,
            date: str = DEFAULT_DATE, logprob_reduce: str = "sum", judge_question: str = JUDGE_QUESTION,
            batch_size: int = 64) -> dict:
    """Why a response scores what it does (probe/attribution/): for each response, ``score`` (what `score_responses`
    gives it), ``components`` (the embedding and each layer's attention and MLP part, through the final norm frozen
    at its real scale; ``heads=True``: each attention head too) and ``rest`` (head bias, minus the log-sum-exp of a
    log-probability, a soft-cap's bend, the residual stream's and final norm's rounding in the model's dtype),
    ``score = sum(components) + rest`` to a bound of the dtype that the call refuses to break (`ProbeError`);
    ``patching`` against ``baseline`` (default: the median-scored response, given 3 or more) on the prefix's cache,
    with attribution patching's estimate (``atp``) and their Spearman agreements (n, 95% interval) per level;
    ``integrated_gradients`` over the prompt's input embeddings (``ig_steps`` points at most, refined until the
    completeness residual is under ``ig_target`` of the gap; 0: none). The dict `probe explain` writes as
    explain.json.

    >>> probe.explain(lm, None, "What is the greatest thing ever?", ["Love", "freedom", "The Beatles"])  # doctest: +SKIP
    """
    from probe.attribution.inputs import explain_responses

    loaded, mode = _loaded(model, tokenizer, score)
    if mode not in ("reward", "logprob", "judge"):
        raise ProbeError(f"score={mode!r}: explain reads reward, logprob or judge")
    opts = ScoringOptions(logprob_reduce, judge_question, resolve_date(date))  # type: ignore[arg-type]
    if not isinstance(prompt, str) or not prompt.strip():
        raise ProbeError("prompt is empty: give the user prompt the responses answer")
    return explain_responses(loaded, mode, prompt, _responses(responses), opts, system, baseline=baseline, heads=heads,
                             patch=patch, atp=atp, ig_steps=ig_steps, ig_target=ig_target, ig_baseline=ig_baseline,
                             batch=batch_size)


__all__ = ["load", "sweep", "score_responses", "trace", "gcg", "explain", "ScoreMode"]
