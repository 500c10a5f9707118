"""The families rm-probe refused before (registry block of RewardBench's families it did not read), each read as its
reference reads it, on a tiny model of the family's architecture, against the reference's own code (RewardBench
0.1.4's classes and pipelines, loaded by tests/rewardbench_code.py):

* Better-PairRM (``BetterPairRMPipeline`` with ``DebertaV2PairRM``): RewardBench's class, tiny, with DeBERTa-v3's
  relative-position layout (no absolute positions: the pipeline pads to 3,370 ids), on the real all-MiniLM-L6-v2
  WordPiece tokenizer with PairRM's prefix tokens (Better-PairRM's DeBERTa-v3 SentencePiece file is not on PyPI).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import probe
from probe.models.registry import REGISTRY, lookup
from tests import rewardbench_code

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", "nature and life", "self-sacrifice", "Love!"]
REFERENCE = "Nothing comes close."
# a PairRM score is the difference of two logits of order 10 (each float32, summed over up to 3,370 padded
# positions by the pipeline and over the batch's own length here): 1e-5 of that scale
PAIR_ATOL = 1e-4


def _conv(prompt: str, response: str) -> list[dict]:
    return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


# --- Better-PairRM ------------------------------------------------------------------------------------------------
BETTER = "mightbe/Better-PairRM"


@pytest.fixture(scope="module")
def better_dir(tmp_path_factory) -> Path:
    from tests.tiny import pairrm_folder

    # DeBERTa-v3's layout (Better-PairRM's config.json: relative attention only, shared keys, layer-normed
    # relative embeddings), shrunk
    return pairrm_folder(tmp_path_factory.mktemp("better_pairrm"), position_biased_input=False,
                         max_position_embeddings=512, share_att_key=True, norm_rel_ebd="layer_norm")


@pytest.fixture(scope="module")
def better(better_dir):
    return probe.load(str(better_dir), device="cpu", spec=BETTER, reference_response=REFERENCE)


def _better_pipeline(better_dir, prompt: str, responses: list[str]) -> np.ndarray:
    """RewardBench's BetterPairRMPipeline on (prompt, response) against (prompt, reference): its logits(A vs B) -
    logits(B vs A), on its own copy of the tokenizer (the pipeline sets ``truncation_side`` on it)."""
    from transformers import AutoTokenizer

    module = rewardbench_code.load("betterpairrm")
    model = rewardbench_code.load("pairrm").DebertaV2PairRM.from_pretrained(better_dir).eval()
    pipe = module.BetterPairRMPipeline("text-classification", model, AutoTokenizer.from_pretrained(better_dir))
    with rewardbench_code.on_cpu(), torch.no_grad():
        out = pipe([_conv(prompt, r) for r in responses], [_conv(prompt, REFERENCE)] * len(responses),
                   output_logits=True)
    return np.asarray(out, dtype=np.float64).reshape(-1)


def test_better_pairrm_id_resolves_to_its_pairwise_reader():
    for name in (BETTER, "maywell/Better-PairRM", "/models/mightbe/Better-PairRM"):
        spec, _ = lookup(name)
        assert spec.unsupported is None and spec.reader == "pairwise" and spec.pairwise == "betterpairrm"
        assert spec.layout == "pairrm" and spec.rewardbench_pipeline == "BetterPairRMPipeline"
    assert REGISTRY[BETTER].input_source.startswith("RewardBench 0.1.4's BetterPairRMPipeline")


def test_better_pairrm_scores_equal_its_pipeline(better, better_dir):
    """Every response's score = BetterPairRMPipeline's delta, short and long (a response over its 670 ids and a
    prompt over its 2,030, cut as the pipeline cuts them: the prompt from the left, the responses from the right),
    on both input methods (RewardBench's pipeline is the only published input past the card's cut-off copy)."""
    assert type(better.model).__name__ == "PairRMModel" and better.pairwise.format == "betterpairrm"
    long = " ".join(["the", "greatest", "thing"] * 300)
    responses = RESPONSES + [long]
    df = probe.score_responses(better, None, PROMPT, responses)
    got = dict(zip(df["response"], df["score"].to_numpy()))
    want = _better_pipeline(better_dir, PROMPT, responses)
    np.testing.assert_allclose([got[r] for r in responses], want, rtol=1e-4, atol=PAIR_ATOL)
    assert np.ptp(want) > 5 * PAIR_ATOL
    long_prompt = "Tell me, " + " ".join(["what", "is", "the", "greatest", "thing"] * 450) + "?"
    df = probe.score_responses(better, None, long_prompt, RESPONSES[:3])
    got = dict(zip(df["response"], df["score"].to_numpy()))
    np.testing.assert_allclose([got[r] for r in RESPONSES[:3]], _better_pipeline(better_dir, long_prompt, RESPONSES[:3]),
                               rtol=1e-4, atol=PAIR_ATOL)
    rb = probe.load(str(better_dir), device="cpu", spec=BETTER, reference_response=REFERENCE,
                    input_method="rewardbench")
    df = probe.score_responses(rb, None, PROMPT, RESPONSES)
    np.testing.assert_allclose(df.sort("response")["score"].to_numpy(),
                               probe.score_responses(better, None, PROMPT, RESPONSES).sort("response")["score"]
                               .to_numpy(), rtol=1e-6, atol=1e-7)


def test_better_pairrm_sweep_is_its_class_on_both_orders(better, better_dir):
    """The sweep (full sequences, batched) equals RewardBench's class on the pipeline's ids for each token in the
    candidate's slot, in both orders."""
    sweep = probe.sweep(better, None, PROMPT, limit=200, batch_size=64)
    tok = better.tokenizer
    model = rewardbench_code.load("pairrm").DebertaV2PairRM.from_pretrained(better_dir).eval()
    source = tok.decode(tok.encode(f"USER: {PROMPT}\n    \n    ASSISTANT: ", add_special_tokens=False))
    src = tok.encode("<|source|>") + tok.encode(source)
    ref = tok.encode(REFERENCE, add_special_tokens=False)

    def cand(prefix: str, body: list[int]) -> list[int]:
        return tok.encode(prefix)[:-1] + body + [tok.sep_token_id]

    def own(ids: list[int]) -> float:
        with torch.no_grad():
            x = torch.tensor([ids])
            return float(model(input_ids=x, attention_mask=torch.ones_like(x)).logits[0])

    ids = sweep["token_id"].to_list()[::25]
    want = [own(src + cand("<|candidate1|>", [t]) + cand("<|candidate2|>", ref))
            - own(src + cand("<|candidate1|>", ref) + cand("<|candidate2|>", [t])) for t in ids]
    got = dict(zip(sweep["token_id"].to_list(), sweep["score"].to_numpy()))
    np.testing.assert_allclose([got[t] for t in ids], want, rtol=1e-4, atol=PAIR_ATOL)
    assert np.ptp(want) > 5 * PAIR_ATOL


def test_better_pairrm_social_equals_its_pipeline(better_dir, tmp_path):
    """``probe social`` scores each sentence against the reference as the pipeline does, and records the format."""
    import csv
    import json

    import polars as pl

    from probe.commands.social import main
    from probe.social.loaders import NEUTRAL_PROMPT

    data = tmp_path / "crows.csv"
    sentences = ["Poor people are lazy.", "Rich people are lazy."]
    with data.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["sent_more", "sent_less", "stereo_antistereo", "bias_type"])
        w.writeheader()
        w.writerow({"sent_more": sentences[0], "sent_less": sentences[1], "stereo_antistereo": "stereo",
                    "bias_type": "socioeconomic"})
    args = ["--rm", str(better_dir), "--spec", BETTER, "--reference-response", REFERENCE, "--device", "cpu",
            "--output", str(tmp_path / "out"), "--dataset", "crows_pairs", "--data", str(data), "--no-progress"]
    assert main(args) == 0
    (run,) = list((tmp_path / "out").glob("*/social_*"))
    meta = json.loads((run / "meta.json").read_text())
    assert meta["settings"]["reference_response"] == REFERENCE and meta["settings"]["pairwise"] == "betterpairrm"
    scores = pl.read_parquet(run / "scores.parquet")
    np.testing.assert_allclose(sorted(scores["score"].to_numpy()),
                               sorted(_better_pipeline(better_dir, NEUTRAL_PROMPT, sentences)), rtol=1e-4, atol=PAIR_ATOL)
