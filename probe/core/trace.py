"""Per-token reward traces: the score of every prefix of a response, to see where in a response the reward moves.

A response's ids ``r`` (as its chat template renders it) are cut after each token: the trace at k is the score of
the conversation whose assistant turn holds ``r[:k]`` and stops there (no end-of-turn ids: a cut response has not
ended). The last row, ``complete``, is the response's ordinary score, closing ids included.

* Reward heads read at the last token (sequence classifiers, the families' module heads, the gated heads) and the
  log-probability head: one forward over ``prefix + r`` (`PrefixScorer.score_prefixes`): in a causal model the
  hidden state at position k is that of ``prefix + r[:k]`` alone, so each prefix's score is read there; the
  log-probability trace is the cumulative sum (or running mean) of the response's token log-probabilities.
* Families whose score is the model's own forward (encoders, remote code): every prefix re-scored through it
  (``method`` says "re-scored"), one forward per prefix.
* Families whose score is read after the response's turn is closed (a principle model asks its principle after it; a
  process reward model reads the step separator appended after it): every prefix closed as a whole response would be
  (``r[:k]`` + the template's closing ids), each the card's score of the response cut there (``method`` says "each
  prefix closed"), on the fast path, ``CHUNK`` prefixes a batch.
* Pairwise models and the judge wrap the response in a question: a cut response would be another question; refused.

`trace` takes whole responses (text), ``CHUNK`` at a time (`trace_chunk`); `trace_ids` takes ids (a GCG result's).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import polars as pl
import torch

from probe.config import ScoreMode, ScoringOptions
from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.scoring import build_scorer, conversation, make_head, reference_head, split_template
from probe.errors import ProbeError
from probe.models.loading import LoadedModel

CHUNK = 64  # responses per forward: the complete responses' batch and the prefixes' batch alike
CLOSED = "each prefix closed"  # the trace method of a score read after the response's closing ids


def trace_method(loaded: LoadedModel, mode: ScoreMode) -> str:
    """How the trace is computed for this model and score mode (one line of refusal where it cannot be)."""
    if mode in ("judge", "rating"):
        raise ProbeError("a judge's trace would cut the response inside the judging question: trace a reward model "
                         "or a log-probability (--score logprob)")
    if loaded.pairwise is not None:
        raise ProbeError("a pairwise model scores a response against another one: a cut response has no trace here")
    if loaded.ref is not None:
        return "one forward per model"
    if mode == "reward" and (loaded.principle is not None or loaded.spec.reader == "step"):
        return CLOSED  # read after a question, or a separator, that follows the response: not at its k-th token
    return "one forward" if mode == "logprob" or loaded.spec.reader != "forward" else "re-scored"


def trace_ids(loaded: LoadedModel, mode: ScoreMode, prompt: str, response_ids: Sequence[int],
              opts: ScoringOptions = ScoringOptions(), system: str | None = None, label: str | None = None
              ) -> pl.DataFrame:
    """The trace of one response given as ids in the response slot of ``prompt``'s split: one row per prefix
    (``position`` 1..n, the ``token_id`` ending it, its text, ``score``) and the complete response's score."""
    method = trace_method(loaded, mode)
    build = conversation(mode, prompt, system, opts, loaded)
    split = split_template(loaded.tokenizer, build, n_verify=0, own_tokens=False)
    ids = [int(i) for i in response_ids]
    if not ids:
        raise ProbeError("an empty response has no trace")
    head = make_head(loaded, mode, opts, response_in_prefix=split.scored_in_prefix)
    complete = float(build_scorer(loaded, head, list(split.prefix_ids)).score([ids + list(split.suffix_ids)])[0])
    scorers = _scorers(loaded, mode, opts, split.prefix_ids, split.scored_in_prefix, method)
    scores = _prefix_scores(loaded, scorers, [ids], method, split.suffix_ids)[0]
    return _rows(loaded, ids, scores, complete, method, label)


def _rows(loaded, ids: list[int], scores, full: float, method: str, label: str | None) -> pl.DataFrame:
    tok = loaded.tokenizer
    from probe.report.text import shown_ids

    rows = [{"response": label if label is not None else shown_ids(tok, ids), "position": k + 1,
             "token_id": ids[k], "token": shown_ids(tok, [ids[k]]), "text_so_far": shown_ids(tok, ids[: k + 1]),
             "score": float(scores[k]), "kind": "prefix"} for k in range(len(ids))]
    rows.append({**rows[-1], "position": len(ids) + 1, "token_id": None, "token": "(end of turn)",
                 "score": float(full), "kind": "complete"})
    return pl.DataFrame(rows, schema_overrides={"token_id": pl.Int64}).with_columns(pl.lit(method).alias("method"))


def _scorers(loaded, mode, opts, prefix_ids, scored_in_prefix: int, method) -> list:
    """The scorers a trace reads (built once per prompt: the prefix's forward is shared by every response): the
    model's own forward for re-scored families; else the prefix cache of the model, and of its reference."""
    prefix = list(prefix_ids)
    head = make_head(loaded, mode, opts, response_in_prefix=scored_in_prefix)
    if method == "re-scored":
        return [FullSequenceScorer(loaded.model, head, prefix, batch_size=1)]
    if method == CLOSED:
        return [build_scorer(loaded, head, prefix)]
    scorers = [PrefixScorer(loaded.model, head, prefix)]
    if loaded.ref is not None:
        scorers.append(PrefixScorer(loaded.ref.model, reference_head(loaded, head), prefix))
    return scorers


def _prefix_scores(loaded, scorers, responses: list[list[int]], method, suffix=()) -> list[torch.Tensor]:
    """Each response's prefix scores: re-scored one prefix at a time; each prefix followed by the closing ids
    ``suffix`` (`CLOSED`), ``CHUNK`` prefixes a batch; or read from one batched forward per model (batches of
    ``CHUNK`` responses)."""
    if method == "re-scored":
        return [torch.stack([scorers[0].score([ids[: j + 1]])[0] for j in range(len(ids))]) for ids in responses]
    if method == CLOSED:
        closed = [[ids[: j + 1] + list(suffix) for j in range(len(ids))] for ids in responses]
        return [torch.cat([scorers[0].score(rows[s : s + CHUNK]) for s in range(0, len(rows), CHUNK)])
                for rows in closed]
    out = []
    for s in range(0, len(responses), CHUNK):
        part = [sc.score_prefixes(responses[s : s + CHUNK]) for sc in scorers]
        out += part[0] if len(part) == 1 else [loaded.beta * (a - b.to(a.device)) for a, b in zip(*part)]
    return out


def trace(loaded: LoadedModel, mode: ScoreMode, prompt: str, responses: Sequence[str],
          opts: ScoringOptions = ScoringOptions(), system: str | None = None) -> tuple[pl.DataFrame, float]:
    """The traces of whole responses (text, rendered by the chat template), one after another, traced ``CHUNK`` at a
    time (`trace_chunk`: the unit `probe trace` deals over torchrun's ranks); and the seconds they took."""
    t0 = time.perf_counter()
    responses = list(responses)
    out = [trace_chunk(loaded, mode, prompt, responses[s : s + CHUNK], opts, system)
           for s in range(0, len(responses), CHUNK)]
    return pl.concat(out), time.perf_counter() - t0


def trace_chunk(loaded: LoadedModel, mode: ScoreMode, prompt: str, responses: Sequence[str],
                opts: ScoringOptions = ScoringOptions(), system: str | None = None) -> pl.DataFrame:
    """The traces of at most ``CHUNK`` responses under one prompt: their complete scores in one batch, their
    prefixes' scores in one forward per model. The same numbers whichever process traces the chunk."""
    from probe.core.responses import prepare, score_rows

    if len(responses) > CHUNK:
        raise ValueError(f"trace_chunk takes at most {CHUNK} responses, not {len(responses)}")
    method = trace_method(loaded, mode)
    rows = prepare(loaded, mode, "trace", prompt, list(responses), opts, system)
    for text, prefix in zip(rows.responses, rows.prefixes):
        if prefix != rows.prefix_ids:
            raise ProbeError(f"response {text!r}: the template merges it with the text before it; its trace would "
                             "not start at the response")
    scorers = _scorers(loaded, mode, opts, rows.prefix_ids, rows.scored_in_prefix, method)  # the split prepare made
    complete = score_rows(loaded, mode, rows, opts=opts, batch_size=CHUNK, verify=0)  # the whole responses, batched
    ids = [list(cont[:n]) for cont, n in zip(rows.continuations, rows.n_tokens)]
    prefix_scores = _prefix_scores(loaded, scorers, ids, method, rows.suffix_ids)
    return pl.concat([_rows(loaded, r, s, float(full), method, text)
                      for text, r, s, full in zip(rows.responses, ids, prefix_scores, complete)])
