"""Judges that rate and judges that compare: an instruction-tuned language model asked a judge prompt, read from
one next-token distribution (no text is generated).

``--score rating``: the user turn shows the prompt and the response under a rating prompt; the assistant's turn
opens (and starts with the prompt's ``answer_prefix``); the score is the expected rating under the model's next-token
distribution restricted to the rating tokens ("1" ... "9" by default, each one id of the tokenizer, else one line):
``sum_r r * softmax(logits[rating ids])_r``.

``--score judge-pair``: the user turn shows the prompt and two responses, the candidate and ``--reference-response``;
the score is P(candidate chosen) = softmax of the two label tokens' logits ("A", "B"), averaged over both orders
(the candidate first, then second), through the pairwise engine (probe/core/pairwise.py).

A judge prompt is a YAML file (``--judge-prompt FILE``) or one shipped in probe/data/judge_prompts (by name)::

    kind: rating            # or pair
    source: where the text comes from (recorded in the run)
    system: null            # the system prompt ("": an empty system turn), or null (--system replaces it)
    user: "... {prompt} ... {response} ..."        # pair: {prompt}, {response_a}, {response_b}
    answer_prefix: ""       # text the answer starts with before the rating (label) token, e.g. "[["
    ratings: [1, 10]        # rating: the lowest and highest rating, every integer between is a token
    labels: [A, B]          # pair: the tokens that name the first and the second response
    unit_test: "..."        # rating: a unit-test judge's (LMUnit's) default criterion, where user holds {unit_test}
                            # (--unit-test replaces it)
    top_logprobs: 20        # rating: read as LMUnit's postprocess reads vLLM's top-20 log-probabilities: only the
                            # ratings among the k most likely next tokens count (renormalised), and the score is 0
                            # where the most likely token is not a rating (or none is among them)
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

from probe.core.template import WrappedConversation, _check_prompt, fill
from probe.errors import DataFormatError
from probe.textfile import read_yaml

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "data" / "judge_prompts"
# the rating default is 1 to 9: "10" is two tokens of most tokenizers (SmolLM2, Qwen, Gemma), one of Llama 3's
DEFAULTS = {"rating": "rewardbench2-rating-1to9", "pair": "rewardbench-pair"}
PLACES = {"rating": ("{prompt}", "{response}"), "pair": ("{prompt}", "{response_a}", "{response_b}")}
JudgeKind = Literal["rating", "pair"]


@dataclass(frozen=True)
class JudgePrompt:
    name: str  # a shipped prompt's name, or the file's path
    kind: JudgeKind
    source: str
    user: str
    system: str | None = None
    answer_prefix: str = ""
    ratings: tuple[int, int] | None = None
    labels: tuple[str, str] | None = None
    unit_test: str | None = None  # the criterion filled into {unit_test}: the prompt's default or --unit-test
    top_logprobs: int | None = None

    @property
    def sha256(self) -> str:
        extra = (self.unit_test, self.top_logprobs) if (self.unit_test, self.top_logprobs) != (None, None) else ()
        text = "\x00".join(str(x) for x in (self.kind, self.system, self.user, self.answer_prefix, self.ratings,
                                            self.labels, *extra))
        return hashlib.sha256(text.encode()).hexdigest()

    def describe(self) -> dict:
        """What a run records: the prompt's name, source and whole text, and its digest."""
        return {"judge_prompt": {**asdict(self), "sha256": self.sha256}}

    def system_or(self, system: str | None) -> str | None:
        """The run's ``--system`` (a persona's) where given, else the judge prompt's own."""
        return system if system is not None else self.system

    def rating_values(self) -> list[int]:
        lo, hi = self.ratings
        return list(range(lo, hi + 1))

    def with_unit_test(self, text: str | None) -> JudgePrompt:
        """This prompt with ``--unit-test`` as its criterion (None: its own default); one line where it takes none."""
        if text is None:
            return self
        if self.unit_test is None:
            raise DataFormatError(f"--unit-test: the judge prompt {self.name} rates responses without a unit test; it "
                                  "goes with a unit-test judge (LMUnit: ContextualAI/LMUnit-*, --judge-prompt lmunit)")
        if not text.strip():
            raise DataFormatError("--unit-test is empty: give the criterion every response is rated against")
        return replace(self, unit_test=text)

    def fill(self, prompt: str, first: str, second: str | None = None) -> str:
        """The user turn (`probe.core.template.fill`: one pass, so the texts filled in stay as written)."""
        if self.kind == "rating":
            test = {"unit_test": self.unit_test} if self.unit_test is not None else {}
            return fill(self.user, prompt=prompt, response=first, **test)
        return fill(self.user, prompt=prompt, response_a=first, response_b=second)


def shipped() -> list[str]:
    return sorted(p.stem for p in PROMPTS_DIR.glob("*.yaml"))


def load_judge_prompt(value: str | None, kind: JudgeKind) -> JudgePrompt:
    """``--judge-prompt NAME|FILE`` for a judge of ``kind`` (None: the shipped default); one line on a bad file."""
    value = value or DEFAULTS[kind]
    path = PROMPTS_DIR / f"{value}.yaml" if value in shipped() else Path(value)
    if not path.is_file():
        raise DataFormatError(f"--judge-prompt {value}: no such file, nor a shipped prompt ({', '.join(shipped())})")
    data = read_yaml(path, "YAML")
    where = f"--judge-prompt {value}"
    if not isinstance(data, dict):
        raise DataFormatError(f"{where}: expected a YAML mapping (kind, source, user, ...; see probe/core/judges.py)")
    unknown = sorted(set(data) - {"kind", "source", "system", "user", "answer_prefix", "ratings", "labels", "unit_test",
                                  "top_logprobs"})
    if unknown:
        raise DataFormatError(f"{where}: unknown field(s) {', '.join(unknown)}")
    if data.get("kind") != kind:
        use = {"rating": "--score rating", "pair": "--score judge-pair"}
        raise DataFormatError(f"{where} is a {data.get('kind')!r} prompt; {use[kind]} needs kind: {kind}")
    user = data.get("user")
    if not isinstance(user, str) or any(p not in user for p in PLACES[kind]):
        raise DataFormatError(f"{where}: user must be a text with {', '.join(PLACES[kind])}")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise DataFormatError(f"{where}: say where the prompt comes from (source: ...); it is recorded in every run")
    system, prefix = data.get("system"), data.get("answer_prefix") or ""
    if system is not None and not isinstance(system, str) or not isinstance(prefix, str):
        raise DataFormatError(f"{where}: system and answer_prefix are texts")
    ratings = labels = None
    if kind == "rating":
        r = data.get("ratings")
        if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) and r[0] < r[1]
                and r[1] - r[0] <= 100):
            raise DataFormatError(f"{where}: ratings must be [lowest, highest], two integers (e.g. [1, 10])")
        ratings = (r[0], r[1])
    else:
        lab = data.get("labels")
        if not (isinstance(lab, list) and len(lab) == 2 and all(isinstance(x, str) and x for x in lab)
                and lab[0] != lab[1]):
            raise DataFormatError(f"{where}: labels must be two different texts (e.g. [A, B])")
        labels = (lab[0], lab[1])
    unit_test, top = _unit_test_fields(data, kind, user, where)
    name = value if value in shipped() else str(path)
    # system: "" is an empty system turn, as --system "" is (it was read as null: the template's own system prompt)
    return JudgePrompt(name, kind, source.strip(), user, system, prefix, ratings, labels, unit_test, top)


def _unit_test_fields(data: dict, kind: str, user: str, where: str) -> tuple[str | None, int | None]:
    """A unit-test judge's default criterion (present exactly where the user turn holds {unit_test}) and the top-k
    rule of its reading; rating prompts only."""
    test, top = data.get("unit_test"), data.get("top_logprobs")
    if kind != "rating" and (test is not None or top is not None):
        raise DataFormatError(f"{where}: unit_test and top_logprobs go with kind: rating")
    if ("{unit_test}" in user) != (test is not None):
        raise DataFormatError(f"{where}: a user turn with {{unit_test}} needs a default unit_test, and unit_test a "
                              "user turn with {unit_test}")
    if test is not None and not (isinstance(test, str) and test.strip()):
        raise DataFormatError(f"{where}: unit_test must be a text")
    if top is not None and not (isinstance(top, int) and not isinstance(top, bool) and top >= 1):
        raise DataFormatError(f"{where}: top_logprobs must be an integer >= 1")
    return test, top


def rating_prompt(options) -> JudgePrompt:
    """The rating prompt of a run's `ScoringOptions` (the shipped default where none was set)."""
    return options.judge_prompt or load_judge_prompt(None, "rating")


def single_ids(tokenizer, texts: list[str], who: str, fix: str = "") -> list[int]:
    """Each text's one id (as the answer's next token), or one line naming those that are not one token (and
    ``fix``, what to do about it)."""
    ids = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    bad = [f"{t!r} -> {i}" for t, i in zip(texts, ids) if len(i) != 1]
    if bad:
        raise DataFormatError(f"{who}: {', '.join(bad[:4])} {'is' if len(bad) == 1 else 'are'} not one token of this "
                              "tokenizer, so one next-token distribution cannot give the answer" + (f"; {fix}" if fix
                                                                                                     else ""))
    return [i[0] for i in ids]


@dataclass(frozen=True)
class AnswerPrefix(WrappedConversation):
    """A conversation whose rendering ends with the assistant's turn open and ``text`` already written (encoded on
    its own, without special tokens): the judge's answer starts there."""

    text: str = ""

    def render_ids(self, tokenizer, response: str) -> list[int]:
        from probe.core.template import render

        ids = render(tokenizer, self.build, response)
        return ids + (tokenizer.encode(self.text, add_special_tokens=False) if self.text else [])

    @property
    def text_after(self) -> str:
        return self.text


def rating_conversation(judge: JudgePrompt, prompt: str, system: str | None, date_string: str):
    """The rating layout: one user turn with the prompt and the response, the assistant's turn opened."""
    from probe.core.template import Conversation

    if judge.unit_test is not None:  # prompt, response and unit test filled in one pass (judge.fill)
        _check_prompt(prompt)
        build = JudgeTurn(judge, prompt, judge.system_or(system), date_string)
    else:
        build = Conversation(prompt, judge.system_or(system), judge.user, date_string)
    return AnswerPrefix(build, judge.answer_prefix) if judge.answer_prefix else build


@dataclass(frozen=True)
class JudgeTurn:
    """A rating judge's one user turn, ``judge.fill(prompt, response)`` (a unit-test judge's criterion with them),
    after the system prompt, the assistant's turn opened."""

    judge: JudgePrompt
    prompt: str
    system: str | None
    date_string: str

    def __call__(self, response: str):
        from probe.core.template import system_turn

        return system_turn(self.system) + [{"role": "user", "content": self.judge.fill(self.prompt, response)}], True

    @property
    def template_kwargs(self) -> dict[str, str]:
        return {"date_string": self.date_string}


@dataclass(frozen=True)
class UserTurn:
    """One user turn (after the system prompt, if any) with the assistant's turn opened: a pairwise judge's input."""

    text: str
    system: str | None
    date_string: str

    def __call__(self, response: str):
        from probe.core.template import system_turn

        return system_turn(self.system) + [{"role": "user", "content": self.text}], True

    @property
    def template_kwargs(self) -> dict[str, str]:
        return {"date_string": self.date_string}


def pair_ids(tokenizer, judge: JudgePrompt, prompt: str, first: str, second: str, system: str | None,
             date_string: str) -> list[int]:
    """A pairwise judge's input ids for one order: the judge prompt with both responses in one user turn, the
    assistant's turn opened and its ``answer_prefix`` written."""
    from probe.core.template import render

    build = UserTurn(judge.fill(prompt, first, second), judge.system_or(system), date_string)
    return render(tokenizer, AnswerPrefix(build, judge.answer_prefix) if judge.answer_prefix else build, "")

