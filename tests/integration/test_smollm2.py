"""The real SmolLM2-135M-Instruct (embedded, offline): parity, template split, golden values, CLI, kill/resume."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
import torch

from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.scoring import ScoringOptions, make_head, prompt_split, sweep_rows
from probe.core.template import render, response_conversation

pytestmark = pytest.mark.slow
GOLDEN = json.loads((Path(__file__).parents[1] / "testdata" / "smollm2_golden.json").read_text())
PROMPT = GOLDEN["prompt"]


def _random_ids(tok, n, seed):
    rng = random.Random(seed)
    return rng.sample(range(len(tok)), n) + list(tok.all_special_ids)


@pytest.mark.parametrize("mode", ["logprob", "judge"])
def test_cached_batched_equals_full_sequence_one_by_one(smol, mode):
    head = make_head(smol, mode, ScoringOptions())
    split = prompt_split(smol, mode, PROMPT, None, ScoringOptions(), len(smol.tokenizer))
    rows = sweep_rows(_random_ids(smol.tokenizer, 40, seed=5), split.suffix_ids)
    fast = PrefixScorer(smol.model, head, split.prefix_ids).score(rows)
    ref = FullSequenceScorer(smol.model, head, split.prefix_ids, batch_size=1).score(rows)
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-5)


def test_multi_token_and_padded_rows(smol):
    head = make_head(smol, "logprob", ScoringOptions())
    split = prompt_split(smol, "logprob", PROMPT, None, ScoringOptions(), len(smol.tokenizer))
    tok = smol.tokenizer
    texts = ["Love", "Love and peace", "The universe itself, obviously", "?"]
    rows = [tok.encode(t, add_special_tokens=False) + list(split.suffix_ids) for t in texts]
    fast = PrefixScorer(smol.model, head, split.prefix_ids).score(rows)
    ref = FullSequenceScorer(smol.model, head, split.prefix_ids, batch_size=1).score(rows)
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-5)


def test_random_head_reward_model_with_pad_in_template(smol_rm):
    # SmolLM2's pad id is <|im_end|>, which the template itself contains: the pooling pitfall
    assert smol_rm.model.config.pad_token_id in smol_rm.tokenizer.encode("<|im_end|>")
    head = make_head(smol_rm, "reward", ScoringOptions())
    split = prompt_split(smol_rm, "reward", PROMPT, None, ScoringOptions(), len(smol_rm.tokenizer))
    rows = sweep_rows(_random_ids(smol_rm.tokenizer, 24, seed=8), split.suffix_ids)
    fast = PrefixScorer(smol_rm.model, head, split.prefix_ids).score(rows)
    ref = FullSequenceScorer(smol_rm.model, head, split.prefix_ids, batch_size=1).score(rows)
    torch.testing.assert_close(fast, ref, atol=1e-4, rtol=1e-5)


def test_template_split_equals_tokenizer_ids(smol):
    tok = smol.tokenizer
    build = response_conversation(PROMPT)
    split = prompt_split(smol, "logprob", PROMPT, None, ScoringOptions(), len(tok))
    assert split.suffix_ids == tuple(tok.encode("<|im_end|>\n", add_special_tokens=False))
    assert split.leading_space == "kept" and split.bos_count == 1  # SmolLM2's "BOS" is <|im_start|>
    rng = random.Random(0)
    n = 0
    for tid in rng.sample(range(len(tok)), 2000):
        text = tok.decode([tid])
        if tok.encode(text, add_special_tokens=False) == [tid] and tid not in tok.all_special_ids:
            assert render(tok, build, text) == split.full_ids([tid]), (tid, text)
            n += 1
            if n == 200:
                break
    assert n == 200


@pytest.mark.parametrize("mode", ["logprob", "judge"])
def test_golden_values(smol, mode):
    head = make_head(smol, mode, ScoringOptions())
    split = prompt_split(smol, mode, PROMPT, None, ScoringOptions(), len(smol.tokenizer))
    assert [smol.tokenizer.decode([t]) for t in GOLDEN["token_ids"]] == GOLDEN["decoded"]
    got = PrefixScorer(smol.model, head, split.prefix_ids).score(sweep_rows(GOLDEN["token_ids"], split.suffix_ids))
    torch.testing.assert_close(got, torch.tensor(GOLDEN[mode]), atol=2e-4, rtol=0)


def _cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "probe.exhaustive", "--prompt", PROMPT, "--limit", "1536", "--shard-size", "256",
            "--batch-size", "128", "--output", str(out), "--no-progress", "--device", "cpu", *extra]


def test_cli_kill_and_resume_is_identical(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    full = subprocess.run(_cli(tmp_path / "a"), capture_output=True, text=True, env=env, timeout=600)
    assert full.returncode == 0, full.stderr
    assert "best 20 (words only)" in full.stdout and "wrote " in full.stdout
    (ref_dir,) = list((tmp_path / "a").glob("*/exhaustive_*"))

    proc = subprocess.Popen(_cli(tmp_path / "b"), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((tmp_path / "b").rglob("shard_*.npy"))) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (run_dir,) = list((tmp_path / "b").glob("*/exhaustive_*"))
    n_before = len(list(run_dir.rglob("shard_*.npy")))
    assert 2 <= n_before < 6 and not (run_dir / "scores.parquet").exists()

    resumed = subprocess.run(_cli(tmp_path / "b", "--resume"), capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    meta = json.loads((run_dir / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["resumed"]
    assert meta["timing"]["prompts"]["greatest"]["tokens_scored_now"] == 1536 - 256 * n_before
    a = pl.read_parquet(ref_dir / "scores.parquet")
    b = pl.read_parquet(run_dir / "scores.parquet")
    # which columns differ, and where, if any (seen once on a loaded 2-core machine, not reproduced alone)
    differ = {c: int((a[c] != b[c]).sum()) for c in a.columns if not a[c].equals(b[c])}
    by_id = a.sort("token_id")["score"] - b.sort("token_id")["score"]
    assert a.equals(b), (differ, float(by_id.abs().max()), int((by_id != 0).sum()))


def test_response_run_on_smollm2_equals_its_own_forward(smol, tmp_path):
    """Multi-word, non-ASCII and emoji responses through the real SmolLM2: the logprob of each whole response
    (sum over its tokens and the closing ones) equals the model's own full forward of apply_chat_template's ids."""
    import torch

    from probe.commands.score import main
    from probe.core.template import response_conversation, split_template

    responses = ["Black people", "The Beatles", "self-sacrifice", "café au lait", "🎉 joy", "Love"]
    (tmp_path / "r.csv").write_text("item,note\n" + "\n".join(f'"{r}",x' for r in responses) + "\n", encoding="utf-8")
    assert main(["--responses", str(tmp_path / "r.csv"), "--response-column", "item", "--prompt", PROMPT,
                 "--output", str(tmp_path / "out"), "--no-progress", "--verify", "3"]) == 0
    (run_dir,) = (tmp_path / "out").glob("*/responses_*")
    df = pl.read_parquet(run_dir / "scores.parquet")
    tok, model = smol.tokenizer, smol.model
    n_prefix = len(split_template(tok, response_conversation(PROMPT)).prefix_ids)
    for row in df.iter_rows(named=True):
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPT},
                                       {"role": "assistant", "content": row["response"]}],
                                      tokenize=True, return_dict=False)
        with torch.inference_mode():
            logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
        ref = float(sum(logp[i - 1, ids[i]] for i in range(n_prefix, len(ids))))
        assert row["score"] == pytest.approx(ref, abs=1e-3 * (1 + abs(ref))), row["response"]
    assert df.filter(pl.col("response") == "Love")["rank"][0] == 1


def test_default_rating_runs_on_smollm2(smol, tmp_path):
    """The default rating prompt (1-9: '10' is two SmolLM2 tokens) runs on the embedded model, through the command,
    and each score is the expected rating under the model's own next-token distribution."""
    from probe.commands.score import main
    from probe.core.judges import load_judge_prompt

    responses = ["Love", "The Beatles", "I do not know."]
    (tmp_path / "r.txt").write_text("\n".join(responses) + "\n")
    assert main(["--score", "rating", "--responses", str(tmp_path / "r.txt"), "--prompt", PROMPT, "--device", "cpu",
                 "--output", str(tmp_path / "out"), "--no-progress", "--verify", "3"]) == 0
    (run_dir,) = (tmp_path / "out").glob("*/responses_*")
    df = pl.read_parquet(run_dir / "scores.parquet")
    judge = load_judge_prompt(None, "rating")
    assert judge.ratings == (1, 9)
    tok, model = smol.tokenizer, smol.model
    digits = [tok.convert_tokens_to_ids(str(r)) for r in range(1, 10)]
    for row in df.iter_rows(named=True):
        text = judge.user.format(prompt=PROMPT, response=row["response"])
        ids = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True, add_generation_prompt=True,
                                      return_dict=False)
        with torch.inference_mode():
            p = torch.softmax(model(torch.tensor([ids])).logits[0, -1, digits].float(), -1)
        want = float((p * torch.arange(1, 10)).sum())
        assert row["score"] == pytest.approx(want, abs=1e-4), row["response"]
