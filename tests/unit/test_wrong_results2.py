"""Issue 56: a resume or a batch job with another --seed (two random heads: two null models), a pairwise social item
whose options end in whitespace (each order rendered from its text), and two runs of one model id side by side
(social suite tables, the value analysis)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from probe.errors import ProbeError
from tests.unit.test_pairwise import PROMPT, REFERENCE, slic, slic_dir  # noqa: F401  (module fixtures)


# --- 2. a pairwise model in probe social: the second order rendered from the option's text ----------------------------
def _own_forward_score(lm, text: str) -> float:
    """SlicPairPM's score of ``text`` against the reference, each order rendered from the texts by the pipeline's own
    input (`PairwiseConversation.render_ids`) and run through the model's own forward: the mean over both orders of
    P(candidate chosen) = sigmoid(logit A - logit B) at the last position."""
    from probe.core.pairwise import PairwiseConversation

    a, b = (lm.tokenizer.encode(x, add_special_tokens=False)[0] for x in "AB")
    p = []
    for order in (0, 1):
        ids = PairwiseConversation(PROMPT, lm.pairwise, order=order).render_ids(lm.tokenizer, text)
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids])).logits[0, -1].double()
        d = float(logits[a] - logits[b])
        p.append(1 / (1 + np.exp(-d)) if order == 0 else 1 / (1 + np.exp(d)))
    return float(np.mean(p))


def test_pairwise_social_options_ending_in_whitespace_are_rendered_in_each_order(slic):  # noqa: F811
    """Llama 3's template trims the user turn: in the second order the candidate ends it, so 'foam\\n' and 'foam '
    lose their whitespace there. The social scores equal both orders rendered from the text (the old path moved the
    first order's ids, newline and space included, into the second order)."""
    from probe.core.pairwise import PairwiseConversation
    from probe.social.items import Item
    from probe.social.scoring import score_items

    options = ("The kettle is full of foam\n", "The kettle is full of foam ", "The kettle is full of foam")
    second = [PairwiseConversation(PROMPT, slic.pairwise, order=1).render_ids(slic.tokenizer, o) for o in options]
    assert second[0] == second[2] == second[1]  # the premise: the template trims the whitespace in the second order
    item = Item("pairs", "safety", "ws-1", PROMPT, options, ("a", "b", "c"))
    df = score_items(slic, "reward", [item], verify=2)
    want = [_own_forward_score(slic, o) for o in options]
    np.testing.assert_allclose(df.sort("option")["score"].to_numpy(), want, rtol=1e-5, atol=1e-6)
    assert abs(want[0] - want[2]) > 1e-6  # the first order still sees the newline: the options differ
