"""The paper's input method, reproduced for comparison and benchmarking (never the default).

Christian et al. decoded each token id to text, rendered the chat template as a string and re-tokenized the
whole string with the tokenizer's defaults (``add_special_tokens=True``). Leading spaces can be lost,
special-token text is parsed back into control tokens, templates that write ``{{ bos_token }}`` get a second
BOS, and many ids come back as other ids. `paper_ids` builds exactly those inputs.

Two ways to score them:
* `paper_statistics` says what the route did to each id's response slot (survived, doubled BOS, and why a
  slot changed), per prompt in a paper-method run's meta.json and in ``probe analyze input-method``.
* `PaperRows` feeds them to the prefix-cache engine: the ids all rows share form the prefix, the rest are
  right-padded continuations. The scores are those of the paper's inputs (exact, as the parity tests show
  for any rows), without the paper's cost.
* `naive_scores` is the paper's procedure itself: batches of strings, padded by the tokenizer, through the
  model's own forward. The benchmark times it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from probe.core.template import ConversationBuilder, TemplateSplit, template_kwargs


def paper_texts(tokenizer, build: ConversationBuilder, token_ids: Sequence[int]) -> list[str]:
    return rendered_texts(tokenizer, build, [tokenizer.decode([int(tid)]) for tid in token_ids])


def rendered_texts(tokenizer, build: ConversationBuilder, responses: Sequence[str]) -> list[str]:
    """Each response rendered into the conversation as text (no per-item function call: this runs over whole
    vocabularies)."""
    kwargs = template_kwargs(build)
    after = getattr(build, "text_after", "")  # a judge's answer prefix: the answer starts there
    out = []
    for response in responses:
        messages, gen = build(response)
        out.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kwargs) + after)
    return out


def paper_ids(tokenizer, build: ConversationBuilder, token_ids: Sequence[int]) -> list[list[int]]:
    texts = paper_texts(tokenizer, build, token_ids)
    return tokenizer(texts, add_special_tokens=True)["input_ids"]


def common_prefix(rows: Sequence[Sequence[int]]) -> list[int]:
    first = list(rows[0])
    n = len(first)
    for r in rows[1:]:
        m = min(n, len(r))
        i = 0
        while i < m and r[i] == first[i]:
            i += 1
        n = i
    return first[:n]


# Why a response slot changed under the paper's route, checked in this order (the first that applies counts):
REASONS = (
    "merged with the template's text",  # the response's text fused with its neighbours: no slot to compare
    "whitespace trimmed by the template",  # the slot is the text with whitespace cut off (Llama 3 and Gemma trim;
    # Qwen3 strips leading newlines)
    "control token re-parsed",  # an added token: its text is markup the template or the tokenizer acts on
    "does not round-trip",  # decode then encode gives other ids, template or not
    "other",
)


def _trimmed_forms(text: str) -> tuple[str, ...]:
    """What templates make of a response's surrounding whitespace: ``| trim``, one-sided strips, Qwen3's
    ``lstrip('\n')``."""
    forms = (text.strip(), text.lstrip(), text.rstrip(), text.lstrip("\n"), text.rstrip("\n"))
    return tuple(f for f in dict.fromkeys(forms) if f != text)  # the untrimmed text is no trimming


def paper_statistics(tokenizer, token_ids: Sequence[int] | np.ndarray, texts: Sequence[str], rows: Sequence[Sequence[int]],
                     split: TemplateSplit, n_examples: int = 5) -> dict:
    """What the paper's route did to each id's response slot, against rm-probe's ``prefix + [id] + suffix``.

    ``texts``: each id decoded; ``rows``: the paper's re-tokenized inputs. Returns the fraction of ids whose
    slot survives exactly, the fraction whose whole sequence is identical, the rows with a doubled BOS, and
    per reason (`REASONS`) how many slots changed, with examples ``[id, text, slot ids]``.
    """
    from probe.core.vocab import control_token_ids

    added = control_token_ids(tokenizer) | {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {}) or {}}
    single = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    n = len(token_ids)
    survive = identical = doubled_rows = 0
    changed: dict[str, list] = {r: [] for r in REASONS}
    trimmed_candidates = []
    bos, pre, suf = tokenizer.bos_token_id, list(split.prefix_ids), list(split.suffix_ids)
    for tid, text, row, enc in zip(token_ids, texts, rows, single):  # inline: it runs over whole vocabularies
        tid, row = int(tid), list(row)
        identical += row == [*pre, tid, *suf]
        lead = 0
        while bos is not None and lead < len(row) and row[lead] == bos:
            lead += 1
        if lead > split.bos_count:  # the template wrote BOS and the tokenizer added another
            doubled_rows += 1
            row = row[lead - split.bos_count :]
        fits = len(row) >= len(pre) + len(suf) and row[: len(pre)] == pre and row[len(row) - len(suf) :] == suf
        slot = row[len(pre) : len(row) - len(suf)] if fits else None
        if slot == [tid]:
            survive += 1
        elif slot is None:
            changed["merged with the template's text"].append((tid, text, slot))
        elif text != text.strip():
            trimmed_candidates.append((tid, text, slot, enc))
        else:
            changed[_other_reason(tid, enc, added)].append((tid, text, slot))
    forms = [_trimmed_forms(t) for _, t, _, _ in trimmed_candidates]
    flat = [f for fs in forms for f in fs]
    encoded = iter(tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else [])
    for (tid, text, slot, enc), fs in zip(trimmed_candidates, forms):
        trimmed = [next(encoded) for _ in fs]
        reason = "whitespace trimmed by the template" if slot in trimmed else _other_reason(tid, enc, added)
        changed[reason].append((tid, text, slot))
    frac = lambda k: round(k / n, 6) if n else None  # noqa: E731
    return {
        "n_ids": n,
        "slot_survives": frac(survive), "n_slot_survives": survive,
        "sequence_identical": frac(identical), "n_sequence_identical": identical,
        "doubled_bos_rows": doubled_rows, "doubled_bos_fraction": frac(doubled_rows),
        "slot_changed": {r: {"n": len(v), "fraction": frac(len(v)),
                             "examples": [[t, x, s] for t, x, s in v[:n_examples]]} for r, v in changed.items() if v},
    }


def _other_reason(tid: int, encoded: list[int], added: set[int]) -> str:
    if tid in added:
        return "control token re-parsed"
    return "does not round-trip" if encoded != [tid] else "other"


class PaperRows:
    """The paper's inputs for a set of token ids, split into a shared prefix and padded continuations."""

    def __init__(self, tokenizer, build: ConversationBuilder, token_ids: Sequence[int] | np.ndarray,
                 split: TemplateSplit | None = None):
        self.token_ids = np.asarray(token_ids)
        self.texts = [tokenizer.decode([int(t)]) for t in self.token_ids]
        self.ids = tokenizer(rendered_texts(tokenizer, build, self.texts), add_special_tokens=True)["input_ids"]
        prefix = common_prefix(self.ids)
        if len(prefix) == min(len(r) for r in self.ids):  # keep at least one continuation token per row
            prefix = prefix[:-1]
        self.prefix_ids = prefix
        self.position = {int(t): i for i, t in enumerate(self.token_ids)}
        self.statistics = (None if split is None else
                           paper_statistics(tokenizer, self.token_ids, self.texts, self.ids, split))

    def rows(self, token_ids: Sequence[int] | np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        p = len(self.prefix_ids)
        conts = [self.ids[self.position[int(t)]][p:] for t in token_ids]
        m = max(len(c) for c in conts)
        rows = torch.tensor([c + [c[-1]] * (m - len(c)) for c in conts])
        return rows, torch.tensor([len(c) for c in conts])


def naive_scores(model, tokenizer, texts: Sequence[str], batch_size: int, label_index: int = 0) -> np.ndarray:
    """The paper's procedure for a sequence classifier: tokenize a batch of strings with padding, run the model's
    own forward with the attention mask, read ``logits[:, label_index]``."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    out = []
    device = model.get_input_embeddings().weight.device
    with torch.inference_mode():
        for s in range(0, len(texts), batch_size):
            enc = tokenizer(list(texts[s : s + batch_size]), padding=True, return_tensors="pt").to(device)
            out.append(model(**enc).logits[:, label_index].float().cpu().numpy())
    return np.concatenate(out)
