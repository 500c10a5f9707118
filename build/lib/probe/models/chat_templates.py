"""Official chat templates of the model families, shipped for tokenizers that carry none.

GGUF files and some local copies come without a chat template, and a reward model is only meaningful on
the layout it was trained on. ``probe/data/chat_templates/<name>.jinja`` holds the templates exactly as the
families' instruct repositories publish them in ``tokenizer_config.json`` (see the README there);
``--chat-template NAME`` picks one, ``--chat-template FILE`` reads a Jinja file or a tokenizer_config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from probe.errors import TemplateError

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "data" / "chat_templates"


def template_names() -> list[str]:
    return sorted(p.stem for p in TEMPLATES_DIR.glob("*.jinja"))


def chat_template_text(name: str) -> str:
    path = TEMPLATES_DIR / f"{name}.jinja"
    if not path.is_file():
        raise TemplateError(f"no shipped chat template {name!r}; known: {', '.join(template_names())}")
    return path.read_text(encoding="utf-8")


def resolve_chat_template(arg: str) -> str:
    """``--chat-template``: a shipped template's name, a Jinja file, or a tokenizer_config.json holding one."""
    path = Path(arg).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise TemplateError(f"--chat-template {arg}: not UTF-8 text (byte {err.start})") from None
        if path.suffix != ".json":
            return text
        try:
            template = json.loads(text).get("chat_template")
        except (json.JSONDecodeError, AttributeError) as err:
            raise TemplateError(f"--chat-template {arg}: not a tokenizer_config.json ({err})") from None
        if not isinstance(template, str) or not template:
            raise TemplateError(f"--chat-template {arg}: the file has no chat_template string")
        return template
    if arg in template_names():
        return chat_template_text(arg)
    raise TemplateError(f"--chat-template {arg}: no such file, and not a shipped template "
                        f"({', '.join(template_names())})")
