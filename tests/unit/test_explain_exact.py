"""probe explain closes or refuses (probe/attribution/checks.py): a stream scaled as Granite scales it, half-precision
models, affine family heads in bf16 and fp16, gated heads with the gate held, a reported score that is not the one
decomposed, and an item's explanation that must not depend on the items explained with it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

import probe
from probe.attribution.checks import NotExplained
from probe.errors import ProbeError
from probe.models.loading import LoadedModel
from probe.models.registry import DEFAULT, REGISTRY
from tests import tiny

PROMPT = "What, in one word, is the greatest thing ever?"
RESPONSES = ["Love and peace", "the cat", "freedom"]


def _loaded(model, tokenizer, spec=DEFAULT, kind="reward") -> LoadedModel:
    return LoadedModel(model, tokenizer, spec, kind, "tiny", "tiny", None, "test")


def _in(lm: LoadedModel, dtype: torch.dtype) -> LoadedModel:
    return replace(lm, model=copy.deepcopy(lm.model).to(dtype))


def _holds(r: dict) -> None:
    """The record's line ``score = parts + rest`` is true to the bound it states, and each check held."""
    c = r["check"]
    assert abs(c["closure"]) <= c["closure_tolerance"], (r["response"], c["closure"], c["closure_tolerance"])
    total = sum(r["components"].values()) + r["rest"]
    assert abs(r["score"] - total) <= c["bound"], (r["response"], r["score"], total, c["bound"])
    assert c["residual_stream_gap_over_bound"] <= 1
    if c["engine_tolerance"] is not None:
        assert abs(c["engine_minus_decomposed_forward"]) <= c["engine_tolerance"]
    if "heads_closure" in c:
        assert c["heads_closure"] <= c["heads_tolerance"]


@pytest.fixture(scope="module")
def granite(tokenizers):
    """A tiny GraniteForCausalLM: the stream adds ``residual_multiplier x`` each block's outputs, the embedding is
    multiplied by ``embedding_multiplier`` and the logits divided by ``logits_scaling`` (Granite Guardian's
    family)."""
    import transformers

    klass = getattr(transformers, "GraniteForCausalLM", None)
    if klass is None:
        pytest.skip("this transformers has no Granite")
    tok = tokenizers["llama3"]
    cfg = transformers.GraniteConfig(**tiny._common(tok, residual_multiplier=0.22, embedding_multiplier=12.0,
                                                    logits_scaling=8.0, attention_multiplier=0.0078))
    return _loaded(tiny.build(klass, cfg), tok, kind="causal")


@pytest.mark.parametrize("mode", ["logprob", "judge"])
def test_a_granite_model_is_decomposed_with_its_residual_multiplier(granite, mode):
    """Granite's stream is ``x + residual_multiplier part``: the parts carry the multiplier and close to the model's
    own score (before, `--score logprob` printed parts summing 0.054 away from the score against a bound of 7e-5);
    a layer's heads sum to its (scaled) attention part."""
    out = probe.explain(granite, None, PROMPT, RESPONSES, score=mode, heads=True, ig_steps=0, patch=False)
    for r in out["responses"]:
        _holds(r)
        assert r["check"]["heads_closure"] <= r["check"]["heads_tolerance"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_stream_read_without_its_scale_is_refused_naming_it(granite, monkeypatch, dtype):
    """Read as if it had no residual multiplier, the stream is not the sum of its parts in either dtype: refused in
    one line that names the config's stream settings, never written as an explanation."""
    import probe.attribution.model as model

    monkeypatch.setattr(model, "_block_scale", lambda layer: 1.0, raising=False)
    with pytest.raises(NotExplained, match=r"residual stream is not the sum.*residual_multiplier=0\.22"):
        probe.explain(_in(granite, dtype), None, PROMPT, ["Love"], score="logprob", ig_steps=0, patch=False)


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("llama-lm", "judge"), ("gemma2-lm", "logprob"),
                                       ("qwen3-rm", "reward")])
def test_half_precision_explanations_are_true_to_their_bound(tiny_models, name, mode):
    """bf16: the parts are the model's own bf16 activations summed in float32, the stream's and the final norm's
    bf16 rounding are items of rest, and ``score = parts + rest`` holds to the bound written beside it, a bound of a
    few bf16 units of the head's own values (before: 127.9 on a judge score of -1.4, and the tiny reward model's
    line 'score +7.2828 = parts +7.3317' with no rest to make it true); the best-minus-worst difference holds to
    the sum of its two items' bounds."""
    lm = _in(tiny_models[name], torch.bfloat16)
    out = probe.explain(lm, None, PROMPT, RESPONSES[:2], score=mode, heads=True, ig_steps=0, patch=False)
    for r in out["responses"]:
        assert r["check"]["closure_tolerance"] <= 0.05 * (1 + abs(r["check"]["decomposed_forward_score"]))
        _holds(r)
        from probe.attribution.checks import closure_line

        assert r["check"]["dtype"] == "torch.bfloat16"
        assert {"residual_rounding", "final_norm_rounding"} <= set(r["rest_items"])
        assert "bfloat16 bound" in closure_line(r)
    d = out["difference"]
    assert abs(d["score"] - (sum(d["components"].values()) + d["rest"])) <= d["check"]["bound"]
    assert "bfloat16" in out["exactness"]


def _family(tokenizers, layout: str, **fields) -> LoadedModel:
    from probe.models.families import family_model

    tok = tokenizers["llama3"]
    cfg = tiny.llama_config(tok)
    for k, v in fields.items():
        setattr(cfg, k, v)
    torch.manual_seed(0)
    model = family_model(layout, cfg)(cfg).float().eval()
    tiny.spread_heads(model, "model")
    model.requires_grad_(False)
    spec = {"ultrarm": "openbmb/UltraRM-13b", "grm": "Ray2333/GRM-llama3-8B-sftreg"}[layout]
    return _loaded(model, tok, REGISTRY[spec])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout,fields", [("ultrarm", {}), ("grm", {"vhead_layer_type": "linear"})])
def test_linear_family_heads_are_explained_in_half_precision(tokenizers, layout, fields, dtype):
    """UltraRM's layout and GRM's linear head in bf16 and fp16 (how UltraRM, Eurus, Starling-34B, Beaver and GRM run
    on a GPU): their affine map read off float32 copies of the model's own weights, the explanation closing to its
    bound (before: refused as "not linear (an MLP)" by a check below bf16's rounding)."""
    lm = _in(_family(tokenizers, layout, **fields), dtype)
    out = probe.explain(lm, None, PROMPT, RESPONSES, score="reward", ig_steps=0, patch=False)
    for r in out["responses"]:
        _holds(r)


def test_an_mlp_family_head_is_refused_in_every_dtype(tokenizers):
    lm = _family(tokenizers, "grm")  # GRM's default head: Linear-ReLU-Linear
    for dtype in (torch.float32, torch.bfloat16):
        with pytest.raises(ProbeError, match="not affine"):
            probe.explain(_in(lm, dtype), None, PROMPT, ["Love"], score="reward", ig_steps=0, patch=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", ["armo-like", "qrm-like"])
def test_a_gated_head_is_decomposed_with_its_gate_held_at_its_real_value(tiny_models, name, dtype):
    """ArmoRM/QRM: the gating network's output held at the value it had on this forward (as the final norm's scale
    is), the score is linear in the read position's state and closes; the gate recorded is the reference model's own
    (tests/gated_reference.py: its gating network on its own hidden state at the gate position). Before: refused."""
    lm = _in(tiny_models[name], dtype)
    out = probe.explain(lm, None, PROMPT, RESPONSES, score="reward", ig_steps=0, patch=False)
    model = lm.model
    for r in out["responses"]:
        _holds(r)
        held = r["held"]
        full = torch.tensor([[*_prefix(lm, r), *r["continuation_ids"]]])
        with torch.no_grad():
            h = model.model(input_ids=full).last_hidden_state
            gate = model.gating(h[:, held["gate_position"]]).float()[0]
        assert held["gate_position"] == model._gate_position(full[0].tolist())
        assert torch.allclose(gate, torch.tensor(held["gate"]), rtol=0, atol=4 * torch.finfo(dtype).eps)


def _prefix(lm, r):
    from probe.attribution.inputs import response_items
    from probe.config import ScoringOptions

    items, _ = response_items(lm, "reward", PROMPT, [r["response"]], ScoringOptions())
    return items[0].prefix


def test_a_reported_score_that_is_not_the_forward_decomposed_is_refused(tiny_models):
    """The score the run reported must be the decomposed forward's, to the dtype's rule: an item whose reported
    score is off (another template, a dropped --ref) is refused in one line naming it and the gap."""
    from probe.attribution.explain import explain_items
    from probe.attribution.inputs import response_items
    from probe.config import ScoringOptions
    from probe.core.scoring import make_head

    lm = tiny_models["llama-rm"]
    opts = ScoringOptions()
    items, _ = response_items(lm, "reward", PROMPT, ["Love"], opts)
    wrong = [replace(items[0], engine_score=items[0].engine_score + 0.01 * (1 + abs(items[0].engine_score)))]
    head_for = lambda k: make_head(lm, "reward", opts, response_in_prefix=k)  # noqa: E731
    explain_items(lm, head_for, items, ig_steps=0)  # the engine's own score passes
    with pytest.raises(NotExplained, match=r"'Love': the score reported is .*off by .*not the one that was scored"):
        explain_items(lm, head_for, wrong, ig_steps=0)


def test_an_items_explanation_does_not_depend_on_the_items_beside_it(tiny_models):
    """Every forward holds rows of one item in a call whose shape is the item's alone: 'Love' explained alone and
    among others gives the same bits (parts, patching, AtP, integrated gradients)."""
    lm = tiny_models["llama-lm"]
    kw = dict(score="logprob", baseline="the cat", heads=True, ig_steps=12, batch_size=5)
    alone = probe.explain(lm, None, PROMPT, ["Love"], **kw)["responses"][0]
    among = probe.explain(lm, None, PROMPT, ["freedom", "Love", "Love and peace"], **kw)["responses"][1]
    assert among["response"] == alone["response"] == "Love"
    for key in ("components", "heads", "rest_items"):
        assert among[key] == alone[key], key
    for key in ("effects", "direct_difference", "atp"):
        assert among["patching"][key] == alone["patching"][key], key
    assert among["integrated_gradients"]["attributions"] == alone["integrated_gradients"]["attributions"]
