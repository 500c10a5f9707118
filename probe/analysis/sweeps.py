"""Saved sweeps as tables, and the shared vocabulary across models with different tokenizers."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from probe.errors import DataFormatError
from probe.runs.rundir import RunDir
from probe.core.vocab import strip_markers

NORMALISATIONS = ("exact", "strip", "lower")


@dataclass
class Sweep:
    path: Path
    meta: dict
    scores: pl.DataFrame  # prompt_key, token_id, score, rank, vocabulary columns

    @property
    def model(self) -> str:
        return self.meta["model"]["id"]

    @property
    def responses(self) -> bool:
        """A run of ``probe score --responses``: its rows are responses (``decoded`` holds each response's text,
        ``token_id`` the response's identity: `response_rows`), not the vocabulary's tokens."""
        return self.meta.get("experiment") == "responses"

    @property
    def prompts(self) -> dict[str, str]:
        return {k: v["text"] for k, v in self.meta["prompts"].items()}

    def prompt(self, key: str) -> pl.DataFrame:
        if key not in self.prompts:
            raise DataFormatError(f"{self.path}: no prompt {key!r} (has {sorted(self.prompts)})")
        return self.scores.filter(pl.col("prompt_key") == key)

    def key_for(self, text_or_key: str) -> str:
        if text_or_key in self.prompts:
            return text_or_key
        for k, t in self.prompts.items():
            if t == text_or_key:
                return k
        raise DataFormatError(f"{self.path}: no prompt {text_or_key!r} (has {sorted(self.prompts)})")


# what each kind of run is called in a refusal, and the command that reads it
OTHER_RUNS = {"social": ("a social-benchmark run (probe social)", "its numbers are in its summary.json and "
                                                                   "scores.parquet"),
              "gcg_max": ("a GCG run (probe gcg)", "its result is in its result.json and trajectory.parquet"),
              "gcg_min": ("a GCG run (probe gcg --direction min)", "its result is in its result.json and "
                                                                  "trajectory.parquet"),
              "beam": ("a beam run (probe gcg --beam)", "its result is in its result.json and beam.parquet")}


def other_run(path, kind: str, reader: str) -> DataFormatError:
    """The one line for a run ``reader`` does not read: what the run is, and where its results are."""
    what, where = OTHER_RUNS.get(kind, (f"a {kind} run", "see its meta.json"))
    return DataFormatError(f"{path} is {what}; {reader}; {where}")


def load_sweep(path: str | Path) -> Sweep:
    """A finished run of ``probe score``: an exhaustive sweep, or a response run (`Sweep.responses`) whose table
    is given the sweep's columns (each response as a ``decoded`` string, no vocabulary flags set)."""
    rd = RunDir(path)
    meta = rd.read_meta()
    kind = meta.get("experiment", "exhaustive")
    if kind not in ("exhaustive", "responses"):
        raise other_run(path, kind, "probe analyze reads runs of probe score (sweeps, --responses)")
    if meta.get("status") != "complete":
        raise DataFormatError(f"{path}: the run is not complete (status {meta.get('status')!r}); finish it with --resume")
    if not (rd.path / "scores.parquet").is_file():
        raise DataFormatError(f"{path}: no scores.parquet")
    scores = rd.read_table("scores.parquet")
    if kind == "responses":
        return Sweep(rd.path, meta, response_rows(scores))
    return Sweep(rd.path, meta, upgrade_vocab_columns(scores))


def response_rows(df: pl.DataFrame) -> pl.DataFrame:
    """A response run's table with the columns the sweep analyses read: ``decoded`` = the response, ``token_id`` =
    the response's identity (the same id for the same text in every prompt of the run: the dense rank of its text,
    and of its occurrence among equal texts of the prompt, in the table's order), and flags that hold for a response
    (valid text, not special; ``is_word``: a one-word response that is an English word). Whatever joins rows of
    response runs (persona grids, agreement, contrast) joins the responses themselves, never their places in a
    ranking (issue 49: the rows are in rank order)."""
    from probe.core.vocab import english_word_frequencies, is_english_word

    freqs = english_word_frequencies()
    words = [" " not in r.strip() and is_english_word(r.strip(), freqs) for r in df["response"].to_list()]
    df = df.with_row_index("_row")
    df = df.with_columns(pl.int_range(pl.len()).over("prompt_key", "response").alias("_nth"))
    ids = df.select("response", "_nth").unique().sort("response", "_nth").with_row_index("token_id")
    df = df.join(ids.with_columns(pl.col("token_id").cast(pl.UInt32)), on=["response", "_nth"], how="left")
    df = df.sort("_row").drop("_row", "_nth")
    return df.with_columns(
        pl.col("response").alias("decoded"), pl.col("response").alias("piece"),
        pl.lit(False).alias("is_special"), pl.lit(False).alias("is_added"),
        pl.Series("is_word", words, dtype=pl.Boolean),
        pl.col("response").str.contains(r"^[A-Za-z]+$").alias("is_alpha"),
        pl.col("response").str.starts_with(" ").alias("leading_space"),
        pl.lit(True).alias("valid_utf8"), pl.lit(True).alias("roundtrips"))


def upgrade_vocab_columns(df: pl.DataFrame) -> pl.DataFrame:
    """The W flag by today's rule (probe.core.vocab.is_english_word), recomputed from the decoded text wherever
    wordfreq is installed, so that a run written under an earlier rule (one that called " Uk" or "ed" a word) reads
    as a new one does. Runs written before the word flag meant a word: their ``is_word`` was "alphabetic" (now
    ``is_alpha``). Runs made without wordfreq (the GPU machine) have an empty ``is_word``: left empty where wordfreq
    is not installed either."""
    if "decoded" not in df.columns or "is_word" not in df.columns:
        return df
    old = "is_alpha" not in df.columns
    from probe.core.vocab import english_word_frequencies, is_english_word

    freqs = english_word_frequencies()
    if freqs is None and not old:
        return df
    words = [is_english_word(strip_markers(d), freqs) for d in df["decoded"].to_list()]
    out = df.rename({"is_word": "is_alpha"}) if old else df  # (with_columns replaces a column in its place)
    return out.with_columns(pl.Series("is_word", words, dtype=pl.Boolean))


def normalise(text: str, mode: str = "exact") -> str:
    """``exact``: Unicode NFC only (a leading space is part of the string); ``strip``: also strip surrounding
    whitespace and sub-word markers; ``lower``: also lower-case."""
    text = unicodedata.normalize("NFC", text)
    if mode == "exact":
        return text
    text = strip_markers(text)
    return text.lower() if mode == "lower" else text


def unique_strings(df: pl.DataFrame, mode: str = "exact") -> pl.DataFrame:
    """One prompt's rows -> ``string, score``, dropping strings that several ids of this tokenizer decode to
    (after normalisation): such a string has no single score. Invalid UTF-8 fragments and empty strings go too."""
    rows = df.filter(pl.col("valid_utf8")).select(
        pl.col("decoded").map_elements(lambda t: normalise(t, mode), return_dtype=pl.String).alias("string"),
        "score", "token_id")
    rows = rows.filter(pl.col("string").str.len_chars() > 0)
    counts = rows.group_by("string").len()
    keep = counts.filter(pl.col("len") == 1).select("string")
    return rows.join(keep, on="string").select("string", "score", "token_id")


def same_tokenizer(frames: dict[str, pl.DataFrame]) -> bool:
    """Whether every run decodes every token id to the same text (one tokenizer, e.g. two score modes)."""
    first = None
    for df in frames.values():
        ids = df.select("token_id", "decoded").sort("token_id")
        if first is None:
            first = ids
        elif not ids.equals(first):
            return False
    return True


def shared_vocabulary(frames: dict[str, pl.DataFrame], mode: str = "exact", by: str = "strings",
                      with_kind: bool = False):
    """One row per shared vocabulary entry, ``string`` plus one score column per model.

    ``by="strings"`` (the paper's matching across tokenizers): the strings that every model's tokenizer has as
    exactly one id, after normalisation (`normalise`). ``by="ids"``: runs of one tokenizer, joined on the token id
    (all ids, duplicated strings included). ``by="auto"``: ids where the runs share a tokenizer, else strings.
    ``with_kind``: also return "token ids" or "strings"."""
    use_ids = by == "ids" or (by == "auto" and same_tokenizer(frames))
    out = None
    for name, df in frames.items():
        if use_ids:
            u = df.select(pl.col("token_id"), pl.col("decoded").alias("string"), pl.col("score").alias(name))
            out = u if out is None else out.join(u.drop("string"), on="token_id", how="inner")
        else:
            u = unique_strings(df, mode).select("string", pl.col("score").alias(name))
            out = u if out is None else out.join(u, on="string", how="inner")
    if out is None or out.height == 0:
        raise DataFormatError("the models share no vocabulary strings under this normalisation")
    out = out.sort("token_id").drop("token_id") if use_ids else out.sort("string")
    return (out, "token ids" if use_ids else "strings") if with_kind else out


def short_name(model_id: str) -> str:
    return model_id.rstrip("/").split("/")[-1]


def mode_name(meta: dict, default: str | None = "?") -> str | None:
    """A run's score mode in a label: ``logprob``, ``reward``, ``judge``, or for an implicit reward ``implicit vs
    <reference>``."""
    ref = (meta.get("model") or {}).get("ref")
    if ref:
        return f"implicit vs {short_name(ref.get('id', '?'))}"
    return (meta.get("score") or {}).get("mode") or meta.get("mode") or default  # a social run's: top level


def input_route(meta: dict) -> str:
    """The input method a run was scored with: ``ids`` (the family's own inputs), ``rewardbench`` or
    ``paper``. From its settings (a response run records it only when not ``ids``), else its model record's
    input convention, which names RewardBench's route where that was taken."""
    from probe.models.registry import REWARDBENCH_DPO_INPUT

    method = (meta.get("settings") or {}).get("input_method")
    if method:
        return str(method)
    convention = str(((meta.get("model") or {}).get("input") or {}).get("convention") or "")
    rewardbench = "(--input-method rewardbench)" in convention or convention == REWARDBENCH_DPO_INPUT
    return "rewardbench" if rewardbench else "ids"


def run_labels(sweeps: list[Sweep], with_mode: bool = True) -> list[str]:
    """One label per run: model and score mode (``SmolLM2-135M-Instruct [judge]``; without ``with_mode`` the
    mode only where a model repeats), then what else tells runs of one label apart (`labels_for`)."""
    return labels_for([s.model for s in sweeps], [s.meta for s in sweeps], with_mode)


def _random_head_seed(meta: dict):
    return (((meta.get("settings") or {}).get("weights") or {}).get("random_head") or {}).get("seed")


def _revision(meta: dict):
    return (meta.get("model") or {}).get("revision") or (meta.get("settings") or {}).get("revision")


# what tells two runs of one model and score mode apart, in the order a label names it: (its words, its value)
TELLING = (
    (lambda v: f"{v} input", lambda m: input_route(m) if m else None),
    (lambda v: f"revision {v}", _revision),
    (lambda v: f"random head seed {v}", _random_head_seed),
    (lambda v: str(v).removeprefix("torch."), lambda m: (m.get("settings") or {}).get("dtype")),
    (lambda v: f"spec {v}", lambda m: (m.get("settings") or {}).get("spec")),
    (lambda v: f"output {v}", lambda m: (m.get("settings") or {}).get("label_index")),
)


def _with(name: str, words: str) -> str:
    return f"{name[:-1]}, {words}]" if name.endswith("]") else f"{name} [{words}]"


def labels_for(models: list[str], metas: list[dict], with_mode: bool = True, short: bool = True) -> list[str]:
    """One distinct label per run of ``models`` (ids; ``short``: the last part of each), from its ``meta.json``
    (``{}`` where there is none): the model, its score mode (always with ``with_mode``, else where the model
    repeats), then where runs of one label still share it, each setting that differs among them: the input method
    (``m [reward, rewardbench input]`` beside ``m [reward, ids input]``), revision, a random head's seed, dtype,
    registry spec, output column; numbered (``#2``) where labels still repeat (two runs alike, tables without a
    meta.json)."""
    base = [short_name(m) if short else m for m in models]
    names = []
    for b, meta in zip(base, metas):
        mode = mode_name(meta, default=None) if meta else None
        names.append(_with(b, mode) if mode and (with_mode or base.count(b) > 1) else b)
    return tell_apart(names, metas)


def tell_apart(names: list[str], metas: list[dict], telling=TELLING) -> list[str]:
    """``names`` made distinct: where runs share one, each setting of ``telling`` that differs among them is added
    to it, in that order (`labels_for`); numbered (``#2``) where names still repeat."""
    for words, value in telling:
        values = [value(m) if m else None for m in metas]
        names = [_with(n, words(v)) if v is not None and len({values[k] for k, q in enumerate(names) if q == n}) > 1
                 else n for n, v in zip(names, values)]
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]
