"""The command line on the hybrid and newer decoders (issue 71): ``probe score --limit 300`` and ``--responses`` on a
tiny model of each architecture saved as a Hugging Face folder, their scores equal to the model's own forward over
the whole conversation, the path recorded in meta.json."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
import torch

from probe.commands.score import main
from probe.core.engine import FullSequenceScorer
from probe.core.scoring import make_head
from probe.core.template import render, response_conversation, split_template
from probe.models.loading import load_model
from tests import tiny, tiny_hybrid

pytestmark = pytest.mark.slow
PROMPT = "What, in one word, is the greatest thing ever?"
ARCHS = ["qwen3_5", "qwen3_next", "nemotron_h", "granitemoehybrid", "falcon_h1", "jamba", "lfm2", "olmo_hybrid",
         "gemma4_shared_kv"]
ITEMS = ["Love", "water", "peace and quiet", "Music", "the sea at night", "Freedom", "home", "a good book"]


@pytest.mark.parametrize("name", ARCHS)
def test_score_and_responses_equal_the_models_own_forward(tokenizers, tmp_path, name):
    if not tiny_hybrid.available(name):
        pytest.skip(f"this transformers has no {tiny_hybrid.ARCHS[name][1]}")
    tok = tokenizers["chatml"]
    folder = tiny_hybrid.save(name, tok, tmp_path / name)
    mode = tiny_hybrid.mode(name)
    common = ["--rm", folder, "--score", mode, "--device", "cpu", "--prompt", PROMPT, "--no-progress",
              "--verify", "8"]
    assert main([*common, "--limit", "300", "--shard-size", "128", "--output", str(tmp_path / "sweep")]) == 0
    (items := tmp_path / "items.txt").write_text("\n".join(ITEMS) + "\n", encoding="utf-8")
    assert main([*common, "--responses", str(items), "--output", str(tmp_path / "resp")]) == 0

    lm = load_model(folder, kind=tiny_hybrid.kind(name), device="cpu")
    split = split_template(lm.tokenizer, response_conversation(PROMPT))
    own = FullSequenceScorer(lm.model, make_head(lm, mode), split.prefix_ids, batch_size=1)
    for kind, run in (("exhaustive", tmp_path / "sweep"), ("responses", tmp_path / "resp")):
        (run_dir,) = run.glob(f"*/{kind}_*")
        meta = json.loads((run_dir / "meta.json").read_text())
        assert meta["status"] == "complete"
        record = meta["model"]["scoring_path"]
        assert record["path"] == "cache" and record["recurrent_state" if name != "gemma4_shared_kv" else "layers"]
        short = "one token at a time up to 8 new tokens, else chunked"
        assert record.get("continuation") == {"jamba": "one token at a time", "qwen3_5": short, "qwen3_next": short,
                                              "olmo_hybrid": short}.get(name)
        scores = pl.read_parquet(run_dir / "scores.parquet")
        if kind == "exhaustive":
            assert scores.height == 300
            picked = scores.filter(pl.col("token_id").is_in(list(range(0, 300, 37)))).sort("token_id")
            rows = [[int(t), *split.suffix_ids] for t in picked["token_id"]]
        else:
            assert scores.height == len(ITEMS)
            picked = scores.sort("response")
            whole = [render(lm.tokenizer, response_conversation(PROMPT), r) for r in picked["response"]]
            assert all(ids[: len(split.prefix_ids)] == list(split.prefix_ids) for ids in whole)
            rows = [ids[len(split.prefix_ids):] for ids in whole]
        ref = own.score(rows)
        got = torch.tensor(picked["score"].to_numpy())
        torch.testing.assert_close(got, ref, atol=tiny.F32_FORWARD["rel"] * max(1.0, float(ref.abs().max())), rtol=0)
        assert float(np.std(scores["score"].to_numpy())) > 1e-4
