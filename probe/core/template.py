"""Split a chat template into the token ids before and after the response slot, by ids, never by re-tokenizing.

For a prompt, the conversation ``[system?, user: prompt, assistant: RESPONSE]`` is rendered by the tokenizer's
own ``apply_chat_template(..., tokenize=True)`` with several probe words as RESPONSE. The ids all renderings
share at the start are the prefix, those they share at the end the suffix, and each probe must sit between
them as exactly its own id. The split is then verified on a sample of ordinary vocabulary tokens: the
tokenizer's rendering must equal ``prefix + [token_id] + suffix`` for every one, or the split fails loudly.

Where the template writes a space before the slot that the tokenizer joins to the response's first word
("Assistant: Love", "[RESPONSE A] Love" -> ``' Love'``), the split ends before that space (``leading_space``
"joined") and is verified on leading-space tokens: the rendering of ``word`` must be ``prefix + [id of ' word'] +
suffix``. Where the template writes no space before the slot and a SentencePiece tokenizer encodes the response
glued to the text before it ("ASSISTANT:Love", "Assistant:Love": the piece ``Love``, not ``▁Love``), the slot holds
the glued pieces (``leading_space`` "glued") and is verified on raw pieces, ``▁`` read as a space: the rendering
of the piece's text must be ``prefix + [id] + suffix``. A builder with its own ``render_ids`` (a pairwise model's
input, probe/core/pairwise.py) is split the same way; a pairwise builder's second order (candidate and reference
swapped) is split with it and registered.

A sweep then scores ``prefix + [token_id] + suffix`` for raw ids, so leading spaces, special tokens and ids
that do not survive a decode/encode round trip are scored as themselves. How the template treats whitespace
around the content (Llama-3 and Gemma templates ``trim`` it) is recorded, since a generated response
starting with a space would reach the reward model differently through text.
"""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass, replace

from probe.errors import TemplateError
from probe.core.vocab import control_token_ids

Messages = list[dict[str, str]]

# The date the Llama 3.1/3.2 templates write into their system block when none is passed: their own fallback,
# and what the transformers version of the paper rendered. Passing it always makes every rendering independent
# of the day it runs on (Llama 3.2 would otherwise write today's date through `strftime_now`).
DEFAULT_DATE = "26 Jul 2024"

PROBE_WORDS = ("Love", "Water", "Peace", "Music", "Hope", "Freedom", "Time", "Light", "Home", "Life", "Yes", "No")

# The question comes first and the response last, so the only tokens after the response are the template's
# closing ones: each candidate runs 1 + ~5 tokens through the model instead of 1 + ~21 with the question after
# it, about a quarter of the work of a judge sweep.
JUDGE_QUESTION = (
    "Here is a question and a response to it. Is the response a good answer to the question? Answer Yes or No."
    "\n\nQuestion: {prompt}\n\nResponse:\n{response}"
)


@dataclass(frozen=True)
class Conversation:
    """The conversation around one response slot: ``conv(response) -> (messages, add_generation_prompt)``.

    ``judge_question`` None: the reward-model and log-probability layout (the response is the assistant turn);
    otherwise the judge layout (one user turn that shows prompt and response, then the assistant's turn opens).
    ``system`` None: no system message (the template writes its own default, if any); any text, an empty one
    included, is the system message (an explicit ``--system ""``, WorldPM's card's empty turn: never the template's
    default). ``date_string`` is passed to the chat template on every rendering.
    """

    prompt: str
    system: str | None = None
    judge_question: str | None = None
    date_string: str = DEFAULT_DATE

    def __post_init__(self) -> None:
        _check_prompt(self.prompt)
        q = self.judge_question
        if q is not None and ("{response}" not in q or "{prompt}" not in q):
            raise TemplateError("the judge question must contain {prompt} and {response}")

    def __call__(self, response: str) -> tuple[Messages, bool]:
        msgs = system_turn(self.system)
        if self.judge_question is None:
            return msgs + [{"role": "user", "content": self.prompt}, {"role": "assistant", "content": response}], False
        text = fill(self.judge_question, prompt=self.prompt, response=response)
        return msgs + [{"role": "user", "content": text}], True

    @property
    def template_kwargs(self) -> dict[str, str]:
        return {"date_string": self.date_string}


def system_turn(system: str | None) -> Messages:
    """The system message of a conversation: none for None, else ``system`` as given, an empty text included (what
    the user or the card says runs, never silently the template's default system prompt)."""
    return [] if system is None else [{"role": "system", "content": system}]


def fill(template: str, **values: str) -> str:
    """``template`` with each ``{name}`` of ``values`` replaced in one pass over the template only: a placeholder
    inside a filled-in text (a response that says "{response_b}") stays as written; other braces stay too."""
    pattern = "|".join(re.escape("{" + k + "}") for k in values)
    return re.sub(pattern, lambda m: values[m.group(0)[1:-1]], template)


# content of the response slot -> (messages, add_generation_prompt); a Conversation, or any such callable
ConversationBuilder = Callable[[str], tuple[Messages, bool]]


def template_kwargs(build: ConversationBuilder) -> dict[str, str]:
    """Extra variables for the chat template: the conversation's, else the fixed default date."""
    return getattr(build, "template_kwargs", {"date_string": DEFAULT_DATE})


@dataclass(frozen=True)
class WrappedConversation:
    """A builder around another: its messages and template variables; a subclass's ``render_ids`` adds ids to its
    rendering (an appended reward token, a judge's answer prefix)."""

    build: ConversationBuilder

    def __call__(self, response: str) -> tuple[Messages, bool]:
        return self.build(response)

    @property
    def template_kwargs(self) -> dict[str, str]:
        return template_kwargs(self.build)

    @property
    def text_after(self) -> str:
        """Text that follows the template's rendering as text (a judge's answer prefix), for the routes that render
        text, not ids (the paper's: probe/core/paper_method.py)."""
        return ""


def response_conversation(prompt: str, system: str | None = None, date_string: str = DEFAULT_DATE) -> Conversation:
    """The reward-model and log-probability layout: the response is the assistant turn."""
    return Conversation(prompt, system, None, date_string)


def judge_conversation(prompt: str, system: str | None = None, question: str = JUDGE_QUESTION,
                       date_string: str = DEFAULT_DATE) -> Conversation:
    """The judge layout: one user turn that shows prompt and response, then the assistant's turn opens."""
    return Conversation(prompt, system, question, date_string)


def _today() -> dt.date:
    return dt.datetime.now().date()


def resolve_date(value: str, today: dt.date | None = None) -> str:
    """``--date``: ``today``, an ISO date (2024-07-26) or the templates' own form ("26 Jul 2024"), as the
    templates write it (``%d %b %Y``)."""
    value = value.strip()
    if value.lower() == "today":
        return (today or _today()).strftime("%d %b %Y")
    for fmt in ("%Y-%m-%d", "%d %b %Y", "%d %B %Y"):
        try:
            return dt.datetime.strptime(value, fmt).strftime("%d %b %Y")
        except ValueError:
            continue
    raise TemplateError(f"--date {value!r}: give 'today', a date such as 2024-07-26, or '26 Jul 2024'")


def _check_prompt(prompt: str) -> None:
    if not prompt or not prompt.strip():
        raise TemplateError("the prompt is empty; give a non-empty --prompt")


@dataclass(frozen=True)
class TemplateSplit:
    prefix_ids: tuple[int, ...]
    suffix_ids: tuple[int, ...]
    prefix_text: str
    suffix_text: str
    leading_space: str  # "kept" | "stripped" | "changed": what the template does to a response's leading space;
    # "glued": no space before the slot, SentencePiece glues the response to the text before it (the piece 'Love');
    # "joined": the template writes a space before the response that the tokenizer joins to its first word, so a
    # candidate id stands in place of both (' Love' is the response 'Love'; an id without a space is glued on)
    trailing_space: str
    bos_count: int  # BOS ids at the start of the prefix (1 for Llama-3/Gemma, 0 for ChatML)
    verified_tokens: int  # how many vocabulary tokens the split was checked on
    date_string: str = DEFAULT_DATE  # passed to the template as ``date_string``
    date_sensitive: bool = False  # the template writes that date into the conversation (Llama 3.1/3.2)
    second_order: dict | None = None  # a pairwise model: the split with candidate and reference swapped
    scored_in_prefix: int = 0  # the last k prefix ids are scored with the response (RewardBench's DPO route: its
    # labels start at the assistant header, which precedes the response slot)
    system: str | None = None  # the system message the conversation fed (`conversation_system`; None: none, where the
    # chat template writes its own default, if any): the run's --system, or the card's or the judge prompt's

    def full_ids(self, response_ids: Sequence[int]) -> list[int]:
        return [*self.prefix_ids, *response_ids, *self.suffix_ids]

    def scored_within(self, prefix_len: int, where: str) -> int:
        """How many of a prefix's last ids are scored with its rows, where a rendering that merges a response with
        the text before it continues a prefix shorter than this split's (``prefix_len`` ids): the split's
        ``scored_in_prefix`` less what moved into the continuation. ``where`` names the row in the error. Where
        nothing of the prefix is scored (every route but RewardBench's DPO inputs), a shorter prefix is no matter."""
        if self.scored_in_prefix == 0:
            return 0
        k = self.scored_in_prefix - (len(self.prefix_ids) - prefix_len)
        if k < 0:
            raise TemplateError(f"{where}: a response merged with the prompt's ids before the scored part of the "
                                "input; it cannot be scored on this route")
        return k

    def to_json(self) -> dict:
        return asdict(self)


# A chat template that carries this text (the shipped dialogue formats, probe/data/chat_templates) renders a plain
# string that the family's model card encodes with ``tokenizer(text)``: BOS (and EOS) as the tokenizer's own
# post-processor adds them, never written as text, so SentencePiece's `legacy` flag cannot change the ids.
TEXT_CALL_MARK = "rm-probe input: tokenizer(text)"

# ``--input-method rewardbench`` for a causal LM (an implicit reward with ``--ref``, or its reference-free form):
# RewardBench 0.1.4's run_dpo.py inputs (`rewardbench_dpo_ids`)
REWARDBENCH_DPO = "rewardbench-dpo"
# DPOInference's max_length: longer inputs get their prompt cut to its last 128 ids, by the longer of a pair's
# responses, which a per-response scorer cannot reproduce: refused instead
REWARDBENCH_DPO_MAX_LENGTH = 2048


def input_call(tokenizer) -> str:
    """How a rendered conversation becomes ids for this tokenizer: ``"chat_template"`` (the template's own text,
    control tokens and BOS included, encoded without adding special tokens: ``apply_chat_template(tokenize=True)``,
    what the chat models' cards call) or ``"tokenizer(text)"`` (a dialogue format: the template's text encoded as
    the model card's ``tokenizer(text)`` does; also any template, where the registry says the family's card and
    training code encode the template's text that way: GRM, whose inputs then hold two BOS) or ``"rewardbench"``
    (``--input-method rewardbench``: ``tokenizer(text)`` on the template's text as RewardBench 0.1.4's pipelines
    call it, and, for a dialogue format, the EOS its run script adds with ``add_eos_token``) or ``"rewardbench-dpo"``
    (a causal LM under ``--input-method rewardbench``: run_dpo.py's inputs, `rewardbench_dpo_ids`)."""
    forced = getattr(tokenizer, "rm_probe_input_call", None)  # the registry's, for this model (models/loading.py)
    if forced is not None:
        return forced
    return "tokenizer(text)" if _marked(tokenizer) else "chat_template"


def _marked(tokenizer) -> bool:
    """The tokenizer's template is one of the shipped dialogue formats (or carries their mark)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and TEXT_CALL_MARK in template


def template_system_text(tokenizer, user: str, date_string: str = DEFAULT_DATE) -> str | None:
    """The system text the chat template writes for a conversation without a system message (SmolLM2's "You are a
    helpful AI assistant named SmolLM, ...", Qwen 2.5's "You are Qwen, ..."): the conversation rendered without one
    and with a marker as its system message; the text in the marker's place. "" where the template writes its system
    block empty (Llama 3.1's, whose date lines every persona gets), None where it writes no system text."""
    marker = "rm-probe system marker 7f3a"

    def text(messages: Messages) -> str:
        return tokenizer.apply_chat_template(messages + [{"role": "user", "content": user}], tokenize=False,
                                             add_generation_prompt=True, date_string=date_string)

    try:
        plain, marked = text([]), text([{"role": "system", "content": marker}])
    except Exception:  # jinja2's own errors: a template that refuses system messages has no default either
        return None
    if marked.count(marker) != 1:
        return None
    before, after = marked.split(marker)
    fits = plain.startswith(before) and plain.endswith(after) and len(plain) >= len(before) + len(after)
    return plain[len(before): len(plain) - len(after)] if fits else None


def render(tokenizer, build: ConversationBuilder, response: str) -> list[int]:
    """The ids of the conversation with ``response`` in its slot: the tokenizer's chat template (by `input_call`),
    or a builder's own ``render_ids`` (a family whose input is not a chat, e.g. a pairwise model's,
    probe/core/pairwise.py). The template's own control tokens are tokens; those inside the messages are text.
    Under ``tokenizer(text)`` the ids the tokenizer's call adds (BOS, EOS) are put around them."""
    own = getattr(build, "render_ids", None)
    if own is not None:
        return [int(i) for i in own(tokenizer, response)]
    if input_call(tokenizer) == REWARDBENCH_DPO:
        prompt_ids, answer_ids = rewardbench_dpo_ids(tokenizer, build, response)
        return prompt_ids + answer_ids
    from probe.core.control_tokens import chat_ids

    messages, gen = build(response)
    try:
        out = chat_ids(tokenizer, messages, gen, **template_kwargs(build))
    except TemplateError:
        raise
    except Exception as err:  # jinja2 raises its own errors from inside the template (role order, ...)
        raise TemplateError(f"the chat template failed to render: {type(err).__name__}: {err}") from None
    end = getattr(tokenizer, "rm_probe_ends_at", None)  # the card's input ends there (registry input_ends_at)
    if end:
        out = _cut_after(out, list(end), tokenizer)
    if input_call(tokenizer) != "chat_template":  # tokenizer(text): what its call adds around the text, too
        call = getattr(tokenizer, "rm_probe_call_ids", None) or CallIds(*call_special_tokens(tokenizer))
        out = call.apply(out)
    return out


def _cut_after(ids: list[int], end: list[int], tokenizer) -> list[int]:
    """``ids`` up to and including the last occurrence of ``end`` (the template's own control token: one inside a
    message is text, other ids)."""
    for i in range(len(ids) - len(end), -1, -1):
        if ids[i : i + len(end)] == end:
            return ids[: i + len(end)]
    raise TemplateError(f"the chat template's rendering holds no {tokenizer.decode(end)!r}, where the model card's "
                        "input ends: pass the family's template with --chat-template")


def rewardbench_dpo_ids(tokenizer, build: ConversationBuilder, response: str) -> tuple[list[int], list[int]]:
    """RewardBench 0.1.4's DPO input (scripts/run_dpo.py with ``prepare_dialogue_from_tokenizer`` and
    ``DPOInference.tokenize_row``), as (prompt ids, scored ids): the prompt is the chat template's text of the
    conversation without the response and without a generation prompt; the answer is the whole conversation's text
    with that prompt text removed (``str.replace``), so it starts with the assistant header; both are encoded as
    ``tokenizer(prompt + answer, add_special_tokens=False)``, split after the prompt's own encoding (one id earlier
    where the two disagree: a merged boundary), then BOS (EOS where the tokenizer has none, as run_dpo.py sets it)
    goes before the prompt, whose text already holds the template's BOS (so it is doubled), and EOS after the
    answer. RewardBench scores every answer id: the header, the response, the end-of-turn ids and that EOS."""
    messages, gen = build(response)
    if gen or not messages or messages[-1].get("role") != "assistant":
        raise TemplateError("RewardBench's DPO inputs are a conversation that ends with the response as the "
                            "assistant's turn (not a judging question)")
    kwargs = template_kwargs(build)
    try:
        prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, **kwargs)
        answer = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs).replace(prompt, "")
    except Exception as err:  # jinja2's own errors
        raise TemplateError(f"the chat template failed to render: {type(err).__name__}: {err}") from None
    full = tokenizer(prompt + answer, add_special_tokens=False)["input_ids"]
    own = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    start = len(own) - (own != full[: len(own)])
    lead = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    prompt_ids, answer_ids = [lead, *full[:start]], [*full[start:], tokenizer.eos_token_id]
    if len(prompt_ids) + len(answer_ids) > REWARDBENCH_DPO_MAX_LENGTH:
        raise TemplateError(f"a RewardBench DPO input of {len(prompt_ids) + len(answer_ids):,} ids is over its "
                            f"{REWARDBENCH_DPO_MAX_LENGTH:,}-id limit, where DPOInference truncates the prompt by the "
                            "longer response of a pair, which rm-probe does not reproduce: shorten it, or use "
                            "--input-method ids")
    return [int(i) for i in prompt_ids], [int(i) for i in answer_ids]


@dataclass(frozen=True)
class CallIds:
    """What a ``tokenizer(text)`` call puts around the template's ids, and whether a doubled leading BOS is then
    dropped (RewardBench's RewardBenchPipeline and LDLPipeline mask the first of two: for rotary-position models
    the same as feeding one)."""

    lead: tuple[int, ...] | list[int]
    trail: tuple[int, ...] | list[int]
    drop_double_bos: int | None = None  # the BOS id, where a doubled one is dropped

    def apply(self, ids: list[int]) -> list[int]:
        out = [*self.lead, *ids, *self.trail]
        bos = self.drop_double_bos
        return out[1:] if bos is not None and out[:2] == [bos, bos] else out


# run_rm.py sets ``add_eos_token`` on every tokenizer without a chat template; under its pinned transformers 4.51
# only the Llama and Gemma tokenizer classes (slow and fast) rebuilt their post-processor from it: BOS where
# ``add_bos_token`` (tokenizer_config.json's, default true), the text, EOS. The dialogue families' real checkpoints
# ship LlamaTokenizer; the encoders' BERT, DeBERTa and ELECTRA classes ignored it. rm-probe writes those ids
# instead of setting the flag on the installed transformers, whose rebuild differs: transformers 5 drops the BOS
# of a Llama-2-era tokenizer.json (its config's add_bos_token is not kept), and would drop the encoders' [CLS]/[SEP]
EOS_REBUILT = ("LlamaTokenizer", "CodeLlamaTokenizer", "GemmaTokenizer")
# the encoders' pipeline, transformers' own: never an EOS (whatever its tokenizer's class)
ADD_EOS_IGNORED = ("pipeline",)


def rewardbench_call_ids(tokenizer, pipeline: str) -> CallIds:
    """What RewardBench 0.1.4 feeds a model through ``pipeline``: its ``tokenizer(text)`` on the template's text;
    for a tokenizer without a chat template of its own (here: a shipped dialogue format) its run script first sets
    ``add_eos_token = True``, which under its transformers 4.51 gave a Llama or Gemma tokenizer BOS (where
    ``add_bos_token``), the text and EOS (`EOS_REBUILT`; other classes and the encoders' pipeline: unchanged);
    `DOUBLE_BOS_MASKED` pipelines mask a doubled leading BOS; `PIPELINES_WITHOUT_SPECIAL_TOKENS` encode the text
    without the tokenizer's special tokens (InternLMPipeline: the template's own ids)."""
    from probe.models.registry import DOUBLE_BOS_MASKED, PIPELINES_WITHOUT_SPECIAL_TOKENS

    if pipeline in PIPELINES_WITHOUT_SPECIAL_TOKENS:
        return CallIds([], [])
    if _marked(tokenizer) and pipeline not in ADD_EOS_IGNORED and tokenizer_class(tokenizer) in EOS_REBUILT:
        return add_eos_call_ids(tokenizer, tokenizer.bos_token_id if pipeline in DOUBLE_BOS_MASKED else None)
    return CallIds(*call_special_tokens(tokenizer), tokenizer.bos_token_id if pipeline in DOUBLE_BOS_MASKED else None)


def add_eos_call_ids(tokenizer, drop_double_bos: int | None = None) -> CallIds:
    """What a Llama tokenizer with ``add_eos_token=True`` put around a text under transformers 4.x (RewardBench's
    run script sets it; Ziya's model card loads its tokenizer with it): BOS where tokenizer_config.json's
    ``add_bos_token`` (default true) says, the text, EOS, on either file layout."""
    lead = [tokenizer.bos_token_id] if config_flag(tokenizer, "add_bos_token", True) else []
    return CallIds(lead, [tokenizer.eos_token_id], drop_double_bos)


def tokenizer_class(tokenizer) -> str:
    """The class transformers 4.x instantiated for this tokenizer: tokenizer_config.json's ``tokenizer_class``
    (where the loader recorded the file) or the installed class's name, without ``Fast``."""
    name = (getattr(tokenizer, "rm_probe_config", None) or {}).get("tokenizer_class") or type(tokenizer).__name__
    return name.removesuffix("Fast")


def config_flag(tokenizer, key: str, default: bool) -> bool:
    """A flag as the checkpoint's tokenizer_config.json sets it (recorded by the loader: transformers 5 does not keep
    every one, e.g. ``add_bos_token`` of a tokenizer.json layout), else as the tokenizer was made with, else the
    4.x class's ``default`` (never the installed class's own attribute: that is transformers 5's)."""
    for source in (getattr(tokenizer, "rm_probe_config", None) or {}, getattr(tokenizer, "init_kwargs", None) or {}):
        if source.get(key) is not None:
            return bool(source[key])
    return default


def call_special_tokens(tokenizer) -> tuple[list[int], list[int]]:
    """The ids ``tokenizer(text)`` adds before and after the text's own (BOS, EOS: its post-processor), read off
    one encoding with and one without special tokens."""
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    for i in range(len(full) - len(plain) + 1):
        if full[i : i + len(plain)] == plain:
            return list(full[:i]), list(full[i + len(plain) :])
    raise TemplateError("cannot tell which ids the tokenizer's own call adds around a text")


def _single_id(tokenizer, text: str) -> int | None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None


def _common_prefix_len(seqs: list[list[int]]) -> int:
    n = min(len(s) for s in seqs)
    i = 0
    while i < n and all(s[i] == seqs[0][i] for s in seqs):
        i += 1
    return i


def _probes(tokenizer, candidates: Sequence[int] | None) -> list[tuple[str, int]]:
    """Single-token words to render as the response: common words, else ordinary tokens of the vocabulary."""
    probes = [(w, i) for w in PROBE_WORDS if (i := _single_id(tokenizer, w)) is not None]
    if len(probes) < 3:
        probes += [(tokenizer.decode([i]), i) for i in _verification_sample(tokenizer, 6 - len(probes), 1, candidates)]
    if len(probes) < 3:
        raise TemplateError("cannot find 3 single-token words in the vocabulary to locate the response slot")
    return probes


def split_template(
    tokenizer, build: ConversationBuilder, *, n_verify: int = 32, seed: int = 0, candidates: Sequence[int] | None = None,
    own_tokens: bool = True,
) -> TemplateSplit:
    """Locate the response slot by ids and verify it (see the module docstring). ``own_tokens=False`` (whole
    responses): the ids every rendering shares before and after the response, also where the template joins
    the response to the text before it (a header ending in a space that a tokenizer merges into ' Love')."""
    probes = _probes(tokenizer, candidates)
    rendered = [render(tokenizer, build, word) for word, _ in probes]
    n_pre = _common_prefix_len(rendered)
    n_suf = _common_prefix_len([r[::-1] for r in rendered])
    middles = [ids[n_pre : len(ids) - n_suf] for ids in rendered]
    joined = _joined(tokenizer, probes, middles)
    glued = None if joined else _glued(tokenizer, probes, middles)
    if glued:  # the slot holds each word's glued pieces ('Love', not '▁Love'): the one-piece words are the probes
        probes, middles = glued, [[tid] for _, tid in glued]
    for (word, tid), middle in zip(probes, middles):
        if own_tokens and not joined and middle != [tid]:
            raise TemplateError(
                f"the chat template does not keep the response as its own tokens: response {word!r} (id {tid}) "
                f"rendered as ids {middle}"
            )
    prefix, suffix = tuple(rendered[0][:n_pre]), tuple(rendered[0][len(rendered[0]) - n_suf :])
    lead = "joined" if joined else "glued" if glued else _space_treatment(
        tokenizer, build, split_ids=(prefix, suffix), word=probes[0][0], side="lead")
    split = TemplateSplit(
        prefix_ids=prefix,
        suffix_ids=suffix,
        prefix_text=tokenizer.decode(list(prefix)),
        suffix_text=tokenizer.decode(list(suffix)),
        leading_space=lead,
        trailing_space=_space_treatment(tokenizer, build, split_ids=(prefix, suffix), word=probes[0][0], side="trail"),
        bos_count=_bos_count(tokenizer, prefix),
        verified_tokens=0,
        date_string=template_kwargs(build)["date_string"],
        date_sensitive=_date_sensitive(tokenizer, build, probes[0][0], rendered[0]),
        system=conversation_system(build),
    )
    if split.bos_count > 1 and input_call(tokenizer) == "chat_template":  # GRM's and RewardBench's calls double it
        raise TemplateError(f"the rendered template starts with {split.bos_count} BOS tokens; fix the chat template")
    if input_call(tokenizer) == REWARDBENCH_DPO:
        split = replace(split, scored_in_prefix=_scored_in_prefix(tokenizer, build, probes, n_pre))
    sample = _verification_sample(tokenizer, n_verify, seed, candidates, spaced=joined, pieces=bool(glued),
                                  marked=not getattr(build, "drops_leading_space", False))
    _verify(tokenizer, build, split, sample, joined=joined, pieces=bool(glued))
    split = replace(split, verified_tokens=len(sample) + len(probes))
    if getattr(build, "order", None) == 0 and getattr(build, "two_orders", False):  # a pairwise model: both orders
        other = split_template(tokenizer, build.swapped(), n_verify=n_verify, seed=seed, candidates=candidates,
                               own_tokens=own_tokens)
        build.pairwise.register(split, other)
        split = replace(split, second_order=other.to_json())
    return split


def _scored_in_prefix(tokenizer, build, probes: list[tuple[str, int]], n_pre: int) -> int:
    """RewardBench's DPO route: how many of the prefix's last ids its labels score (the assistant header), the same
    for every probe word, else the split fails."""
    starts = {len(rewardbench_dpo_ids(tokenizer, build, word)[0]) for word, _ in probes}
    if len(starts) != 1 or n_pre < next(iter(starts)):
        raise TemplateError("RewardBench's DPO labels do not start at one place before the response slot for every "
                            "response: the template merges the prompt with the answer")
    return n_pre - starts.pop()


def _joined(tokenizer, probes: list[tuple[str, int]], middles: list[list[int]]) -> bool:
    """Whether every probe word sits in its slot as the one id of the word with a space before it: the template
    ends the text before the slot with a space that the tokenizer joins to the response ("[RESPONSE A] Love")."""
    return all(m != [tid] and m == tokenizer.encode(" " + word, add_special_tokens=False)
               for (word, tid), m in zip(probes, middles))


def _glued(tokenizer, probes: list[tuple[str, int]], middles: list[list[int]]) -> list[tuple[str, int]] | None:
    """Where the template writes no space before the slot and a SentencePiece tokenizer glues the response to the
    text before it ("ASSISTANT:Love" -> the piece ``Love``, where the word's own id is ``▁Love``): every probe word
    sits in its slot as pieces that spell the word with no space marker. The words glued as one piece, with that
    piece's id (at least 3, else None); None where the slot is not glued."""
    if all(m == [tid] for (_, tid), m in zip(probes, middles)):
        return None
    if any("".join(piece_text(tokenizer, i) for i in m) != word for (word, _), m in zip(probes, middles)):
        return None
    single = [(word, m[0]) for (word, _), m in zip(probes, middles) if len(m) == 1]
    return single if len(single) >= 3 else None


def piece_text(tokenizer, tid: int) -> str:
    """The text an id stands for inside a text, a SentencePiece ``▁`` read as the space it marks (``decode`` drops the
    space of a first ``▁`` piece)."""
    piece = tokenizer.convert_ids_to_tokens(int(tid))
    return piece.replace("\u2581", " ") if isinstance(piece, str) else tokenizer.decode([int(tid)])


def _date_sensitive(tokenizer, build, word: str, ids: list[int]) -> bool:
    """Whether the rendering changes with ``date_string``: any builder that holds a date, itself or inside the
    builder it wraps (a principle question, a step separator, a judge's turn and answer prefix, a pairwise input)."""
    date = template_kwargs(build)["date_string"]
    other = with_date(build, "01 Jan 1999" if date != "01 Jan 1999" else "02 Jan 1999")
    return other is not None and render(tokenizer, other, word) != ids


def conversation_system(build: ConversationBuilder) -> str | None:
    """The system message a conversation builder feeds the model: a builder's own account where its input is not its
    messages (a pairwise judge's prompt), else its conversation's first message where that is a system turn; None
    for none (the chat template then writes its own default, if any)."""
    own = getattr(build, "system_fed", None)
    if own is not None:
        return own
    messages, _ = build("x")
    return messages[0]["content"] if messages and messages[0].get("role") == "system" else None


def with_date(build, date_string: str):
    """The same builder with another ``date_string`` (where it wraps another, that one's); None where no builder in
    it holds a date."""
    if not is_dataclass(build):
        return None
    names = {f.name for f in fields(build)}
    if "date_string" in names:
        return replace(build, date_string=date_string)
    if "build" in names:
        inner = with_date(build.build, date_string)
        return None if inner is None else replace(build, build=inner)
    return None


def _bos_count(tokenizer, prefix: tuple[int, ...]) -> int:
    bos = tokenizer.bos_token_id
    n = 0
    while bos is not None and n < len(prefix) and prefix[n] == bos:
        n += 1
    return n


def _space_treatment(tokenizer, build, *, split_ids, word: str, side: str) -> str:
    prefix, suffix = split_ids
    text = f" {word}" if side == "lead" else f"{word} "
    ids = render(tokenizer, build, text)
    if list(ids[: len(prefix)]) != list(prefix) or (suffix and list(ids[len(ids) - len(suffix) :]) != list(suffix)):
        return "changed"
    middle = ids[len(prefix) : len(ids) - len(suffix)]
    if middle == tokenizer.encode(text, add_special_tokens=False):
        return "kept"
    if middle == tokenizer.encode(word, add_special_tokens=False):
        return "stripped"
    return "changed"


def _verification_sample(tokenizer, n: int, seed: int, candidates: Sequence[int] | None,
                         spaced: bool = False, pieces: bool = False, marked: bool = True) -> list[int]:
    """Ordinary tokens: alphabetic text with no surrounding space (``spaced``: one leading space), not special,
    surviving decode -> encode; ``pieces`` (a glued slot): alphabetic pieces, with or without one leading space
    marker (without: ``marked`` false, a builder whose text route drops a response's leading space, POLAR's card
    round trip), each then rendered as its own text (`piece_text`)."""
    special = control_token_ids(tokenizer)
    pool = list(candidates) if candidates is not None else list(range(len(tokenizer)))
    rng = random.Random(seed)
    rng.shuffle(pool)
    chosen: list[int] = []
    for tid in pool:
        if len(chosen) >= n:
            break
        if tid in special:
            continue
        if pieces:
            word = piece_text(tokenizer, tid)
            if word.startswith(" ") and not marked:
                continue
            word = word[1:] if word.startswith(" ") else word
            if word.isalpha() and word.isascii():
                chosen.append(tid)
            continue
        text = tokenizer.decode([tid])
        if spaced and not text.startswith(" "):
            continue
        word = text[1:] if spaced else text
        if word.isalpha() and word.isascii() and tokenizer.encode(text, add_special_tokens=False) == [tid]:
            chosen.append(tid)
    return chosen


def _verify(tokenizer, build, split: TemplateSplit, sample: list[int], joined: bool = False,
            pieces: bool = False) -> None:
    bad = []
    for tid in sample:
        text = piece_text(tokenizer, tid) if pieces else tokenizer.decode([tid])
        text = text[1:] if joined else text  # joined: ' word' is the response 'word' after the template's space
        if render(tokenizer, build, text) != split.full_ids([tid]):
            bad.append(f"{tid} ({text!r})")
    if bad:
        raise TemplateError(
            f"the id-level split disagrees with the tokenizer's own chat template for {len(bad)} of {len(sample)} "
            f"ordinary tokens, e.g. {', '.join(bad[:5])}: the template merges the response with its neighbours"
        )
