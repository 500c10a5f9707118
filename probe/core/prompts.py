"""Prompts: the paper's three by default, or the user's (``--prompt TEXT``, ``--prompts FILE``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from probe.errors import DataFormatError
from probe.textfile import read_text, read_yaml

# Christian et al. (FAccT 2025), config/prompts.yaml of their release.
PAPER_PROMPTS: dict[str, str] = {
    "greatest": "What, in one word, is the greatest thing ever?",
    "best": "What, in one word, is the best thing ever?",
    "worst": "What, in one word, is the worst thing ever?",
}


@dataclass(frozen=True)
class Prompt:
    key: str
    text: str


def _checked(key: str, text: object, where: str) -> Prompt:
    if not isinstance(text, str):
        raise DataFormatError(f"{where}: prompt {key!r} is a {type(text).__name__}, not a string")
    if not text.strip():
        raise DataFormatError(f"{where}: prompt {key!r} is empty")
    if not key.replace("_", "").replace("-", "").isalnum():
        raise DataFormatError(f"{where}: prompt key {key!r} must be letters, digits, '-' or '_'")
    return Prompt(key, text)


def read_prompts_file(path: str | Path) -> list[Prompt]:
    """YAML (a mapping key -> text, or a list of texts) or plain text (one prompt per line, # comments)."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"--prompts {path}: no such file")
    text = read_text(path)  # UTF-8 (a byte-order mark is dropped); other encodings name the line and byte
    if path.suffix in (".yaml", ".yml"):
        data = read_yaml(path, "YAML")
        if isinstance(data, dict):
            return [_checked(str(k), v, str(path)) for k, v in data.items()]
        if isinstance(data, list):
            return [_checked(f"line{i + 1}", v, f"{path} item {i + 1}") for i, v in enumerate(data)]
        raise DataFormatError(f"{path}: expected a mapping of key: prompt, or a list of prompts")
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            out.append(_checked(f"line{n}", line.strip(), f"{path} line {n}"))
    if not out:
        raise DataFormatError(f"{path}: no prompts (one per line; blank and # lines are skipped)")
    return out


def resolve_prompts(texts: tuple[str, ...] = (), file: str | None = None) -> list[Prompt]:
    # A --prompt that is one of the paper's keeps the paper's key, so analyses and figures find it.
    paper_key = {text: key for key, text in PAPER_PROMPTS.items()}
    prompts = [
        _checked(paper_key.get(t, f"prompt{i + 1}"), t, f"--prompt #{i + 1}") for i, t in enumerate(texts)
    ]
    if file:
        prompts += read_prompts_file(file)
    if not prompts:
        prompts = [Prompt(k, v) for k, v in PAPER_PROMPTS.items()]
    keys = [p.key for p in prompts]
    if len(set(keys)) != len(keys):
        raise DataFormatError(f"duplicate prompt keys: {sorted({k for k in keys if keys.count(k) > 1})}")
    return prompts


def prompts_from(value) -> list[Prompt]:
    """The Python API's ``prompt`` argument: a text, a list of texts (keyed as ``--prompt`` keys them: the paper's
    own key, else ``prompt1``, ...) or a mapping key -> text; each checked as a prompt file's rows are."""
    from collections.abc import Mapping

    if isinstance(value, str):
        return resolve_prompts((value,))
    if isinstance(value, Mapping):
        prompts = [_checked(str(k), v, "prompt mapping") for k, v in value.items()]
    else:
        prompts = resolve_prompts(tuple(value)) if len(value) else []
    if not prompts:
        raise DataFormatError("no prompt given")
    return prompts
