"""Tiny random models of the hybrid linear-attention / state-space decoders (and the newer attention decoders whose
caches are not plain key/value layers), each built from its published configuration's layout, shrunk.

What is kept from each published config: the pattern of layer types (which layers are linear attention, Mamba,
short convolution, full or sliding attention, MoE or dense), the short convolution's kernel size, the grouping of
heads (query heads per key-value head, key heads per value head in the gated delta nets) and the switches that
change the arithmetic (norms, gates, multipliers, NoPE). What is shrunk: widths, head counts (keeping their ratios),
depth (keeping at least one period of the layer pattern), the Mamba-2 scans' chunk (16, so that a prompt's prefix
spans several chunks), sliding and chunked attention windows (8) and the indexer's top-k (4): each below a prompt's
length, so that what they cut is really cut. All built on the tests' tiny ChatML tokenizer (SmolLM2's template).

``ARCHS[name]``: (config builder, config class, sequence classifier or None, causal LM), by name: classes newer than
the oldest transformers the project allows are looked up by name (`available`). `build` gives a float32 model,
seeded, in eval mode; `kind` says whether the family has a sequence classifier ("reward"), else its tests read the
log-probability of a causal LM.
"""

from __future__ import annotations

import torch
import transformers

WIDTH = 64


def _ids(tokenizer) -> dict:
    return dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id)


def _cls(name: str):
    return getattr(transformers, name, None)


def _make(config_name: str, tokenizer, over: dict, **fields):
    """``config_name`` with the tokenizer's ids, ``fields`` and, over them, ``over`` (a builder's caller's changes)."""
    return _cls(config_name)(**{**_ids(tokenizer), **fields, **over})


def qwen3_5(tokenizer, **over):
    """Qwen3.5 (Qwen3_5TextConfig's defaults: the 9B's layout): three gated delta net layers to each full-attention
    one, 16 key / 32 value linear heads (2 value heads per key head), conv kernel 4, 16 query / 4 key-value heads."""
    return _make("Qwen3_5TextConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_labels=1)


def qwen3_5_moe(tokenizer, **over):
    """Qwen3.5-35B-A3B's layout: Qwen3.5's layer pattern, every MLP a routed MoE with a shared expert."""
    return _make("Qwen3_5MoeTextConfig", tokenizer, over,
        hidden_size=WIDTH, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1,
        head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
        layer_types=["linear_attention"] * 3 + ["full_attention"])


def qwen3_next(tokenizer, **over):
    """Qwen3-Next-80B-A3B: 3:1 gated delta net / gated full attention, MoE on every layer (sparse step 1)."""
    return _make("Qwen3NextConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_labels=1)


def nemotron_h(tokenizer, **over):
    """Nemotron-H / Nemotron 3 Nano: Mamba-2 layers, MoE and dense MLP layers and a few attention layers
    (``M E M * M -`` here), conv kernel 4, Mamba heads in groups (8 groups published), relu2 MLPs."""
    return _make("NemotronHConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=16, n_groups=2, conv_kernel=4,
        chunk_size=16, expand=2, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=32,
        layers_block_type=["linear_attention", "moe", "linear_attention", "full_attention", "linear_attention",
                           "mlp"])


def granitemoehybrid(tokenizer, **over):
    """Granite 4.0-H: Mamba-2 layers with one attention layer in several (no position embedding: NoPE), every
    layer's MLP a MoE with a shared expert, Granite's multipliers."""
    return _make("GraniteMoeHybridConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=5, num_attention_heads=4,
        num_key_value_heads=1, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=64,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=8.0,
        position_embedding_type="nope",
        layer_types=["linear_attention"] * 2 + ["full_attention"] + ["linear_attention"] * 2)


def olmo_hybrid(tokenizer, **over):
    """OLMo hybrid: three gated delta net layers (negative eigenvalues allowed) to each attention layer."""
    return _make("OlmoHybridConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=4, linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, linear_allow_neg_eigval=True,
        layer_types=["linear_attention"] * 3 + ["full_attention"])


def jamba(tokenizer, **over):
    """Jamba: Mamba-1 layers with one attention layer in 8 (period 8, offset 4), a MoE MLP on every other layer."""
    return _make("JambaConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=1, num_experts=4, num_experts_per_tok=2, expert_layer_period=2, expert_layer_offset=1,
        attn_layer_period=8, attn_layer_offset=4, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=8,
        num_labels=1)


def bamba(tokenizer, **over):
    """Bamba-9B: Mamba-2 layers with attention at a few indices."""
    return _make("BambaConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4,
        mamba_expand=2, mamba_chunk_size=16, attn_layer_indices=[2])


def falcon_h1(tokenizer, **over):
    """Falcon-H1: every layer runs attention and Mamba-2 in parallel (one cache layer holding both), with its
    muP multipliers."""
    return _make("FalconH1Config", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=1,
        mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=16, mamba_rms_norm=True,
        embedding_multiplier=5.0, lm_head_multiplier=0.03, key_multiplier=0.5, attention_in_multiplier=0.8,
        attention_out_multiplier=0.9, ssm_in_multiplier=1.2, ssm_out_multiplier=0.7,
        mlp_multipliers=[0.9, 0.6], ssm_multipliers=[0.5, 0.4, 0.3, 0.6, 0.8])


def kimi_linear(tokenizer, **over):
    """Kimi-Linear: three Kimi delta attention layers to each multi-head latent attention layer, MoE MLPs after
    a first dense one."""
    return _make("KimiLinearConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        v_head_dim=16, qk_nope_head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        linear_head_dim=16, linear_num_heads=4, linear_conv_kernel_dim=4,
        mlp_layer_types=["dense"] + ["sparse"] * 3, layer_types=["linear_attention"] * 3 + ["full_attention"])


def lfm2(tokenizer, **over):
    """LFM2-1.2B: short gated convolutions (cache of 3) with attention at a few layers (here 2 and 5 of 6)."""
    return _make("Lfm2Config", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, conv_L_cache=3, block_auto_adjust_ff_dim=False,
        layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention"])


def lfm2_moe(tokenizer, **over):
    """LFM2-8B-A1B: LFM2's layout with MoE MLPs after the first dense layers."""
    return _make("Lfm2MoeConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3, num_dense_layers=2, num_experts=4,
        num_experts_per_tok=2, layer_types=["conv", "conv", "full_attention", "conv", "conv", "full_attention"])


def mamba2(tokenizer, **over):
    """Mamba-2 (Codestral Mamba's layout: 8 groups): state-space layers only."""
    return _make("Mamba2Config", tokenizer, over,
        hidden_size=WIDTH, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16,
        n_groups=2, conv_kernel=4, expand=2, chunk_size=16)


def zamba2(tokenizer, **over):
    """Zamba2: Mamba-2 layers with a shared attention block applied at a few of them ("hybrid" layers)."""
    return _make("Zamba2Config", tokenizer, over, hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=4,
        layers_block_type=["linear_attention", "linear_attention", "hybrid", "linear_attention"],
        num_attention_heads=4, num_key_value_heads=4, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
        mamba_ngroups=1, n_mamba_heads=8, chunk_size=16, num_mem_blocks=1, use_mem_rope=True, num_labels=1)


def minimax(tokenizer, **over):
    """MiniMax-Text-01: seven lightning (linear) attention layers to each softmax attention one (here 3:1), MoE
    MLPs, its residual alpha/beta factors."""
    return _make("MiniMaxConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, num_local_experts=4, num_experts_per_tok=2, block_size=16,
        layer_types=["linear_attention"] * 3 + ["full_attention"], num_labels=1)


def gemma4_shared_kv(tokenizer, **over):
    """Gemma 4's small models (E2B/E4B): sliding and full attention layers, the last layers reading the key-value
    cache of earlier ones (``num_kv_shared_layers``), per-layer input embeddings."""
    return _make("Gemma4TextConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=16, sliding_window=8, num_kv_shared_layers=2,
        vocab_size_per_layer_input=len(tokenizer), hidden_size_per_layer_input=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2)


def llama4_text(tokenizer, **over):
    """Llama 4 Scout's text model: chunked attention with a full (no-RoPE) layer in 4, MoE, attention temperature
    tuning (chunk shrunk to 8 tokens so a prefix spans several)."""
    return _make("Llama4TextConfig", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=64, intermediate_size_mlp=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, num_local_experts=4, num_experts_per_tok=1,
        attention_chunk_size=8, floor_scale=8, layer_types=["chunked_attention"] * 3 + ["full_attention"],
        no_rope_layers=[1, 1, 1, 0])


def deepseek_v32(tokenizer, **over):
    """DeepSeek-V3.2: multi-head latent attention with an indexer choosing the top-k keys (2048 published, 4 here
    so that a prefix has more keys than are kept)."""
    return _make("DeepseekV32Config", tokenizer, over,
        hidden_size=WIDTH, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8,
        v_head_dim=16, qk_nope_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, index_topk=4, index_head_dim=16, index_n_heads=2, head_dim=8)


def mamba(tokenizer, **over):
    """Mamba (v1): selective state-space layers only, conv kernel 4."""
    return _make("MambaConfig", tokenizer, over, hidden_size=WIDTH, num_hidden_layers=2, state_size=16,
                               conv_kernel=4, expand=2, time_step_rank=8)


# name -> (config builder, config class, sequence-classifier class or None, causal LM class)
ARCHS = {
    "qwen3_5": (qwen3_5, "Qwen3_5TextConfig", "Qwen3_5TextForSequenceClassification", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe": (qwen3_5_moe, "Qwen3_5MoeTextConfig", None, "Qwen3_5MoeForCausalLM"),
    "qwen3_next": (qwen3_next, "Qwen3NextConfig", "Qwen3NextForSequenceClassification", "Qwen3NextForCausalLM"),
    "nemotron_h": (nemotron_h, "NemotronHConfig", None, "NemotronHForCausalLM"),
    "granitemoehybrid": (granitemoehybrid, "GraniteMoeHybridConfig", None, "GraniteMoeHybridForCausalLM"),
    "olmo_hybrid": (olmo_hybrid, "OlmoHybridConfig", None, "OlmoHybridForCausalLM"),
    "jamba": (jamba, "JambaConfig", "JambaForSequenceClassification", "JambaForCausalLM"),
    "bamba": (bamba, "BambaConfig", None, "BambaForCausalLM"),
    "falcon_h1": (falcon_h1, "FalconH1Config", None, "FalconH1ForCausalLM"),
    "kimi_linear": (kimi_linear, "KimiLinearConfig", None, "KimiLinearForCausalLM"),
    "lfm2": (lfm2, "Lfm2Config", None, "Lfm2ForCausalLM"),
    "lfm2_moe": (lfm2_moe, "Lfm2MoeConfig", None, "Lfm2MoeForCausalLM"),
    "mamba": (mamba, "MambaConfig", None, "MambaForCausalLM"),
    "mamba2": (mamba2, "Mamba2Config", None, "Mamba2ForCausalLM"),
    "zamba2": (zamba2, "Zamba2Config", "Zamba2ForSequenceClassification", "Zamba2ForCausalLM"),
    "minimax": (minimax, "MiniMaxConfig", "MiniMaxForSequenceClassification", "MiniMaxForCausalLM"),
    "gemma4_shared_kv": (gemma4_shared_kv, "Gemma4TextConfig", None, "Gemma4ForCausalLM"),
    "llama4_text": (llama4_text, "Llama4TextConfig", None, "Llama4ForCausalLM"),
    "deepseek_v32": (deepseek_v32, "DeepseekV32Config", None, "DeepseekV32ForCausalLM"),
}


def available(name: str) -> bool:
    """Whether this transformers has the architecture's config and classes (all of them from 5.24 on)."""
    return all(n is None or _cls(n) is not None for n in ARCHS[name][1:])


def kind(name: str) -> str:
    """"reward" where transformers has a sequence classifier for the family, else "causal"."""
    return "reward" if ARCHS[name][2] else "causal"


def mode(name: str) -> str:
    """The score mode its tests read: the reward head, else the log-probability."""
    return "reward" if kind(name) == "reward" else "logprob"


def build(name: str, tokenizer, kind_: str | None = None, seed: int = 0):
    """The tiny model ``name`` as a sequence classifier (``kind_`` "reward", where the family has one) or causal LM,
    float32, seeded, its score head spread so that scores differ visibly."""
    make, _, cls_rm, cls_lm = ARCHS[name]
    kind_ = kind_ or kind(name)
    config = make(tokenizer)
    torch.manual_seed(seed)
    model = _cls(cls_rm if kind_ == "reward" else cls_lm)(config).float().eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if pname.startswith("score"):
                p.normal_(0, 1.0)
    model.requires_grad_(False)
    return model


def save(name: str, tokenizer, folder) -> str:
    """`build`'s model saved with ``tokenizer`` as a Hugging Face folder (what the command line loads)."""
    model = build(name, tokenizer)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
