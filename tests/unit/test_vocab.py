import pytest

from probe.vocab import build_vocab_table, strip_markers


@pytest.mark.parametrize("family", ["llama3", "gemma", "chatml"])
def test_flags_match_a_one_by_one_computation(tokenizers, family):
    tok = tokenizers[family]
    table = build_vocab_table(tok, batch=97)  # a batch size that does not divide the vocabulary
    assert table.height == len(tok)
    assert table["token_id"].to_list() == list(range(len(tok)))
    special = set(tok.all_special_ids)
    for row in table.iter_rows(named=True):
        tid = row["token_id"]
        text = tok.decode([tid])
        assert row["decoded"] == text
        assert row["roundtrips"] == (tok.encode(text, add_special_tokens=False) == [tid])
        assert row["is_special"] == (tid in special)
        assert row["is_word"] == strip_markers(text).isalpha()


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
