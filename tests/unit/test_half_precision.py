"""bfloat16, as every real user runs on a GPU: the fast path is as accurate as the model's own bf16 forward, the
self-check's tolerance comes from the model's measured rounding noise (probe/core/precision.py) and still stops
a wrong reader, and a bf16 run passes its self-check under AVX2 kernels as under AVX-512 ones.

The reference for accuracy is the model's own forward in float32 and in bf16 (not the tolerance under test): a
correct bf16 fast path is no further from float32 than the model's own bf16 forward is (measured ratio 0.67 to
1.31 over the tiny families, experiments/results/bf16_tolerance_cpu.md; bound 2). On a CPU bf16 matmuls are
slow, so the models are tiny and the samples small.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

import probe
from probe.commands.score import ScoreVocabConfig, run
from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.heads import LinearRewardHead, LogprobHead
from probe.core.precision import HALF_TOLERANCE, rounding_noise, roundings_per_output, simulated_rounding, tolerance
from probe.core.scoring import ScoringOptions, TemplateRows, check_rows, make_head, prompt_split
from probe.errors import ProbeError

pytestmark = pytest.mark.parity

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", "self-sacrifice", "café", "🎉", "nature and life"]
AS_ACCURATE = 2.0  # the bf16 fast path's error against float32 <= this x the model's own bf16 forward's


def _bf16(lm):
    twin = copy.deepcopy(lm)
    twin.model = twin.model.to(torch.bfloat16)
    return twin


def _rows(lm, mode, n, seed=0):
    split = prompt_split(lm, mode, PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    ids = np.random.default_rng(seed).choice(len(lm.tokenizer), size=n, replace=False)
    source = TemplateRows(split)
    return split.prefix_ids, *source.rows(ids.tolist()), ids


def _own(lm, mode, prefix, rows, lengths) -> np.ndarray:
    """The model's own forward, one sequence at a time (no cache, no shared prefix)."""
    head = make_head(lm, mode)
    return FullSequenceScorer(lm.model, head, prefix).score(rows, lengths).cpu().numpy().astype(np.float64)


def _fast(lm, mode, prefix, rows, lengths) -> np.ndarray:
    return PrefixScorer(lm.model, make_head(lm, mode), prefix).score(rows, lengths).cpu().numpy().astype(np.float64)


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("qwen3-rm", "reward"),
                                       ("gemma3-rm", "reward"), ("armo-like", "reward"), ("llama-lm", "logprob"),
                                       ("gemma3-lm", "logprob"), ("llama-lm", "judge")])
def test_bf16_fast_path_is_as_accurate_as_the_models_own_bf16_forward(tiny_models, name, mode):
    full = tiny_models[name]
    half = _bf16(full)
    prefix, rows, lengths, _ = _rows(full, mode, 32)
    truth = _own(full, mode, prefix, rows, lengths)
    own_err = np.abs(_own(half, mode, prefix, rows, lengths) - truth).max()
    fast_err = np.abs(_fast(half, mode, prefix, rows, lengths) - truth).max()
    assert own_err > 0  # really computed in bf16
    assert fast_err <= AS_ACCURATE * own_err, (fast_err, own_err)


def test_shared_prefix_attention_accumulates_half_precision_in_float32():
    """The kernel's bf16 output is float32 attention over the same bf16 inputs, rounded once (what SDPA's fused
    kernels do). Rounding the scores to bf16 before the softmax, as the first version did, is 10x further off."""
    from types import SimpleNamespace

    from probe.kernels.prefix_attention import SharedPrefix, shared_prefix_attention

    g = torch.Generator().manual_seed(0)
    b, h, kvh, n, length, d = 6, 4, 2, 3, 20, 16
    q = (torch.randn(b, h, n, d, generator=g) * 3).bfloat16()
    k, v = (torch.randn(b, kvh, n, d, generator=g) * 3).bfloat16(), torch.randn(b, kvh, n, d, generator=g).bfloat16()
    kp = (torch.randn(1, kvh, length, d, generator=g) * 3).bfloat16()
    vp = torch.randn(1, kvh, length, d, generator=g).bfloat16()
    prefix = SharedPrefix.from_cache(SimpleNamespace(layers=[SimpleNamespace(keys=kp, values=vp)]), length)
    out, _ = shared_prefix_attention(SimpleNamespace(layer_idx=0), q, k, v, None, rm_shared_prefix=prefix)
    # reference: whole keys/values in float32, grouped-query heads expanded, causal among the new tokens
    keys = torch.cat([kp.expand(b, -1, -1, -1), k], 2).float().repeat_interleave(h // kvh, 1)
    values = torch.cat([vp.expand(b, -1, -1, -1), v], 2).float().repeat_interleave(h // kvh, 1)
    mask = torch.ones(n, length + n, dtype=torch.bool).tril(length)
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), keys, values, attn_mask=mask)
    ref = ref.transpose(1, 2)  # [b, n, h, d] as the kernel returns
    assert out.dtype == torch.bfloat16

    def ulps(x):  # distance from the float32 reference in units of bf16's spacing there
        return ((x.float() - ref).abs() / (ref.abs() * 2**-7).clamp(min=2**-133)).max().item()

    assert ulps(out) <= 1.0  # rounded once (to nearest, or to the other neighbour within float32 noise)
    scores_in_bf16 = (torch.softmax((q.float() @ keys.transpose(-1, -2)).bfloat16().float() * d**-0.5
                                    + torch.where(mask, 0.0, float("-inf")), -1) @ values).transpose(1, 2)
    assert ulps(scores_in_bf16) > 10


def test_simulated_rounding_is_seeded_one_unit_roundoff_and_removed(tiny_models):
    lm = _bf16(tiny_models["llama-rm"])
    ids = torch.tensor([[1, 2, 3, 4]], device=lm.model.device)
    plain = lm.model(input_ids=ids).logits
    with simulated_rounding(lm.model, seed=3):
        a = lm.model(input_ids=ids).logits
    with simulated_rounding(lm.model, seed=3):
        b = lm.model(input_ids=ids).logits
    with simulated_rounding(lm.model, seed=4):
        c = lm.model(input_ids=ids).logits
    torch.testing.assert_close(a, b, atol=0, rtol=0)  # seeded
    assert not torch.equal(a, c) and not torch.equal(a, plain)
    torch.testing.assert_close(lm.model(input_ids=ids).logits, plain, atol=0, rtol=0)  # hooks removed
    # one module, one step: x -> x * (1 + U(-u, u)), u = 2^-8 for bf16
    lin = torch.nn.Linear(64, 512).bfloat16()
    x = torch.randn(32, 64).bfloat16()
    with simulated_rounding(lin, seed=0):
        moved = lin(x).float()
    rel = ((moved - lin(x).float()) / lin(x).float()).abs()
    assert rel.max().item() <= 2 ** -8 * 1.01 + 2 ** -8 and rel.max().item() > 0


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("llama-lm", "logprob")])
def test_rounding_noise_bounds_the_real_bf16_disagreement_and_is_not_loose(tiny_models, name, mode):
    """Measured on these rows: the fast path's bf16 disagreement with the model's own bf16 forward stays within
    the tolerance (2 x noise), and the noise is no more than 5 x the model's own bf16 error against float32 per
    unit of rounding the noise simulates (`roundings_per_output`: 1 on a CPU, so the tolerance is at most 10 x the
    real rounding error there, where the spread rule gave 32 x; 2-3 on CUDA, whose kernels round where no module
    hook sees it: on an H200 Gemma 2's eager attention gave noise 5.3 x its own error at 3 units)."""
    full = tiny_models[name]
    half = _bf16(full)
    prefix, rows, lengths, _ = _rows(full, mode, 16, seed=2)
    own16 = _own(half, mode, prefix, rows, lengths)
    noise = rounding_noise(half.model, lambda: _own(half, mode, prefix, rows, lengths), own16)
    disagreement = np.abs(_fast(half, mode, prefix, rows, lengths) - own16).max()
    own_err = np.abs(own16 - _own(full, mode, prefix, rows, lengths)).max()
    assert disagreement <= HALF_TOLERANCE * noise
    units = roundings_per_output(next(half.model.parameters()).device.type, torch.bfloat16)
    assert own_err <= noise <= 5 * units * own_err


def test_tolerance_rules():
    ref = np.array([-3.0, 0.0, 10.0])
    np.testing.assert_allclose(tolerance(ref, torch.float32), [4e-3, 1e-3, 11e-3])
    np.testing.assert_allclose(tolerance(ref, torch.bfloat16, noise=0.25), [0.5, 0.5, 0.5])
    np.testing.assert_allclose(tolerance(ref, torch.bfloat16, noise=0.0), [4e-3, 1e-3, 11e-3])  # never below float32
    with pytest.raises(ValueError, match="rounding noise"):
        tolerance(ref, torch.bfloat16)


def test_bf16_self_check_stops_a_wrong_reader(tiny_models):
    """A head reading another column of a three-output classifier, and one reading the token before the pooled
    one: rounding noise never covers them. The right reader passes the same check."""
    from transformers import LlamaForSequenceClassification

    from tests import tiny

    base = tiny_models["llama-rm"]
    model = tiny.build(LlamaForSequenceClassification, tiny.llama_config(base.tokenizer, num_labels=3))
    lm = _bf16(replace(base, model=model))
    prefix, rows, lengths, ids = _rows(lm, "reward", 16, seed=3)
    right = LinearRewardHead(lm.model, label_index=2)
    scorer = PrefixScorer(lm.model, right, prefix)
    names = [f"token {t}" for t in ids]
    check = check_rows(lm, right, prefix, scorer, rows, lengths, names)
    assert check.rounding_noise > 0 and check.max_abs_diff <= check.tolerance
    wrong_column = PrefixScorer(lm.model, LinearRewardHead(lm.model, label_index=0), prefix).score(rows, lengths)
    with pytest.raises(ProbeError, match="self-check failed"):
        check_rows(lm, right, prefix, scorer, rows, lengths, names, got=wrong_column.cpu().numpy())
    earlier = scorer.score(rows, lengths - 1)  # the last suffix token not read: pooled one position early
    with pytest.raises(ProbeError, match="self-check failed"):
        check_rows(lm, right, prefix, scorer, rows, lengths, names, got=earlier.cpu().numpy())


def test_bf16_logprob_self_check_stops_a_dropped_token(tiny_models):
    lm = _bf16(tiny_models["llama-lm"])
    prefix, rows, lengths, ids = _rows(lm, "logprob", 16, seed=4)
    head = make_head(lm, "logprob")
    scorer = PrefixScorer(lm.model, head, prefix)
    names = [f"token {t}" for t in ids]
    assert check_rows(lm, head, prefix, scorer, rows, lengths, names).rounding_noise > 0
    without_last = PrefixScorer(lm.model, LogprobHead(lm.model), prefix).score(rows[:, :-1]).cpu().numpy()
    with pytest.raises(ProbeError, match="self-check failed"):
        check_rows(lm, head, prefix, scorer, rows, lengths, names, got=without_last)


@pytest.mark.parametrize("which,score", [("rm", "reward"), ("lm", "logprob")])
def test_bf16_sweep_agrees_with_float32(tiny_dirs, which, score):
    full = probe.load(tiny_dirs[which], device="cpu", score=score)
    half = _bf16(full)
    a = probe.sweep(full, None, PROMPT, limit=160, batch_size=80).sort("token_id")
    b = probe.sweep(half, None, PROMPT, limit=160, batch_size=80).sort("token_id")  # its self-check runs in bf16
    assert b["score"].dtype == pl.Float32
    split = prompt_split(full, score, PROMPT, None, ScoringOptions(), len(full.tokenizer))
    rows, lengths = TemplateRows(split).rows(list(range(160)))
    prefix = split.prefix_ids
    own_err = np.abs(_own(half, score, prefix, rows, lengths) - _own(full, score, prefix, rows, lengths)).max()
    err = np.abs(b["score"].to_numpy().astype(np.float64) - a["score"].to_numpy())
    assert 0 < err.max() <= AS_ACCURATE * own_err


@pytest.mark.parametrize("which,score", [("rm", "reward"), ("lm", "logprob")])
def test_bf16_responses_agree_with_float32(tiny_dirs, which, score):
    full = probe.load(tiny_dirs[which], device="cpu", score=score)
    a = probe.score_responses(full, None, PROMPT, RESPONSES).sort("response")
    b = probe.score_responses(_bf16(full), None, PROMPT, RESPONSES).sort("response")
    assert b["score"].dtype == pl.Float32 and a["n_tokens"].equals(b["n_tokens"])
    err = np.abs(b["score"].to_numpy().astype(np.float64) - a["score"].to_numpy())
    # the model's own bf16 forward over the same conversations, rendered by the chat template
    tok = full.tokenizer
    half = _bf16(full)
    own_err = 0.0
    for response in RESPONSES:
        conv = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": response}]
        ids = tok.apply_chat_template(conv, tokenize=True, return_dict=False)
        n_prefix = len(tok.apply_chat_template(conv[:1], tokenize=True, add_generation_prompt=True,
                                               return_dict=False))
        t = torch.tensor([list(ids)])
        h32, h16 = make_head(full, score), make_head(half, score)
        own_err = max(own_err, abs(float(h32.own_forward(full.model, t, n_prefix)[0])
                                   - float(h16.own_forward(half.model, t, n_prefix)[0])))
    assert 0 < err.max() <= AS_ACCURATE * own_err


def test_bf16_fused_logprob_head_equals_the_plain_one(tiny_dirs):
    full = probe.load(tiny_dirs["lm"], device="cpu", score="logprob")
    half = _bf16(full)
    prefix = full.tokenizer.encode("<|begin_of_text|>Say one word:", add_special_tokens=False)
    rows = torch.randint(0, 1000, (24, 3), generator=torch.Generator().manual_seed(0))
    scores = {}
    for name, lm in (("full", full), ("half", half)):
        for fused in (True, False):
            head = LogprobHead(lm.model, "sum", fused=fused)
            scores[name, fused] = PrefixScorer(lm.model, head, prefix).score(rows).float().cpu().numpy()
    # in bf16 the two heads read the same bf16 hidden states: only their float32 accumulation order differs
    np.testing.assert_allclose(scores["half", True], scores["half", False], rtol=1e-3, atol=1e-3)
    own = {name: FullSequenceScorer(lm.model, LogprobHead(lm.model), prefix).score(rows).cpu().numpy()
           for name, lm in (("full", full), ("half", half))}
    own_err = np.abs(own["half"] - own["full"]).max()
    assert 0 < np.abs(scores["half", True] - scores["full", True]).max() <= AS_ACCURATE * own_err


@pytest.mark.parametrize("kernels", ["default", "avx2"])
def test_bf16_command_passes_its_self_check_on_avx2_and_avx512_kernels(tiny_dirs, tmp_path, kernels):
    """The command that stopped on an AVX2-only CPU ("token 1: 0.54349 vs 0.66016"): run in a process whose ATen
    kernels are capped at AVX2 (ATEN_CPU_CAPABILITY), as on such a CPU, and with this machine's own."""
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    if kernels == "avx2":
        env["ATEN_CPU_CAPABILITY"] = "avx2"
    code = ("import sys, torch; from probe.commands.score import ScoreVocabConfig, run; "
            "print(torch.backends.cpu.get_cpu_capability()); "
            "print(run(ScoreVocabConfig(rm=sys.argv[1], prompt=(sys.argv[2],), device='cpu', dtype='bfloat16', "
            "output=sys.argv[3], limit=96, progress=False, verify=16)).path)")
    proc = subprocess.run([sys.executable, "-c", code, tiny_dirs["rm"], PROMPT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    capability, path = proc.stdout.split()[-2:]
    if kernels == "avx2":
        assert capability == "AVX2"
    meta = json.loads((Path(path) / "meta.json").read_text())
    check = meta["self_check"]["greatest"]
    assert meta["model"]["dtype"] == "torch.bfloat16"
    assert len(check["token_ids"]) == 16 and 0 < check["max_abs_diff"] <= check["tolerance"]
    assert check["tolerance"] == pytest.approx(HALF_TOLERANCE * check["rounding_noise"])


def test_bf16_command_writes_float32_scores(tiny_dirs, tmp_path):
    run_dir = run(ScoreVocabConfig(rm=tiny_dirs["rm"], prompt=(PROMPT,), device="cpu", dtype="bfloat16",
                                   output=str(tmp_path), limit=96, progress=False, verify=8))
    assert run_dir.read_table("scores.parquet")["score"].dtype == pl.Float32
    assert run_dir.read_meta()["self_check"]["greatest"]["rounding_noise"] > 0


def test_rounding_noise_moves_every_model_and_keeps_the_largest_seed(tokenizers):
    """With --ref the checked scores come from two models: the noise must perturb both (a reference that reads only
    the second model still moves), and be the largest change over every seed asked for (recomputed seed by seed
    here with simulated_rounding itself)."""
    from transformers import LlamaForCausalLM

    from probe.core.precision import roundings_per_output
    from tests import tiny

    tok = tokenizers["llama3"]
    a = tiny.build(LlamaForCausalLM, tiny.llama_config(tok)).to(torch.bfloat16).eval()
    b = tiny.build(LlamaForCausalLM, tiny.llama_config(tok), seed=1).to(torch.bfloat16).eval()
    ids = torch.tensor([tok.encode("What is the greatest thing ever? Love", add_special_tokens=False)])

    def second_only():
        calls.append(1)
        with torch.no_grad():
            return b(input_ids=ids).logits[0].float().sum(-1).numpy()

    calls: list[int] = []
    plain = second_only()
    units = roundings_per_output("cpu", torch.bfloat16)
    per_seed = []
    for seed in range(6):  # the perturbation rounding_noise applies to the second model (k = 1), seed by seed
        with simulated_rounding(b, seed + 1000, units):
            per_seed.append(float(np.max(np.abs(second_only() - plain))))
    # a number of seeds whose last is not the largest (so that keeping only the last seed's change would show)
    n = next(k for k in range(2, 7) if per_seed[k - 1] < max(per_seed[:k]))
    calls.clear()
    noise = rounding_noise((a, b), second_only, plain, repeats=n)
    assert noise > 0 and len(calls) == n  # the second model is perturbed too, once per seed
    assert noise == pytest.approx(max(per_seed[:n]), rel=1e-6)
