"""Hybrid linear-attention and state-space reward models, and the newer decoders whose caches are not plain key/value
layers, scored on their prefix (issue 71; probe/core/cache.py).

Each architecture is a tiny model of its published layout (tests/tiny_hybrid.py). Its sweep rows and whole responses
must equal the model's own forward over the whole conversation (float32 rounding), take the path meta.json records,
and give a row the same bits at batch sizes 1 and 64 (MKL's strict mode, as the commands set it: tests/conftest.py).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from probe.config import ScoringOptions
from probe.core.cache import UnsupportedCache, plan
from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.scoring import build_scorer, make_head, path_record, prompt_split, scoring_path, sweep_rows
from probe.errors import ProbeError
from tests import tiny, tiny_hybrid
from tests.conftest import _loaded

pytestmark = pytest.mark.parity
PROMPT = "What, in one word, is the greatest thing ever?"
# Kimi's own forward (the reference) runs transformers' chunked kernel, a Python loop over a 64-token chunk per call (a
# second a call here): its tests are slow ones
CACHED = [pytest.param(n, marks=pytest.mark.slow) if n == "kimi_linear" else n
          for n in tiny_hybrid.ARCHS if n != "deepseek_v32"]


def _arch(name: str):
    from probe.core import cache

    if not tiny_hybrid.available(name):
        pytest.skip(f"this transformers has no {tiny_hybrid.ARCHS[name][1]}")
    if not cache.HAS_UNIFIED and name in cache.HYBRID_MODEL_TYPES:
        pytest.skip(f"transformers < {cache.UNIFIED_CACHE}: a hybrid is refused in one line there "
                    "(tests/unit/test_shared_prefix_coverage.py)")


@pytest.fixture(scope="module")
def hybrid(tokenizers):
    """name -> LoadedModel of the tiny model, built once per module on the ChatML tokenizer."""
    built: dict = {}

    def get(name: str):
        _arch(name)
        if name not in built:
            tok = tokenizers["chatml"]
            built[name] = _loaded(tiny_hybrid.build(name, tok), tok, kind=tiny_hybrid.kind(name))
        return built[name]

    return get


def _setup(lm, name: str):
    mode = tiny_hybrid.mode(name)
    split = prompt_split(lm, mode, PROMPT, None, ScoringOptions(), len(lm.tokenizer))
    return mode, split


def _responses(tok, split, n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    # 1 to 10 ids and the closing ones: both sides of 8 (probe/core/cache.py SHORT_STEPWISE), stepped and chunked
    return [[rng.randrange(len(tok)) for _ in range(rng.randint(1, 10))] + list(split.suffix_ids) for _ in range(n)]


def _close(got: torch.Tensor, ref: torch.Tensor) -> None:
    """Within float32's rounding of two forwards that sum in other orders (tests/tiny.py F32_FORWARD), at the
    scores' scale (a log-probability summed over a response reaches tens)."""
    scale = float(ref.abs().max())
    torch.testing.assert_close(got, ref, rtol=0, atol=tiny.F32_FORWARD["rel"] * max(1.0, scale))


@pytest.mark.parametrize("name", CACHED)
def test_sweep_and_whole_responses_equal_the_models_own_forward(hybrid, name):
    lm = hybrid(name)
    mode, split = _setup(lm, name)
    rows = sweep_rows(np.arange(0, len(lm.tokenizer), 181), split.suffix_ids)
    responses = _responses(lm.tokenizer, split, 5, seed=3)
    fast = PrefixScorer(lm.model, make_head(lm, mode), split.prefix_ids)
    own = FullSequenceScorer(lm.model, make_head(lm, mode), split.prefix_ids, batch_size=1)
    ref = own.score(rows)
    assert ref.std() > 1e-3  # scores that vary: not a comparison of constants
    _close(fast.score(rows).cpu(), ref)
    _close(fast.score(responses).cpu(), own.score(responses))
    # the plain cache path, as recorded (the shared-prefix kernel covers no hybrid's attention)
    assert scoring_path(lm) == "cache" and path_record(lm)["path"] == "cache"
    reuse = plan(lm.model.config)
    assert reuse.path == "cache" and reuse.stepwise == (name in ("jamba", "mamba"))
    assert bool(reuse.short_stepwise) == (name in ("qwen3_5", "qwen3_5_moe", "qwen3_next", "olmo_hybrid",
                                                   "kimi_linear"))
    if reuse.short_stepwise == 8:  # the responses took both paths
        lengths = {len(r) for r in responses}
        assert min(lengths) <= reuse.short_stepwise < max(lengths)


@pytest.mark.parametrize("name", CACHED)
def test_a_row_has_the_same_bits_at_batch_sizes_1_and_64(hybrid, name):
    """Under a BLAS that rounds by the row count (tests/hostile_blas.py): every call a row's score goes through has a
    shape set by the row alone (probe/core/invariance.py), the recurrent state copied per row and the one-token steps
    included; a mixture of experts is the exception, its expert products holding the tokens routed to them, and the
    run's record says so (`routed_experts`)."""
    from probe.core.invariance import describe, routed_experts
    from tests.hostile_blas import HostileBLAS

    lm = hybrid(name)
    mode, split = _setup(lm, name)
    rows = sweep_rows(np.arange(0, len(lm.tokenizer), 23)[:64], split.suffix_ids)
    with HostileBLAS():
        fast = PrefixScorer(lm.model, make_head(lm, mode), split.prefix_ids)
        together = fast.score(rows).cpu()
        alone = {i: fast.score(rows[i : i + 1]).cpu() for i in (0, 31, 63)}  # first, inner, last (the tail)
    assert together.std() > 1e-3
    if routed_experts(lm.model):
        assert describe("cpu", lm.model)["batch_invariant"] is False
        return
    for i, got in alone.items():
        assert torch.equal(got, together[i : i + 1]), i


def test_each_row_gets_its_own_copy_of_the_recurrent_state_and_the_prefix_keeps_its_own(hybrid):
    from probe.core.cache import replicate, row_state_bytes

    lm = hybrid("qwen3_5")
    _, split = _setup(lm, "qwen3_5")
    fast = PrefixScorer(lm.model, make_head(lm, "reward"), split.prefix_ids)
    before = [{k: v.clone() for k, v in layer.recurrent_states.items() if v is not None}
              for layer in fast.cache.layers if hasattr(layer, "recurrent_states")]
    assert before and row_state_bytes(fast.cache) > 0
    copied = replicate(fast.cache, 3).layers[0].recurrent_states[0]
    assert copied.shape[0] == 3 and copied.is_contiguous() and copied.untyped_storage().data_ptr() != \
        fast.cache.layers[0].recurrent_states[0].untyped_storage().data_ptr()
    fast.score([[5, 6, 7], [8, 9]])
    after = [{k: v for k, v in layer.recurrent_states.items() if v is not None}
             for layer in fast.cache.layers if hasattr(layer, "recurrent_states")]
    assert all(torch.equal(x[k], y[k]) for x, y in zip(before, after) for k in x)  # the prefix's state untouched
    assert all(v.shape[0] == 1 for layer in fast.cache.layers if hasattr(layer, "conv_states")
               for v in layer.conv_states.values() if v is not None)


def test_minimax_rows_never_start_from_another_batch(hybrid):
    """MiniMax keeps its lightning states outside ``.layers``: a shallow copy shared them, so each batch started from
    the previous batch's end states (and batches of two sizes crashed)."""
    lm = hybrid("minimax")
    _, split = _setup(lm, "minimax")
    rows = sweep_rows(np.arange(0, 300, 7), split.suffix_ids)
    fast = PrefixScorer(lm.model, make_head(lm, "reward"), split.prefix_ids)
    first = fast.score(rows[:16]).cpu()
    fast.score(rows[16:40])  # another batch, of another size
    again = fast.score(rows[:16]).cpu()
    assert torch.equal(again, first)
    own = FullSequenceScorer(lm.model, make_head(lm, "reward"), split.prefix_ids, batch_size=1)
    _close(again, own.score(rows[:16]))


def test_the_self_check_catches_state_carried_from_one_batch_to_the_next(hybrid):
    """The sweep's self-check scored its sample as one fresh batch, which a scorer carrying state between batches
    passes (MiniMax passed at 5.7e-4 while later rows were 2.3e-2 off): it now scores it as a first and a later
    batch."""
    from probe.core.scoring import TemplateRows, self_check

    lm = hybrid("qwen3_5")
    _, split = _setup(lm, "qwen3_5")
    fast = PrefixScorer(lm.model, make_head(lm, "reward"), split.prefix_ids)

    class Carrying(PrefixScorer):  # its first batch right, every later one 1e-2 off
        calls = 0

        def score(self, cont, lengths=None):
            self.calls += 1
            return super().score(cont, lengths) + (0.0 if self.calls == 1 else 1e-2)

    head = make_head(lm, "reward")
    check = self_check(lm, head, TemplateRows(split), fast, [3, 50, 700])
    assert check.max_abs_diff < check.tolerance
    carrying = Carrying(lm.model, make_head(lm, "reward"), split.prefix_ids)
    with pytest.raises(ProbeError, match="self-check failed"):
        self_check(lm, head, TemplateRows(split), carrying, [3, 50, 700])


@pytest.mark.parametrize("name", ["jamba", "mamba"])
def test_mamba1_continues_one_token_at_a_time(hybrid, name):
    """Mamba-1's selective scan starts a multi-token call from a zero state: the continuation as one call is wrong
    (the reason for the rule), one token at a time equals the full forward."""
    from probe.core.cache import continue_prefix
    from probe.core.engine import backbone_of, cache_keyword, output_cache

    lm = hybrid(name)
    bb = backbone_of(lm.model)
    prefix = torch.arange(5, 45)[None]
    cont = torch.tensor([[7, 8, 9, 10, 11]])
    with torch.no_grad():
        cache = output_cache(bb(input_ids=prefix, use_cache=True))
        ref = bb(input_ids=torch.cat([prefix, cont], 1), use_cache=False).last_hidden_state[:, 40:]
        whole = continue_prefix(bb, cache_keyword(bb), cache, 40, cont)
        steps = continue_prefix(bb, cache_keyword(bb), cache, 40, cont, stepwise=True)
    assert (whole - ref).abs().max() > 1e-3
    torch.testing.assert_close(steps, ref, atol=2e-5 * max(1.0, float(ref.abs().max())), rtol=0)


def test_indexed_sparse_attention_runs_each_sequence_whole(hybrid):
    """DeepSeek-V3.2's indexer keeps the top-k keys of the whole sequence; a cached continuation does not reproduce
    it: sweeps and responses run through the model's own forward, recorded; the paths that need a continuation
    refuse in one line."""
    lm = hybrid("deepseek_v32")
    mode, split = _setup(lm, "deepseek_v32")
    assert plan(lm.model.config).path == "full" and scoring_path(lm) == "full"
    record = path_record(lm)
    assert record["path"] == "full" and "indexed" in record["why"]
    scorer = build_scorer(lm, make_head(lm, mode), split.prefix_ids)
    assert isinstance(scorer, FullSequenceScorer)
    rows = sweep_rows(np.arange(0, len(lm.tokenizer), 97), split.suffix_ids)
    own = FullSequenceScorer(lm.model, make_head(lm, mode), split.prefix_ids, batch_size=1).score(rows)
    assert torch.equal(scorer.score(rows).cpu(), own)
    with pytest.raises(UnsupportedCache, match="DeepseekV32: indexed sparse attention") as err:
        PrefixScorer(lm.model, make_head(lm, mode), split.prefix_ids)
    assert isinstance(err.value, ProbeError) and "\n" not in str(err.value)


def test_a_layer_type_without_a_rule_is_refused_before_any_weights(tokenizers, tmp_path, capsys):
    """One line naming the architecture and the layer type, exit 2, from the config alone: the run and --dry-run
    both, and no run folder."""
    import transformers

    from probe.commands.score import main

    _arch("qwen3_5")
    config = transformers.Qwen3_5TextConfig(**tiny_hybrid._ids(tokenizers["chatml"]), hidden_size=32,
                                            num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)
    config.layer_types = ["linear_attention", "compressed_sparse_attention"]
    config.architectures = ["Qwen3_5TextForSequenceClassification"]
    with pytest.raises(UnsupportedCache, match="Qwen3_5TextForSequenceClassification: layer type "
                                               "'compressed_sparse_attention'"):
        plan(config)
    folder = tmp_path / "model"
    config.save_pretrained(folder)  # no weights: the refusal comes first
    tokenizers["chatml"].save_pretrained(folder)
    for extra in (["--dry-run"], ["--limit", "10"]):
        capsys.readouterr()
        assert main(["--rm", str(folder), "--device", "cpu", "--output", str(tmp_path / "runs"), "--no-progress",
                     *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(folder) in err[0], err
        assert "Qwen3_5TextForSequenceClassification: layer type 'compressed_sparse_attention'" in err[0]
    assert not list(tmp_path.glob("runs/**/meta.json"))  # no run opened


def test_llama4_text_finds_its_own_stack(hybrid):
    """Llama4ForCausalLM names ``language_model`` as its base model, an attribute only its multimodal parent has."""
    from probe.core.engine import backbone_of

    lm = hybrid("llama4_text")
    assert backbone_of(lm.model) is lm.model.model


def test_the_plan_covers_the_counted_peak_of_a_hybrid_batch(hybrid, monkeypatch):
    """A row of a hybrid copies the prefix's recurrent state and runs chunk-padded kernels: what a row really
    allocates (counted tensor by tensor, 32 rows minus 16) is at most the plan's bytes per row, within 2x; the
    prefix's state (batch 1) is in the plan's fixed bytes. (Tiles off: with them 16 and 32 rows are one forward of
    the same shape, and a row's cost would not show.)"""
    monkeypatch.setenv("RM_PROBE_TILE_ROWS", "0")
    from probe.core.cache import row_state_bytes
    from probe.models.memory import fixed_bytes, row_cost
    from tests.memory_count import peak_bytes

    for name in ("qwen3_5", "bamba"):
        lm = hybrid(name)
        mode = tiny_hybrid.mode(name)
        n_prefix, n_new = 64, 4
        scorer = PrefixScorer(lm.model, make_head(lm, mode), list(range(1, n_prefix + 1)))
        gen = torch.Generator().manual_seed(0)
        peaks = {b: peak_bytes(lambda b=b: scorer.score(torch.randint(1, 1000, (b, n_new), generator=gen)))
                 for b in (16, 32)}
        measured = (peaks[32] - peaks[16]) / 16
        planned = row_cost(lm.model.config, n_prefix, n_new, torch.float32, mode, "cache").total
        # the plan counts every tensor the meta run creates; the CPU's counted peak of Qwen3.5's one-token steps
        # (SHORT) is about half of it (each step's working tensors freed before the next): a plan within 2x
        assert measured <= planned <= 2.0 * measured, (name, measured, planned)
        assert planned > row_state_bytes(scorer.cache) > 0
        assert fixed_bytes(lm.model.config, n_prefix, torch.float32, "cache") >= row_state_bytes(scorer.cache)


@pytest.mark.parametrize("name", ["qwen3_5", "nemotron_h", "falcon_h1", "minimax", "lfm2"])
def test_gcg_back_propagates_through_a_hybrid_continuation(tokenizers, name):
    """GCG's differentiable path: the states a row's forward read are updated by assignment, not in place (autograd
    refused the backward: 'modified by an inplace operation'), and Falcon-H1's one-hot rows carry the embedding
    multiplier its decoder applies to looked-up ids alone; the scores equal the ids' path."""
    from probe.core.gcg import embedding_matrix
    from probe.core.heads import LogprobHead

    _arch(name)
    model = tiny_hybrid.build(name, tokenizers["chatml"], "causal")
    scorer = PrefixScorer(model, LogprobHead(model), list(range(3, 40)))
    weight, scale = embedding_matrix(model)
    cont = torch.tensor([[10, 11, 12, 7], [10, 13, 12, 8]])
    x = (weight[cont[:, :3]] * scale).clone().requires_grad_(True)
    got = scorer.score_embeds(x, cont)
    got.sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    _close(got.detach().cpu(), scorer.score(cont).cpu())


def test_gcg_on_a_mamba1_model_is_refused_in_one_line(hybrid):
    from probe.core.heads import LogprobHead

    lm = hybrid("jamba")
    model = tiny_hybrid.build("jamba", lm.tokenizer, "causal")
    scorer = PrefixScorer(model, LogprobHead(model), list(range(3, 40)))
    x = model.get_input_embeddings()(torch.tensor([[10, 11]])).clone().requires_grad_(True)
    with pytest.raises(UnsupportedCache, match="Mamba-1") as err:
        scorer.score_embeds(x, torch.tensor([[10, 11, 7]]))
    assert "\n" not in str(err.value)


def test_the_qwen3_5_vision_language_sequence_classifier_reads_text_on_the_cache_path(tokenizers):
    """Qwen3_5ForSequenceClassification (the VL model's classifier, what SGLang serves Qwen3.5 reward models
    through) on text: its language model's hybrid layers, on the cache path, equal its own forward."""
    import transformers

    _arch("qwen3_5")
    if getattr(transformers, "Qwen3_5VisionConfig", None) is None:
        pytest.skip("this transformers has no Qwen3.5 VL model")
    tok = tokenizers["chatml"]
    vision = transformers.Qwen3_5VisionConfig(depth=1, hidden_size=32, intermediate_size=64, num_heads=2,
                                              out_hidden_size=64)
    config = transformers.Qwen3_5Config(text_config=tiny_hybrid.qwen3_5(tok).to_dict(), vision_config=vision.to_dict(),
                                        num_labels=1)
    torch.manual_seed(0)
    model = transformers.Qwen3_5ForSequenceClassification(config).float().eval().requires_grad_(False)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)
    lm = _loaded(model, tok)
    _, split = _setup(lm, "qwen3_5")
    rows = sweep_rows(np.arange(0, len(tok), 181), split.suffix_ids)
    fast = PrefixScorer(model, make_head(lm, "reward"), split.prefix_ids)
    ref = FullSequenceScorer(model, make_head(lm, "reward"), split.prefix_ids, batch_size=1).score(rows)
    assert ref.std() > 1e-3 and scoring_path(lm) == "cache" and plan(model.config).recurrent
    _close(fast.score(rows).cpu(), ref)


def test_the_dry_run_plans_a_hybrid_row_with_its_state(tokenizers, tmp_path, capsys):
    """--dry-run from the config alone: the cache path, the layers, the per-row state in the bytes per row."""
    from probe.commands.score import main
    from probe.core.cache import row_state_bytes
    from probe.core.engine import output_cache
    from probe.models.dryrun import plan as dry_plan

    _arch("qwen3_5")
    tok = tokenizers["chatml"]
    config = tiny_hybrid.qwen3_5(tok)
    config.architectures = ["Qwen3_5TextForSequenceClassification"]
    config.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    assert main(["--rm", str(tmp_path / "model"), "--device", "cpu", "--dry-run", "--prompt", PROMPT]) == 0
    out = capsys.readouterr().out
    assert "cache path" in out and "3 linear_attention, 1 full_attention" in out and "copied per row" in out
    p = dry_plan(str(tmp_path / "model"), torch.float32, 16.0, "reward", device_type="cpu")
    model = tiny_hybrid.build("qwen3_5", tok)
    with torch.no_grad():
        cache = output_cache(model.model(input_ids=torch.arange(3, 51)[None], use_cache=True))
    assert p["path"] == "cache" and p["bytes_per_row"] > row_state_bytes(cache) > 0


def test_minimax_placeholders_before_dummy_layers_keep_the_prefix(hybrid, monkeypatch):
    """Before transformers had `DummyLayer` (5.17, the GPU machine's), MiniMax's lightning layers sat on empty
    layers that reported no past, and the model's mask then hid the prefix: rm-probe's placeholders report its length
    (`_past_only`). Here on this transformers with `DummyLayer` taken away: still the model's own forward."""
    from probe.core import cache

    lm = hybrid("minimax")
    _, split = _setup(lm, "minimax")
    rows = sweep_rows(np.arange(0, 300, 23), split.suffix_ids)
    monkeypatch.setattr(cache, "_DUMMY", None)
    fast = PrefixScorer(lm.model, make_head(lm, "reward"), split.prefix_ids)
    replica = cache.replicate(fast.cache, 3)
    assert all(layer.get_seq_length() == fast.n_prefix for layer in replica.layers)
    own = FullSequenceScorer(lm.model, make_head(lm, "reward"), split.prefix_ids, batch_size=1)
    ref = own.score(rows)
    assert ref.std() > 1e-3
    _close(fast.score(rows).cpu(), ref)
