"""Prompts: the paper's three by default, or the user's (``--prompt TEXT``, ``--prompts FILE``); a persona grid
(``--systems FILE``) crosses them with system prompts, one of them the control."""

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
    """One prompt to score under. In a persona grid (`persona_grid`) the key is ``<prompt>@<persona>``, ``system``
    the persona's system prompt (None: the template's own, a control without one), ``base`` the prompt's own key."""

    key: str
    text: str
    persona: str | None = None
    system: str | None = None
    base: str | None = None

    def system_or(self, default: str | None) -> str | None:
        """The system prompt to render: the persona's in a grid, else the run's ``--system``."""
        return self.system if self.persona is not None else default

    def meta(self) -> dict:
        """What a run records of a grid cell beside the prompt's text (nothing outside a grid)."""
        return {} if self.persona is None else {"persona": self.persona, "base_prompt": self.base}


def _check_key(key: str, what: str, where: str) -> None:
    """Prompt and persona keys name files and grid cells: letters, digits, '-' or '_'."""
    if not key.replace("_", "").replace("-", "").isalnum():
        raise DataFormatError(f"{where}: {what} key {key!r} must be letters, digits, '-' or '_'")


def _checked(key: str, text: object, where: str) -> Prompt:
    if not isinstance(text, str):
        raise DataFormatError(f"{where}: prompt {key!r} is {a_type(text)}, not a string")
    if not text.strip():
        raise DataFormatError(f"{where}: prompt {key!r} is empty")
    _check_key(key, "prompt", where)
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


# a persona grid's control: the key of --systems that every other persona is compared with (--control)
CONTROL = "control"
PERSONA_SEP = "@"


def read_systems_file(path: str | Path) -> dict[str, str | None]:
    """``--systems FILE``: YAML ``key: system prompt``. A key's value may be empty (``control:`` or ``""``): no
    system message, the chat template's own default (the usual control)."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"--systems {path}: no such file")
    data = read_yaml(path, "YAML")
    if not isinstance(data, dict) or not data:
        raise DataFormatError(f"{path}: expected a YAML mapping of key: system prompt (one key the control)")
    out: dict[str, str | None] = {}
    for key, text in data.items():
        key = str(key)
        _check_key(key, "persona", str(path))
        if text is not None and not isinstance(text, str):
            raise DataFormatError(f"{path}: persona {key!r} is {a_type(text)}, not a system prompt (text)")
        out[key] = text if text and text.strip() else None
    return out


def persona_grid(prompts: list[Prompt], systems: dict[str, str | None], control: str = CONTROL,
                 where: str = "--systems") -> list[Prompt]:
    """Every prompt under every persona (the control first): keys ``<prompt>@<persona>``."""
    if control not in systems:
        raise DataFormatError(f"{where}: no persona {control!r} to compare the others with (has "
                              f"{', '.join(systems)}); name the control with --control KEY")
    if len(systems) < 2:
        raise DataFormatError(f"{where}: only the control persona {control!r}; a grid compares at least one persona "
                              "with it")
    order = [control] + [k for k in systems if k != control]
    return [Prompt(f"{p.key}{PERSONA_SEP}{k}", p.text, k, systems[k], p.key) for p in prompts for k in order]


def grid_for(config) -> list[Prompt]:
    """A command's prompts: ``--prompt``/``--prompts``, crossed with ``--systems`` where given."""
    prompts = resolve_prompts(config.prompt, config.prompts)
    if getattr(config, "systems", None):
        prompts = persona_grid(prompts, read_systems_file(config.systems), config.control)
    return prompts


def systems_from(value, control: str = CONTROL) -> tuple[dict[str, str | None] | None, str]:
    """The Python API's ``systems``: None, a YAML file's path, or a mapping key -> system prompt (None or "": no
    system message)."""
    if value is None:
        return None, control
    if isinstance(value, (str, Path)):
        return read_systems_file(value), control
    return {str(k): (v if v and str(v).strip() else None) for k, v in dict(value).items()}, control


def persona_meta(config, prompts: list[Prompt], tokenizer=None, date_string: str | None = None,
                 fed: dict[str, str | None] | None = None) -> dict:
    """A run's ``personas`` section (empty outside a grid): the file, the control and each persona's system prompt,
    from the grid's cells (`grid_for`); with ``tokenizer``, ``template_system``: the system text its chat template
    writes for a persona without a system message (`template.template_system_text`; None: no system text); with
    ``fed`` (prompt key -> the system message the model was fed), ``systems_fed``: each persona the model was fed
    another system message than its own (the model card's or the judge prompt's, for a persona without one)."""
    if not getattr(config, "systems", None):
        return {}
    systems = {p.persona: p.system for p in prompts if p.persona is not None}
    out = {"file": str(config.systems), "control": config.control, "systems": systems}
    other = {p.persona: fed[p.key] for p in prompts if p.persona is not None and fed is not None and p.key in fed
             and fed[p.key] != p.system}
    if other:
        out["systems_fed"] = other
    if tokenizer is not None and None in systems.values():
        from probe.core.template import DEFAULT_DATE, template_system_text

        out["template_system"] = template_system_text(tokenizer, prompts[0].text, date_string or DEFAULT_DATE)
    return {"personas": out}


def a_type(value) -> str:
    """A YAML value's type with its article, as a message names it: "an int", "a list", "a dict"."""
    name = type(value).__name__
    return ("an " if name[:1] in "aeiou" else "a ") + name


def system_label(personas: dict, persona: str) -> str:
    """What ``persona``'s prefix holds in the system's place, in words: its system prompt, or, for none, what the
    chat template wrote instead (a run made before rm-probe recorded it: said so)."""
    text = personas["systems"].get(persona)
    if text:
        return repr(text)
    if persona in personas.get("systems_fed", {}):
        return f"no system message of its own: the model's own system turn, {personas['systems_fed'][persona]!r}"
    if "template_system" not in personas:
        return "no system message (what the chat template wrote instead was not recorded in this run)"
    default = personas["template_system"]
    if default:
        return f"no system message: the chat template wrote its own default system prompt, {default!r}"
    return "no system message, and the chat template wrote " + ("an empty system block" if default == "" else
                                                                "no system text")
