"""Score any list of whole responses (one word or many) under a prompt, on the prefix cache.

Each response is the whole assistant turn, rendered by the tokenizer's own chat template (text in, ids out, so
the ids are exactly what ``apply_chat_template`` gives for that conversation, with the fixed date). The ids
before the response slot, found once per prompt by `split_template`, are the shared prefix: it runs once and
its KV cache is kept; each row is the rest of its rendering (response ids + the template's closing ids). Rows
are sorted by length and batched, so the padding stays small. A rendering that does not start with the shared
prefix (the template merged the response with the text before it) gets the longest prefix it does share, in a
group of its own.

What the template did to each response is recorded: ``slot_text`` is the decoded response slot and ``change``
says how it differs from the text given (``trimmed``: the template stripped white space; ``control token``: a
control-token string became that token; ``other``), None where it does not.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from probe.config import ScoreMode, ScoringOptions
from probe.core.engine import pad_rows
from probe.core.packing import full_tile_batches
from probe.core.scoring import AdaptiveBatcher, build_scorer, check_rows, conversation, make_head
from probe.core.template import TemplateSplit, render, split_template
from probe.core.vocab import control_token_ids
from probe.errors import DataFormatError
from probe.models.loading import LoadedModel


@dataclass
class ResponseRows:
    """One prompt's responses as ids: per response, the prefix it continues and its continuation."""

    prompt_key: str
    responses: list[str]
    prefix_ids: tuple[int, ...]  # the shared prefix (most rows continue it)
    suffix_ids: tuple[int, ...]  # the template's closing ids after a response
    prefixes: list[tuple[int, ...]]  # per response
    continuations: list[list[int]]  # per response: response ids + closing ids
    n_tokens: list[int]  # per response: ids in the response slot
    slot_text: list[str]
    change: list[str | None]
    checks: list[dict] = field(default_factory=list)
    split: TemplateSplit | None = None  # the prompt's split (its scored_in_prefix: `TemplateSplit.scored_within`)

    @property
    def scored_in_prefix(self) -> int:
        """The shared prefix's last ids scored with each response (RewardBench's DPO route)."""
        return self.split.scored_in_prefix if self.split is not None else 0

    def head_offset(self, prefix: tuple[int, ...]) -> int:
        """How many of ``prefix``'s last ids are scored with its rows (`TemplateSplit.scored_within`)."""
        return self.split.scored_within(len(prefix), f"prompt {self.prompt_key!r}") if self.split is not None else 0

    def groups(self) -> dict[tuple[int, ...], list[int]]:
        """prefix -> the rows that continue it, shortest continuation first."""
        out: dict[tuple[int, ...], list[int]] = {}
        for i in sorted(range(len(self.responses)), key=lambda i: (len(self.continuations[i]), i)):
            out.setdefault(self.prefixes[i], []).append(i)
        return out


def _slot_text(tok, prefix: Sequence[int], slot_ids: Sequence[int], glued: bool) -> str:
    """The response as its ids in the slot spell it. A glued slot (no space before it: 'ASSISTANT:Love') is decoded
    after the prefix's last id, which keeps a first piece's own space ('▁Love' -> ' Love'; decoded alone, a
    SentencePiece tokenizer drops it)."""
    if glued and prefix:
        anchor = tok.decode(list(prefix[-1:]))
        both = tok.decode([*prefix[-1:], *slot_ids])
        if both.startswith(anchor):
            return both[len(anchor):]
    return tok.decode(list(slot_ids))


def _change(text: str, slot: str, slot_ids: Sequence[int], control: set[int], template_space: bool = False) -> str | None:
    """How the text in the response slot differs from the response given. ``template_space``: the template writes
    a space before the slot that the tokenizer joins to the response's first word (not a change of the response)."""
    if slot == text or (template_space and slot == " " + text):
        return None
    if slot == text.strip() or slot.strip() == text.strip():
        return "trimmed"
    if any(i in control for i in slot_ids):
        return "control token"
    return "other"


def prepare(loaded: LoadedModel, mode: ScoreMode, prompt_key: str, prompt: str, responses: Sequence[str],
            opts: ScoringOptions = ScoringOptions(), system: str | None = None) -> ResponseRows:
    """Render every response under ``prompt`` and split the renderings into shared prefix + continuation."""
    tok = loaded.tokenizer
    build = conversation(mode, prompt, system, opts, loaded)
    split = split_template(tok, build, n_verify=0, own_tokens=False)
    prefix, suffix = tuple(split.prefix_ids), tuple(split.suffix_ids)
    control = control_token_ids(tok)
    template_space = split.leading_space == "joined"
    rows = ResponseRows(prompt_key, list(responses), prefix, suffix, [], [], [], [], [],
                        split=split)
    for k, text in enumerate(responses):
        if not isinstance(text, str) or text == "":
            raise DataFormatError(f"response {k + 1} of prompt {prompt_key!r} is empty; every response needs text")
        full = render(tok, build, text)
        if tuple(full[: len(prefix)]) == prefix and len(full) > len(prefix):
            own = prefix
        else:  # the template merged the response with the text before it: the longest prefix the two share
            n = 0
            while n < min(len(prefix), len(full) - 1) and full[n] == prefix[n]:
                n += 1
            own = tuple(full[:n])
        cont = full[len(own):]
        end = len(cont) - len(suffix) if suffix and tuple(cont[-len(suffix):]) == suffix else len(cont)
        slot_ids = cont[:end]
        slot = _slot_text(tok, own, slot_ids, split.leading_space == "glued")
        if split.second_order is not None:  # a pairwise model: this response's second order, from its text
            second_order_from_text(loaded, build, own, text, cont)
        rows.prefixes.append(own)
        rows.continuations.append(cont)
        rows.n_tokens.append(len(slot_ids))
        rows.slot_text.append(slot)
        rows.change.append(_change(text, slot, slot_ids, control, template_space))
    return rows


def second_order_from_text(loaded: LoadedModel, build, prefix: Sequence[int], text: str, cont: Sequence[int]) -> None:
    """Record a response's continuation in the pairwise model's second order (candidate and reference swapped),
    rendered from its text (`Pairwise.rendered`), where it continues the second order's prefix (``prefix``: the
    first order's prefix the continuation ``cont`` follows). Moving the ids instead is wrong where the template
    treats the response differently in the second order (Llama 3's trims the user turn, which ends with the
    candidate there: a trailing newline or space is dropped)."""
    from probe.core.pairwise import second_prefix

    full = render(loaded.tokenizer, build.swapped(), text)
    prefix2 = second_prefix(loaded.pairwise, prefix)[0]
    if list(full[: len(prefix2)]) == list(prefix2) and len(full) > len(prefix2):
        loaded.pairwise.rendered[tuple(cont)] = list(full[len(prefix2):])


def score_rows(loaded: LoadedModel, mode: ScoreMode, rows: ResponseRows, indices: Sequence[int] | None = None,
               opts: ScoringOptions = ScoringOptions(), batch_size: int = 64, verify: int = 4,
               progress: Callable[[int], None] | None = None, batcher: AdaptiveBatcher | None = None) -> np.ndarray:
    """Scores of the rows ``indices`` (default: all), in that order. Per prefix one cache; rows sorted by
    length, batches of ``batch_size`` padded to their longest row; the first ``verify`` rows (spread over the
    lengths) re-scored through the model's own forward (`check_rows`, recorded in ``rows.checks``)."""
    wanted = list(range(len(rows.responses))) if indices is None else list(indices)
    out = np.full(len(rows.responses), np.nan, dtype=np.float32)
    batcher = batcher or AdaptiveBatcher(batch_size)
    keep = set(wanted)
    for prefix, members in rows.groups().items():
        members = [i for i in members if i in keep]
        if not members:
            continue
        head = make_head(loaded, mode, opts, response_in_prefix=rows.head_offset(prefix))
        scorer = build_scorer(loaded, head, list(prefix))
        tile = scorer.tiles if getattr(scorer, "packed", False) else None
        drop = int(head.drops_last_input)
        for part in full_tile_batches(members, lambda: batcher.batch_size,
                                      lambda i: len(rows.continuations[i]) - drop, tile, loaded.device):
            cont, lengths = pad_rows([rows.continuations[i] for i in part])
            out[part] = batcher.run(scorer.score, cont, lengths=lengths, progress=progress)
        n_check = min(verify, len(members))
        if n_check:
            pick = [members[int(round(x))] for x in np.linspace(0, len(members) - 1, n_check)]
            cont, lengths = pad_rows([rows.continuations[i] for i in pick])
            check = check_rows(loaded, head, list(prefix), scorer, cont, lengths,
                               [f"response {rows.responses[i]!r}" for i in pick], got=out[pick])
            check_json = {k: v for k, v in check.to_json().items() if k != "token_ids"}
            rows.checks.append({"responses": [rows.responses[i] for i in pick], **check_json})
    return out[wanted]


def response_batch_size(loaded: LoadedModel, mode: ScoreMode, rows: list[ResponseRows]) -> int:
    """Rows per scoring call for whole responses: 256 on CPU (packed into tiles of 512 positions, probe/core/packing.py:
    a call of 256 SmolLM2 responses of 1-40 words fills its tiles to 0.9x, of 64 to 0.8x), on GPU what fits for the
    longest row (at most 1,024)."""
    if loaded.device.type != "cuda":
        return 256
    from probe.core.scoring import default_batch_size

    longest = max(max(len(c) for c in r.continuations) for r in rows)
    return min(1024, default_batch_size(loaded, max(len(r.prefix_ids) for r in rows), longest, mode))


def ranked_responses(rows: ResponseRows, scores: np.ndarray) -> pl.DataFrame:
    """``prompt_key, response, n_tokens, score, rank`` (1 = best within the prompt; ties share the best rank,
    in the list's order) and what the template did: ``slot_text``, ``change``."""
    df = pl.DataFrame({
        "prompt_key": [rows.prompt_key] * len(rows.responses), "response": rows.responses,
        "n_tokens": pl.Series(rows.n_tokens, dtype=pl.UInt32), "score": pl.Series(scores, dtype=pl.Float32),
        "slot_text": rows.slot_text, "change": pl.Series(rows.change, dtype=pl.String),
    })
    df = df.with_columns(pl.col("score").rank(method="min", descending=True).cast(pl.UInt32).alias("rank"))
    return df.select("prompt_key", "response", "n_tokens", "score", "rank", "slot_text", "change").sort(
        "rank", maintain_order=True)
