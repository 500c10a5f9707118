"""The vocabulary table: one row per token id with its text and the flags an auditor filters on.

Columns: ``token_id``, ``piece`` (the raw vocabulary entry, e.g. ``ĠLove`` or ``▁Love``), ``decoded``
(``tokenizer.decode([id])``), ``is_special`` (a control token: in the special-token map, or an added token the
tokenizer marks special, such as Llama's ``<|end_of_text|>``, ``<|start_header_id|>`` and reserved tokens or
Gemma's ``<start_of_turn>`` and ``<unusedNN>``), ``is_added`` (any added token, special or not, e.g. Qwen's
``<think>``), ``is_alpha`` (alphabetic once a leading space and the ``Ġ``/``▁``/``##`` markers are
stripped), ``is_word`` (that form is an English word: see `is_english_word`), ``leading_space``, ``valid_utf8`` (the id decodes to whole
characters, not a byte fragment), ``roundtrips`` (encoding the decoded text gives back exactly this one id,
the property the paper's text-based method silently relied on).
"""

from __future__ import annotations

import functools
import logging

import polars as pl

log = logging.getLogger(__name__)

SPACE_MARKERS = ("Ġ", "▁", "##")
VOCAB_SCHEMA = {
    "token_id": pl.UInt32,
    "piece": pl.String,
    "decoded": pl.String,
    "is_special": pl.Boolean,
    "is_added": pl.Boolean,
    "is_alpha": pl.Boolean,
    "is_word": pl.Boolean,
    "leading_space": pl.Boolean,
    "valid_utf8": pl.Boolean,
    "roundtrips": pl.Boolean,
}


def strip_markers(text: str) -> str:
    """Word form of a piece or decoded token: no leading whitespace or subword markers."""
    text = text.lstrip()
    for marker in SPACE_MARKERS:
        if text.startswith(marker):
            text = text[len(marker) :]
    return text.strip()


# Zipf thresholds by length: wordfreq counts abbreviations, names and word pieces, and the shorter the form, the more
# of its frequent entries are such ("uk", "ed", "al"; "mach", "ames", "adhd" among the four-letter ones below 3.5)
MIN_ZIPF, MIN_ZIPF_FOUR = 3.0, 3.5
# wordfreq splits "doesn't" into "doesn" and "t", so the stems of "n't" carry a frequency without being words
# ("haven" is one)
NEGATION_STEMS = frozenset("aren couldn didn doesn hadn hasn isn mightn mustn needn shouldn wasn weren wouldn".split())


@functools.cache
def short_words() -> frozenset[str]:
    """The English words of one to three letters that count as words (probe/data/short_words.txt): wordfreq's
    forms of at most three letters at a Zipf frequency of at least 4.5, less abbreviations ("uk", "tv", "mr"),
    names ("al", "ed", "bob"), letters, word pieces ("ing", "el", "de", "pre") and contraction tails ("ll", "ve":
    wordfreq splits "I'll" into "i" and "ll")."""
    from importlib.resources import files

    text = (files("probe") / "data" / "short_words.txt").read_text(encoding="utf-8")
    return frozenset(w.strip() for w in text.splitlines() if w.strip() and not w.startswith("#"))


def english_word_frequencies() -> dict[str, float] | None:
    """wordfreq's English word list; None where wordfreq is not installed (a dependency of rm-probe, missing only
    where a machine runs the GPU paths without it, such as the GPU kit's): the ``W`` flag is then left empty (null),
    said once, and scores are unaffected."""
    try:
        from wordfreq import get_frequency_dict
    except ImportError:
        _warn_no_wordfreq()
        return None
    return get_frequency_dict("en", wordlist="large")


@functools.cache
def _warn_no_wordfreq() -> None:
    log.warning("wordfreq is not installed: the W flag (English word) is left empty (pip install wordfreq)")


def is_english_word(form: str, freqs: dict[str, float] | None) -> bool | None:
    """A word, not a fragment: ``form`` (markers and spaces stripped) is alphabetic and, case-folded, either one
    of the shipped common words of one to three letters (`short_words`), or of four letters at a Zipf frequency
    in wordfreq's English list of at least 3.5, or of five or more at least 3 (one per million words of running
    text). Abbreviations, names and word pieces of up to three letters (" Uk", "ed", "al", "ing") are not words,
    nor rarer four-letter forms (" Mach"), nor the stems of "n't" (" doesn"); rare words and names of five letters
    or more still pass. English only: the flag is meant for the English prompts of the paper; tokens of other
    languages are not called words. On SmolLM2's 49,152 tokens it marks 28,416 (the rule before, wordfreq alone
    at 4.5 for short forms, marked 29,300)."""
    import math

    if freqs is None:
        return None
    if not form.isalpha():
        return False
    key = form.casefold()
    if len(key) <= 3:
        return key in short_words()
    if key in NEGATION_STEMS:
        return False
    freq = freqs.get(key, 0.0)
    if freq <= 0:
        return False
    zipf = math.log10(freq) + 9
    return zipf >= (MIN_ZIPF_FOUR if len(key) == 4 else MIN_ZIPF)


def control_token_ids(tokenizer) -> set[int]:
    """Ids of control tokens: the special-token map (``all_special_ids``) and every added token marked special.

    ``all_special_ids`` alone misses most of them: on Llama 3.2 it holds 2 of the 256 special added tokens,
    on Gemma 3 5 of 6,249."""
    ids = {int(i) for i in tokenizer.all_special_ids}
    for i, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(i))
    return ids


def build_vocab_table(tokenizer, n_ids: int | None = None, batch: int = 8192) -> pl.DataFrame:
    n = len(tokenizer) if n_ids is None else n_ids
    ids = list(range(n))
    pieces = [p if p is not None else "" for p in tokenizer.convert_ids_to_tokens(ids)]
    decoded = tokenizer.batch_decode([[i] for i in ids])
    forms = [strip_markers(d) for d in decoded]
    freqs = english_word_frequencies()
    special = control_token_ids(tokenizer)
    added = set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    roundtrips: list[bool] = []
    for start in range(0, n, batch):
        chunk = decoded[start : start + batch]
        enc = tokenizer(chunk, add_special_tokens=False)["input_ids"]
        roundtrips.extend(e == [start + k] for k, e in enumerate(enc))
    return pl.DataFrame(
        {
            "token_id": ids,
            "piece": pieces,
            "decoded": decoded,
            "is_special": [i in special for i in ids],
            "is_added": [i in added for i in ids],
            "is_alpha": [f.isalpha() for f in forms],
            "is_word": [is_english_word(f, freqs) for f in forms],
            "leading_space": [d[:1].isspace() or p.startswith(SPACE_MARKERS[:2]) for d, p in zip(decoded, pieces)],
            "valid_utf8": ["\ufffd" not in d for d in decoded],
            "roundtrips": roundtrips,
        },
        schema=VOCAB_SCHEMA,
    )
