"""Issue 57 (round 4 of planted bugs): what the last rounds' code gave no test of its own, each at values where a
one-line slip changes the answer: the deal by cost worked by hand, the batch's job order, a trace's units, the
soft-cap's implementations and record, the tested version span at its edges, the control-token rule's order and
its white space, a SentencePiece piece's space, a card's dialogue format, a random head's seed, persona movers
at dz = 0, a judge prompt filled once."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import polars as pl
import pytest
import torch


# --- distributed.deal: the costliest first, each to the least-loaded rank (ties: the lowest) ----------------------
def test_deal_by_hand():
    from probe.runs.distributed import deal

    # costs 5, 4, 3, 3, 3 over 2 ranks: 5 -> r0 (5, 0); 4 -> r1 (5, 4); 3 -> r1 (5, 7); 3 -> r0 (8, 7); 3 -> r1
    assert deal([5.0, 4.0, 3.0, 3.0, 3.0], 2) == [[0, 3], [1, 2, 4]]
    # a cheap chunk first in the list changes nothing: the order is by cost, then index
    assert deal([1.0, 9.0, 9.0, 2.0], 3) == [[1], [2], [0, 3]]
    assert deal([], 2) == [[], []] and deal([2.0], 1) == [[0]]


# --- probe batch: jobs largest first (torchrun's queue and --shard's parts) ---------------------------------------
def test_batch_orders_jobs_largest_first(tmp_path):
    from probe.commands.batch import largest_first
    from probe.config import ScoreVocabConfig

    jobs = [ScoreVocabConfig(prompt=("A?",), limit=3), ScoreVocabConfig(prompt=("A?", "B?"), limit=40),
            ScoreVocabConfig(prompt=("A?",), limit=10), ScoreVocabConfig(prompt=("A?",))]  # no limit: a vocabulary
    assert largest_first(jobs) == [3, 1, 2, 0]


# --- probe trace: a prompt's distinct responses in one unit (fewer than CHUNK) ------------------------------------
def test_a_traces_few_responses_are_one_unit_each_prompt():
    from probe.commands.trace import _units

    pieces = [("--response", "A?", r, {}) for r in ("one", "two", "three", "two")] + [("--gcg", "A?", [7], {})]
    assert _units(pieces) == [("A?", ["one", "two", "three"], True), ("A?", [7], False)]


# --- soft-cap: SDPA never counts as applying it; the record says who chose ---------------------------------------
def _capped_config(impl: str):
    from transformers import Gemma2Config

    cfg = Gemma2Config(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=4, attn_logit_softcapping=50.0)
    cfg._attn_implementation = impl
    return cfg


@pytest.mark.parametrize("impl", ["sdpa", None, "some_kernel"])
def test_sdpa_and_unknown_attention_are_switched_to_eager(impl):
    from probe.errors import ProbeError
    from probe.models.attention import load_kwargs, needed

    assert needed(_capped_config(impl)) == "eager"
    if impl is not None:
        with pytest.raises(ProbeError, match="does not apply"):
            load_kwargs(_capped_config("eager"), impl)
    assert needed(_capped_config("eager")) is None and load_kwargs(_capped_config("eager"), None) == {
        "attn_implementation": "eager"}


def test_the_attention_record_names_who_chose():
    from probe.models.attention import record

    model = torch.nn.Module()
    model.config = _capped_config("eager")
    assert record(model) == {"implementation": "eager", "softcap": 50.0, "chosen_by": "transformers"}
    model.rm_probe_attention_choice = {"instead_of": "sdpa", "why": "w"}
    assert record(model) == {"implementation": "eager", "softcap": 50.0, "chosen_by": "rm-probe",
                             "instead_of": "sdpa", "why": "w"}


# --- the tested version span, at both edges --------------------------------------------------------------------
@pytest.mark.parametrize("package, version, out", [
    ("torch", "2.6.0", False), ("torch", "2.5.1", True), ("torch", "2.13.0", False), ("torch", "2.13.7+cu130", False),
    ("torch", "2.14.0", True), ("transformers", "5.2.0", False), ("transformers", "5.1.9", True),
    ("transformers", "5.24.3", False), ("transformers", "5.25.0", True), ("transformers", "6.0.0", True)])
def test_the_tested_span_at_its_edges(package, version, out):
    from probe.versions import TESTED, outside

    assert TESTED == {"torch": ("2.6.0", "2.13"), "transformers": ("5.2.0", "5.24")}  # the edges tested here
    assert outside(package, version) is out


# --- the control-token rule: longest first, white space never a control token ---------------------------------
def test_control_tokens_longest_first_without_white_space():
    from tokenizers import AddedToken

    from probe.core.control_tokens import control_tokens

    added = [AddedToken(t, special=False) for t in ("<|im", "<|im_end|>", "<|im_start|>", "\n", "  ", "zz")]
    tok = SimpleNamespace(added_tokens_decoder=dict(enumerate(added)))
    template = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>  \n{% endfor %}"
    assert control_tokens(tok, template) == ("<|im_start|>", "<|im_end|>", "<|im")


# --- the glued slot: a SentencePiece piece's marker is the space it stands for ---------------------------------
def test_a_pieces_space_marker_reads_as_a_space():
    from probe.core.template import _glued, piece_text

    pieces = {1: "\u2581Love", 2: "Love", 3: "Pe", 4: "ace", 5: "Joy", 6: "Hope", 7: "\u2581Joy", 8: "\u2581Hope",
              9: "\u2581Peace"}
    tok = SimpleNamespace(convert_ids_to_tokens=lambda i: pieces[i])
    assert piece_text(tok, 1) == " Love" and piece_text(tok, 2) == "Love"
    probes = [("Love", 1), ("Joy", 7), ("Hope", 8), ("Peace", 9)]
    assert _glued(tok, probes, [[2], [5], [6], [3, 4]]) == [("Love", 2), ("Joy", 5), ("Hope", 6)]
    # the slot as the words' own spaced pieces but one: not glued (a space read as nothing would call it glued)
    assert _glued(tok, probes, [[1], [7], [8], [3, 4]]) is None


# --- a card's dialogue format replaces the tokenizer's template; RewardBench's route keeps its own ---------------
def test_a_cards_format_replaces_the_tokenizers_template_on_its_route_only():
    from probe.models.loading import family_template
    from probe.models.registry import CARD_DIALOGUES, REGISTRY

    specs = [s for s in REGISTRY.values() if s.chat_template in CARD_DIALOGUES]
    assert {s.chat_template for s in specs} == set(CARD_DIALOGUES)
    for s in specs:
        assert family_template(s, "ids") == (s.chat_template, True)
        assert family_template(s, "rewardbench") == (s.rewardbench_chat_template, False)
    other = next(s for s in REGISTRY.values() if s.chat_template is not None and s.chat_template not in CARD_DIALOGUES)
    assert family_template(other, "ids") == (other.chat_template, False)


# --- a random head: drawn from the seed a trace passes, the caller's state left alone ----------------------------
def test_a_random_head_follows_the_seed_passed_and_leaves_the_callers_state(tiny_dirs):
    from probe.models.loading import load_for_config

    def head(cfg_seed, seed=None):
        cfg = SimpleNamespace(rm=tiny_dirs["lm"], device="cpu", allow_random_head=True, seed=cfg_seed)
        torch.manual_seed(123)
        before = torch.random.get_rng_state()
        w = load_for_config(cfg, "reward", seed=seed).model.score.weight.detach().clone()
        assert torch.equal(torch.random.get_rng_state(), before)
        return w

    seven = head(7)
    assert torch.equal(head(0, seed=7), seven)  # a trace of a --seed 7 run draws that run's head
    assert not torch.equal(head(0), seven) and torch.equal(head(0), head(3, seed=0))


# --- persona movers: a string whose standardised score did not move is neither rising nor falling ---------------
def test_unmoved_strings_are_in_neither_mover_list():
    from probe.analysis.personas import movers

    moved = pl.DataFrame({"token_id": [1, 2, 3, 4, 5], "decoded": list("abcde"), "rank_control": [1, 2, 3, 4, 5],
                          "rank_persona": [1, 2, 3, 4, 5], "score_control": [5.0, 4, 3, 2, 1],
                          "score_persona": [5.0, 4, 3, 2, 1], "dz": [0.5, 0.0, 0.0, -0.25, -0.25]})
    up, down = movers(moved, 10, words_only=False)
    assert up["decoded"].to_list() == ["a"] and sorted(down["decoded"].to_list()) == ["d", "e"]
    np.testing.assert_array_equal(down["dz"].to_numpy(), [-0.25, -0.25])


# --- a judge's prompt: filled in one pass, whatever the texts say -------------------------------------------------
def test_a_pair_judges_prompt_is_filled_in_one_pass():
    from probe.core.judges import JudgePrompt

    judge = JudgePrompt("t", "pair", "test", "Q: {prompt}\nA: {response_a}\nB: {response_b}")
    assert judge.fill("Say {response_a}", "I say {response_b}", "B {prompt}") == (
        "Q: Say {response_a}\nA: I say {response_b}\nB: B {prompt}")
    rating = JudgePrompt("r", "rating", "test", "{prompt} -> {response}", ratings=(1, 9))
    assert rating.fill("{response}?", "{prompt}!") == "{response}? -> {prompt}!"


# --- probe trace: a piece given as ids gets its own trace, beside text pieces --------------------------------------
def test_a_piece_given_as_ids_is_traced_as_those_ids(tiny_models):
    """The units' traces are put back in the pieces' order: each ids piece (a GCG result whose text does not
    encode back to its ids) gets the trace of its own ids, never a text unit's."""
    from probe.commands.trace import _trace_pieces
    from probe.config import ScoringOptions
    from probe.core.trace import trace_ids
    from probe.runs.distributed import Dist

    loaded = tiny_models["llama-rm"]
    pieces = [("--response", "A?", "Love", {}), ("--gcg", "A?", [70, 71, 72], {}), ("--response", "A?", "Peace", {}),
              ("--gcg", "B?", [80], {})]
    df = _trace_pieces(loaded, "reward", pieces, ScoringOptions(), None, Dist())
    for k, ids in ((2, [70, 71, 72]), (4, [80])):
        got = df.filter(pl.col("trace").str.starts_with(f"trace_{k:02d}"))
        want = trace_ids(loaded, "reward", pieces[k - 1][1], ids)
        assert got.select(want.columns).equals(want)
