"""Published shapes of the paper's reward models' base models, to build configs without downloading anything
(``--dry-run``, benchmarks with random weights). Values from each base model's config.json."""

from __future__ import annotations

SHAPES: dict[str, dict] = {
    "gemma-2-2b": dict(model_type="gemma2", vocab_size=256000, hidden_size=2304, intermediate_size=9216,
                       num_hidden_layers=26, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                       sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                       query_pre_attn_scalar=256, tie_word_embeddings=True),
    "gemma-2-27b": dict(model_type="gemma2", vocab_size=256000, hidden_size=4608, intermediate_size=36864,
                        num_hidden_layers=46, num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                        sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                        query_pre_attn_scalar=144, tie_word_embeddings=True),
    "llama-3-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                       tie_word_embeddings=False),
    "llama-3.1-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                         tie_word_embeddings=False),
    "llama-3.2-3b": dict(model_type="llama", vocab_size=128256, hidden_size=3072, intermediate_size=8192,
                         num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8, head_dim=128,
                         rope_theta=500000.0, tie_word_embeddings=True),
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         rope_theta=500000.0, tie_word_embeddings=True),
    "gemma-3-270m": dict(model_type="gemma3_text", vocab_size=262144, hidden_size=640, intermediate_size=2048,
                         num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                         sliding_window=512, query_pre_attn_scalar=256, tie_word_embeddings=True),
    "qwen3-0.6b": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       rope_theta=1000000.0, tie_word_embeddings=True),
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     rope_theta=1000000.0, tie_word_embeddings=False),
    "smollm2-135m": dict(model_type="llama", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                         rope_theta=100000.0, tie_word_embeddings=True),
}

# the paper's ten reward models -> base shape (and extra heads that add parameters, for the memory estimate)
PAPER_RM_SHAPES = {
    "nicolinho/QRM-Gemma-2-27B": "gemma-2-27b",
    "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": "gemma-2-27b",
    "Skywork/Skywork-Reward-Gemma-2-27B": "gemma-2-27b",
    "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2": "llama-3.1-8b",
    "nicolinho/QRM-Llama3.1-8B": "llama-3.1-8b",
    "LxzGordon/URM-LLaMa-3.1-8B": "llama-3.1-8b",
    "Ray2333/GRM-Llama3-8B-rewardmodel-ft": "llama-3-8b",
    "Ray2333/GRM-Llama3.2-3B-rewardmodel-ft": "llama-3.2-3b",
    "RLHFlow/ArmoRM-Llama3-8B-v0.1": "llama-3-8b",
    "Ray2333/GRM-gemma2-2B-rewardmodel-ft": "gemma-2-2b",
    # RewardBench 2's leaders (2025): Skywork-Reward-V2 on Llama 3.x and Qwen3
    "Skywork/Skywork-Reward-V2-Llama-3.1-8B": "llama-3.1-8b",
    "Skywork/Skywork-Reward-V2-Llama-3.1-8B-40M": "llama-3.1-8b",
    "Skywork/Skywork-Reward-V2-Llama-3.2-3B": "llama-3.2-3b",
    "Skywork/Skywork-Reward-V2-Llama-3.2-1B": "llama-3.2-1b",
    "Skywork/Skywork-Reward-V2-Qwen3-8B": "qwen3-8b",
    "Skywork/Skywork-Reward-V2-Qwen3-0.6B": "qwen3-0.6b",
}


def config_for(shape: str, num_labels: int = 1, **overrides):
    """A transformers config with a published shape (``overrides`` e.g. num_hidden_layers=2)."""
    from transformers import AutoConfig

    if shape not in SHAPES:
        raise KeyError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    kw = {**SHAPES[shape], **overrides}
    model_type = kw.pop("model_type")
    return AutoConfig.for_model(model_type, num_labels=num_labels, pad_token_id=0, **kw)
