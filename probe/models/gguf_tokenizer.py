"""A GGUF's tokenizer (the packaged Gemma 3's and SmolLM2's) as a Hugging Face folder, built by rm-probe itself.

transformers converts a GGUF's tokenizer differently from release to release. Below 5.18 it builds Gemma's as a
Unigram model over the file's scores and adds none of its control tokens; the folder it saves reloads (as
``GemmaTokenizer``) with no merges at all, every character its own id: ``<start_of_turn>`` 15 ids where it is one
(issue 55). From 5.18 on it builds the byte-fallback BPE that Gemma's official ``tokenizer.json`` is. rm-probe builds
that tokenizer itself from the file's metadata, with the ``tokenizers`` library only, so the packaged Gemma 3 reads
the same ids on every transformers: the output of 5.18+'s rules, which tests/unit/test_packaged_tokenizers.py
compares with the newest transformers' own conversion, file for file.

The rules (what the GGUF stores and what Gemma's tokenizer is):

- The vocabulary is the file's token list in its order (id = position), a token of two or more spaces respelled with
  ``▁`` (U+2581) per space, as Gemma's pieces spell spaces.
- The file has no merges: every split of a token into two vocabulary tokens is a merge, ranked by the merged token's
  position in the file (Gemma's file lists pieces best-first; its scores do not follow that order), and among one
  token's splits the longer left piece first.
- The model is BPE with byte fallback and ``<unk>``; spaces become ``▁`` before it (no prefix space is added); the
  decoder turns ``▁`` back into spaces and byte pieces into bytes.
- Tokens the file types CONTROL (3) are special added tokens; USER_DEFINED (4) ones plain added tokens (matched whole),
  except those made of spaces (their respelling is in the vocabulary already).
- BOS is put in front of a text where the file's ``add_bos_token`` says (Gemma: yes); EOS where ``add_eos_token``.

SmolLM2's byte-level vocabulary (transformers 5.2 converts it with every space the unknown token: "What, in one
word" 22 ids where it is 12) is GPT-2's: the file's tokens (spelled in GPT-2's byte alphabet) and merges, the
byte-level split and decoder, CONTROL tokens special. Both builds equal transformers 5.24's own conversion, file
contents and ids.
"""

from __future__ import annotations

import json
from pathlib import Path

from probe.errors import ModelLoadError

SPACE = "\u2581"
CONTROL, USER_DEFINED = 3, 4
# the GGUF keys read (llama.cpp's names) and the special tokens transformers' Gemma class names besides them
SPECIAL_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
               "pad_token": "padding_token_id"}
GEMMA_MASK = "<mask>"
# the architectures whose SentencePiece vocabulary this module builds (the GGUF's general.architecture), and the
# byte-level vocabularies (tokenizer.ggml.pre) whose text split is GPT-2's own (SmolLM2's)
BUILT = ("gemma", "gemma2", "gemma3")
BYTE_LEVEL_PRE = ("smollm",)


# GGUF's value types (the file format, version 2 and 3): struct codes of the fixed-size ones; 8 string, 9 array
_FIXED = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


def read_fields(path: Path) -> dict:
    """Every metadata key of a GGUF file and its value (the tensors are not read): a small reader of the format's
    header, a hundred times faster than gguf's (which maps every one of 262,144 strings as an array)."""
    import mmap
    import struct

    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        magic, file_version, _, count = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or file_version not in (2, 3):
            raise ModelLoadError(f"{path} is not a GGUF file of version 2 or 3")
        pos = 24

        def string():
            nonlocal pos
            (size,) = struct.unpack_from("<Q", buf, pos)
            pos += 8 + size
            return buf[pos - size:pos].decode("utf-8")

        def value(kind):
            nonlocal pos
            if kind == STRING:
                return string()
            if kind == ARRAY:
                inner, n = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                if inner in _FIXED:
                    code = "<" + _FIXED[inner] * n
                    out = list(struct.unpack_from(code, buf, pos))
                    pos += struct.calcsize(code)
                    return out
                return [value(inner) for _ in range(n)]
            code = "<" + _FIXED[kind]
            (out,) = struct.unpack_from(code, buf, pos)
            pos += struct.calcsize(code)
            return out

        fields = {}
        for _ in range(count):
            key = string()
            (kind,) = struct.unpack_from("<I", buf, pos)
            pos += 4
            fields[key] = value(kind)
    return fields


def read_metadata(path: Path) -> dict:
    """The tokenizer's metadata of a GGUF file: architecture, tokens, token types, special tokens and flags."""
    fields = read_fields(path)
    out = {"architecture": fields.get("general.architecture"), "model": fields.get("tokenizer.ggml.model"),
           "pre": fields.get("tokenizer.ggml.pre"), "merges": fields.get("tokenizer.ggml.merges"),
           "tokens": fields["tokenizer.ggml.tokens"], "token_type": fields["tokenizer.ggml.token_type"],
           "add_bos_token": fields.get("tokenizer.ggml.add_bos_token"),
           "add_eos_token": fields.get("tokenizer.ggml.add_eos_token"),
           "chat_template": fields.get("tokenizer.chat_template")}
    for name, key in SPECIAL_IDS.items():
        token_id = fields.get(f"tokenizer.ggml.{key}")
        out[name] = out["tokens"][token_id] if token_id is not None else None
    return out


def builds(metadata: dict) -> bool:
    """Whether this module builds the tokenizer this metadata describes (else transformers' converter does)."""
    return ((metadata["model"] == "llama" and metadata["architecture"] in BUILT)
            or (metadata["model"] == "gpt2" and metadata["pre"] in BYTE_LEVEL_PRE))


def respell(token: str) -> str:
    return SPACE * len(token) if " " in token and not token.strip() else token


def merges(tokens: list[str]) -> list[tuple[str, str]]:
    """Every split of a vocabulary token into two vocabulary tokens, best first: by the merged token's position in
    the file (a token listed twice: its last position), then the longer left piece first."""
    rank = {token: i for i, token in enumerate(tokens)}
    out = []
    for token, position in sorted(rank.items(), key=lambda kv: kv[1]):
        for cut in range(len(token) - 1, 0, -1):
            left, right = token[:cut], token[cut:]
            if left in rank and right in rank:
                out.append((left, right))
    return out


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's printable spelling of each byte: printable Latin-1 bytes as themselves, the rest as U+0100 on."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    spelled, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in spelled:
            spelled[b] = chr(256 + extra)
            extra += 1
    return spelled


def _sentencepiece(metadata: dict):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

    tokens = [respell(t) for t in metadata["tokens"]]
    vocab = {token: i for i, token in enumerate(tokens)}
    unk = metadata["unk_token"]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges(tokens), unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    types = metadata["token_type"]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, kind in zip(metadata["tokens"], types) if kind == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, kind in zip(metadata["tokens"], types) if kind == USER_DEFINED and respell(t) == t])
    return tok, vocab


def _byte_level(metadata: dict):
    """GPT-2's byte-level BPE with the file's merges; a token not spelled in the byte alphabet is respelled from its
    UTF-8 bytes, and a CONTROL token that is not (a mislabel) is not added."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    spelled = _byte_alphabet()
    alphabet = set(spelled.values())
    vocab = {t if set(t) <= alphabet else "".join(spelled[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(metadata["tokens"])}
    pairs = [tuple(m.split(" ")) for m in metadata["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, continuing_subword_prefix="", end_of_word_suffix="",
                               fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, kind in zip(metadata["tokens"], metadata["token_type"])
                            if kind == CONTROL and set(t) <= alphabet])
    return tok, vocab


def backend(metadata: dict):
    """The ``tokenizers.Tokenizer`` these rules make of the file's metadata."""
    from tokenizers import processors

    tok, vocab = (_byte_level if metadata["model"] == "gpt2" else _sentencepiece)(metadata)
    bos, eos = metadata["bos_token"], metadata["eos_token"]
    lead = [bos] if metadata["add_bos_token"] else []
    tail = [eos] if metadata["add_eos_token"] else []

    def around(seq: str, type_id: int) -> list[str]:
        return [f"{t}:{type_id}" for t in lead] + [f"${seq}:{type_id}"] + [f"{t}:{type_id}" for t in tail]

    tok.post_processor = processors.TemplateProcessing(
        single=around("A", 0), pair=around("A", 0) + around("B", 1),
        special_tokens=[(t, vocab[t]) for t in dict.fromkeys(lead + tail)])
    return tok


def write_folder(metadata: dict, out: Path, chat_template: str | None = None) -> Path:
    """``tokenizer.json`` and ``tokenizer_config.json`` into ``out``: class ``GemmaTokenizer`` for a SentencePiece
    vocabulary (as Gemma's own repositories and transformers' conversion name it; ``<mask>`` its mask token), the
    plain fast tokenizer for a byte-level one (its BOS/EOS written by the template, not added)."""
    if not builds(metadata):
        raise ModelLoadError(f"rm-probe builds no {metadata['model']!r} tokenizer for {metadata['architecture']!r}")
    out.mkdir(parents=True, exist_ok=True)
    backend(metadata).save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **{k: metadata[k] for k in SPECIAL_IDS},
              "clean_up_tokenization_spaces": False, "model_max_length": 1000000000000000019884624838656}
    if metadata["model"] == "llama":
        config.update(tokenizer_class="GemmaTokenizer", mask_token=GEMMA_MASK if GEMMA_MASK in metadata["tokens"]
                      else None, add_bos_token=bool(metadata["add_bos_token"]),
                      add_eos_token=bool(metadata["add_eos_token"]))
    template = metadata["chat_template"] or chat_template
    if template:
        config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1) + "\n")
    return out
