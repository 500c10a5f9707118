"""The shared-prefix attention's newer families (kernels/prefix_attention.py SUPPORTED_MODEL_TYPES, issue 71): each a
tiny causal LM whose shared path equals the model's own forward over the whole conversation and the plain cache path,
with its sliding window (8) shorter than the prompt where the family has one. The first five families are tested in
tests/unit/test_kernels.py."""

from __future__ import annotations

import random

import pytest
import torch
import transformers

from probe.config import ScoringOptions
from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.core.scoring import make_head, prompt_split, scoring_path
from probe.kernels.prefix_attention import SUPPORTED_MODEL_TYPES, supported
from tests import tiny
from tests.conftest import _loaded

pytestmark = pytest.mark.parity
SLIDING = dict(sliding_window=8, layer_types=["sliding_attention", "sliding_attention", "full_attention"])
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# model type -> (config class, causal LM class, fields beside tests/tiny.py's common ones, 3 layers)
CASES = {
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM", SLIDING),
    "exaone4": ("Exaone4Config", "Exaone4ForCausalLM", SLIDING),
    "gemma4_text": ("Gemma4TextConfig", "Gemma4ForCausalLM",
                    dict(SLIDING, head_dim=16, hidden_size_per_layer_input=16)),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(head_dim=16)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM",
                 dict(head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      first_k_dense_replace=1, n_group=1, topk_group=1)),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                dict(attention_multiplier=0.05, embedding_multiplier=4.0, residual_multiplier=0.3, logits_scaling=2.0)),
    "ministral": ("MinistralConfig", "MinistralForCausalLM",
                  dict(head_dim=16, sliding_window=8,
                       layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    "ministral3": ("Ministral3Config", "Ministral3ForCausalLM", dict(head_dim=16)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(sliding_window=8, num_local_experts=4, num_experts_per_tok=2)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", SLIDING),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=8)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(MOE, shared_expert_intermediate_size=32)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(MOE, head_dim=16)),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", dict(head_dim=16)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(no_rope_layers=[1, 1, 0])),
}
FIRST_FIVE = ("llama", "gemma2", "gemma3_text", "qwen2", "qwen3")


def _model(tokenizer, model_type: str, **more):
    config_name, class_name, fields = CASES[model_type]
    config_cls, model_cls = getattr(transformers, config_name, None), getattr(transformers, class_name, None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"this transformers has no {class_name}")
    config = config_cls(**tiny._common(tokenizer, num_hidden_layers=3, **{**fields, **more}))
    torch.manual_seed(0)
    return model_cls(config).float().eval().requires_grad_(False)


def test_every_family_of_the_kernel_is_tested():
    assert set(SUPPORTED_MODEL_TYPES) == set(FIRST_FIVE) | set(CASES)


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_the_shared_prefix_attention_equals_the_models_own_forward(tokenizers, model_type):
    tok = tokenizers["chatml"]
    lm = _loaded(_model(tok, model_type), tok, kind="causal")
    split = prompt_split(lm, "logprob", "What, in one word, is the greatest thing ever?", None, ScoringOptions(),
                         len(tok))
    assert len(split.prefix_ids) > 8  # longer than the sliding window
    rng = random.Random(1)
    rows = [[rng.randrange(len(tok)) for _ in range(rng.randint(1, 4))] + list(split.suffix_ids) for _ in range(8)]
    shared = PrefixScorer(lm.model, make_head(lm, "logprob"), split.prefix_ids)
    plain = PrefixScorer(lm.model, make_head(lm, "logprob"), split.prefix_ids, shared_attention=False)
    assert supported(lm.model) and shared.shared is not None and scoring_path(lm) == "shared"
    ref = FullSequenceScorer(lm.model, make_head(lm, "logprob"), split.prefix_ids).score(rows)
    atol = tiny.F32_FORWARD["rel"] * float(ref.abs().max())  # a summed log-probability: tens
    torch.testing.assert_close(shared.score(rows).cpu(), ref, atol=atol, rtol=0)
    torch.testing.assert_close(plain.score(rows).cpu(), ref, atol=atol, rtol=0)


def test_gemma4_with_shared_key_value_layers_stays_on_the_cache_path(tokenizers):
    """Its last layers read the keys and values of earlier ones (their cache layers hold none): not the kernel's."""
    from tests import tiny_hybrid

    if not tiny_hybrid.available("gemma4_shared_kv"):
        pytest.skip("this transformers has no Gemma 4")
    tok = tokenizers["chatml"]
    model = tiny_hybrid.build("gemma4_shared_kv", tok)
    assert model.config.model_type == "gemma4_text" and not supported(model)
    assert scoring_path(_loaded(model, tok, kind="causal")) == "cache"


@pytest.mark.parametrize("config_class", ["JambaConfig", "Qwen3NextConfig", "MambaConfig", "LlamaConfig",
                                          "DeepseekV32Config"])
def test_a_hybrid_under_a_transformers_without_the_unified_cache_is_refused_in_one_line(config_class, monkeypatch):
    """Before transformers 5.5 each hybrid kept a cache class of its own (the Mamba models none in their output): the
    prefix state had no rule, and the runs failed with tracebacks deep in the engine (transformers 5.2, CI's lowest
    column); up to 5.14 some families still did (experiments/results/versions_hybrid.md). Now the plan refuses them
    from the config alone, naming the version to install; a plain decoder passes."""
    from probe.core import cache

    monkeypatch.setattr(cache, "HAS_UNIFIED", False)  # what transformers 5.2 to 5.14 have (natively False there)
    if not hasattr(transformers, config_class):
        pytest.skip(f"this transformers has no {config_class}")
    config = getattr(transformers, config_class)()
    if config_class in ("LlamaConfig", "DeepseekV32Config"):  # DeepSeek V3.2: every sequence whole, on any release
        assert cache.plan(config).path == ("cache" if config_class == "LlamaConfig" else "full")
        return
    with pytest.raises(cache.UnsupportedCache) as err:
        cache.plan(config)
    line = str(err.value)
    assert "\n" not in line and f"needs transformers >= {cache.UNIFIED_CACHE}" in line
    assert cache.UNIFIED_CACHE == "5.15"
    assert f"this is {transformers.__version__}" in line and "pip install -U" in line
