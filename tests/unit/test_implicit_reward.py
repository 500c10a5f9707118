"""Implicit (DPO) rewards against a reference model, ``--ref MODEL --beta B``: the score of a response is
``B * (log p_model - log p_ref)`` over the same response ids. Checked against RewardBench's DPO scoring
(``DPOInference`` of rewardbench 0.1.4 on the same ids), against the two models' own sweeps, and for the bad
inputs (another vocabulary, --beta 0, a score mode with no log-ratio, GCG)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch

import probe
from probe.commands.score import main as score_main
from tests import rewardbench_code as rb
from tests import tiny

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love", "Black people", "The Beatles", "nature and life"]


@pytest.fixture(scope="module")
def pair(tokenizers, tmp_path_factory):
    """A tiny causal LM (the "policy"), a perturbed copy of it (the "reference"), and a model of another
    vocabulary, saved as folders."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("pair")
    tok = tokenizers["llama3"]
    policy = tiny.build(LlamaForCausalLM, tiny.llama_config(tok))
    ref = tiny.perturbed_copy(policy, seed=5)
    other_tok = tokenizers["gemma"]
    other = tiny.build(LlamaForCausalLM, tiny.llama_config(other_tok))
    out = {}
    for name, model, t in (("policy", policy, tok), ("ref", ref, tok), ("other", other, other_tok)):
        model.save_pretrained(root / name)
        t.save_pretrained(root / name)
        out[name] = str(root / name)
    return out


def test_sweep_is_beta_times_the_difference_of_the_two_models_sweeps(pair, tmp_path):
    assert score_main(["--rm", pair["policy"], "--ref", pair["ref"], "--beta", "0.5", "--prompt", PROMPT,
                       "--limit", "200", "--device", "cpu", "--output", str(tmp_path), "--no-progress"]) == 0
    (run,) = list(tmp_path.glob("*/exhaustive_*"))
    got = pl.read_parquet(run / "scores.parquet").sort("token_id")
    sweeps = [probe.sweep(probe.load(pair[m], device="cpu", score="logprob"), None, PROMPT, limit=200).sort("token_id")
              for m in ("policy", "ref")]
    want = 0.5 * (sweeps[0]["score"].to_numpy().astype(np.float64) - sweeps[1]["score"].to_numpy())
    np.testing.assert_allclose(got["score"].to_numpy(), want, rtol=1e-5, atol=1e-5)
    assert np.ptp(want) > 1e-3
    meta = json.loads((run / "meta.json").read_text())
    assert meta["settings"]["ref"]["model"] == pair["ref"] and meta["settings"]["beta"] == 0.5
    assert meta["model"]["ref"]["id"] == pair["ref"] and meta["model"]["beta"] == 0.5
    assert meta["settings"]["model"] == pair["policy"] and "weights" in meta["settings"]["ref"]  # both in the fingerprint
    check = meta["self_check"][next(iter(meta["self_check"]))]
    assert check["max_abs_diff"] <= check["tolerance"]
    # the reports and tables name it as what it is, not as the model's log-probability
    from probe.analysis.sweeps import load_sweep, run_labels
    from probe.report.text import format_top_bottom

    assert run_labels([load_sweep(run)]) == ["policy [implicit vs ref]"]
    key = next(iter(meta["prompts"]))
    assert ", implicit vs ref, 200 tokens]" in format_top_bottom(got.filter(pl.col("prompt_key") == key), key, PROMPT,
                                                                 meta, 3)


def test_whole_responses_equal_rewardbench_dpo_scoring(pair):
    """RewardBench's DPOInference (policy minus reference, summed over the response's labels) on the same ids:
    each conversation rendered whole by the chat template, the labels everything after the ids all renderings
    share (the prompt and the assistant header), i.e. the response and the template's closing tokens."""
    lm = probe.load(pair["policy"], device="cpu", ref=pair["ref"])
    ours = probe.score_responses(lm, None, PROMPT, RESPONSES)
    got = dict(zip(ours["response"], ours["score"].to_numpy()))
    tok = lm.tokenizer
    rows = [torch.tensor(tok.apply_chat_template([{"role": "user", "content": PROMPT},
                                                  {"role": "assistant", "content": r}], tokenize=True,
                                                 return_dict=False)) for r in RESPONSES]
    shared = 0
    while all(len(x) > shared and x[shared] == rows[0][shared] for x in rows):
        shared += 1
    n_prompt = [shared] * len(rows)
    dpo = rb.load_dpo().DPOInference(lm.model, lm.ref.model, tok, SimpleNamespace(device=torch.device("cpu")))

    def batch(idx):
        ids = [rows[i] for i in idx]
        width = max(len(x) for x in ids)
        pad = lambda x, v: torch.cat([x, torch.full((width - len(x),), v)])  # noqa: E731
        labels = [pad(torch.where(torch.arange(len(x)) < n_prompt[i], -100, x), -100) for i, x in zip(idx, ids)]
        return torch.stack([pad(x, tok.pad_token_id) for x in ids]), torch.stack(
            [pad(torch.ones(len(x), dtype=torch.long), 0) for x in ids]), torch.stack(labels)

    c_ids, c_mask, c_lab = batch([0, 1])
    r_ids, r_mask, r_lab = batch([2, 3])
    with torch.no_grad():
        chosen, rejected = dpo.inference_step({"chosen_input_ids": c_ids, "chosen_attention_mask": c_mask,
                                               "chosen_labels": c_lab, "rejected_input_ids": r_ids,
                                               "rejected_attention_mask": r_mask, "rejected_labels": r_lab})
    np.testing.assert_allclose([got[r] for r in RESPONSES], torch.cat([chosen, rejected]).numpy(), rtol=1e-5,
                               atol=1e-5)


def test_bad_reference_inputs_are_one_line(pair, tmp_path, capsys):
    def run(*args):
        code = score_main([*args, "--prompt", PROMPT, "--device", "cpu", "--output", str(tmp_path / "out"),
                           "--no-progress"])
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
        assert not list((tmp_path / "out").rglob("meta.json"))
        return lines[0]

    assert "its tokenizer is not the model's" in run("--rm", pair["policy"], "--ref", pair["other"])
    assert "--beta 0 makes every implicit reward 0" in run("--rm", pair["policy"], "--ref", pair["ref"], "--beta", "0")
    for bad in ("nan", "inf", "-inf", "-0.1"):
        assert "a finite number > 0" in run("--rm", pair["policy"], "--ref", pair["ref"], f"--beta={bad}")
    assert "--score reward has no log-ratio" in run("--rm", pair["policy"], "--ref", pair["ref"], "--score", "reward")
    assert "goes with --ref" in run("--rm", pair["policy"], "--beta", "0.1")


def test_gcg_and_the_beam_on_an_implicit_reward(pair):
    """GCG's objective and gradient take both models (the reference's term with -beta): the relaxed objective on
    an exact one-hot equals the cached objective, its gradient matches finite differences, the reported best score
    equals the two models' own forwards, and the exact beam's depth 1 is the --ref sweep."""
    from probe.config import GCGConfig
    from probe.core.gcg import GCG, allowed_tokens, beam_search, run
    from probe.core.scoring import ScoringOptions, make_head, prompt_split
    from probe.core.vocab import build_vocab_table

    lm = probe.load(pair["policy"], device="cpu", ref=pair["ref"], beta=0.5)
    cfg = GCGConfig(prompt=PROMPT, length=2, steps=3, search_width=16, topk=8, seed=1, progress=False, batch_size=32)
    split = prompt_split(lm, "logprob", PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    allowed = allowed_tokens(build_vocab_table(lm.tokenizer), cfg.allowed, cfg.allow_special)
    gcg = GCG(lm, make_head(lm, "logprob"), split, cfg, allowed)
    ids = torch.tensor(lm.tokenizer.encode("Love peace", add_special_tokens=False)[:2])
    base = gcg.onehot(ids)
    with torch.no_grad():
        assert float(gcg.relaxed_objective(base, ids)) == pytest.approx(float(gcg.objective(ids[None])[0]), abs=1e-4)
    grad = gcg.token_gradient(ids)
    d = torch.zeros_like(base)
    d[0, 7] += 1
    d[0, ids[0]] -= 1
    with torch.no_grad():
        fd = float(gcg.relaxed_objective(base + 1e-2 * d, ids) - gcg.relaxed_objective(base - 1e-2 * d, ids)) / 2e-2
    assert fd == pytest.approx(float(grad[0, 7] - grad[0, ids[0]]), rel=2e-2, abs=1e-3)
    res = run(lm, cfg)
    # the best ids through each model's own forward, with the log-probabilities summed here from the logits
    full = torch.tensor([list(split.prefix_ids) + res.best_ids + list(split.suffix_ids)])
    n = len(split.prefix_ids)
    own = []
    for model in (lm.model, lm.ref.model):
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=full).logits[0].double(), -1)
        own.append(sum(float(logp[i - 1, full[0, i]]) for i in range(n, full.shape[1])))
    assert res.best_score == pytest.approx(0.5 * (own[0] - own[1]), abs=1e-4)
    assert res.search_score == pytest.approx(res.best_score, abs=1e-4)
    (level,) = beam_search(lm, GCGConfig(prompt=PROMPT, length=1, beam=3, progress=False, batch_size=64), split, allowed)
    sweep = probe.sweep(lm, None, PROMPT).sort("score", descending=True)
    allowed_ids = set(torch.nonzero(allowed).flatten().tolist())
    best = sweep.filter(sweep["token_id"].is_in(list(allowed_ids)))
    assert [i[0] for i in level["ids"].to_list()] == best["token_id"].head(3).to_list()


def test_another_vocabulary_is_refused_before_any_weights_load(pair, monkeypatch):
    from probe.errors import ModelLoadError
    from probe.models import loading

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded before the vocabularies were compared")

    monkeypatch.setattr(loading, "_from_pretrained", no_weights)
    with pytest.raises(ModelLoadError, match="its tokenizer is not the model's"):
        probe.load(pair["policy"], device="cpu", ref=pair["other"])


def test_social_benchmark_with_a_reference(pair, social_data, tmp_path):
    """probe social --ref: every option's score is beta x the difference of the two models' own social scores,
    and the run's fingerprint holds the reference."""
    from probe.commands.social import main as social_main

    data = ["--dataset", "crows_pairs", "--data", str(social_data / "crows_pairs" / "crows_pairs_anonymized.csv"),
            "--limit", "4", "--device", "cpu", "--no-progress", "--score", "logprob"]
    scores = {}
    for name, extra in (("policy", ["--rm", pair["policy"]]), ("ref", ["--rm", pair["ref"]]),
                        ("pair", ["--rm", pair["policy"], "--ref", pair["ref"], "--beta", "2"])):
        assert social_main([*extra, *data, "--output", str(tmp_path / name)]) == 0
        (run,) = list((tmp_path / name).glob("*/social_*"))
        scores[name] = pl.read_parquet(run / "scores.parquet").sort("item_id", "option")["score"].to_numpy()
        meta = json.loads((run / "meta.json").read_text())
    np.testing.assert_allclose(scores["pair"], 2 * (scores["policy"].astype(np.float64) - scores["ref"]), rtol=1e-5,
                               atol=1e-5)
    assert meta["settings"]["ref"]["model"] == pair["ref"] and meta["settings"]["beta"] == 2.0


def test_a_reference_makes_another_batch_job():
    """probe batch must not skip an implicit-reward job because the model's plain job is done (and old job keys,
    without a reference, stay as they were)."""
    from probe.config import ScoreVocabConfig

    plain = ScoreVocabConfig(rm="org/dpo-model", prompt=(PROMPT,)).job_key()
    implicit = ScoreVocabConfig(rm="org/dpo-model", prompt=(PROMPT,), ref="org/sft-model", beta=0.1).job_key()
    assert "ref" not in plain and implicit == plain | {"ref": "org/sft-model", "beta": 0.1}


def test_exact_beam_past_depth_one_scores_the_fixed_tokens_under_both_models(pair):
    """Depth 2 of the exact beam with --ref: each kept response's score is beta x (log p_model - log p_ref) of both
    response tokens and the closing ids, the first token (now in the prefix) scored by the reference too; checked
    on each model's own forward, log-probabilities summed here."""
    from probe.config import GCGConfig
    from probe.core.gcg import allowed_tokens, beam_search
    from probe.core.scoring import ScoringOptions, prompt_split
    from probe.core.vocab import build_vocab_table

    lm = probe.load(pair["policy"], device="cpu", ref=pair["ref"], beta=0.5)
    cfg = GCGConfig(prompt=PROMPT, length=2, beam=3, progress=False, batch_size=64)
    split = prompt_split(lm, "logprob", PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    allowed = allowed_tokens(build_vocab_table(lm.tokenizer), cfg.allowed, cfg.allow_special)
    levels = beam_search(lm, cfg, split, allowed)
    assert len(levels) == 2
    n = len(split.prefix_ids)
    for ids, score in zip(levels[1]["ids"].to_list(), levels[1]["score"].to_list()):
        assert len(ids) == 2
        full = torch.tensor([list(split.prefix_ids) + list(ids) + list(split.suffix_ids)])
        own = []
        for model in (lm.model, lm.ref.model):
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=full).logits[0].double(), -1)
            own.append(sum(float(logp[i - 1, full[0, i]]) for i in range(n, full.shape[1])))
        assert score == pytest.approx(0.5 * (own[0] - own[1]), abs=1e-4)


def test_fingerprints_hold_the_reference_and_its_weights(pair, tmp_path):
    """A --ref run's fingerprint holds the reference's weights, read from its files (two references of one shape
    and config but other weights give two fingerprints, so a resume never mixes them); GCG and beam runs with --ref
    are other runs than plain ones; probe batch keys a --logprob-reduce mean job apart from sum."""
    import shutil

    from safetensors.torch import load_file, save_file

    from probe.commands.gcg import _settings as gcg_settings
    from probe.config import GCGConfig, ScoreVocabConfig
    from probe.models.loading import weights_identity
    from probe.runs.rundir import fingerprint

    other = tmp_path / "ref2"
    shutil.copytree(pair["ref"], other)
    weights = load_file(other / "model.safetensors")
    weights = {k: v + 0.01 for k, v in weights.items()}
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    lms = [probe.load(pair["policy"], device="cpu", ref=r) for r in (pair["ref"], str(other))]
    ids = [weights_identity(lm.ref) for lm in lms]
    assert ids[0] != ids[1]
    from probe.runs.meta import reference_settings

    assert [reference_settings(lm)["ref"]["weights"] for lm in lms] == ids
    for cfg in (GCGConfig(prompt=PROMPT), GCGConfig(prompt=PROMPT, beam=3)):
        prints = {fingerprint(gcg_settings(cfg, lm)) for lm in lms}
        plain = fingerprint(gcg_settings(cfg, probe.load(pair["policy"], device="cpu", score="logprob")))
        assert len(prints) == 2 and plain not in prints
    sums = ScoreVocabConfig(rm="m", prompt=(PROMPT,)).job_key()
    means = ScoreVocabConfig(rm="m", prompt=(PROMPT,), logprob_reduce="mean").job_key()
    assert sums != means and means["logprob_reduce"] == "mean"
