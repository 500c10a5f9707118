"""The paper's input method, reproduced for comparison and benchmarking (never the default).

Christian et al. decoded each token id to text, rendered the chat template as a string and re-tokenized the
whole string with the tokenizer's defaults (``add_special_tokens=True``). Leading spaces can be lost,
special-token text is parsed back into control tokens, templates that write ``{{ bos_token }}`` get a second
BOS, and many ids come back as other ids. `paper_ids` builds exactly those inputs.

Two ways to score them:
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

from probe.template import ConversationBuilder


def paper_texts(tokenizer, build: ConversationBuilder, token_ids: Sequence[int]) -> list[str]:
    out = []
    for tid in token_ids:
        messages, gen = build(tokenizer.decode([int(tid)]))
        out.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen))
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


class PaperRows:
    """The paper's inputs for a set of token ids, split into a shared prefix and padded continuations."""

    def __init__(self, tokenizer, build: ConversationBuilder, token_ids: Sequence[int], template_ids=None):
        self.token_ids = np.asarray(token_ids)
        self.ids = paper_ids(tokenizer, build, self.token_ids)
        prefix = common_prefix(self.ids)
        if len(prefix) == min(len(r) for r in self.ids):  # keep at least one continuation token per row
            prefix = prefix[:-1]
        self.prefix_ids = prefix
        self.position = {int(t): i for i, t in enumerate(self.token_ids)}
        self.same_as_template = (None if template_ids is None else
                                 float(np.mean([r == template_ids(int(t)) for t, r in zip(self.token_ids, self.ids)])))

    def rows(self, token_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
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
