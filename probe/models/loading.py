"""Load a reward model (or a causal LM used as a reward proxy) by Hugging Face id, local path or "embedded".

The core engine never calls ``from_pretrained``; commands call `load_model` and hand the result on.
Every failure a user can cause becomes a one-line `ModelLoadError` that says what to do.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

from probe.errors import ModelLoadError, ProbeError, TemplateError
from probe.models.chat_templates import chat_template_text, resolve_chat_template, template_names
from probe.models.embedded import model_id_for, packaged, packaged_dir
if TYPE_CHECKING:
    from probe.core.pairwise import Pairwise
from probe.models.registry import (CARD_DIALOGUES, ENCODER_TYPES, REGISTRY, REWARDBENCH_RAW_INPUT, RewardModelSpec,
                                   encoder_spec, lookup, structural_spec)

log = logging.getLogger(__name__)

ModelKind = Literal["reward", "causal"]
# parameter-name prefixes of the heads a reward model must bring from its checkpoint
# the model attribute where loading notes the head parameters it drew at random (LoadedModel.random_head)
RANDOM_HEAD = "rm_probe_random_head"
HEAD_PREFIXES = ("score.", "classifier.", "regression_layer.", "gating.", "v_head.", "value_head.")


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    spec: RewardModelSpec
    kind: ModelKind
    model_id: str  # what the user passed, or the embedded model's id
    path: str  # where the weights were read from
    revision: str | None
    spec_match: str  # how the registry entry was found
    source: dict | None = None  # packaged models: the package, GGUF file and quantization really run
    ref: LoadedModel | None = None  # reference model of an implicit reward (--ref)
    beta: float = 1.0  # the implicit reward's scale
    pairwise: Pairwise | None = None  # a pairwise preference model: its format and reference response
    principle: str | None = None  # the principle a principle model's score asks about (--principle, or its card's)
    # --allow-random-head on a checkpoint without a head: the parameters drawn at random and the seed they were drawn
    # from (`load_for_config`); part of the weights' identity, since two seeds are two null models
    random_head: dict | None = None
    # a generative judge (registry judge_prompt: LMUnit) loaded to be read under its own judge prompt: the name of that
    # prompt, whose reading the family's input call (registry input_call: vLLM's tokenizer(text)) belongs to; None
    # where it is read otherwise (another prompt, --score logprob or judge: the chat template's ids) or is no judge
    own_judge: str | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype


def _sampled_bytes(path: Path, chunk: int = 1 << 20) -> bytes:
    """A weight file's first, middle and last ``chunk`` bytes (all of it when small)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        if size <= 3 * chunk:
            return fh.read()
        out = []
        for start in (0, (size - chunk) // 2, size - chunk):
            fh.seek(start)
            out.append(fh.read(chunk))
    return b"".join(out)


def weights_identity(loaded: LoadedModel) -> dict:
    """What identifies the weights, without paths or timestamps (part of the resume fingerprint): a packaged
    model's package, file and quantization; else the Hub commit where known, and a hash over the folder's
    config, tokenizer and code files by content and its weight files by name, size and three 1 MiB samples of
    their bytes (start, middle, end: two fine-tunes of one base differ there, while reading gigabytes of weights
    to hash them whole would take minutes)."""
    import hashlib

    drawn = {"random_head": dict(loaded.random_head)} if loaded.random_head else {}
    if loaded.source is not None:
        return dict(loaded.source) | drawn
    out: dict = {"commit": getattr(loaded.model.config, "_commit_hash", None)}
    folder = Path(loaded.path)
    if folder.is_dir():
        digest = hashlib.sha256()
        for f in sorted(p for p in folder.iterdir() if p.is_file()):
            if f.suffix in (".safetensors", ".bin", ".pt", ".gguf"):
                digest.update(f"{f.name}:{f.stat().st_size}\n".encode())
                digest.update(_sampled_bytes(f))
            elif f.suffix in (".json", ".jinja", ".py", ".model", ".txt", ".tiktoken"):
                digest.update(f.name.encode() + b"\0" + f.read_bytes())
        out["files_sha256"] = digest.hexdigest()[:16]
    return out | drawn


INSTALL_CUDA_TORCH = ("install a PyTorch built for the CUDA version your NVIDIA driver supports (nvidia-smi shows it; "
                      "e.g. pip install torch --index-url https://download.pytorch.org/whl/cu126), or use --device cpu")


def cuda_problem() -> str | None:
    """Why this process cannot run on a CUDA device, in one sentence that says what to install; None where it can.
    A CPU-only build of torch; a CUDA build that the driver cannot run (torch 2.11+'s default wheels are built for
    CUDA 13 and need driver 580 or newer); no driver; no device visible."""
    import warnings

    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"torch {torch.__version__} is a CPU-only build: {INSTALL_CUDA_TORCH}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        usable = torch.cuda.is_available()
    if usable:
        return None
    reason = next((str(w.message).strip().splitlines()[0] for w in caught if "CUDA" in str(w.message)), None)
    if reason is None:
        try:
            torch.cuda.init()
        except Exception as err:  # noqa: BLE001 (RuntimeError, AssertionError, ...: all one answer)
            reason = _first_line(err)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if reason is None and visible is not None:
        reason = f"CUDA_VISIBLE_DEVICES={visible!r} hides every device"
    return (f"torch {torch.__version__} (built for CUDA {torch.version.cuda}) cannot use a GPU here"
            f"{f' ({reason})' if reason else ': no CUDA device is visible'}; {INSTALL_CUDA_TORCH}")


def resolve_device(device: str) -> torch.device:
    """``auto``: the first GPU where one can run, else the CPU (with a warning where a GPU is present that this torch
    cannot use); ``cuda``/``cuda:N`` where none can run, or N is not a device: one line naming the fix."""
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if Path("/dev/nvidia0").exists() and (problem := cuda_problem()) is not None:
            log.warning("--device auto: running on the CPU, although an NVIDIA GPU is present: %s", problem)
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ModelLoadError(f"--device {device}: not a device (use auto, cpu, cuda or cuda:N)") from None
    if dev.type == "cuda":
        if (problem := cuda_problem()) is not None:
            raise ModelLoadError(f"--device {device}: {problem}")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"--device {device}: this machine shows {torch.cuda.device_count()} CUDA device(s) "
                                 f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return dev


def resolve_dtype(dtype: str, device: torch.device, spec: RewardModelSpec) -> torch.dtype:
    """float32 on CPU (half-precision matmuls are much slower there); the spec's dtype (bf16) on GPU, unless asked."""
    if dtype == "auto":
        return torch.float32 if device.type == "cpu" else getattr(torch, spec.dtype)
    out = getattr(torch, dtype, None)
    if not isinstance(out, torch.dtype) or not out.is_floating_point:
        raise ModelLoadError(f"--dtype {dtype}: not a floating-point torch dtype (use auto, float32, bfloat16, "
                             "float16 or float64)")
    if out in (torch.bfloat16, torch.float16) and device.type == "cpu":
        log.warning("--dtype %s on CPU: half-precision matmuls are very slow on CPUs without AVX-512 BF16/AMX "
                    "(float32 is the CPU default)", dtype)
    elif out == torch.float64:
        log.warning("--dtype float64: double precision runs at half float32's speed or less (far less on most "
                    "GPUs); it is useful as a reference, no model was trained in it")
    elif out not in (torch.float32, torch.bfloat16, torch.float16):
        log.warning("--dtype %s: an unusual dtype for a forward pass; expect missing kernels", dtype)
    return out


SHIMS = ("llama_inputs_docstring",)


def apply_shims(spec: RewardModelSpec, trust_remote_code: bool = False) -> None:
    """Compatibility shims for remote modelling code written against transformers 4.x: the spec's, and all of
    them whenever remote code is allowed (a checkpoint under an unknown name may need them as much)."""
    for shim in dict.fromkeys((*spec.shims, *(SHIMS if trust_remote_code else ()))):
        if shim == "llama_inputs_docstring":
            # ArmoRM/QRM/URM import this docstring constant, removed in transformers 5.
            import transformers.models.llama.modeling_llama as llama

            if not hasattr(llama, "LLAMA_INPUTS_DOCSTRING"):
                llama.LLAMA_INPUTS_DOCSTRING = ""
        else:
            raise ValueError(f"unknown shim {shim!r} in spec {spec.name!r}")


def _source(ref: str | None) -> tuple[str, str]:
    """(model_id, path-or-id to load from); checks local paths before any network access."""
    if packaged(ref) is not None:
        return model_id_for(ref), str(packaged_dir(ref))
    path = Path(ref).expanduser()
    if path.exists():
        if path.is_file():
            raise ModelLoadError(f"{ref} is a file; pass the model's directory (with config.json)")
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{ref} is a directory but not a model: it has no config.json")
        return ref, str(path)
    if ref.startswith((".", "/", "~")) or ref.count("/") > 1:
        raise ModelLoadError(f"{ref}: no such directory")
    if "/" not in ref:  # not org/name: a misspelt packaged model is told so before any download is tried
        import difflib

        from probe.models.embedded import PACKAGED

        close = difflib.get_close_matches(ref.lower(), list(PACKAGED), n=1, cutoff=0.75)
        if close:
            raise ModelLoadError(f"--rm {ref}: not a packaged model nor a folder; did you mean {close[0]}? "
                                 f"(packaged: {', '.join(PACKAGED)}; a Hugging Face id is org/name)")
    return ref, ref


def hub_or_offline() -> bool:
    """Before the first Hub request for a model id: whether the Hub can be reached. When it cannot (an offline
    machine), huggingface_hub is switched to offline mode for this process, so a cached model loads at once and
    a missing one fails at once, instead of after about 30 s of retries. ``HF_HUB_OFFLINE=1`` skips the check."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        log.warning("the Hugging Face Hub (%s) cannot be reached: loading from the local cache only "
                    "(set HF_HUB_OFFLINE=1 to skip this check)", host)
        constants.HF_HUB_OFFLINE = True
        os.environ["HF_HUB_OFFLINE"] = "1"
        return False


def _read_config(path: str, revision: str | None, trust_remote_code: bool):
    from transformers import AutoConfig

    if not Path(path).is_dir():
        hub_or_offline()

    try:
        return AutoConfig.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise ModelLoadError(
            f"cannot load {path!r}: not a local model directory, and the Hugging Face Hub did not serve it "
            f"(offline, no such repo or revision, or a gated model: run `hf auth login`). ({_first_line(err)})"
        ) from None
    except ValueError as err:
        if "trust_remote_code" in str(err):
            raise ModelLoadError(f"{path} needs its own modelling code: add --trust-remote-code") from None
        raise ModelLoadError(f"cannot read the config of {path}: {_first_line(err)}") from None


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _check_sentencepiece(path: str) -> None:
    """A folder whose only tokenizer is a SentencePiece ``tokenizer.model`` needs ``sentencepiece`` (and ``protobuf``)
    to be read; without them transformers falls through to a misleading tiktoken error."""
    import importlib.util

    folder = Path(path)
    if not (folder / "tokenizer.model").is_file() or (folder / "tokenizer.json").is_file():
        return
    def importable(module: str) -> bool:
        try:
            return importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package (google) is missing
            return False

    missing = [pkg for pkg, module in (("sentencepiece", "sentencepiece"), ("protobuf", "google.protobuf"))
               if not importable(module)]
    if missing:
        raise ModelLoadError(f"the tokenizer of {path} is a SentencePiece tokenizer.model (no tokenizer.json); reading it "
                             f"needs {' and '.join(missing)}: pip install {' '.join(missing)}")


def _tokenizer_config(path: str, revision: str | None) -> dict:
    """The checkpoint's tokenizer_config.json as written (transformers 5 does not keep every flag of it, e.g. the
    ``add_bos_token`` of a Llama-2-era tokenizer.json layout, which RewardBench's ids depend on); {} without one."""
    from transformers.utils import cached_file

    try:
        found = cached_file(path, "tokenizer_config.json", revision=revision,
                            _raise_exceptions_for_missing_entries=False)
        return json.loads(Path(found).read_text(encoding="utf-8")) if found else {}
    except (OSError, ValueError):
        return {}


def hf_format() -> dict:
    """The tokenizer's Hugging Face files, never mistral-common's (``mistral_format=False``, where transformers has the
    choice: 5.2x). rm-probe reads a tokenizer through its chat template and ids (tokenizer.json, tokenizer.model),
    which mistral-common's backend does not offer. Left to choose, transformers maps every Mistral-family model type
    to that backend wherever the mistral_common package is found, and probes it by importing it: in an install that
    holds the package for its data files alone (``make venv``: ``--no-deps``), that import fails (tiktoken, jsonschema),
    and every Mistral, Ministral and Ministral 3 checkpoint saved by transformers 5 failed to load its tokenizer."""
    from transformers.models.auto import tokenization_auto

    return {"mistral_format": False} if hasattr(tokenization_auto, "_use_mistral_format") else {}


def load_tokenizer(path: str, revision: str | None, trust_remote_code: bool, chat_template: str | None = None,
                   family_template: str | None = None, need_template: bool = True, family_replaces: bool = False):
    """The tokenizer, with ``chat_template`` (``--chat-template``) if given; else its own template; else the
    family's dialogue format from the registry (``family_template``, a shipped template's name), which with
    ``family_replaces`` (a format the model card writes by hand) is used even where the tokenizer has a template."""
    from transformers import AutoTokenizer

    _check_sentencepiece(path)
    try:
        tok = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code,
                                            **hf_format())
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"cannot load the tokenizer of {path}: {_first_line(err)}") from None
    tok.rm_probe_config = _tokenizer_config(path, revision)
    if chat_template is not None:
        tok.chat_template = resolve_chat_template(chat_template)
    elif family_template is not None and family_replaces and getattr(tok, "chat_template", None):
        log.info("%s: the model card writes its input by hand, not with the tokenizer's chat template: using the "
                 "card's dialogue format %r (--chat-template overrides)", path, family_template)
        tok.chat_template = resolve_chat_template(family_template)
    elif not getattr(tok, "chat_template", None) and family_template is not None:
        log.info("%s: the tokenizer has no chat template; using the family's dialogue format %r", path, family_template)
        tok.chat_template = resolve_chat_template(family_template)
    if need_template and not getattr(tok, "chat_template", None):
        raise TemplateError(
            f"the tokenizer of {path} has no chat template; pass one with --chat-template NAME|FILE (a shipped "
            f"template: {', '.join(template_names())}; a Jinja file; or a tokenizer_config.json that holds one)"
        )
    return tok



# readers RewardBench 0.1.4 has no pipeline for (its default loads a sequence classifier): what each reads
NO_REWARDBENCH_PIPELINE = {"logit": "that reads {}'s reward from its language-model logits",
                           "step": "for {}, a process reward model"}


def load_model(
    ref: str | None,
    *,
    kind: ModelKind,
    device: str = "auto",
    dtype: str = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
    chat_template: str | None = None,
    spec_name: str | None = None,
    label_index: int | None = None,
    device_map: str | None = None,
    allow_random_head: bool = False,
    need_template: bool = True,
    reference_response: str | None = None,
    input_method: str = "ids",
    principle: str | None = None,
    judge_prompt: str | None = None,
) -> LoadedModel:
    """Load model and tokenizer; ``kind="reward"`` reads a sequence-classification head, ``"causal"`` an LM head.
    ``judge_prompt``: the name of the rating prompt the run reads (None: no rating); a generative judge's input call
    (registry ``input_call``: LMUnit's vLLM encoding) goes with its own prompt only.
    ``reference_response``: what a pairwise model compares each response with (default `pairwise.DEFAULT_REFERENCE`);
    an error for any other model. ``principle``: what a principle model's score asks about (default: its card's,
    registry ``principle``); an error for any other model."""
    from probe.versions import check_versions

    check_versions()
    if spec_name is None and ref is not None and (known := lookup(ref)[0]).unsupported:
        raise ModelLoadError(f"{ref}: not supported: {known.unsupported}")
    model_id, path = _source(ref)
    named = REGISTRY.get(spec_name) if spec_name is not None else lookup(model_id)[0]
    if named is not None and named.layout == "starling7b" and not Path(path).is_dir():
        raise ModelLoadError(f"{ref}: Starling-RM-7B-alpha is read from a local folder: its repository's .pt weights "
                             "file with meta-llama/Llama-2-7b-chat-hf's config.json and tokenizer files beside it (its "
                             "card builds the model on that base); pass that folder")
    config = _read_config(path, revision, trust_remote_code)
    if spec_name is not None:
        if spec_name not in REGISTRY:
            raise ModelLoadError(f"--spec {spec_name}: unknown; known: {', '.join(sorted(REGISTRY))}")
        spec, match = REGISTRY[spec_name], "--spec"
    else:
        spec, match = lookup(model_id, getattr(config, "architectures", None))
    if kind == "reward" and match == "default" and getattr(config, "model_type", None) in ENCODER_TYPES:
        spec, match = encoder_spec(config.model_type), "encoder config"
    if kind == "reward" and (spec.reader == "forward" or spec.layout == "pairrm" or spec.pairwise == "shp"):
        log.warning("%s: %s; no shared-prefix cache: every candidate runs through the model's own full forward "
                    "(batched), which is exact and slower", model_id, spec.notes or spec.name)
    if kind == "reward" and match in ("default", "architecture"):
        log.warning("%s is not in the registry: using the %s spec %r (%s); every sweep re-checks it against the "
                    "model's own forward", model_id, "architecture" if match == "architecture" else "default",
                    spec.name, spec.notes or spec.reader)
    if label_index is not None:
        spec = replace(spec, label_index=label_index)
    pairwise = _pairwise(model_id, spec, kind, reference_response)
    if input_method == "rewardbench" and pairwise is not None and pairwise.format == "polar":
        raise ModelLoadError(f"--input-method rewardbench: RewardBench 0.1.4 has no pipeline for {model_id} (POLAR); "
                             "its card's own input is the default route")
    principle = _principle(model_id, spec, kind, principle)
    if input_method == "rewardbench" and kind == "reward" and spec.reader in NO_REWARDBENCH_PIPELINE:
        raise ModelLoadError(f"--input-method rewardbench: RewardBench 0.1.4 has no pipeline "
                             f"{NO_REWARDBENCH_PIPELINE[spec.reader].format(model_id)} (its default would load a "
                             "sequence classifier's random head); the model card's input is the default "
                             "(--input-method ids)")
    if input_method == "rewardbench" and kind == "reward" and spec.chat_template == "text-pair":
        # an encoder: run_rm.py's raw concatenation (a language model takes run_dpo.py's inputs: _set_input_call)
        spec = replace(spec, chat_template="raw", rewardbench_pipeline="pipeline")
    if spec.trust_remote_code and not trust_remote_code and kind == "reward":
        raise ModelLoadError(f"{model_id} ships its own modelling code: add --trust-remote-code to run it")
    from probe.core.pairwise import OWN_FORWARD

    own_format = pairwise is not None and pairwise.format in OWN_FORWARD  # PairRM's, SteamSHP's, POLAR's: not a chat
    if not (kind == "reward" and (spec.reader == "forward" or own_format)):
        check_prefix_reuse(model_id, config)  # before any weights: one line for a cache the engine cannot continue
    family, replaces = family_template(spec, input_method) if kind == "reward" else (None, False)
    tokenizer = load_tokenizer(path, revision, trust_remote_code, chat_template, family,
                               need_template and not own_format, family_replaces=replaces)
    if spec.chat_template == "raw" and tokenizer.chat_template == chat_template_text("raw"):
        spec = replace(spec, input_source=REWARDBENCH_RAW_INPUT)  # (a tokenizer's own template: RewardBench's too)
    own_judge = spec.judge_prompt if kind == "causal" and judge_prompt is not None \
        and judge_prompt == spec.judge_prompt else None
    _set_input_call(tokenizer, spec, kind, input_method, own_judge is not None)
    if kind == "reward" and input_method == "ids" and pairwise is None:
        _warn_rewardbench_bos(model_id, tokenizer, spec)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev, spec)
    apply_shims(spec, trust_remote_code)
    model = _from_pretrained(path, kind, spec, revision, trust_remote_code, torch_dtype,
                             dev if device_map is None else device_map, allow_random_head, config)
    _trained_attention(model, spec)
    if pairwise is not None and pairwise.format == "polar":
        check_polar_reward_token(model_id, tokenizer, model.config)
    if kind == "reward" and (found := structural_spec(model, spec)) is not None:
        log.warning("%s: no linear score head, but an ArmoRM/QRM-style regression layer and gating network: using "
                    "the gated reader (%s); every sweep re-checks it against the model's own forward",
                    model_id, found.name)
        spec, match = replace(found, label_index=spec.label_index), "structure"
    n_out = getattr(getattr(model, "score", None), "out_features", 1)
    if kind == "reward" and spec.reader == "linear" and n_out != 1 and label_index is None and match == "default":
        raise ModelLoadError(
            f"{model_id} has {n_out} outputs and the registry has no rule to read one score from it: "
            "pass --label-index K (the output column to use) or --spec NAME"
        )
    if device_map is None:
        model.to(dev)  # loaded there already (_placement); side files (LDL's .pt heads) and remote code's extras
    model.eval()
    model.requires_grad_(False)
    source = pkg.source() if (pkg := packaged(ref)) is not None else None
    drawn = getattr(model, RANDOM_HEAD, None)
    return LoadedModel(model, tokenizer, spec, kind, model_id, path, revision, match, source, pairwise=pairwise,
                       principle=principle, random_head={"parameters": list(drawn)} if drawn else None,
                       own_judge=own_judge)


def check_prefix_reuse(model_id: str, config) -> None:
    """Refuse, in one line naming the architecture and the layer type, a decoder whose cache rm-probe has no rule to
    continue a shared prefix from (probe/core/cache.py); warn where its rows run whole instead."""
    from probe.core.cache import UnsupportedCache, plan

    try:
        reuse = plan(config)
    except UnsupportedCache as err:
        raise UnsupportedCache(f"{model_id}: {err}") from None
    if reuse.path == "full":
        log.warning("%s: %s; no shared prefix: every sequence runs through the model's own forward (exact, slower)",
                    model_id, reuse.why)


def check_polar_reward_token(model_id: str, tokenizer, config) -> None:
    """POLAR's card writes its reward token as the text ``[UNUSED_TOKEN_130]`` and reads the score there; its training
    appended the config's ``reward_token_id``. A tokenizer that does not encode that text as that one id would have
    the score read elsewhere: refused in one line (nothing to check where the config names no reward token)."""
    from probe.core.pairwise import POLAR_REWARD_TOKEN

    want = getattr(config, "reward_token_id", None)
    got = tokenizer.encode(POLAR_REWARD_TOKEN, add_special_tokens=False)
    if want is not None and got != [want]:
        raise ModelLoadError(f"{model_id}: its tokenizer encodes {POLAR_REWARD_TOKEN!r}, where POLAR's card reads the "
                             f"score, as ids {got}, not as the config's reward_token_id {want}")


def _trained_attention(model, spec: RewardModelSpec) -> None:
    """The model runs the attention it was trained with (probe/models/attention.py): where rm-probe chose it at
    loading, recorded; where remote code ignored the choice, switched now or refused in one line."""
    from probe.models.attention import mark_chosen, use_trained_attention

    mark_chosen(model, spec.attn_implementation)
    try:
        use_trained_attention(model)
    except ProbeError as err:
        raise ModelLoadError(str(err)) from None


def family_template(spec: RewardModelSpec, input_method: str) -> tuple[str | None, bool]:
    """The shipped dialogue format of the family, and whether it replaces a chat template the tokenizer carries: its
    model card's (a format the card writes by hand, registry ``CARD_DIALOGUES``, replaces it: the card never calls
    it), or under ``--input-method rewardbench`` the one RewardBench's run script renders (registry
    ``rewardbench_chat_template``; the tokenizer's own template where RewardBench uses that)."""
    card = spec.chat_template in CARD_DIALOGUES
    if input_method == "rewardbench" and card:
        return spec.rewardbench_chat_template, False
    return spec.chat_template, card


def _set_input_call(tokenizer, spec: RewardModelSpec, kind: ModelKind, input_method: str, own_judge: bool = False) -> None:
    """How this model's conversations become ids (probe/core/template.py: input_call): the family's convention
    (registry ``input_call``: a reward model's, or a generative judge's read under its own judge prompt,
    ``own_judge``), or RewardBench's route; where that is a ``tokenizer(text)`` call, what the call adds around the
    text is worked out here once, not at every rendering."""
    from probe.core.template import (
        REWARDBENCH_DPO,
        CallIds,
        add_eos_call_ids,
        call_special_tokens,
        input_call,
        rewardbench_call_ids,
    )

    if spec.input_call is not None and (kind == "reward" or own_judge):  # the family's input convention (registry
        # input_source): a reward model's, or a generative judge's under its own prompt (LMUnit's vLLM call); the same
        # checkpoint read by log-probabilities or another prompt gets the chat template's ids
        tokenizer.rm_probe_input_call = spec.input_call
    if input_method == "rewardbench" and kind == "causal":  # run_dpo.py's inputs (probe/core/template.py)
        tokenizer.rm_probe_input_call = REWARDBENCH_DPO
        return
    route = input_method == "rewardbench" and rewardbench_differs(spec)
    if route:
        tokenizer.rm_probe_input_call = "rewardbench"
    elif spec.input_ends_at is not None and kind == "reward":  # the card's input stops there (registry)
        tokenizer.rm_probe_ends_at = tokenizer.encode(spec.input_ends_at, add_special_tokens=False)
    if input_call(tokenizer) != "chat_template":
        tokenizer.rm_probe_call_ids = (rewardbench_call_ids(tokenizer, spec.rewardbench_pipeline) if route
                                       else add_eos_call_ids(tokenizer) if spec.input_eos and kind == "reward"
                                       else CallIds(*call_special_tokens(tokenizer)))


def _warn_rewardbench_bos(model_id: str, tokenizer, spec: RewardModelSpec) -> None:
    """Where the default route feeds the template's ids and the checkpoint's template writes no BOS while the
    tokenizer's own call adds one, RewardBench's pipeline (tokenizer(text), the first of a doubled BOS masked: 0.1.4's
    and RewardBench 2's) feeds one BOS more than this run: said at loading, so that numbers are compared knowingly."""
    from probe.core.template import call_special_tokens, input_call
    from probe.models.registry import DOUBLE_BOS_MASKED

    if input_call(tokenizer) != "chat_template" or spec.rewardbench_pipeline not in DOUBLE_BOS_MASKED:
        return
    try:
        lead, _ = call_special_tokens(tokenizer)
        ids = list(tokenizer.apply_chat_template([{"role": "user", "content": "a"}, {"role": "assistant",
                                                  "content": "b"}], tokenize=True, return_dict=False))
    except Exception:  # a template that cannot render this: the split will say why
        return
    if lead and ids[: len(lead)] != lead:
        log.warning("%s: its chat template writes no BOS and its tokenizer's call adds one: this run feeds the "
                    "template's ids (what the model card's classifier and its training read), %s feeds one %s more "
                    "(--input-method rewardbench reproduces it)", model_id, spec.rewardbench_pipeline,
                    tokenizer.decode(lead))


def rewardbench_differs(spec: RewardModelSpec) -> bool:
    """Whether RewardBench's run script feeds this family other ids than rm-probe's default: it does for every family
    its pipelines encode as ``tokenizer(text)`` (the chat template's text, so a tokenizer that adds BOS doubles it;
    without a chat template, fastchat's format with ``add_eos_token``), and for PairRM (its card's ``tokenize_pair``
    on plain texts; RewardBench's ``tokenize_conv_pair``), and for InternLM2 reward (its card's ``get_score`` encodes
    the template's text with the tokenizer's special tokens, two BOS; InternLMPipeline without them, one); the
    pair-preference LMs get their pipeline's own input by default already."""
    return spec.reader != "pairwise" or spec.pairwise == "pairrm"


def _pairwise(model_id: str, spec: RewardModelSpec, kind: ModelKind, reference_response: str | None):
    """A pairwise model's setting (its format and the reference response), before any weights load; a reference
    response for a model that scores responses on their own is an error."""
    from probe.core.pairwise import DEFAULT_REFERENCE, Pairwise

    if kind != "reward" or spec.reader != "pairwise":
        if reference_response is not None and spec.reader == "pairwise":
            raise ModelLoadError(f"--reference-response: {model_id} is read as a pairwise model by --score reward "
                                 "only; other score modes read it as a language model, without a reference")
        if reference_response is not None:
            raise ModelLoadError(f"--reference-response: {model_id} is not a pairwise preference model (spec "
                                 f"{spec.name!r}); it scores each response on its own")
        return None
    if spec.pairwise == "polar" and reference_response is None:
        raise ModelLoadError(f"{model_id} (POLAR) scores a response by how close it is to a reference response (its "
                             "card's 'reference', a demonstration of the answer wanted), and its card suggests no "
                             "default: pass --reference-response TEXT")
    found = Pairwise(spec.pairwise, DEFAULT_REFERENCE if reference_response is None else reference_response)
    log.warning("%s is a pairwise preference model: every response is scored against the reference response %r%s "
                "(%s)%s", model_id, found.reference, " in both orders" if found.two_orders else "",
                found.describe()["score"],
                "" if reference_response is not None else "; the default reference: pass --reference-response TEXT")
    return found


def _principle(model_id: str, spec: RewardModelSpec, kind: ModelKind, principle: str | None) -> str | None:
    """The principle a principle model's reward asks about (registry ``principle_question``): ``--principle``, else
    its card's example; before any weights load, one line for a model that takes none."""
    if kind != "reward" or spec.principle_question is None:
        if principle is not None:
            raise ModelLoadError(f"--principle: {model_id} takes no principle (spec {spec.name!r}"
                                 f"{'' if kind == 'reward' else ', read as a language model'}); only a principle "
                                 "reward model's score asks about one")
        return None
    if principle is None:
        log.warning("%s scores how far a response fulfils a principle: the model card's %r (pass --principle TEXT)",
                    model_id, spec.principle)
    return spec.principle if principle is None else principle


def model_class(auto, config, path: str, revision: str | None, trust_remote_code: bool):
    """The class ``auto.from_pretrained`` would instantiate: the checkpoint's own (auto_map) or the library's."""
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code and auto.__name__ in auto_map:
        from transformers.dynamic_module_utils import get_class_from_dynamic_module

        return get_class_from_dynamic_module(auto_map[auto.__name__], path, revision=revision)
    from transformers.models.auto.auto_factory import _get_model_class

    return _get_model_class(config, auto._model_mapping)


def _placement(config, spec: RewardModelSpec, device_map) -> dict:
    """``from_pretrained`` keywords for where the weights go and which attention runs: straight onto the target
    device (``device_map`` is ``--device-map``, or the one device as a torch.device: a single-device map loads each
    tensor there, never a whole copy in host memory first, and adds no dispatch hooks), with an attention
    implementation that applies the model's soft-cap (probe/models/attention.py)."""
    from probe.models.attention import load_kwargs

    try:
        out = load_kwargs(config, spec.attn_implementation)
    except ProbeError as err:
        raise ModelLoadError(str(err)) from None
    if device_map is not None and not (isinstance(device_map, torch.device) and device_map.type == "cpu"):
        out["device_map"] = device_map
    return out


def _from_pretrained(path, kind, spec, revision, trust_remote_code, dtype, device_map, allow_random_head, config):
    """Load the weights. Remote classes that override ``from_pretrained`` (QRM's forces flash-attention and
    drops every other argument, output_loading_info included) are loaded through the library's own
    ``PreTrainedModel.from_pretrained``, so dtype, device map and the head check hold for them too."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, PreTrainedModel

    if kind == "reward" and spec.layout is not None:
        return _load_family(path, spec, revision, dtype, device_map, allow_random_head, config)
    # a pair-preference LM and a reward read from the next-token logit (the "logit" reader) read the LM head
    seq_cls = kind == "reward" and spec.pairwise != "slicpairpm" and spec.reader != "logit"
    auto = AutoModelForSequenceClassification if seq_cls else AutoModelForCausalLM
    if kind == "reward" and spec.auto_class is not None:  # remote code registered under another Auto class
        import transformers

        auto = getattr(transformers, spec.auto_class)
    kwargs: dict = dict(revision=revision, trust_remote_code=trust_remote_code, dtype=dtype,
                        **_placement(config, spec, device_map))
    if seq_cls and allow_random_head:
        kwargs["num_labels"] = 1
    what = "sequence-classification (reward)" if seq_cls else "causal language"
    try:
        cls = model_class(auto, config, path, revision, trust_remote_code)
    except (KeyError, OSError, ValueError, ImportError) as err:
        raise ModelLoadError(f"cannot load {path} as a {what} model: {_first_line(err)}") from None
    load = auto.from_pretrained
    if getattr(cls.from_pretrained, "__func__", None) is not PreTrainedModel.from_pretrained.__func__:
        log.warning("%s overrides from_pretrained and would ignore the loading options: loading it through "
                    "PreTrainedModel.from_pretrained instead", cls.__name__)
        load = PreTrainedModel.from_pretrained.__func__.__get__(cls)
        kwargs.pop("trust_remote_code")
    try:
        out = load(path, output_loading_info=True, **kwargs)
    except torch.OutOfMemoryError:
        raise ModelLoadError(
            f"out of GPU memory while loading {path}: use --device-map auto to spread it over several GPUs"
        ) from None
    except (OSError, ValueError, KeyError, ImportError) as err:
        raise ModelLoadError(f"cannot load {path} as a {what} model: {_first_line(err)}") from None
    model, info = out if isinstance(out, tuple) else (out, None)
    if info is None:
        log.warning("%s returned no loading information: the check for an untrained reward head is skipped", path)
        info = {}
    missing = sorted(k for k in info.get("missing_keys", ()) if k.startswith(HEAD_PREFIXES))
    if kind == "reward" and missing:
        setattr(model, RANDOM_HEAD, tuple(missing))  # allowed (else refused below): LoadedModel.random_head
    if kind == "reward" and missing and not allow_random_head:
        raise ModelLoadError(
            f"{path} has no trained reward head (randomly initialised: {', '.join(missing)}); it is not a reward "
            "model. Score it with --score logprob or --score judge, or pass --allow-random-head for a null model"
        )
    if not seq_cls and (untrained := untrained_lm_head(model, info.get("missing_keys", ()))):
        arch = ", ".join(getattr(config, "architectures", None) or ["a model without an LM head"])
        raise ModelLoadError(
            f"{path} has no trained language-model head (randomly initialised: {', '.join(untrained)}; the checkpoint "
            f"is {arch}): " + (f"spec {spec.name!r} reads its reward from that head; it is not this checkpoint's "
                               "family (--spec NAME)" if kind == "reward" else
                               "the logprob, judge, judge-pair and rating scores read that head. Score it with --score "
                               "reward")
        )
    return model


def untrained_lm_head(model, missing) -> list[str]:
    """The names of the LM head's parameters the checkpoint does not hold under any of their names (a head tied to
    the input embeddings, SmolLM2's or Gemma's, holds the trained embeddings: not listed)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names: dict[int, list[str]] = {id(p): [] for p in (head.parameters() if head is not None else ())}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in names:
            names[id(p)].append(name)
    return sorted(n for ns in names.values() if ns and set(ns) <= set(missing) for n in ns)


def _load_family(path, spec, revision, dtype, device_map, allow_random_head, config):
    """A family's backbone and head by their checkpoint names (probe/models/families.py): a head weight the
    checkpoint lacks is an error, not a random head."""
    from probe.models.families import LAYOUTS, family_model, load_side_files, pairrm_model, starling7b_state_dict

    kwargs: dict = dict(revision=revision, dtype=dtype, **_placement(config, spec, device_map))
    try:
        cls = pairrm_model(config) if spec.layout == "pairrm" else family_model(spec.layout, config)
        if spec.layout == "starling7b":  # one torch file of GPTRewardModel's state dict, its names mapped
            kwargs.pop("revision")
            model, info = cls.from_pretrained(None, config=config, state_dict=starling7b_state_dict(path),
                                              output_loading_info=True, **kwargs)
        else:
            model, info = cls.from_pretrained(path, output_loading_info=True, **kwargs)
    except torch.OutOfMemoryError:
        raise ModelLoadError(f"out of GPU memory while loading {path}: use --device-map auto") from None
    except (OSError, ValueError, KeyError, ImportError) as err:
        raise ModelLoadError(f"cannot load {path} as a {spec.layout} reward model: {_first_line(err)}") from None
    side = {name.removesuffix(".pt") for name in load_side_files(model, path)}
    backbone = LAYOUTS[spec.layout].backbone + "."
    missing = sorted(k for k in info.get("missing_keys", ()) if not k.startswith(backbone) and k.split(".")[0] not in side)
    if spec.layout == "starling7b":  # the whole model comes from the one file: a backbone weight it lacks stays random
        missing = sorted(info.get("missing_keys", ()))
    if missing:
        setattr(model, RANDOM_HEAD, tuple(missing))  # allowed (else refused below): LoadedModel.random_head
    if missing and not allow_random_head:
        raise ModelLoadError(f"{path} lacks the {spec.layout} head's weights ({', '.join(missing[:4])}): it is not a "
                             f"checkpoint of {spec.name}; pass --spec NAME for another family")
    return model


_CONFIG_RM = object()


def _load_for_config(config, kind: ModelKind, rm: object = _CONFIG_RM, input_method: str | None = None,
                     seed: int | None = None, judge_prompt: str | None = None) -> LoadedModel:
    """`load_model` with the model settings a command's config carries (rm, device, dtype, revision, ...);
    ``rm`` overrides the config's own (a command that runs several models); ``seed``: a random head's, where the
    config's own ``seed`` is not the run's (a trace draws it from the traced run's)."""
    get = lambda name, default=None: getattr(config, name, default)  # noqa: E731
    judge_pair = get("score") == "judge-pair"  # a language model as a pairwise judge: its reference set below
    if get("allow_random_head", False):
        # a head the checkpoint lacks is drawn from the run's seed (recorded in its settings), so the null model is
        # the same run to run and a trace of the run draws it again; the caller's random state is left as it was
        drawn_from = int(seed if seed is not None else get("seed", 0) or 0)
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count()))):
            torch.manual_seed(drawn_from)
            loaded = _load_model_for(get, kind, rm, input_method, judge_pair, judge_prompt)
        return replace(loaded, random_head={**loaded.random_head, "seed": drawn_from}) if loaded.random_head else loaded
    return _load_model_for(get, kind, rm, input_method, judge_pair, judge_prompt)


def _load_model_for(get, kind: ModelKind, rm: object, input_method: str | None, judge_pair: bool,
                    judge_prompt: str | None) -> LoadedModel:
    loaded = load_model(
        get("rm") if rm is _CONFIG_RM else rm, kind=kind, device=get("device", "auto"), dtype=get("dtype", "auto"), revision=get("revision"),
        trust_remote_code=get("trust_remote_code", False), chat_template=get("chat_template"), spec_name=get("spec"),
        label_index=get("label_index"), device_map=get("device_map"), allow_random_head=get("allow_random_head", False),
        reference_response=None if judge_pair else get("reference_response"),
        input_method="rewardbench" if (input_method or get("input_method")) == "rewardbench" else "ids",
        principle=get("principle"), judge_prompt=judge_prompt,
    )
    return with_judge_pair(loaded, get("reference_response"), get("judge_prompt")) if judge_pair else loaded


def with_judge_pair(loaded: LoadedModel, reference: str | None, judge_prompt: str | None) -> LoadedModel:
    """``--score judge-pair``: the causal LM read as a pairwise judge (probe/core/judges.py) against ``reference``."""
    from probe.core.pairwise import judge_pairwise

    if loaded.kind != "causal":
        raise ModelLoadError("--score judge-pair asks a language model to compare two responses: load it as one")
    return replace(loaded, pairwise=judge_pairwise(reference, judge_prompt))



def load_for_config(config, kind: ModelKind, rm: object = _CONFIG_RM, input_method: str | None = None,
                    seed: int | None = None, judge_prompt=None) -> LoadedModel:
    """`load_model` with the model settings a command's config carries; with ``ref`` (``--ref``) the reference
    model too, as a causal LM on the same device, after its vocabulary was found equal to the model's.
    ``input_method``: instead of the config's (the API's ``probe.load``). ``judge_prompt``: the rating prompt the run
    reads (a `JudgePrompt`, its name, or None), which decides whether a judge family's input call applies."""
    judge_prompt = getattr(judge_prompt, "name", judge_prompt)
    ref = getattr(config, "ref", None)
    if ref is None:
        return _load_for_config(config, kind, rm, input_method, seed, judge_prompt)
    policy_ref = config.rm if rm is _CONFIG_RM else rm
    check_same_vocabulary(policy_ref, ref, getattr(config, "revision", None), getattr(config, "trust_remote_code", False))
    loaded = _load_for_config(config, kind, rm, input_method, seed, judge_prompt)
    reference = load_model(ref, kind="causal", device=str(loaded.device) if getattr(config, "device_map", None) is None
                           else "auto", dtype=str(loaded.dtype).removeprefix("torch."),
                           trust_remote_code=getattr(config, "trust_remote_code", False),
                           device_map=getattr(config, "device_map", None), need_template=False)
    return replace(loaded, ref=reference, beta=float(config.beta))


def check_same_vocabulary(policy: str | None, ref: str, revision: str | None, trust_remote_code: bool) -> None:
    """The two tokenizers map every string to the same ids (vocabulary and added tokens): otherwise the reference
    would score other tokens; and the reference is not the model itself (every score would be 0). One line, before
    any weights load (a packaged model's tokenizer is read from its GGUF alone: nothing is converted)."""
    from probe.models.embedded import packaged_tokenizer_dir

    def folder(x):
        return str(packaged_tokenizer_dir(x)) if packaged(x) is not None else _source(x)[1]

    here, there = folder(policy), folder(ref)
    if Path(here).expanduser().resolve() == Path(there).expanduser().resolve() and revision is None:
        raise ModelLoadError(f"--ref {ref} is the model itself: every implicit reward would be 0; give the model's "
                             "reference (its SFT model), or drop --ref to score its log-probabilities")
    a, b = (load_tokenizer(f, r, trust_remote_code, need_template=False) for f, r in ((here, revision), (there, None)))
    va, vb = a.get_vocab(), b.get_vocab()
    if va != vb:
        differ = sorted(t for t in set(va) | set(vb) if va.get(t) != vb.get(t))[:3]
        examples = ", ".join(f"{ascii(t)} (id {va.get(t, 'none')} in the model, {vb.get(t, 'none')} in --ref)"
                             for t in differ)
        raise ModelLoadError(f"--ref {ref}: its tokenizer is not the model's ({len(va):,} against {len(vb):,} "
                             f"entries; e.g. {examples}): an implicit reward needs one vocabulary")