"""The second real model: Gemma 3 270M (packaged GGUF, 262,144-token vocabulary, sliding-window layers) as a
log-probability and judge proxy: the command end to end with its self-check, the fused log-probability head
against the plain one at this vocabulary, and cached scores against the model's own forward."""

from __future__ import annotations

import json

import pytest
import torch

from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.heads import LogprobHead
from probe.models.loading import load_model
from probe.core.scoring import ScoringOptions, make_head, prompt_split

pytestmark = pytest.mark.slow
PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3-270m", kind="causal", device="cpu")


def test_packaged_gemma_is_what_it_says(gemma):
    cfg = gemma.model.config
    assert gemma.model_id == "google/gemma-3-270m" and gemma.source["quantization"] == "Q4_K_M"
    assert cfg.model_type == "gemma3_text" and cfg.vocab_size == len(gemma.tokenizer) == 262144
    assert "sliding_attention" in cfg.layer_types and cfg.sliding_window == 512
    assert "<start_of_turn>" in gemma.tokenizer.chat_template  # the shipped official template


def _rows(lm, split):
    ctrl = [lm.tokenizer.convert_tokens_to_ids(t) for t in ("<start_of_turn>", "<end_of_turn>", "<bos>", "<unused7>")]
    return [[t, *split.suffix_ids] for t in ctrl + list(range(300, 262144, 9973))]


def test_fused_head_at_262k_equals_the_plain_head(gemma):
    split = prompt_split(gemma, "logprob", PROMPT, None, ScoringOptions(), len(gemma.tokenizer))
    rows = _rows(gemma, split)
    fused = PrefixScorer(gemma.model, LogprobHead(gemma.model, fused=True), split.prefix_ids).score(rows)
    plain = PrefixScorer(gemma.model, LogprobHead(gemma.model, fused=False), split.prefix_ids).score(rows)
    torch.testing.assert_close(fused, plain, atol=2e-4, rtol=1e-5)
    assert plain.std() > 1.0


@pytest.mark.parametrize("mode", ["logprob", "judge"])
def test_cached_scores_equal_the_models_own_forward(gemma, mode):
    split = prompt_split(gemma, mode, PROMPT, None, ScoringOptions(), len(gemma.tokenizer))
    rows = _rows(gemma, split)[:12]
    head = make_head(gemma, mode)
    fast = PrefixScorer(gemma.model, head, split.prefix_ids).score(rows)
    ref = FullSequenceScorer(gemma.model, head, split.prefix_ids, batch_size=1).score(rows)
    torch.testing.assert_close(fast, ref, atol=5e-4, rtol=1e-5)


def test_command_with_self_check(tmp_path):
    from probe.commands.score import main

    assert main(["--rm", "gemma3-270m", "--limit", "512", "--prompt", PROMPT, "--output", str(tmp_path),
                 "--no-progress", "--top", "3"]) == 0
    meta = json.loads(next(tmp_path.glob("*/exhaustive_*/meta.json")).read_text())
    assert meta["score"]["mode"] == "logprob" and meta["score"]["fused"] is True
    check = meta["self_check"]["greatest"]
    assert len(check["token_ids"]) == 16 and check["max_abs_diff"] < check["tolerance"]
    assert meta["model"]["source"]["quantization"] == "Q4_K_M" and meta["prompts"]["greatest"]["bos_count"] == 1
