"""Mistral-family checkpoints saved by transformers 5 load their tokenizer in the project's own install (issue 71).

transformers 5.2x takes an installed mistral_common as the tokenizer backend of every Mistral-family model type and
imports it to probe each checkpoint; `make venv` installed mistral-common without its dependencies (for its data
files), so that import failed (``No module named 'tiktoken'``) for every Mistral, Ministral and Ministral 3 folder.
The Makefile now installs what its import needs (MISTRAL_DEPS), and rm-probe reads the Hugging Face files even where
a ``tekken.json`` sits beside them (probe/models/loading.py `hf_format`): its chat template and ids are what it
scores.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tests import tiny

FAMILIES = [("MistralConfig", "MistralForSequenceClassification"),
            ("MinistralConfig", "MinistralForSequenceClassification"),
            ("Ministral3Config", "Ministral3ForSequenceClassification")]


def _folder(tmp_path, config_name: str, class_name: str, tokenizer):
    config_cls, model_cls = getattr(transformers, config_name, None), getattr(transformers, class_name, None)
    if config_cls is None or model_cls is None:
        pytest.skip(f"this transformers has no {class_name}")
    config = config_cls(**tiny._common(tokenizer, num_labels=1, hidden_size=32, num_hidden_layers=1, head_dim=8))
    torch.manual_seed(0)
    folder = tmp_path / config_name
    model_cls(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("config_name,class_name", FAMILIES)
def test_a_mistral_family_checkpoint_loads_its_tokenizer(tokenizers, tmp_path, config_name, class_name):
    from probe.models.loading import load_model

    tok = tokenizers["llama3"]
    folder = _folder(tmp_path, config_name, class_name, tok)
    lm = load_model(str(folder), kind="reward", device="cpu")
    assert lm.tokenizer("Love is all")["input_ids"] == tok("Love is all")["input_ids"]
    assert lm.tokenizer.chat_template == tok.chat_template


def test_the_hugging_face_files_are_read_where_a_tekken_file_sits_beside_them(tokenizers, tmp_path):
    """A Mistral checkpoint that ships mistral-common's ``tekken.json`` too: transformers alone would pick
    mistral-common's backend (no Jinja chat template, another API); rm-probe reads tokenizer.json."""
    import importlib.util
    import shutil
    from pathlib import Path

    from probe.models.loading import load_tokenizer

    spec = importlib.util.find_spec("mistral_common")
    if spec is None:
        pytest.skip("mistral-common is not installed (make venv installs it)")
    tok = tokenizers["llama3"]
    folder = _folder(tmp_path, "MistralConfig", "MistralForSequenceClassification", tok)
    shutil.copyfile(Path(spec.submodule_search_locations[0]) / "data" / "tekken_240911.json", folder / "tekken.json")
    got = load_tokenizer(str(folder), None, False)
    assert type(got).__name__ != "MistralCommonBackend"
    assert got("Love is all")["input_ids"] == tok("Love is all")["input_ids"] and got.chat_template == tok.chat_template
