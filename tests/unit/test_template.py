import random

import pytest

from probe.errors import TemplateError
from probe.core.template import judge_conversation, render, response_conversation, split_template

PROMPT = "What, in one word, is the greatest thing ever?"


@pytest.mark.parametrize("family", ["llama3", "gemma", "chatml"])
@pytest.mark.parametrize("layout", ["response", "judge"])
def test_split_equals_tokenizer_ids_on_random_tokens(tokenizers, family, layout):
    tok = tokenizers[family]
    build = response_conversation(PROMPT) if layout == "response" else judge_conversation(PROMPT)
    split = split_template(tok, build)
    rng = random.Random(3)
    checked = 0
    for tid in rng.sample(range(len(tok)), 300):
        text = tok.decode([tid])
        if not (text.isalpha() and tok.encode(text, add_special_tokens=False) == [tid]):
            continue
        assert render(tok, build, text) == split.full_ids([tid]), (family, tid, text)
        checked += 1
    assert checked > 30
    assert split.verified_tokens >= 30


def test_system_prompt_goes_into_the_prefix(tokenizers):
    tok = tokenizers["chatml"]
    split = split_template(tok, response_conversation(PROMPT, system="Be brief."))
    assert "Be brief." in split.prefix_text and PROMPT in split.prefix_text
    assert split.suffix_text == "<|im_end|>\n"


@pytest.mark.parametrize("family,expected", [("llama3", "stripped"), ("gemma", "stripped"), ("chatml", "kept")])
def test_whitespace_treatment_is_recorded(tokenizers, family, expected):
    split = split_template(tokenizers[family], response_conversation(PROMPT))
    assert split.leading_space == expected
    assert split.trailing_space == expected


@pytest.mark.parametrize("strip,leading,trailing", [("rstrip", "kept", "stripped"), ("lstrip", "stripped", "kept")])
def test_a_template_that_trims_one_side_is_recorded_per_side(tokenizers, strip, leading, trailing):
    """ChatML with the content trimmed on one side only (Python's str.rstrip/lstrip in the template): the two
    probes must disagree, so a trailing-space probe that copied the leading one would fail here."""
    import copy

    tok = copy.deepcopy(tokenizers["chatml"])
    tok.chat_template = tok.chat_template.replace("message['content']", f"message['content'].{strip}()")
    split = split_template(tok, response_conversation(PROMPT))
    assert (split.leading_space, split.trailing_space) == (leading, trailing)


def test_bos_appears_once(tokenizers):
    for family, n in (("llama3", 1), ("gemma", 1), ("chatml", 0)):
        split = split_template(tokenizers[family], response_conversation(PROMPT))
        assert split.bos_count == n


def test_doubled_bos_fails_loudly(tokenizers):
    tok = tokenizers["llama3"]
    bad = tok.chat_template.replace("{{ bos_token }}", "{{ bos_token }}{{ bos_token }}", 1)
    tok2 = tok.__class__(tokenizer_object=tok.backend_tokenizer, **tok.special_tokens_map)
    tok2.chat_template = bad
    with pytest.raises(TemplateError, match="2 BOS"):
        split_template(tok2, response_conversation(PROMPT))


def test_template_that_rewrites_the_response_fails(tokenizers):
    tok = tokenizers["chatml"]
    tok2 = tok.__class__(tokenizer_object=tok.backend_tokenizer, **tok.special_tokens_map)
    tok2.chat_template = tok.chat_template.replace("message['content']", "message['content'] | upper")
    with pytest.raises(TemplateError, match="does not keep the response"):
        split_template(tok2, response_conversation(PROMPT))


def test_template_that_glues_the_response_to_text_fails(tokenizers):
    tok = tokenizers["chatml"]
    tok2 = tok.__class__(tokenizer_object=tok.backend_tokenizer, **tok.special_tokens_map)
    glued = tok.chat_template.replace("'\n' + message['content']", "'\nt' + message['content']")
    assert glued != tok.chat_template
    tok2.chat_template = glued
    with pytest.raises(TemplateError):
        split_template(tok2, response_conversation(PROMPT))


def test_verification_catches_tokens_that_merge(tokenizers):
    # a split whose prefix ends in "t": "ing" renders as "ting" through the tokenizer, not as [t] + [ing]
    from dataclasses import replace

    from probe.core.template import _verify

    tok = tokenizers["chatml"]
    build = response_conversation(PROMPT)
    split = split_template(tok, build)
    ing = tok.encode("ing", add_special_tokens=False)
    assert len(ing) == 1 and len(tok.encode("ting", add_special_tokens=False)) == 1
    _verify(tok, build, split, ing)  # the true split passes
    t_id = tok.encode("t", add_special_tokens=False)
    bad = replace(split, prefix_ids=split.prefix_ids + tuple(t_id))
    glued = lambda r: build("t" + r)  # noqa: E731
    with pytest.raises(TemplateError, match="merges the response"):
        _verify(tok, glued, bad, ing)


def test_empty_prompt_is_an_error():
    with pytest.raises(TemplateError, match="empty"):
        response_conversation("   ")
    with pytest.raises(TemplateError, match="empty"):
        judge_conversation("")


def test_broken_template_is_a_template_error(tokenizers):
    tok = tokenizers["chatml"]
    tok2 = tok.__class__(tokenizer_object=tok.backend_tokenizer, **tok.special_tokens_map)
    tok2.chat_template = "{{ raise_exception('no assistant turns here') }}"
    with pytest.raises(TemplateError, match="failed to render"):
        split_template(tok2, response_conversation(PROMPT))


def test_control_tokens_in_the_prompt_stay_text(tokenizers):
    tok = tokenizers["chatml"]
    split = split_template(tok, response_conversation("Say <|im_end|> please"))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    # only the template's own <|im_end|> (closing system-less user turn) is a control token in the prefix
    assert split.prefix_ids.count(im_end) == 1


def test_a_template_whose_space_joins_the_response_is_split_as_joined(tokenizers):
    """'assistant: Love' on a byte-level BPE: the template's space joins the word (' Love' is one id). The split
    ends before that space, records 'joined', and is verified on leading-space tokens: the rendering of the word
    equals prefix + [id of ' word'] + suffix. A template whose text before the slot is not a space still fails."""
    tok = tokenizers["chatml"]
    tok2 = tok.__class__(tokenizer_object=tok.backend_tokenizer, **tok.special_tokens_map)
    spaced = tok.chat_template.replace("'\n' + message['content']", "': ' + message['content']")
    assert spaced != tok.chat_template
    tok2.chat_template = spaced
    split = split_template(tok2, response_conversation(PROMPT))
    assert split.leading_space == "joined" and split.verified_tokens > 3
    assert tok2.decode(list(split.prefix_ids)).endswith("assistant:")
    from probe.core.template import PROBE_WORDS, render

    words = [w for w in PROBE_WORDS if len(tok2.encode(" " + w, add_special_tokens=False)) == 1]
    assert len(words) >= 3
    for w in words:
        assert render(tok2, response_conversation(PROMPT), w) == split.full_ids(tok2.encode(" " + w, add_special_tokens=False))
