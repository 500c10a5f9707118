"""Per-family quirks of reward models, in one typed registry.

A `RewardModelSpec` says how to load a model and how to read one score from it:

* ``reader`` is how the *cached* engine reads the score from the backbone's hidden states:
  ``"linear"``  the sequence-classification head (``model.score``) on the last token, column ``label_index``;
  ``"gated"``   ArmoRM/QRM-style heads: a regression layer on the last token, mixed by a gating network that
                reads the hidden state at the start of the last ``gating_pattern`` (the end of the user turn);
  ``"module"``  a family's own head on a backbone (GRM -sftreg, INF-ORM, UltraRM, Starling-34B, Beaver, LDL;
                ``layout`` names it, probe/models/families.py), read at the family's pooling position;
  ``"forward"`` no cached reader is known: every candidate goes through the model's own full forward
                (exact, slower).
  ``"logit"``   a reward model shipped as a causal LM (NVIDIA's Nemotron rewards): the LM head's logit of vocabulary
                id ``label_index`` at the last input position (the row of ``lm_head`` on the final-normed hidden
                state), as the card's ``generate(max_new_tokens=1, output_scores=True).scores[0][0][label_index]``,
                minus the logit of ``logit_minus`` where set (the principle model's 'Yes' minus 'No');
  ``"step"``    a process reward model: a 2-way head (``model.score``) at the step separator ``step_token`` appended
                after the response (one step), read as the positive class's probability (Qwen2.5-Math-PRM);
  ``"pairwise"`` a pairwise preference model (``pairwise`` names its input format, probe/core/pairwise.py): each
                candidate is scored against a reference response in both orders; PairRM (an encoder, ``layout``
                ``pairrm``) through its own forward, RLHFlow's pair-preference LMs on the shared-prefix cache;
                POLAR in one order (the reference first), through its own forward.
* ``output`` / ``label_index`` say where the model's *own* forward puts the score (``outputs.logits[:, 0]``
  or ``outputs.score``). That forward is the reference path: every sweep re-scores a few tokens through it
  and stops if the cached reader disagrees, so a wrong entry here cannot silently produce wrong numbers.

Entries are keyed by Hugging Face id; an unknown model falls back to an entry for its architecture, then to
``"default"``, and the fallback is logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

log = logging.getLogger(__name__)

Reader = Literal["linear", "gated", "module", "forward", "pairwise", "logit", "step"]

# The input conventions of the families (RewardModelSpec.input_source): what each model card (or training code) calls
CHAT_TEMPLATE_INPUT = ("model card: tokenizer.apply_chat_template(conversation, tokenize=True); BOS as the template "
                       "writes it (once), no EOS added")
DIALOGUE_INPUT = ("model card: tokenizer(text) on the dialogue string {}; BOS from the tokenizer's post-processor "
                  "(never text, so SentencePiece's legacy flag cannot change the ids), no EOS")
TEMPLATE_IDS_CARD = ("model card ({}): tokenizer.apply_chat_template(conversation, tokenize=True) (or its "
                     "return_tensors='pt' form): the template's ids, BOS as the template writes it (once), no EOS; {}")
SKYWORK_V1_INPUT = ("model card (Skywork/Skywork-Reward-Gemma-2-27B and -Llama-3.1-8B, v0.1): "
                    "rm_tokenizer(rm_tokenizer.apply_chat_template(conv, tokenize=False)); 'We removed the BOS token "
                    "from the chat templates of the two models to prevent it being added twice': BOS from the "
                    "tokenizer's call (once; none where a template without it is read as the template's ids), no EOS; "
                    "the score logits[0][0]")
SKYWORK_V2_INPUT = ("model card (Skywork/Skywork-Reward-V2-*, the same for every size): apply_chat_template(conv, "
                    "tokenize=False), its leading BOS text removed ('remove the potential duplicate bos token'), then "
                    "tokenizer(text): the template's ids with one BOS (none on Qwen3), no EOS; the score logits[0][0]")
LLAMA3_ASSISTANT_HEADER = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
GRM_INPUT = ("model card and training code (GRM's reward_models/load_datasets.py: tokenizer.encode_plus("
             "tokenizer.apply_chat_template(messages, tokenize=False))): the template's text through tokenizer(text), "
             "so BOS twice (the template's and the tokenizer's), as the model was trained; no EOS")
GRM_FT_INPUT = ("model card (Ray2333/GRM-gemma2-2B-rewardmodel-ft; the Llama -ft cards as copied by their users) and "
                "GRM's training code: tokenizer.encode_plus(tokenizer.apply_chat_template(message, tokenize=False)): the "
                "template's text through tokenizer(text), so BOS twice, as the model was trained; no EOS; the score "
                "the logits")
# the pipeline of each family's class, for checkpoints found by their class (RewardBench itself keys by model id)
PIPELINE_OF_LAYOUT = {"grm": "GRMPipeline", "inform": "RewardBenchPipeline", "ultrarm": "OpenBMBPipeline",
                      "beaver": "BeaverPipeline", "ldl": "LDLPipeline"}
# RewardBench's pipelines that mask the first of two leading BOS tokens (pipeline.py, ldlreward.py): for rotary
# position models the same as feeding one
DOUBLE_BOS_MASKED = ("RewardBenchPipeline", "LDLPipeline")
REWARDBENCH_DPO_INPUT = ("RewardBench 0.1.4's run_dpo.py (DPOInference.tokenize_row): BOS (EOS where the tokenizer "
                         "has none) + tokenizer(template text without the generation prompt) + the rest of the "
                         "whole conversation's text + EOS, every id from the assistant header on scored; two BOS "
                         "where the template writes one")
REWARDBENCH_RAW_INPUT = ("RewardBench 0.1.4's run_rm.py with fastchat's 'raw' template (its README's command for "
                         "OpenAssistant's DeBERTa): tokenizer(prompt + response), the plain concatenation in one "
                         "segment, [CLS] .. [SEP]")
STARLING_INPUT = ("model card (Nexusflow/Starling-RM-34B, get_reward): reward_tokenizer(samples) on ChatML written by "
                  "hand, '<|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n{response}<|im_end|>': the "
                  "chat template's text cut after the last '<|im_end|>' (no newline), the ids Yi's tokenizer adds "
                  "(none); the reward read before the first id 0")
STARLING7B_INPUT = DIALOGUE_INPUT.format(
    "'<s>[INST] {prompt} </s> [/INST] {response}</s>' (model card of berkeley-nest/Starling-RM-7B-alpha, its "
    "'llama2 chat template' test sample, with its '<s>' and '</s>' as control tokens) through Llama-2-7b-chat's "
    "tokenizer: its BOS + text, so BOS twice") + (
    "; the reward read at the last token (the card's PAD_ID is the BOS id: index -1, the row's last position, which "
    "for its rows padded to 2,048 ids and RewardBench's padded batches is a pad); --input-method rewardbench: the "
    "tokenizer's own chat template through tokenizer(text), as StarlingPipeline")
WORLDPM_INPUT = ("model card (Qwen/WorldPM-72B, as the QwenLM/WorldPM GitHub README copies it; the Hub card's stored "
                 "copy is cut before its usage): get_score: tokenizer.apply_chat_template(conversation, tokenize=False, "
                 "add_generation_prompt=False) with an empty system turn ('System prompt remains empty during "
                 "training ... System marker is preserved'), tokenizer.encode(text, add_special_tokens=False), "
                 "model(input_ids=...)[0]; the reward read by the remote class ('the hidden state of <|endoftext|>'); "
                 "--system replaces the empty turn; --input-method rewardbench: WorldPMPipeline's, the same call "
                 "without the system turn (the template's default)")
ULTRARM_INPUT = DIALOGUE_INPUT.format(
    "'Human: {prompt}\\n\\nAssistant: {response}' (model card of openbmb/UltraRM-13b: its ultrarm_template; the "
    "card's webgpt examples join the turns with one newline) through LlamaTokenizer: BOS + text") + (
    "; --input-method rewardbench: RewardBench's openbmb format 'User: ..\\n\\nAssistant: ..\\n\\n' + EOS")
BEAVER_INPUT = DIALOGUE_INPUT.format(
    "'BEGINNING OF CONVERSATION: USER: {prompt} ASSISTANT:{response}' (model card of PKU-Alignment/beaver-7b-*, "
    "safe-rlhf's PROMPT_BEGIN + PROMPT_USER + PROMPT_ASSISTANT, no space after 'ASSISTANT:'; an earlier response ends "
    "with EOS, as safe-rlhf's format_prompt; safe-rlhf's training also appends EOS to the scored response, the card "
    "does not)") + ("; --input-method rewardbench: RewardBench's pku-align format 'BEGINNING OF CONVERSATION: USER: .. "
                    "ASSISTANT: .. ' + EOS")
ZIYA_INPUT = ("model card: tokenizer(text) on 'Human:' + query + '\\n\\nAssistant:' + response, the tokenizer loaded "
              "as LlamaTokenizer.from_pretrained(..., add_eos_token=True) (model card of IDEA-CCNL/Ziya-LLaMA-7B-Reward): "
              "BOS + text + EOS, the reward read at the EOS (the card truncates to 1,024 ids, rm-probe does not); "
              "--input-method rewardbench: RewardBench's Ziya format '\\n\\nHuman: ..\\n\\nAssistant: ..\\n\\n' + EOS")
EURUS_INPUT = DIALOGUE_INPUT.format(
    "'[INST] {prompt} [/INST] {response}' (model card of openbmb/Eurus-RM-7b: 'the same template as "
    "Mistral-Instruct-v0.2'; its example strings misspell the closing tag '[\\INST]', read here as the tag it "
    "names) through its AutoTokenizer: BOS + text, whatever chat template the tokenizer carries") + (
    "; --input-method rewardbench: the tokenizer's own chat template through tokenizer(text), as OpenBMBPipeline")
URM_INPUT = ("model card (LxzGordon/URM-LLaMa-3.1-8B): tokenizer(tokenizer.apply_chat_template(messages, "
             "tokenize=False)): the template's text through tokenizer(text), so BOS twice (the template's and the "
             "tokenizer's); no EOS; the score logits[0][0]")
INTERNLM2_INPUT = ("model card (internlm/internlm2-*-reward): model.get_score(tokenizer, chat), which encodes "
                   "tokenizer.apply_chat_template(chat, tokenize=False) with tokenizer.encode(text) (special tokens "
                   "added: a second BOS after the template's) and appends the config's reward_token_id; "
                   "--input-method rewardbench: InternLMPipeline's encode(text, add_special_tokens=False), the "
                   "template's ids (one BOS) and the reward token")
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
PRM_INPUT = ("model card (Qwen/Qwen2.5-Math-PRM-7B, -72B, Qwen2.5-Math-7B-PRM800K: one code for all three): messages "
             "system (the card's 'Please reason step by step, and put your final answer within \\boxed{}.', unless "
             "--system), user, assistant '<extra_0>'.join(steps) + '<extra_0>'; tokenizer.encode(apply_chat_template("
             "messages, tokenize=False, add_generation_prompt=False)) (Qwen's tokenizer adds no special tokens: the "
             "template's ids); a response is one step: its ids, then the <extra_0> id, then the template's end of "
             "turn; the reward softmax(logits[sep])[1] at that separator (make_step_rewards: the positive class)")
LMUNIT_INPUT = ("the authors' evaluation code (ContextualAI/LMUnit eval/eval.py, eval/reward_bench2.py; the model card's "
                "quick start passes the bare user text, without the chat template): messages system 'rationale=No', "
                "user 'Query: {prompt}\\n\\nResponse: {response}\\n\\nUnit Test: {unit_test}' (--unit-test; default "
                "'Is the response helpful?'), apply_chat_template(tokenize=False, add_generation_prompt=True), the "
                "text encoded as vLLM encodes a prompt string, tokenizer(text) (Llama 3.1: BOS twice; Qwen 2.5: none "
                "added), then the output's start '{\"score\": ' (--score rating, --judge-prompt lmunit); the score is "
                "LMUnit.postprocess's: the expected digit 0-6 over the digits among the top-20 next tokens, "
                "renormalised, 0 where the most likely token is no digit")
# RewardBench pipelines that encode the template's text without the tokenizer's special tokens (its route: the
# template's own ids)
PIPELINES_WITHOUT_SPECIAL_TOKENS = ("InternLMPipeline", "WorldPMPipeline")
# the dialogue formats a model card writes by hand (shipped as <name>-card templates): used on the default route even
# where the checkpoint's tokenizer carries a chat template of its own, which the card does not call; -> the format
# RewardBench's run script renders instead (None: the tokenizer's own template)
CARD_DIALOGUES = {"ultrarm-card": "openbmb", "beaver-card": "pku-align", "ziya-card": "ziya", "eurus-card": None,
                  "starling7b-card": None}
NEMOTRON_INPUT = ("{}: tokenizer.apply_chat_template([user, assistant], tokenize=True, add_generation_prompt=False, "
                  "return_tensors='pt', return_dict=True): the template's ids, BOS as the template writes it (once), "
                  "no EOS; the score model.generate(..., max_new_tokens=1, return_dict_in_generate=True, "
                  "output_scores=True)['scores'][0][0][0]: the logit of vocabulary id 0 at the position after the last "
                  "input id (the template's end of turn), unscaled (generate's scores are the raw logits where the "
                  "generation config sets no sampling or penalty)")
NEMOTRON_PRINCIPLE_QUESTION = ("Evaluate the response to the previous prompt in terms of whether it satisfies this "
                               "principle: {principle}. Only answer Yes or No.")
NEMOTRON_PRINCIPLE_INPUT = (
    "model card of nvidia/Llama-3.3-Nemotron-70B-Reward-Principle (its README.md as a public repository's verbatim "
    "copy holds it; the stored card pages stop before the usage block): tokenizer.apply_chat_template([user: prompt, "
    "assistant: response, user: principle_question], tokenize=True, add_generation_prompt=True, return_tensors='pt', "
    "return_dict=True), principle_question = f\"" + NEMOTRON_PRINCIPLE_QUESTION + "\" (the card's example principle: "
    "'correctness'; --principle TEXT, recorded in the run): the template's ids, BOS as the template writes it, the "
    "assistant's header last; the score model.generate(..., max_new_tokens=1, return_dict_in_generate=True, "
    "output_scores=True): scores[0][0][9642] - scores[0][0][2822], the logits of 'Yes' minus 'No' at the position "
    "after the input (ids as the card writes them, Llama 3's vocabulary)")
PAIR_INPUT = "model card: tokenizer(question, answer): [CLS] question [SEP] answer [SEP] with segment ids"
GEMMA_MODEL_TURN = "<end_of_turn>\n<start_of_turn>model\n"


@dataclass(frozen=True)
class RewardModelSpec:
    name: str = field(metadata={"help": "registry key (a Hugging Face id, an architecture, or 'default')"})
    reader: Reader = field(default="linear", metadata={"help": "how the cached engine reads the score"})
    output: str = field(default="logits", metadata={"help": "attribute of the model's own output holding the score"})
    label_index: int = field(default=0, metadata={"help": "column of that output (and of the linear head)"})
    gating_pattern: str | None = field(
        default=None, metadata={"help": "text whose last occurrence marks the gating position (gated reader)"}
    )
    trust_remote_code: bool = field(default=False, metadata={"help": "the model needs its own modelling code"})
    dtype: str = field(default="bfloat16", metadata={"help": "dtype on GPU (CPU always runs float32)"})
    attn_implementation: str | None = field(default=None, metadata={"help": "forced attention implementation"})
    shims: tuple[str, ...] = field(
        default=(), metadata={"help": "compatibility shims applied before loading remote code (see loading.py)"}
    )
    layout: str | None = field(default=None, metadata={
        "help": "module reader: the family's backbone and head layout (probe/models/families.py)"})
    pairwise: str | None = field(default=None, metadata={
        "help": "pairwise reader: the input format, 'pairrm', 'betterpairrm', 'slicpairpm' or 'shp' (probe/core/pairwise.py)"})
    auto_class: str | None = field(default=None, metadata={
        "help": "the Auto class the family's remote code registers its model under, when not the sequence classifier "
                "(InternLM2 reward: AutoModel)"})
    append_token: str | None = field(default=None, metadata={
        "help": "config attribute holding an id the family appends after the chat template (InternLM2's "
                "reward_token_id): rendered inputs end with it"})
    system_prompt: str | None = field(default=None, metadata={
        "help": "the system turn the model card writes when --system is not given ('': an empty system turn, kept: "
                "WorldPM's card); None: none, the template's own default"})
    step_token: str | None = field(default=None, metadata={
        "help": "step reader: the step separator the model card appends after each step (Qwen2.5-Math-PRM's "
                "'<extra_0>'); the reward is read at its last occurrence"})
    judge_prompt: str | None = field(default=None, metadata={
        "help": "a generative judge (LMUnit): the shipped judge prompt (probe/data/judge_prompts) its card's code "
                "reads it with; --score auto is then --score rating under it, and input_call applies to that reading"})
    sign: float = field(default=1.0, metadata={"help": "multiplies the score (-1: a cost model read as a reward)"})
    logit_minus: int | None = field(default=None, metadata={
        "help": "logit reader: the reward is the logit of id label_index minus the logit of this id (Llama-3.3-"
                "Nemotron-70B-Reward-Principle's card: 'Yes' 9642 minus 'No' 2822); None: the one logit"})
    principle_question: str | None = field(default=None, metadata={
        "help": "a user turn the model card asks after the response, its '{principle}' filled with --principle, then "
                "the assistant's turn opens (Nemotron's principle model); None: the model takes no principle"})
    principle: str | None = field(default=None, metadata={
        "help": "the principle the model card's example passes: the default of --principle"})
    chat_template: str | None = field(default=None, metadata={
        "help": "shipped template (probe/data/chat_templates) for a tokenizer that has none: the family's dialogue "
                "format as its model card writes it (a CARD_DIALOGUES format replaces even a template the tokenizer "
                "carries, which the card does not call; RewardBench's own: rewardbench_chat_template)"})
    input_call: Literal["tokenizer(text)"] | None = field(default=None, metadata={
        "help": "'tokenizer(text)': the chat template's text is encoded by the tokenizer's own call (BOS and EOS as "
                "it adds them: GRM's training code and cards); None: as the template says (probe/core/template.py)"})
    input_eos: bool = field(default=False, metadata={
        "help": "the model card's tokenizer call adds EOS after the text (Ziya's card: LlamaTokenizer.from_pretrained("
                "..., add_eos_token=True)): the default route writes BOS (where add_bos_token), the text, EOS, as "
                "that call gave under the transformers of its time"})
    input_ends_at: str | None = field(default=None, metadata={
        "help": "the model card's input ends right after the last occurrence of this text (a control token of the "
                "template): the default route cuts the rendering there; --input-method rewardbench keeps the "
                "template's whole text (Starling-RM-34B: its card writes ChatML by hand and stops at the last "
                "'<|im_end|>', without the newline Yi's template adds)"})
    input_source: str = field(default=CHAT_TEMPLATE_INPUT, metadata={
        "help": "where the family's input convention comes from (the model card's or training code's call) and how "
                "BOS and EOS are handled; the ids follow it (probe/core/template.py: input_call)"})
    family: str = field(default="", metadata={"help": "base-model family, for grouping in analyses"})
    rewardbench_pipeline: str = field(default="RewardBenchPipeline", metadata={
        "help": "the pipeline RewardBench 0.1.4 runs this model with (rewardbench/models/__init__.py, keyed by id; "
                "'RewardBenchPipeline' for any model it does not list): --input-method rewardbench follows it"})
    unsupported: str | None = field(default=None, metadata={
        "help": "why rm-probe refuses this model (one line, before anything loads); None for every model it reads"})
    notes: str = field(default="", metadata={"help": "provenance of this entry"})

    @property
    def rewardbench_chat_template(self) -> str | None:
        """The dialogue format RewardBench's run script renders for this family where its model card writes another
        (`CARD_DIALOGUES`): --input-method rewardbench uses it for a tokenizer without a chat template of its own;
        None: the tokenizer's own template."""
        return CARD_DIALOGUES.get(self.chat_template)

    def __post_init__(self) -> None:
        if self.reader == "gated" and not self.gating_pattern:
            raise ValueError(f"spec {self.name!r}: the gated reader needs a gating_pattern")
        if (self.reader == "module" and self.layout is None) or (
                self.layout is not None and self.reader not in ("module", "pairwise")):
            raise ValueError(f"spec {self.name!r}: a layout goes with the module reader (or a pairwise model's class), "
                             "and the module reader needs one")
        if (self.reader == "step") != (self.step_token is not None):
            raise ValueError(f"spec {self.name!r}: the step reader goes with a step_token, and a step_token with it")
        if (self.reader == "pairwise") != (self.pairwise in ("pairrm", "betterpairrm", "slicpairpm", "shp", "polar")):
            raise ValueError(f"spec {self.name!r}: the pairwise reader needs its format, pairrm, betterpairrm, "
                             "slicpairpm, shp or polar")
        if self.label_index < 0:
            raise ValueError(f"spec {self.name!r}: label_index must be >= 0")
        if self.logit_minus is not None and self.reader != "logit":
            raise ValueError(f"spec {self.name!r}: logit_minus goes with the logit reader")
        if (self.principle_question is None) != (self.principle is None) or (
                self.principle_question is not None and "{principle}" not in self.principle_question):
            raise ValueError(f"spec {self.name!r}: a principle question holds '{{principle}}' and comes with the "
                             "card's default principle")


DEFAULT = RewardModelSpec(
    name="default",
    notes="AutoModelForSequenceClassification with num_labels=1: the score is the linear head on the last token.",
)

_REMOTE_LLAMA_SHIMS = ("llama_inputs_docstring",)

ALLENAI_RM_INPUT = TEMPLATE_IDS_CARD.format(
    "allenai/*-RM-RB2: 'a standard classifier, AutoModelForSequenceClassification', loaded with its tokenizer; the "
    "card shows no input call; open-instruct trained them on the template's ids (its preference tokenizing: "
    "tokenizer.apply_chat_template(chosen), tokenize=True, on the template it saves with the checkpoint)",
    "the score logits[0][0]. RewardBench 2 (scripts/run_v2.py, its default_v2 RewardBenchPipeline, as RewardBench "
    "0.1.4's) encodes the template's text with tokenizer(text) and masks a doubled BOS: the same ids where the saved "
    "template writes {{ bos_token }} (Llama 3.1 Instruct's), one BOS more where it writes none (open-instruct's "
    "'tulu' template saved without --add_bos, as docs/tulu3.md trains allenai/Llama-3.1-Tulu-3-8B-RM): rm-probe says "
    "so when it loads one, and --input-method rewardbench feeds RewardBench 2's ids")


NEMOTRON_QWEN_INPUT = TEMPLATE_IDS_CARD.format(
    "nvidia/Qwen-2.5-Nemotron-32B-Reward and nvidia/Qwen-3-Nemotron-32B-Reward, stored pages: 'Model Class: "
    "AutoModelForSequenceClassification', one float for the last assistant turn of a user-assistant dialogue; their "
    "usage blocks are not readable offline, so the call is the one NVIDIA's Llama Nemotron cards make, on the "
    "checkpoint's own template (Qwen 2.5's adds its default system turn). Qwen 3's: trained with a 'nothink' "
    "instruction; its template writes the empty thinking block '<think>\\n\\n</think>\\n\\n' before the last "
    "assistant turn (the non-thinking form, as enable_thinking=False does), read as that instruction; a '/nothink' "
    "text in the user turn would differ and is unverified",
    "the classifier's score at the last token (logits[0][0])")


def _allenai_rm(name: str, family: str = "Llama 3.1") -> RewardModelSpec:
    return RewardModelSpec(name, family=family, input_source=ALLENAI_RM_INPUT,
                           notes="a sequence classifier (allenai's open-instruct reward model; RewardBench 2)")

REGISTRY: dict[str, RewardModelSpec] = {
    spec.name: spec
    for spec in [
        DEFAULT,
        # The paper's ten reward models (../shared/data/paper-release/table_1_reward_models.csv).
        RewardModelSpec("Skywork/Skywork-Reward-Gemma-2-27B", family="Gemma 2", notes="Gemma2ForSequenceClassification",
                        input_call="tokenizer(text)", input_source=SKYWORK_V1_INPUT),
        RewardModelSpec("Skywork/Skywork-Reward-Llama-3.1-8B", family="Llama 3.1",
                        notes="LlamaForSequenceClassification", input_call="tokenizer(text)",
                        input_source=SKYWORK_V1_INPUT),
        RewardModelSpec("Skywork/Skywork-Reward-Gemma-2-27B-v0.2", family="Gemma 2",
                        notes="Gemma2ForSequenceClassification",
                        input_source=TEMPLATE_IDS_CARD.format("Skywork-Reward v0.2", "the score logits[0][0]")),
        RewardModelSpec("Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", family="Llama 3.1",
                        notes="LlamaForSequenceClassification",
                        input_source=TEMPLATE_IDS_CARD.format("Skywork-Reward v0.2", "the score logits[0][0]")),
        RewardModelSpec("Ray2333/GRM-Llama3-8B-rewardmodel-ft", family="Llama 3",
                        input_call="tokenizer(text)", input_source=GRM_FT_INPUT,
                        notes="LlamaForSequenceClassification (the -ft variants carry no extra heads)"),
        RewardModelSpec("Ray2333/GRM-Llama3.2-3B-rewardmodel-ft", family="Llama 3.2",
                        input_call="tokenizer(text)", input_source=GRM_FT_INPUT,
                        notes="LlamaForSequenceClassification"),
        RewardModelSpec("Ray2333/GRM-gemma2-2B-rewardmodel-ft", family="Gemma 2",
                        input_call="tokenizer(text)", input_source=GRM_FT_INPUT,
                        notes="Gemma2ForSequenceClassification"),
        RewardModelSpec(
            "RLHFlow/ArmoRM-Llama3-8B-v0.1", reader="gated", output="score", trust_remote_code=True,
            gating_pattern=LLAMA3_ASSISTANT_HEADER, shims=_REMOTE_LLAMA_SHIMS, family="Llama 3",
            input_source=TEMPLATE_IDS_CARD.format("RLHFlow/ArmoRM-Llama3-8B-v0.1", "the score output.score"),
            rewardbench_pipeline="ArmoRMPipeline",
            notes="LlamaForRewardModelWithGating: score = sum(gating(h[gate]) * (regression(h[last]) @ T)); "
                  "19 objectives; the gate reads the first token of the last assistant header.",
        ),
        RewardModelSpec(
            "nicolinho/QRM-Llama3.1-8B", reader="gated", output="score", trust_remote_code=True,
            gating_pattern=LLAMA3_ASSISTANT_HEADER, shims=_REMOTE_LLAMA_SHIMS, family="Llama 3.1",
            input_source=TEMPLATE_IDS_CARD.format("nicolinho/QRM-Llama3.1-8B", "the score output.score"),
            notes="quantile regression head (num_objectives x num_quantiles), averaged over quantiles, then gated "
                  "as ArmoRM; score is outputs.score[:, 0]",
        ),
        RewardModelSpec(
            "nicolinho/QRM-Gemma-2-27B", reader="gated", output="score", trust_remote_code=True,
            gating_pattern=GEMMA_MODEL_TURN, family="Gemma 2",
            input_source=TEMPLATE_IDS_CARD.format("nicolinho/QRM-Gemma-2-27B", "the score output.score"),
            notes="as QRM-Llama3.1-8B with the Gemma turn pattern; assumed from the Llama variant's published code, "
                  "which is why every sweep re-checks the reader against the model's own forward",
        ),
        RewardModelSpec(
            "LxzGordon/URM-LLaMa-3.1-8B", reader="forward", output="logits", trust_remote_code=True,
            shims=_REMOTE_LLAMA_SHIMS, family="Llama 3.1", input_call="tokenizer(text)", input_source=URM_INPUT,
            notes="uncertainty-aware gated head; its modelling code was not available to check a cached reader "
                  "against, so candidates go through the model's own forward (outputs.logits[:, 0])",
        ),
        # NVIDIA's Nemotron rewards: causal LMs whose card reads the reward from the next-token logit of id 0
        *[RewardModelSpec(name, reader="logit", label_index=0, family=fam, notes=note,
                          input_source=NEMOTRON_INPUT.format(source))
          for name, fam, source, note in (
              ("nvidia/Llama-3.1-Nemotron-70B-Reward-HF", "Llama 3.1",
               "model card of nvidia/Llama-3.1-Nemotron-70B-Reward-HF, usage block as its users copy it (the stored "
               "card pages stop before it)", "LlamaForCausalLM converted from the NeMo reward model"),
              ("nvidia/Llama-3.3-Nemotron-70B-Reward", "Llama 3.3",
               "model card of nvidia/Llama-3.3-Nemotron-70B-Reward as its users copy it (stored card pages stop "
               "before the usage block)", "LlamaForCausalLM, scaled Bradley-Terry on HelpSteer3"),
              ("nvidia/Llama-3.3-Nemotron-70B-Reward-Multilingual", "Llama 3.3",
               "model card of nvidia/Llama-3.3-Nemotron-70B-Reward-Multilingual, a text-generation (causal LM) "
               "checkpoint of the same release; its usage block not readable offline, taken as its sibling "
               "Llama-3.3-Nemotron-70B-Reward's", "LlamaForCausalLM, scaled Bradley-Terry on HelpSteer3 (multilingual)"))],
        RewardModelSpec("nvidia/Llama-3.3-Nemotron-70B-Reward-Principle", reader="logit", label_index=9642,
                        logit_minus=2822, principle_question=NEMOTRON_PRINCIPLE_QUESTION, principle="correctness",
                        family="Llama 3.3", input_source=NEMOTRON_PRINCIPLE_INPUT,
                        notes="LlamaForCausalLM (RLBFF, HelpSteer3): a principle asked after the response; the reward "
                              "is the 'Yes' logit minus the 'No' logit of the assistant's first token"),
        # RewardBench 2's leaders (2025): plain sequence classifiers on Llama 3.x and Qwen3
        *[RewardModelSpec(f"Skywork/Skywork-Reward-V2-{name}", family=fam, notes=f"{arch}ForSequenceClassification",
                          input_source=SKYWORK_V2_INPUT)
          for name, fam, arch in (("Llama-3.1-8B", "Llama 3.1", "Llama"), ("Llama-3.1-8B-40M", "Llama 3.1", "Llama"),
                                  ("Llama-3.2-3B", "Llama 3.2", "Llama"), ("Llama-3.2-1B", "Llama 3.2", "Llama"),
                                  ("Qwen3-8B", "Qwen3", "Qwen3"), ("Qwen3-4B", "Qwen3", "Qwen3"),
                                  ("Qwen3-1.7B", "Qwen3", "Qwen3"), ("Qwen3-0.6B", "Qwen3", "Qwen3"))],
        # NVIDIA's Qwen-based Nemotron rewards (2025): sequence classifiers, unlike the Llama ones above
        RewardModelSpec("nvidia/Qwen-2.5-Nemotron-32B-Reward", family="Qwen 2.5", input_source=NEMOTRON_QWEN_INPUT,
                        notes="Qwen2ForSequenceClassification (Bradley-Terry on HelpSteer3; Qwen-2.5-32B-Instruct)"),
        RewardModelSpec("nvidia/Qwen-3-Nemotron-32B-Reward", family="Qwen3", input_source=NEMOTRON_QWEN_INPUT,
                        notes="Qwen3ForSequenceClassification (Bradley-Terry on HelpSteer3 with a 'nothink' "
                              "instruction; Qwen3-32B)"),
        # allenai's RewardBench 2 reward models (the RB2 collection's repositories and the Tulu 3 RM): plain sequence
        # classifiers; the training runs RewardBench 2's leaderboard lists as allenai/open_instruct_dev-rm_* are found
        # by that prefix (PREFIX_SPECS)
        *[_allenai_rm(f"allenai/{name}") for name in (
            "Llama-3.1-8B-Instruct-RM-RB2", "Llama-3.1-70B-Instruct-RM-RB2", "Llama-3.1-8B-Base-RM-RB2",
            "Llama-3.1-Tulu-3-8B-SFT-RM-RB2", "Llama-3.1-Tulu-3-70B-SFT-RM-RB2", "Llama-3.1-Tulu-3-8B-RL-RM-RB2",
            "Llama-3.1-Tulu-3-8B-RM")],
        # RewardBench's custom families (rewardbench/models/*.py), read by their own head layouts
        *[RewardModelSpec(f"Ray2333/{name}", reader="module", layout="grm", family=fam, input_source=GRM_INPUT,
                          input_call="tokenizer(text)", rewardbench_pipeline="GRMPipeline",
                          notes="GRewardModel: backbone + v_head (MLP or linear) on the last token (RewardBench grm.py)")
          for name, fam in (("GRM-llama3-8B-sftreg", "Llama 3"), ("GRM-llama3-8B-distill", "Llama 3"),
                            ("GRM-llama3.2-3B-sftreg", "Llama 3.2"), ("GRM-Gemma-2B-sftreg", "Gemma"),
                            ("GRM-Gemma2-2B-sftreg", "Gemma 2"))],
        RewardModelSpec("infly/INF-ORM-Llama3.1-70B", reader="module", layout="inform", family="Llama 3.1",
                        input_source=TEMPLATE_IDS_CARD.format(
                            "infly/INF-ORM-Llama3.1-70B; its usage block as its users copy it, the stored card being "
                            "cut before it", "the score logits[0][0] before the first pad"),
                        notes="INFORMForSequenceClassification: Linear-ReLU-Linear score head before the first pad"),
        RewardModelSpec("openbmb/UltraRM-13b", reader="module", layout="ultrarm", chat_template="ultrarm-card",
                        rewardbench_pipeline="OpenBMBPipeline",
                        input_source=ULTRARM_INPUT, family="Llama 2",
                        notes="LlamaRewardModel: regression_head on the last token; the card's dialogue "
                              "'Human: ...\\n\\nAssistant: ...'; RewardBench renders 'User: ...\\n\\nAssistant: "
                              "...\\n\\n' (its openbmb template) and appends EOS"),
        RewardModelSpec("openbmb/Eurus-RM-7b", reader="module", layout="ultrarm", family="Mistral",
                        chat_template="eurus-card", input_source=EURUS_INPUT, rewardbench_pipeline="OpenBMBPipeline",
                        notes="EurusRewardModel, read as UltraRM's class (MistralModel + regression_head at the last "
                              "token), as RewardBench reads both with one pipeline; its remote code is not run"),
        RewardModelSpec("Nexusflow/Starling-RM-34B", reader="module", layout="starling", family="Yi",
                        rewardbench_pipeline="StarlingPipeline", input_call="tokenizer(text)",
                        input_ends_at="<|im_end|>", input_source=STARLING_INPUT,
                        notes="Starling's LlamaForSequenceClassification: transformer + v_head before the first id 0; "
                              "RewardBench renders Yi-34B-Chat's ChatML"),
        *[RewardModelSpec(f"PKU-Alignment/beaver-7b-{v}-{kind}", reader="module", layout="beaver",
                          sign=-1.0 if kind == "cost" else 1.0, chat_template="beaver-card",
                          family="Llama 2",
                          rewardbench_pipeline="BeaverCostPipeline" if kind == "cost" else "BeaverPipeline",
                          input_source=BEAVER_INPUT,
                          notes="LlamaForScore: end score of score_head (normalised as the config says)"
                                + ("; a cost: negated, as RewardBench's BeaverCostPipeline does" if kind == "cost" else ""))
          for v in ("v1.0", "v2.0") for kind in ("reward", "cost")],
        RewardModelSpec("ShikaiChen/LDL-Reward-Gemma-2-27B-v0.1", reader="module", layout="ldl", family="Gemma 2",
                        input_source=TEMPLATE_IDS_CARD.format(
                            "not readable offline past its model loading; its Lenovo v2 server script and RewardBench's "
                            "LDLPipeline, which masks a doubled BOS, give these ids", "the score .score"),
                        rewardbench_pipeline="LDLPipeline",
                        notes="LDLRewardModel27B: 10-bin distributions per objective, gated, expectation on [0, 1]; "
                              "heads in regression_layer.pt and gating_layer.pt"),
        # Encoders (bidirectional: no shared-prefix cache), prompt and response as a text pair, as the model cards
        # score them: tokenizer(question, answer) -> [CLS] question [SEP] answer [SEP]
        *[RewardModelSpec(f"OpenAssistant/{name}", reader="forward", chat_template="text-pair", dtype="float32",
                          input_source=PAIR_INPUT,
                          family=fam, notes=f"{fam} sequence classifier on (question, answer) as a text pair; every "
                                            "candidate through the model's own forward (bidirectional attention)")
          for name, fam in (("reward-model-deberta-v3-large-v2", "DeBERTa-v3"), ("reward-model-deberta-v3-large", "DeBERTa-v3"),
                            ("reward-model-deberta-v3-base", "DeBERTa-v3"),
                            ("reward-model-electra-large-discriminator", "ELECTRA"))],
        # Pairwise preference models: each candidate against a reference response, both orders
        *[RewardModelSpec(name, reader="pairwise", pairwise="pairrm", layout="pairrm", dtype="float32",
                          rewardbench_pipeline="PairRMPipeline",
                          input_source="model card (llm-blender/PairRM-hf): tokenize_pair(prompt, candidate, "
                                       "reference) on the plain texts, in both orders: <|source|> prompt, "
                                       "<|candidate1|> .., <|candidate2|> .., each encoded with [CLS]/[SEP] and "
                                       "truncated as it truncates; --input-method rewardbench: PairRMPipeline's "
                                       "tokenize_conv_pair (PairRM's instruction, 'USER: .. Assistant: <Response 1>')",
                          family="DeBERTa-v3", notes="DebertaV2PairRM: logit(candidate over reference) - logit(reference "
                          "over candidate), RewardBench's PairRMPipeline; an encoder: full sequences, batched")
          for name in ("llm-blender/PairRM-hf", "DebertaV2PairRM")],
        *[RewardModelSpec(name, reader="pairwise", pairwise="slicpairpm", family="Llama 3",
                          rewardbench_pipeline="SlicPairPMPipeline",
                          input_source="RewardBench's SlicPairPMPipeline: the '[CONTEXT] .. [RESPONSE A] .. [RESPONSE B]' "
                                       "user turn through the chat template, BOS removed as the pipeline removes it",
                          notes="a causal LM judging '[CONTEXT] .. [RESPONSE A] .. [RESPONSE B] ..': mean over both "
                                "orders of P(candidate) from the 'A'/'B' logits (RewardBench's SlicPairPMPipeline)")
          for name in ("RLHFlow/pair-preference-model-LLaMA3-8B",)],
        # InternLM2 reward: remote code (AutoModel -> InternLM2ForRewardModel), v_head on the reward token appended
        # after the chat template; its backbone is remote too, so every candidate runs through its own forward
        *[RewardModelSpec(name, reader="forward", output="logits", trust_remote_code=True, auto_class="AutoModel",
                          append_token="reward_token_id", family="InternLM2", rewardbench_pipeline="InternLMPipeline",
                          input_call="tokenizer(text)", input_source=INTERNLM2_INPUT,
                          notes="InternLM2ForRewardModel (remote): v_head at the reward token appended after the chat "
                                "template (RewardBench's InternLMPipeline, the model's get_score); own forward")
          for name in ("internlm/internlm2-7b-reward", "internlm/internlm2-1_8b-reward", "internlm/internlm2-20b-reward",
                       "InternLM2ForRewardModel")],
        # Process reward models (remote code: AutoModel -> Qwen2ForProcessRewardModel, a Qwen2 backbone and a 2-way
        # MLP head per position): the reward of a response as one step, at the <extra_0> appended after it
        *[RewardModelSpec(name, reader="step", output="logits", trust_remote_code=True, auto_class="AutoModel",
                          step_token="<extra_0>", system_prompt=QWEN_MATH_SYSTEM, family="Qwen 2.5",
                          input_source=PRM_INPUT,
                          notes="Qwen2ForProcessRewardModel (remote): score = Linear-ReLU-Linear(hidden, 2) at every "
                                "position; the reward softmax(.)[1] at the step separator <extra_0>, on the "
                                "shared-prefix cache (a plain function of the last hidden state)")
          for name in ("Qwen/Qwen2.5-Math-PRM-7B", "Qwen/Qwen2.5-Math-PRM-72B", "Qwen/Qwen2.5-Math-7B-PRM800K",
                       "Qwen2ForProcessRewardModel")],
        # Unit-test judges: causal LMs read as a rating judge (--score auto = rating, --judge-prompt lmunit), the
        # unit test an option (--unit-test)
        *[RewardModelSpec(name, reader="forward", judge_prompt="lmunit", input_call="tokenizer(text)", family=fam,
                          input_source=LMUNIT_INPUT,
                          notes=f"{base} fine-tune generating a JSON rating; read from one next-token distribution "
                                "after its output's start, on the shared-prefix cache (probe/core/judges.py)")
          for name, fam, base in (("ContextualAI/LMUnit-llama3.1-70b", "Llama 3.1", "Llama-3.1-70B-Instruct"),
                                  ("ContextualAI/LMUnit-qwen2.5-72b", "Qwen 2.5", "Qwen2.5-72B-Instruct"))],
        RewardModelSpec("IDEA-CCNL/Ziya-LLaMA-7B-Reward", chat_template="ziya-card",
                        input_eos=True, dtype="float16", family="Llama", rewardbench_pipeline="ZiyaPipeline",
                        input_source=ZIYA_INPUT,
                        notes="LlamaForSequenceClassification in float16 (as its card and RewardBench run it); the "
                              "card's 'Human:...\\n\\nAssistant:...' + EOS; RewardBench renders '\\n\\nHuman: "
                              "...\\n\\nAssistant: ...\\n\\n' (its Ziya template) + EOS"),
        # Families RewardBench runs with their own code (refused before: a default head would give numbers of no
        # meaning), read as that code or their cards read them (tests/unit/test_refused_families.py)
        RewardModelSpec("berkeley-nest/Starling-RM-7B-alpha", reader="module", layout="starling7b", family="Llama 2",
                        chat_template="starling7b-card", input_call="tokenizer(text)",
                        rewardbench_pipeline="StarlingPipeline", input_source=STARLING7B_INPUT,
                        notes="the card's GPTRewardModel: Llama-2-7b-chat's backbone + v_head (no bias), weights in "
                              "one .pt/model.bin file; its folder needs Llama-2-7b-chat's config.json and tokenizer "
                              "beside that file (the card builds the model from that base)"),
        *[RewardModelSpec(name, reader="forward", output="[0]", trust_remote_code=True, auto_class="AutoModel",
                          family="Qwen 2.5", system_prompt="", rewardbench_pipeline="WorldPMPipeline",
                          input_source=WORLDPM_INPUT,
                          notes="WorldPM's remote reward class (AutoModel), read as its card reads it: outputs[0] of "
                                "the model's own forward on input_ids alone; every candidate through that forward")
          for name in ("Qwen/WorldPM-72B", "Qwen/WorldPM-72B-HelpSteer2", "Qwen/WorldPM-72B-RLHFLow",
                       "Qwen/WorldPM-72B-UltraFeedback")],
        *[RewardModelSpec(name, reader="pairwise", pairwise="shp", auto_class="AutoModelForSeq2SeqLM", family="T5",
                          dtype="float32", rewardbench_pipeline="SHPPipeline",
                          input_source="model card and RewardBench 0.1.4's SHPPipeline: tokenizer('POST: {post}\\n\\n "
                                       "RESPONSE A: {a}\\n\\n RESPONSE B: {b}\\n\\n Which response is better? "
                                       "RESPONSE') (the texts before the response joined by spaces as the post; T5's "
                                       "</s> closing it; cut at 2,048 ids as the pipeline cuts it), both orders",
                          notes="T5ForConditionalGeneration answering 'A' or 'B': logit('A') - logit('B') of the "
                                "decoder's first step (the card's generate(max_new_tokens=1)), P(candidate) averaged "
                                "over both orders; an encoder-decoder: full sequences, batched")
          for name in ("stanfordnlp/SteamSHP-flan-t5-xl", "stanfordnlp/SteamSHP-flan-t5-large")],
        *[RewardModelSpec(name, reader="pairwise", pairwise="betterpairrm", layout="pairrm", dtype="float32",
                          rewardbench_pipeline="BetterPairRMPipeline", family="DeBERTa-v3",
                          input_source="RewardBench 0.1.4's BetterPairRMPipeline (tokenize_conv_pair; the card's "
                                       "'format based on Vicuna 1.1', its stored copy cut before its own usage): "
                                       "'USER: {prompt}' and an open 'ASSISTANT: ' joined as its template joins turns, "
                                       "each text cut (source 2,030 ids from the left, responses 670 from the right) "
                                       "and decoded back; '<|source|>' encoded on its own, then the source, "
                                       "'<|candidate1|>' .., '<|candidate2|>' .., each with [CLS]/[SEP]",
                          notes="DebertaV2PairRM (PairRM's class): logit(candidate over reference) - logit(reference "
                                "over candidate), RewardBench's BetterPairRMPipeline; an encoder: full sequences, "
                                "batched")
          for name in ("mightbe/Better-PairRM", "maywell/Better-PairRM")],
        # Architectures of remote-code models, as their modelling code names the class: for checkpoints not
        # listed by id (fine-tunes, local copies under another name).
        RewardModelSpec(
            "LlamaForRewardModelWithGating", reader="gated", output="score", trust_remote_code=True,
            gating_pattern=LLAMA3_ASSISTANT_HEADER, shims=_REMOTE_LLAMA_SHIMS, family="Llama 3",
            notes="ArmoRM's class (RLHFlow modeling_custom.py)",
        ),
        RewardModelSpec(
            "LlamaForRewardModelWithGating31", reader="gated", output="score", trust_remote_code=True,
            gating_pattern=LLAMA3_ASSISTANT_HEADER, shims=_REMOTE_LLAMA_SHIMS, family="Llama 3.1",
            notes="QRM-Llama3.1's class (reward-bench rewardbench/models/qrm.py): quantiles averaged, then gated",
        ),
        RewardModelSpec(
            "LlamaForRewardModelWithGating3", reader="gated", output="score", trust_remote_code=True,
            gating_pattern=LLAMA3_ASSISTANT_HEADER, shims=_REMOTE_LLAMA_SHIMS, family="Llama 3",
            notes="QRM-Llama3's class (reward-bench rewardbench/models/qrm.py)",
        ),
        *[RewardModelSpec(cls, reader="module", layout=layout, chat_template=template,
                          input_source=GRM_INPUT if layout == "grm" else CHAT_TEMPLATE_INPUT if template is None
                          else ULTRARM_INPUT if layout == "ultrarm" else BEAVER_INPUT,
                          input_call="tokenizer(text)" if layout == "grm" else None,
                          rewardbench_pipeline=PIPELINE_OF_LAYOUT[layout],
                          notes=f"{cls}: RewardBench's class, by architecture")
          for cls, layout, template in (("GRewardModel", "grm", None), ("INFORMForSequenceClassification", "inform", None),
                                        ("LlamaRewardModel", "ultrarm", "ultrarm-card"),
                                        ("LlamaForScore", "beaver", "beaver-card"), ("LDLRewardModel27B", "ldl", None))],
        # Sequence classifiers on the hybrid linear-attention and state-space decoders: transformers' own classes, found
        # by the architecture a checkpoint's config names (SGLang serves Qwen3.5 reward models through
        # Qwen3_5ForSequenceClassification, 2026-08); no checkpoint of the others published yet: listed as they
        # appear. The linear head on the last token, on the plain cache path: the prefix's recurrent state copied
        # per row (probe/core/cache.py); Jamba's Mamba-1 layers continue one token at a time.
        *[RewardModelSpec(cls, family=family,
                          notes=f"{cls}: transformers' class, by architecture; linear head on the last token, the "
                                f"prefix's {state} copied per row (probe/core/cache.py)")
          for cls, family, state in (
              ("Qwen3_5ForSequenceClassification", "Qwen3.5", "gated delta net state"),
              ("Qwen3_5TextForSequenceClassification", "Qwen3.5", "gated delta net state"),
              ("Qwen3NextForSequenceClassification", "Qwen3-Next", "gated delta net state"),
              ("JambaForSequenceClassification", "Jamba", "Mamba-1 state (continued one token at a time)"),
              ("Zamba2ForSequenceClassification", "Zamba2", "Mamba-2 state"),
              ("MiniMaxForSequenceClassification", "MiniMax", "lightning attention state"))],
        RewardModelSpec(
            "LlamaForSequenceClassificationWithNormal_Weights", reader="forward", output="logits",
            trust_remote_code=True, shims=_REMOTE_LLAMA_SHIMS, family="Llama 3.1", input_call="tokenizer(text)",
            input_source=URM_INPUT,
            notes="URM's class (as SGLang loads it): score pairs (mean, variance) weighted by an MLP; own forward",
        ),
        # POLAR (policy-discriminative reward models on InternLM2.5): a candidate scored against a reference response
        # in the card's own text format, through the remote class's own forward. The Hub cards are not readable
        # offline past their introduction; the input, class and score come from the same card as the GitHub README
        # of InternLM/POLAR (its "Inference with transformers" block and src/polar/reward_func.py), xtuner's
        # RewardModelClient (xtuner/utils/rm_utils.py, identical encode), its training input (xtuner/dataset/
        # preference_dataset.py tokenize_ref, reward_token_id 92527 = [UNUSED_TOKEN_130] in the POLAR configs) and its
        # InternLM2ForRewardModel (xtuner/tools/model_converters/modeling_internlm2_reward: v_head at the last id the
        # attention mask covers). Checkpoints found by class (InternLM2ForRewardModel) read as InternLM2 reward.
        *[RewardModelSpec(f"internlm/POLAR-{size}", reader="pairwise", pairwise="polar", output="logits",
                          trust_remote_code=True, auto_class="AutoModel", family="InternLM2.5",
                          input_call="tokenizer(text)", input_source=(
                              "model card (internlm/POLAR-*, the GitHub README's 'Inference with transformers'): "
                              "RewardModelClient.encode -> tokenizer(texts, padding=True), model(**batch)[0]: prompt, "
                              "--reference-response and candidate each encoded with special tokens, cut (4,096 ids a "
                              "response), decoded without them; 'prompt\\nreference<|reward|>prompt\\ncandidate"
                              "[UNUSED_TOKEN_130]' as plain text (no chat template; a --system text joined before "
                              "the prompt with a newline, as the client joins the prompt's messages) through "
                              "tokenizer(text): BOS as the tokenizer adds it, no EOS; the score outputs[0] at the last "
                              "id"),
                          notes="InternLM2ForRewardModel (remote, AutoModel): v_head at the closing "
                                "[UNUSED_TOKEN_130]; one order, the reference first; own forward (its backbone is "
                                "remote code)"
                                + ("; the pre-trained-only checkpoint, read as the card reads the fine-tuned one"
                                   if size.endswith("-Base") else ""))
          for size in ("7B", "1_8B", "7B-Base", "1_8B-Base")],
    ]
}


# ids that name a family by a prefix (training runs published one repository each)
PREFIX_SPECS = {"allenai/open_instruct_dev-rm_": _allenai_rm("allenai/open_instruct_dev-rm_", family="open-instruct RM")}


def repo_id_of(model_ref: str) -> str | None:
    """The Hugging Face repo id a path stands for: a cache snapshot (``.../models--Org--Name/snapshots/<hash>``)
    or the last two components of a local path (``.../Org/Name``) when they are a registered id."""
    parts = Path(model_ref).parts
    for part in reversed(parts):
        if part.startswith("models--") and part.count("--") >= 2:
            org, name = part.removeprefix("models--").split("--", 1)
            return f"{org}/{name}"
    if len(parts) >= 2 and "/".join(parts[-2:]) in REGISTRY:
        return "/".join(parts[-2:])
    return None


def lookup(model_ref: str, architectures: list[str] | None = None) -> tuple[RewardModelSpec, str]:
    """The spec for a model id or local path, and how it was found (for the log and meta.json).

    Order: exact id; the repo id of a cache snapshot path or of a path ending in ``Org/Name``; an id (or snapshot's
    repo id) starting with a `PREFIX_SPECS` prefix; the last path
    component matched against the registered names; the first architecture of the config that is registered
    (the class names remote code defines); ``"default"``.
    """
    if model_ref in REGISTRY:
        return REGISTRY[model_ref], "id"
    repo = repo_id_of(model_ref)
    if repo in REGISTRY:
        return REGISTRY[repo], "snapshot path" if "models--" in model_ref else "path"
    named = repo or ("/".join(Path(model_ref).parts[-2:]) if len(Path(model_ref).parts) >= 2 else model_ref)
    for prefix, spec in PREFIX_SPECS.items():  # a family of training runs named by one prefix
        if named.startswith(prefix):
            return replace(spec, name=named), "id prefix"
    parts = Path(model_ref).parts
    by_name = {key.split("/")[-1]: spec for key, spec in REGISTRY.items() if "/" in key}
    if parts and parts[-1] in by_name:
        return by_name[parts[-1]], "path name"
    for arch in architectures or []:
        if arch in REGISTRY:
            return REGISTRY[arch], "architecture"
    return DEFAULT, "default"


# Encoder families: bidirectional attention, so no prefix can be shared; a text pair, not a chat
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "deberta", "deberta-v2", "electra", "distilbert", "albert", "mpnet",
                 "modernbert")


def encoder_spec(model_type: str) -> RewardModelSpec:
    """For an encoder classifier the registry does not name: the text-pair input and the full-sequence path."""
    return RewardModelSpec(f"encoder ({model_type}, by config)", reader="forward", chat_template="text-pair",
                           family=model_type, notes="bidirectional encoder: (prompt, response) as a text pair; every "
                                                    "candidate through the model's own forward, batched")


# Where a gated head reads its gate, by base family: the end of the user turn in each family's template.
GATING_PATTERNS = {"llama": LLAMA3_ASSISTANT_HEADER, "gemma2": GEMMA_MODEL_TURN, "gemma3_text": GEMMA_MODEL_TURN}


def structural_spec(model, spec: RewardModelSpec) -> RewardModelSpec | None:
    """For a checkpoint that matched no entry (``spec`` is the default): a gated spec when the loaded model is
    built like ArmoRM/QRM (``regression_layer`` and ``gating``, no linear ``score``), whatever its class is
    called. None when the default fits or the family's gating position is unknown."""
    import torch

    if spec.name != "default" or isinstance(getattr(model, "score", None), torch.nn.Linear):
        return None
    if not (hasattr(model, "regression_layer") and hasattr(model, "gating")):
        return None
    model_type = getattr(model.config.get_text_config(), "model_type", None)
    if model_type not in GATING_PATTERNS:
        return None
    return RewardModelSpec(
        f"gated ({model_type}, by structure)", reader="gated", output="score", trust_remote_code=True,
        gating_pattern=GATING_PATTERNS[model_type], family=model_type,
        notes="regression_layer + gating found in the loaded model; gate at the end of the user turn")
