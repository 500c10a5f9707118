"""Control tokens inside a conversation's messages stay text, on every transformers version rm-probe supports.

A response that says ``<|eot_id|>`` or a prompt that quotes ``<s>`` must reach the model as those characters, not as
the end-of-turn or BOS id: only the template's own control tokens are tokens. transformers 5.2x does this with
``apply_chat_template(..., sanitize_control_tokens=True)``. Earlier 5.x releases (5.0 to 5.17, the GPU machine's
among them) have no such argument: it reaches the Jinja template as an unused variable, and a ``<s>`` inside a
response becomes a second BOS, without a word. Where the argument is missing, `chat_ids` applies the same rule itself:

1. the control tokens are the tokenizer's added tokens that are special, or that the template writes literally
   (whitespace tokens such as Gemma's ``"\\n"`` excepted), or those it names in ``chat_control_tokens``;
2. each occurrence of one inside a message is wrapped in two private-use characters, the template renders the text,
3. and the text is encoded piece by piece: the wrapped tokens as plain text, the rest as usual. A piece that follows
   another is encoded after a newline that is then removed, so SentencePiece adds no word-start space there.

tests/unit/test_control_tokens.py checks that this gives the ids of transformers' own rule on real tokenizers.
"""

from __future__ import annotations

import functools
import inspect
import re

from probe.errors import TemplateError

OPEN, CLOSE = "\U000f0000", "\U000f0001"  # the first of the Supplementary Private Use Area-A, as transformers marks them:
# a message that holds one loses it in both rules alike


def native(tokenizer) -> bool:
    """Whether this transformers' ``apply_chat_template`` keeps the messages' control tokens as text itself."""
    return "sanitize_control_tokens" in inspect.signature(tokenizer.apply_chat_template).parameters


@functools.lru_cache(maxsize=64)
def template_literals(template: str) -> frozenset[str]:
    """Every literal string of a Jinja template: its text between tags and its string constants."""
    import jinja2
    from jinja2 import nodes

    try:  # transformers' own environment (trim_blocks, lstrip_blocks, its {% generation %} tag), as it renders
        from transformers.utils.chat_template_utils import _compile_jinja_template

        environment = _compile_jinja_template(template).environment
    except (ImportError, AttributeError, jinja2.TemplateError):
        environment = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    try:
        tree = environment.parse(template)
    except jinja2.TemplateSyntaxError:
        return frozenset({template})
    out = {node.data for node in tree.find_all(nodes.TemplateData)}
    out |= {node.value for node in tree.find_all(nodes.Const) if isinstance(node.value, str)}
    return frozenset(out)


def control_tokens(tokenizer, template: str) -> tuple[str, ...]:
    """The added tokens a message may not produce as tokens (see the module's rule 1), longest first."""
    added = list(tokenizer.added_tokens_decoder.values())
    named = getattr(tokenizer, "chat_control_tokens", None)
    if named is not None:
        found = [t.content for t in added if t.special or t.content in set(named)]
    else:
        literals = template_literals(template)
        found = [t.content for t in added
                 if t.special or (not t.content.isspace() and any(t.content in text for text in literals))]
    return tuple(sorted(set(found), key=len, reverse=True))


def _pattern(tokens: tuple[str, ...]) -> re.Pattern:
    return re.compile("|".join(map(re.escape, tokens)) or "(?!)")  # (?!) matches nothing


def _mark(obj, pattern: re.Pattern):
    """``obj`` (a string, or messages: lists and dicts of them) with each control token wrapped in OPEN/CLOSE."""
    if isinstance(obj, str):
        obj = obj.replace(OPEN, "").replace(CLOSE, "")
        return pattern.sub(lambda m: OPEN + m.group(0) + CLOSE, obj)
    if isinstance(obj, dict):
        return {k: _mark(v, pattern) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_mark(v, pattern) for v in obj]
    return obj


def chat_ids(tokenizer, messages, add_generation_prompt: bool, **template_kwargs) -> list[int]:
    """``apply_chat_template(messages, tokenize=True)`` with the messages' control tokens kept as text: by transformers
    where it can, else by the rule of this module."""
    if native(tokenizer):
        out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                            return_dict=False, sanitize_control_tokens=True, **template_kwargs)
        return [int(i) for i in (out[0] if out and isinstance(out[0], list) else out)]
    return marked_chat_ids(tokenizer, messages, add_generation_prompt, **template_kwargs)


def marked_chat_ids(tokenizer, messages, add_generation_prompt: bool, **template_kwargs) -> list[int]:
    """The rule of this module on any transformers version (`chat_ids` uses it where transformers has none)."""
    template = tokenizer.get_chat_template() if hasattr(tokenizer, "get_chat_template") else tokenizer.chat_template
    pattern = _pattern(control_tokens(tokenizer, template))
    text = tokenizer.apply_chat_template(_mark(messages, pattern), tokenize=False,
                                         add_generation_prompt=add_generation_prompt, **_mark(template_kwargs, pattern))
    return encode_marked(tokenizer, text)


def encode_marked(tokenizer, text: str) -> list[int]:
    """``text`` with its marked control tokens encoded as plain text and everything else as usual (a lone marker,
    left by a template that cut a marked token apart, is dropped but still separates the text around it)."""
    tokens = tuple(sorted(tokenizer.get_added_vocab(), key=len, reverse=True))
    splitter = re.compile(f"{OPEN}({_pattern(tokens).pattern}){CLOSE}|[{OPEN}{CLOSE}]")
    pieces = splitter.split(text)  # text, token (None for a lone marker), text, token, ..., text
    newline = tokenizer.encode("\n", add_special_tokens=False)
    ids = [int(i) for i in tokenizer.encode(pieces[0], add_special_tokens=False)]
    for i, piece in enumerate(pieces[1:], start=1):
        if not piece:
            continue
        as_text = i % 2 == 1
        got = _piece_ids(tokenizer, piece, as_text, newline)
        if as_text and tokenizer.convert_tokens_to_ids(piece) in got:
            raise TemplateError(f"the control token {piece!r} inside a message cannot be kept as text: this tokenizer "
                                "encodes its plain text as the token itself")
        ids += got
    return ids


def _piece_ids(tokenizer, piece: str, as_text: bool, newline: list[int]) -> list[int]:
    kwargs = {"add_special_tokens": False, **({"split_special_tokens": True} if as_text else {})}
    after = tokenizer.encode("\n" + piece, **kwargs)
    got = after[len(newline):] if after[: len(newline)] == newline else tokenizer.encode(piece, **kwargs)
    return [int(i) for i in got]
