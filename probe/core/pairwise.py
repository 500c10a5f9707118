"""Pairwise preference models: a response has no score of its own, only a preference over another response.
rm-probe scores each candidate against one fixed reference response (``--reference-response``), in both orders,
combined as the family's own pipeline combines them (RewardBench 0.1.4, ``rewardbench/models/``):

| format | family (RewardBench pipeline) | input | one order gives | score of a candidate |
|---|---|---|---|---|
| ``pairrm`` | PairRM (its card's ``tokenize_pair``; ``PairRMPipeline`` under ``--input-method rewardbench``) | ``<|source|>`` prompt, ``<|candidate1|>`` and ``<|candidate2|>`` responses, each encoded with [CLS]/[SEP] (RewardBench: the prompt in PairRM's instruction and turn format) | the model's logit of "1 beats 2" | logit(cand, ref) - logit(ref, cand), RewardBench's delta; > 0: preferred to the reference |
| ``betterpairrm`` | Better-PairRM (PairRM's class; ``BetterPairRMPipeline`` on both routes) | as ``pairrm``, the prompt in its "USER: .. ASSISTANT: " format (``tokenize_conv_pair``), each text first cut and decoded from its own ids, the source after its own encoded ``<|source|>``; 2,030 + 2 x 670 ids | as ``pairrm`` | as ``pairrm`` |
| ``shp`` | SteamSHP (``SHPPipeline``; a T5 that generates "A" or "B") | ``POST: {the conversation's texts joined by spaces}\n\n RESPONSE A: a\n\n RESPONSE B: b\n\n Which response is better? RESPONSE`` through the tokenizer (its closing ``</s>``), cut at 2,048 ids as the pipeline cuts it; the encoder's input | logit("A") - logit("B") of the decoder's first step (``generate``'s, from its start token) | the mean of P(candidate chosen) over both orders, in [0, 1] (the pipeline draws one order at random and keeps the generated label) |
| ``judge`` | an instruction-tuned LM as a pairwise judge (``--score judge-pair``, probe/core/judges.py) | the judge prompt with both responses in one user turn of the model's chat template, the assistant's turn opened (and its answer prefix) | P(A) = softmax of the LM's logits for the two label tokens at the last position | the mean of P(candidate chosen) over both orders, in [0, 1] |
| ``slicpairpm`` | RLHFlow pair-preference models (``SlicPairPMPipeline``) | one user turn ``[CONTEXT] ... [RESPONSE A] a [RESPONSE B] b \\n`` in the tokenizer's chat template, BOS removed | P(A) = softmax of the LM's logits for "A" and "B" at the last position | the mean of P(candidate chosen) over both orders, in [0, 1]; > 0.5: preferred |
| ``polar`` | POLAR (``internlm/POLAR-*``; its card's ``RewardModelClient.encode``, no RewardBench pipeline) | plain text ``prompt\\nreference<|reward|>prompt\\ncandidate[UNUSED_TOKEN_130]`` through ``tokenizer(text)`` | the model's own output (its ``v_head`` at the last id) | that output, one order only (the reference first, as the card writes it): how close the candidate's policy is to the reference's |

The candidate's slot is the first order's response slot (the template split, `probe/core/template.py`); the
second order is its own split, registered with the first (`Pairwise.register`). `OrderedPair` scores a row in
the first order, moves its response ids into the second order's slot, scores that, and combines the two; the
reference path (the self-check) does the same through each order's full forward. POLAR has one order only: its
rows go through the model's own forward as any reward model's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch

from probe.core.engine import pad_rows
from probe.core.template import DEFAULT_DATE, Messages, _check_prompt, response_conversation
from probe.errors import ProbeError, TemplateError

PairwiseFormat = Literal["pairrm", "betterpairrm", "slicpairpm", "shp", "judge", "polar"]
# the formats read by PairRM's class (an encoder's own forward, its logit per order; probe/models/families.py)
PAIRRM_CLASS = ("pairrm", "betterpairrm")
# the formats whose every order runs through the model's own forward, full sequences (an encoder, an encoder-decoder):
# their input is the family's own text, not a chat (POLAR's too: its card's text, one order)
OWN_FORWARD = (*PAIRRM_CLASS, "shp", "polar")

# the default reference response when none is given: a reply to any question that commits to nothing
DEFAULT_REFERENCE = "I don't know."

# PairRM (llm-blender): its instruction, verbatim (the typo is the model's training data)
PAIRRM_INSTRUCTION = "Finish the following coversation in each i-th turn by filling in <Response i> with your response."
PAIRRM_PREFIXES = ("<|source|>", "<|candidate1|>", "<|candidate2|>")
PAIRRM_SOURCE_MAX, PAIRRM_CANDIDATE_MAX = 1224, 412
# Better-PairRM (RewardBench's BetterPairRMPipeline): its turn labels, the text its template (whose indentation leaks
# into the output) puts between turns, and its lengths
BETTER_PAIRRM_ROLES = {"system": "SYSTEM MESSAGE: ", "user": "USER: ", "assistant": "ASSISTANT: "}
BETTER_PAIRRM_TURN_SEP = "\n    \n    "
BETTER_PAIRRM_SOURCE_MAX, BETTER_PAIRRM_CANDIDATE_MAX = 2030, 670
# SteamSHP (RewardBench's SHPPipeline, the model card's input_text): the post, both responses, the question
SHP_TEXT = "POST: {post}\n\n RESPONSE A: {response_A}\n\n RESPONSE B: {response_B}\n\n Which response is better? RESPONSE"
SHP_MAX = 2048  # the pipeline's max_length (truncation on, the tokenizer's side: the right)

# RLHFlow's pair-preference models: the context is rendered by this template (the pipeline's own), then shown in
# one user turn of the model's chat template
SLIC_CONTEXT_TEMPLATE = (
    "\n{% for message in messages %}{% if loop.index0 % 2 == 0 %}\n\n<turn> user"
    "\n {{ message['content'] }}{% else %}\n\n<turn> assistant\n"
    " {{ message['content'] }}{% endif %}{% endfor %}\n\n\n"
)
SLIC_PROMPT = "[CONTEXT] {context} [RESPONSE A] {response_A} [RESPONSE B] {response_B} \n"

# POLAR (internlm/POLAR-*): its card's RewardModelClient (github InternLM/POLAR src/polar/reward_func.py, the same as
# xtuner.utils.RewardModelClient): the separator and the closing reward token as text, and its truncation limits
POLAR_SEPARATOR, POLAR_REWARD_TOKEN = "<|reward|>", "[UNUSED_TOKEN_130]"
POLAR_MAX_LENGTH, POLAR_MAX_RESPONSE = 16384 - 4, 4096


@dataclass
class Pairwise:
    """A pairwise model's setting: its input format and the reference response every candidate is compared with.
    ``orders`` holds, per first-order split, the second order's (``register``)."""

    format: PairwiseFormat
    reference: str = DEFAULT_REFERENCE
    judge: object = None  # the judge prompt (probe/core/judges.py: JudgePrompt) of the "judge" format
    orders: list[tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=list, repr=False, compare=False)
    # first-order continuation -> the second order's, for rows rendered from text (whole responses): a response
    # whose ids merge with the text after its slot ("it.\n" -> ".\n") is moved by its own rendering, not by ids
    rendered: dict[tuple[int, ...], list[int]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def two_orders(self) -> bool:
        """Whether a candidate is scored in both orders (every format but POLAR's, which puts the reference first)."""
        return self.format != "polar"

    def describe(self) -> dict:
        if self.format == "polar":
            return {"pairwise": "polar", "reference_response": self.reference,
                    "score": "the model's own output (v_head at the closing [UNUSED_TOKEN_130]) on the card's text "
                             "'prompt\\nreference<|reward|>prompt\\ncandidate[UNUSED_TOKEN_130]': one order, the "
                             "reference first; higher: the candidate is closer to the reference's policy"}
        if self.format == "judge":
            labels = "/".join(repr(x) for x in self.judge.labels)
            return {"pairwise": "judge", "reference_response": self.reference,
                    "score": f"mean over both orders of P(candidate chosen) = softmax of the {labels} logits after the "
                             "judge prompt", **self.judge.describe()}
        rule = ("logit(candidate over reference) - logit(reference over candidate) (RewardBench's PairRM delta)"
                if self.format in PAIRRM_CLASS else
                "mean over both orders of P(candidate chosen) = softmax of the 'A'/'B' logits of the decoder's first "
                "step (SteamSHP's generated label, SHPPipeline)" if self.format == "shp" else
                "mean over both orders of P(candidate chosen) = softmax of the 'A'/'B' logits (RewardBench's SlicPairPM)")
        return {"pairwise": self.format, "reference_response": self.reference, "score": rule}

    def register(self, first, second) -> None:
        """The two orders' splits of one prompt (`TemplateSplit`s: the candidate first, then second)."""
        entry = (tuple(first.prefix_ids), tuple(first.suffix_ids), tuple(second.prefix_ids), tuple(second.suffix_ids))
        if entry not in self.orders:
            self.orders.append(entry)

    def second_order(self, prefix_ids) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """The registered orders whose first prefix ``prefix_ids`` continues or shortens (a beam, a merged slot)."""
        prefix_ids = tuple(prefix_ids)
        fits = [e for e in self.orders if prefix_ids[: len(e[0])] == e[0] or e[0][: len(prefix_ids)] == prefix_ids]
        if not fits:
            raise ProbeError("internal: no second order registered for this prefix (split the template first)")
        return max(fits, key=lambda e: len(e[0]))


@dataclass(frozen=True)
class PairwiseConversation:
    """The conversation builder of a pairwise format (see `probe/core/template.py`): ``render_ids(tok, response)``
    gives the ids the family's pipeline gives for (prompt, response, reference) in ``order`` 0 (the response
    first) or 1 (the reference first)."""

    prompt: str
    pairwise: Pairwise
    system: str | None = None
    order: int = 0
    date_string: str = DEFAULT_DATE

    def __post_init__(self) -> None:
        _check_prompt(self.prompt)
        if self.system and self.pairwise.format == "pairrm":
            raise TemplateError("PairRM reads user and assistant turns only: --system has no place in its input")

    def __call__(self, response: str) -> tuple[Messages, bool]:
        return response_conversation(self.prompt, self.system, self.date_string)(response)

    @property
    def template_kwargs(self) -> dict[str, str]:
        return {"date_string": self.date_string}

    @property
    def two_orders(self) -> bool:
        return self.pairwise.two_orders

    @property
    def drops_leading_space(self) -> bool:
        """POLAR's card encodes each text with BOS and decodes it without: where the tokenizer adds SentencePiece's
        dummy prefix, that takes a response's leading space with it (" Love" reaches the model as "Love"), so the
        split is verified on pieces without a space marker only (probe/core/template.py)."""
        return self.pairwise.format == "polar"

    @property
    def system_fed(self) -> str | None:
        """The system message this input holds: a pairwise judge's prompt's own where the run gives none; else the
        run's (`template.conversation_system`)."""
        return self.pairwise.judge.system_or(self.system) if self.pairwise.format == "judge" else self.system

    def swapped(self) -> PairwiseConversation:
        return replace(self, order=1 - self.order)

    def pair(self, response: str) -> tuple[str, str]:
        ref = self.pairwise.reference
        return (response, ref) if self.order == 0 else (ref, response)

    def render_ids(self, tokenizer, response: str) -> list[int]:
        if self.pairwise.format == "pairrm":
            return self._pairrm(tokenizer, *self.pair(response))
        if self.pairwise.format == "polar":
            return self._polar(tokenizer, response)
        if self.pairwise.format == "betterpairrm":
            return self._betterpairrm(tokenizer, *self.pair(response))
        if self.pairwise.format == "shp":
            return self._shp(tokenizer, *self.pair(response))
        if self.pairwise.format == "judge":
            from probe.core.judges import pair_ids

            return pair_ids(tokenizer, self.pairwise.judge, self.prompt, *self.pair(response), self.system,
                            self.date_string)
        return self._slic(tokenizer, *self.pair(response))

    def _pairrm(self, tok, first: str, second: str) -> list[int]:
        """PairRM's ``tokenize_pair`` (its model card's call): the prompt and both responses as plain texts, each
        after its prefix token, three encodings (each with [CLS] and [SEP]) truncated as it truncates them (source
        to 1,224 ids, each candidate to half of what is left of 2,048). Under ``--input-method rewardbench``,
        RewardBench's PairRMPipeline input, ``tokenize_conv_pair``: the source as PairRM's instruction and a
        USER/Assistant turn, each candidate as ``<Response 1>: text``."""
        from probe.core.template import input_call

        source, c1, c2 = PAIRRM_PREFIXES
        conv = input_call(tok) == "rewardbench"
        text = f"{PAIRRM_INSTRUCTION}USER: {self.prompt}\nAssistant: <Response 1>" if conv else self.prompt
        src = tok.encode(source + text, max_length=PAIRRM_SOURCE_MAX, truncation=True)
        room = (PAIRRM_SOURCE_MAX + 2 * PAIRRM_CANDIDATE_MAX - len(src)) // 2
        said = "<Response 1>: " if conv else ""
        return src + [i for prefix, cand in ((c1, first), (c2, second))
                      for i in tok.encode(f"{prefix}{said}{cand}", max_length=room, truncation=True)]

    def _polar(self, tok, response: str) -> list[int]:
        """POLAR's input, as its card's ``RewardModelClient.encode`` builds it and the card's ``tokenizer(texts)``
        encodes it: the prompt (a system text first, an empty one included, joined with a newline, as the client joins
        the prompt's messages), the reference and the candidate each encoded with the tokenizer's special tokens, cut
        as the client cuts them (each response to 4,096 ids from the right, the prompt to its last ids that fit), decoded
        without special tokens; then ``prompt\\nreference<|reward|>prompt\\ncandidate[UNUSED_TOKEN_130]`` (the
        client's "sft" wrapper: its test for an empty response compares a length with "", so the newline is always
        written) through ``tokenizer(text)``, BOS as that call adds it."""
        prompt = self.prompt if self.system is None else f"{self.system}\n{self.prompt}"
        p_ids, r1_ids, r2_ids = (tok.encode(t, add_special_tokens=True)
                                 for t in (prompt, self.pairwise.reference, response))
        r1_ids, r2_ids = r1_ids[:POLAR_MAX_RESPONSE], r2_ids[:POLAR_MAX_RESPONSE]
        room = (POLAR_MAX_LENGTH - len(r1_ids) - len(r2_ids)) // 2
        if len(p_ids) > room:  # as the client cuts it (also where room <= 0)
            p_ids = p_ids[-room:]
        p, r1, r2 = (tok.decode(i, skip_special_tokens=True) for i in (p_ids, r1_ids, r2_ids))
        text = f"{p}\n{r1}{POLAR_SEPARATOR}{p}\n{r2}{POLAR_REWARD_TOKEN}"
        return tok(text)["input_ids"]

    def _betterpairrm(self, tok, first: str, second: str) -> list[int]:
        """Better-PairRM's input as RewardBench's BetterPairRMPipeline builds it (its ``tokenize_conv_pair``; the
        card's format 'based on Vicuna 1.1', whose own code the stored card cuts off): the turns as ``ROLE: text``
        (text stripped) joined by its template's separator, then an open ``ASSISTANT: ``; that source cut to its
        last 2,030 ids and each response to its first 670 (no special tokens) and decoded back to text; then
        ``tokenize_pair``: ``<|source|>`` encoded on its own ([CLS] .. [SEP]), the source encoded after it (cut from
        the left to what 2,030 leaves), each candidate after its prefix, cut to half of what is left of 3,370."""
        turns = [f"{BETTER_PAIRRM_ROLES[m['role']]}{m['content'].strip()}" for m in self(first)[0][:-1]]
        text = BETTER_PAIRRM_TURN_SEP.join(turns + [BETTER_PAIRRM_ROLES["assistant"]])
        source = tok.decode(_cut_ids(tok, text, BETTER_PAIRRM_SOURCE_MAX, "left", special=False),
                            skip_special_tokens=True)
        first, second = (tok.decode(_cut_ids(tok, t, BETTER_PAIRRM_CANDIDATE_MAX, "right", special=False),
                                    skip_special_tokens=True) for t in (first, second))
        src_prefix, c1, c2 = PAIRRM_PREFIXES
        src = tok.encode(src_prefix)
        src += _cut_ids(tok, source, BETTER_PAIRRM_SOURCE_MAX - len(src), "left")
        room = (BETTER_PAIRRM_SOURCE_MAX + 2 * BETTER_PAIRRM_CANDIDATE_MAX - len(src)) // 2
        return src + [i for prefix, cand in ((c1, first), (c2, second))
                      for i in _cut_ids(tok, f"{prefix}{cand}", room, "right")]

    def _shp(self, tok, first: str, second: str) -> list[int]:
        """SteamSHP's input as RewardBench's SHPPipeline builds it (the card's ``input_text``): the texts of every turn
        before the response (system, user, earlier ones) joined by spaces as the post, the two responses as A and B,
        through the tokenizer (its ``</s>``), cut to 2,048 ids."""
        post = " ".join(m["content"] for m in self(first)[0][:-1])
        return tok.encode(SHP_TEXT.format(post=post, response_A=first, response_B=second), max_length=SHP_MAX,
                          truncation=True)

    def _slic(self, tok, first: str, second: str) -> list[int]:
        """SlicPairPM's input: the context by its template, both responses in its prompt, one user turn of the
        model's chat template, its BOS text removed, encoded without special tokens."""
        msgs = self(first)[0][:-1]
        try:
            context = tok.apply_chat_template(msgs, tokenize=False, chat_template=SLIC_CONTEXT_TEMPLATE)
            text = tok.apply_chat_template(
                [{"role": "user", "content": SLIC_PROMPT.format(context=context, response_A=first, response_B=second)}],
                tokenize=False, **self.template_kwargs)
        except Exception as err:  # jinja2's own errors
            raise TemplateError(f"the chat template failed to render: {type(err).__name__}: {err}") from None
        if tok.bos_token:
            text = text.replace(tok.bos_token, "")
        return tok.encode(text, add_special_tokens=False)


def _cut_ids(tok, text: str, n: int, side: str, special: bool = True) -> list[int]:
    """``tok.encode(text, max_length=n, truncation=True)`` with the tokenizer's ``truncation_side`` set to ``side``
    (as RewardBench's pipelines set it before each call; restored after), the special tokens added or not."""
    before = tok.truncation_side
    tok.truncation_side = side
    try:
        return tok.encode(text, add_special_tokens=special, max_length=n, truncation=True)
    finally:
        tok.truncation_side = before


def judge_pairwise(reference: str | None, judge_prompt: str | None) -> Pairwise:
    """``--score judge-pair``'s setting: the judge prompt (probe/core/judges.py) and the reference response."""
    from probe.core.judges import load_judge_prompt

    return Pairwise("judge", DEFAULT_REFERENCE if reference is None else reference,
                    judge=load_judge_prompt(judge_prompt, "pair"))


def combine(fmt: PairwiseFormat, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """One score from the two orders' outputs (the candidate first, then second): PairRM's logit difference;
    SlicPairPM's (and a pairwise judge's) mean probability of the candidate, its outputs being logit("A") -
    logit("B")."""
    if fmt in PAIRRM_CLASS:
        return first - second
    return 0.5 * (torch.sigmoid(first) + torch.sigmoid(-second))


def second_prefix(pairwise: Pairwise, prefix_ids) -> tuple[list[int], tuple[int, ...], tuple[int, ...]]:
    """For rows continuing ``prefix_ids`` in the first order: the second order's prefix and both suffixes. A prefix
    longer than the split's (a beam's fixed response ids) carries its extra ids over; a shorter one (a response
    merged with the ids before its slot) drops as many from the second prefix, which must end in the same ids."""
    p1, s1, p2, s2 = pairwise.second_order(prefix_ids)
    prefix_ids = list(prefix_ids)
    if len(prefix_ids) >= len(p1):
        return list(p2) + prefix_ids[len(p1):], s1, s2
    k = len(p1) - len(prefix_ids)
    if p1[-k:] != p2[-k:]:
        raise ProbeError("a response merges with the ids before its slot, and the two orders end those ids "
                         "differently: this response cannot be moved into the second order by ids")
    return list(p2[:-k]), s1, s2


class OrderedPair:
    """Scores rows of the first order (the candidate's response ids, then the first suffix) through ``first``;
    the same response ids in the second order's slot through ``second``; `combine`s the two."""

    def __init__(self, fmt: PairwiseFormat, first, second, suffix_first, suffix_second, rendered=None):
        self.fmt, self.first, self.second = fmt, first, second
        self.suffix_first, self.suffix_second = list(suffix_first), list(suffix_second)
        self.rendered = {} if rendered is None else rendered  # `Pairwise.rendered`

    def second_rows(self, cont, lengths=None):
        """Each row's response ids (the slot), in the second order: ``slot + suffix_second``."""
        if isinstance(cont, torch.Tensor):
            lengths = [cont.shape[1]] * cont.shape[0] if lengths is None else torch.as_tensor(lengths).tolist()
            cont = [r[:n] for r, n in zip(cont.tolist(), lengths)]
        n = len(self.suffix_first)
        out = []
        for row in cont:
            row = list(row)
            if (known := self.rendered.get(tuple(row))) is not None:
                out.append(list(known))
                continue
            if row[len(row) - n:] != self.suffix_first or len(row) - n < 1:
                raise ProbeError("a pairwise row does not end with its order's closing ids: the response merges with "
                                 "the text after its slot (a trailing newline or space, say), so it cannot be moved "
                                 "into the second order by ids; strip the response's trailing whitespace")
            out.append(row[: len(row) - n] + self.suffix_second)
        return pad_rows(out)

    def score(self, cont, lengths=None):
        a = self.first.score(cont, lengths)
        rows, lens = self.second_rows(cont, lengths)
        return combine(self.fmt, a, self.second.score(rows, lens).to(a.device))
