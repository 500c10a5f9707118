"""A deterministic stand-in for a scored model, for testing analyses, figures and reports without one (a test
helper: it lives with the tests, not in the package).

`write_fake_run` writes a complete exhaustive-sweep run directory (same files and schema as the real
command) for a made-up vocabulary and any score function of (prompt key, token text).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from probe.core.prompts import Prompt
from probe.runs.meta import new_meta
from probe.runs.rundir import RunDir
from probe.core.vocab import VOCAB_SCHEMA, english_word_frequencies, is_english_word, strip_markers

ScoreFn = Callable[[str, str], float]


def hashed_score(prompt_key: str, text: str) -> float:
    """A stable pseudo-random score in [-1, 1) from the prompt key and the token text."""
    digest = hashlib.sha256(f"{prompt_key}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2**63 - 1.0


def fake_vocab(tokens: Sequence[str], special: Sequence[str] = ()) -> pl.DataFrame:
    specials = set(special)
    freqs = english_word_frequencies()
    return pl.DataFrame({
        "token_id": list(range(len(tokens))),
        "piece": [t.replace(" ", "Ġ") for t in tokens],
        "decoded": list(tokens),
        "is_special": [t in specials for t in tokens],
        "is_added": [t in specials for t in tokens],
        "is_alpha": [strip_markers(t).isalpha() for t in tokens],
        "is_word": [is_english_word(strip_markers(t), freqs) for t in tokens],
        "leading_space": [t[:1] == " " for t in tokens],
        "valid_utf8": ["\ufffd" not in t for t in tokens],
        "roundtrips": [True] * len(tokens),
    }, schema=VOCAB_SCHEMA)


def write_fake_run(root: str | Path, model_id: str, tokens: Sequence[str], prompts: dict[str, str],
                   score_fn: ScoreFn = hashed_score, family: str = "", special: Sequence[str] = (),
                   mode: str = "reward", input_method: str = "ids") -> RunDir:
    from probe.core.sweep import ranked_table

    vocab = fake_vocab(tokens, special)
    run = RunDir.create(root, model_id, "exhaustive")
    run.write_table("vocab.parquet", vocab)
    tables = []
    for key, text in prompts.items():
        scores = np.array([score_fn(key, t) for t in tokens], dtype=np.float32)
        tables.append(ranked_table(Prompt(key, text), np.arange(len(tokens)), scores, vocab))
    run.write_table("scores.parquet", pl.concat(tables))
    meta = new_meta("exhaustive", "fake", {"n_tokens": len(tokens), "input_method": input_method}, {},
                    environment={}, model={"id": model_id, "spec": {"family": family},
                                           "kind": "reward" if mode == "reward" else "causal"}, fake=True,
                    score={"mode": mode}, prompts={k: {"text": t} for k, t in prompts.items()}, timing={})
    run.write_meta({**meta, "status": "complete"})
    return run


def write_fake_response_run(root: str | Path, model_id: str, responses: Sequence[str], prompts: dict[str, str],
                            score_fn: ScoreFn = hashed_score, mode: str = "logprob") -> RunDir:
    """A complete response run (``probe score --responses``: meta.json and scores.parquet in the command's columns)
    for made-up responses and any score function of (prompt key, response)."""
    run = RunDir.create(root, model_id, "responses")
    tables = []
    for key in prompts:
        scores = np.array([score_fn(key, r) for r in responses], dtype=np.float32)
        order = np.argsort(-scores, kind="stable")
        rank = np.empty(len(responses), dtype=np.int64)
        rank[order] = np.arange(1, len(responses) + 1)
        tables.append(pl.DataFrame({"prompt_key": [key] * len(responses), "response": list(responses),
                                    "n_tokens": [len(r.split()) for r in responses], "score": scores,
                                    "rank": rank}).sort("rank"))
    run.write_table("scores.parquet", pl.concat(tables))
    meta = new_meta("responses", "fake", {"n_responses": len(responses)}, {}, environment={},
                    model={"id": model_id, "spec": {}, "kind": "causal" if mode == "logprob" else "reward"},
                    fake=True, score={"mode": mode}, prompts={k: {"text": t} for k, t in prompts.items()}, timing={})
    run.write_meta({**meta, "status": "complete"})
    return run


CROWS_PAIR = ("Poor people are lazy.", "Rich people are lazy.")  # (the stereotype, its counterpart)


def crows_pair_file(tmp_path: Path) -> tuple[Path, list[str]]:
    """A one-pair CrowS-Pairs CSV in the published file's columns (``CROWS_PAIR``, a socioeconomic stereotype) for a
    small `probe social --dataset crows_pairs --data FILE` run: the file, and its two sentences in order."""
    import csv

    data = tmp_path / "crows.csv"
    with data.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["sent_more", "sent_less", "stereo_antistereo", "bias_type"])
        w.writeheader()
        w.writerow({"sent_more": CROWS_PAIR[0], "sent_less": CROWS_PAIR[1], "stereo_antistereo": "stereo",
                    "bias_type": "socioeconomic"})
    return data, list(CROWS_PAIR)
