"""Per-token reward traces: where in a response the reward moves (probe/core/trace.py).

    python -m probe.trace --rm MODEL --prompt "What is the greatest thing ever?" --response "Love and peace"
    python -m probe.trace --rm MODEL --responses answers.txt
    python -m probe.trace --gcg results/<model>/gcg_max_<time>/      # the best response a GCG or beam run found
    python -m probe.trace --social results/<model>/social_<time>/    # items where the undesirable option won

For each response: the score of every prefix of it (the assistant turn cut after each token, without the
end-of-turn ids) and of the complete response. Reward heads and log-probabilities take one forward per response;
the families whose score is the model's own forward (encoders, remote code) re-score every prefix, and say so; a
principle model and a process reward model score every prefix closed as a whole response (its principle asked, its
step separator appended after it), and say so.

With ``--gcg`` or ``--social`` the trace is scored as the run was: its model (from the run's own model record,
checked by its weights), score mode, log-probability reduction, input method, reference model and beta, system
prompt, date and (GCG) prompt. A command-line value that contradicts the run's is refused in one line (leave it
out); runs scored by a judge (judge, rating, judge-pair) or a pairwise model have no trace: a cut response would
sit inside the judge's question. ``--social`` traces the items the run's undesirable rate counts (the undesirable
option scores above its counterpart: probe/social/metrics.py), the first ``--limit``: both options, each under the
item's prompt. The complete responses' scores are compared with the run's own (trace.json: ``run_scores``).

Writes ``trace.parquet`` (one row per prefix; ``trace`` names each trace as its plot ``trace_NN.png`` is named),
``trace.csv``, the plots, ``trace.html`` and ``trace.json`` (every setting that changes the numbers, and each
trace's prompt) into ``--out``, a new or empty folder, written whole at the end: bad input writes nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from probe.commands.args import config_from_args
from probe.config import DEFAULT_DATE, ModelOptions, check_not_blank, resolve_date
from probe.errors import ProbeError

FROM_RUN = "default: the run's with --gcg/--social, else "


@dataclass(frozen=True)
class TraceConfig(ModelOptions):
    prompt: str | None = field(default=None, metadata={
        "help": "the user prompt of --response/--responses (" + FROM_RUN + "the paper's greatest-thing prompt)"})
    response: tuple[str, ...] = field(default=(), metadata={"help": "a response to trace (repeatable)",
                                                            "repeat": True, "metavar": "TEXT"})
    responses: str | None = field(default=None, metadata={
        "help": "a text file of responses, one per line", "metavar": "FILE"})
    gcg: str | None = field(default=None, metadata={
        "help": "a GCG or beam run folder: trace its best response (its ids, under its prompt), scored as the run "
                "was", "metavar": "DIR"})
    social: str | None = field(default=None, metadata={
        "help": "a probe social run folder: trace the items where the undesirable option scores above its "
                "counterpart (what the run's undesirable rate counts): both options, under the item's prompt, "
                "scored as the run was", "metavar": "DIR"})
    limit: int = field(default=10, metadata={"help": "with --social: how many such items (the first N)"})
    system: str | None = field(default=None, metadata={"help": "system prompt (" + FROM_RUN + "the template's)"})
    date: str | None = field(default=None, metadata={
        "help": f"date for chat templates that write one ({FROM_RUN}{DEFAULT_DATE})"})
    score: str = field(default="auto", metadata={
        "help": "reward or logprob (auto: the run's with --gcg/--social, else logprob for the packaged language "
                "models, reward otherwise)"})
    logprob_reduce: Literal["sum", "mean"] | None = field(default=None, metadata={
        "help": "sum or mean (the running mean) of log-probabilities (" + FROM_RUN + "sum)"})
    input_method: Literal["ids", "rewardbench"] | None = field(default=None, metadata={
        "help": "ids (the family's own input) or rewardbench (RewardBench's; see probe social) (" + FROM_RUN + "ids)"})
    out: str | None = field(default=None, metadata={
        "help": "output folder, new or empty (default: results/trace_<time>)"})

    def __post_init__(self) -> None:
        self.check_reference()
        # an empty --prompt was read as not given and traced the paper's prompt instead (probe score refuses it)
        check_not_blank(self, "prompt", "responses", "gcg", "social", "out")
        if not (self.response or self.responses or self.gcg or self.social):
            raise ValueError("give --response TEXT, --responses FILE, --gcg RUN_DIR or --social RUN_DIR")
        if any(not r.strip() for r in self.response):
            raise ValueError("--response is empty: an empty response has no trace")
        if self.limit < 1:
            raise ValueError("--limit must be >= 1")
        if self.logprob_reduce not in (None, "sum", "mean"):
            raise ValueError("--logprob-reduce is sum or mean")
        if self.input_method not in (None, "ids", "rewardbench"):
            raise ValueError("--input-method is ids or rewardbench")
        if self.score in JUDGES:
            raise ValueError(f"--score {self.score}: {NO_JUDGE}")
        if self.unit_test is not None:  # a unit-test judge's criterion: read as a rating, which has no trace
            raise ValueError(f"--unit-test goes with a unit-test judge (LMUnit), read as a rating: {NO_JUDGE}")
        if self.score not in ("auto", "reward", "logprob"):
            raise ValueError(f"--score {self.score}: not a score mode a trace takes (auto, reward or logprob)")
        if self.date is not None:
            resolve_date(self.date)


JUDGES = ("judge", "rating", "judge-pair")
NO_JUDGE = ("a trace cuts the response after each token, and a judge's question (judge, rating, judge-pair) or a "
            "pairwise model's comparison would be cut with it: trace a reward model or a log-probability")


def _plot(df, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    prefix = df.filter(df["kind"] == "prefix")
    fig, ax = plt.subplots(figsize=(max(4.5, 0.35 * prefix.height + 2), 3.4))
    ax.plot(prefix["position"].to_list(), prefix["score"].to_list(), marker="o", lw=1)
    complete = df.filter(df["kind"] == "complete")
    ax.axhline(float(complete["score"][0]), color="0.5", ls="--", lw=0.8, label="complete response")
    labels = [t if len(t) <= 12 else t[:11] + "…" for t in prefix["token"].to_list()]
    ax.set_xticks(prefix["position"].to_list(), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("score of the response so far")
    ax.set_title(title if len(title) <= 70 else title[:67] + "...", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass(frozen=True)
class TracedRun:
    """A GCG, beam or social run as a trace reads it: its settings as TraceConfig fields, its weights' identity."""

    flag: str  # --gcg or --social
    folder: str
    settings: dict
    weights: dict | None
    ref_weights: dict | None
    seed: int  # a random head's (social draws it from --seed before loading)
    allow_random_head: bool
    trust_remote_code: bool
    dtype: str | None  # what the run computed in (its model record)


def _model_ref(record: dict) -> str:
    """What loads the model a run's model record describes: a packaged model's short name, else its folder or id."""
    from probe.models.embedded import PACKAGED

    package = (record.get("source") or {}).get("package")
    named = [m.name for m in PACKAGED.values() if m.pip_name == package]
    return named[0] if named else record.get("path") or record["id"]


def read_run(flag: str, folder: str) -> TracedRun:
    """The run's own settings, from its meta.json (the model from its model record, not the command's first --rm);
    one line where the folder is not such a run or its score has no trace."""
    from probe.config import resolve_score_mode
    from probe.runs.meta import given_system
    from probe.runs.rundir import RunDir

    want = "probe social" if flag == "--social" else "probe gcg"
    if not (Path(folder) / "meta.json").is_file():
        raise ProbeError(f"{flag} {folder}: no meta.json: not a {want} run folder")
    meta = RunDir(folder).read_meta()
    experiment = str(meta.get("experiment"))
    if (experiment == "social") != (flag == "--social") or not experiment.startswith(("social", "gcg", "beam")):
        raise ProbeError(f"{flag} {folder}: a {experiment} run, not a {want} run")
    s, config, model = meta.get("settings") or {}, meta.get("config") or {}, meta.get("model") or {}
    ref = model.get("ref")
    mode = s.get("mode") or resolve_score_mode(s.get("score", "auto"), s.get("rm"), ref and _model_ref(ref))
    if mode not in ("reward", "logprob") or s.get("pairwise"):
        how = f"--score {mode}" if mode not in ("reward", "logprob") else f"a pairwise model ({s['pairwise']})"
        raise ProbeError(f"{flag} {folder}: scored with {how}; {NO_JUDGE}")
    settings = {"rm": _model_ref(model), "revision": model.get("revision"), "spec": s.get("spec"),
                "label_index": s.get("label_index"), "chat_template": s.get("chat_template"),
                "ref": ref and _model_ref(ref), "beta": float(s.get("beta", 1.0)), "score": mode,
                "input_method": s.get("input_method", "ids"), "system": given_system(s),
                "date": s.get("date", DEFAULT_DATE), "principle": s.get("principle")}
    if mode == "logprob":
        settings["logprob_reduce"] = s.get("logprob_reduce", "sum")  # GCG and beam sum (probe/core/gcg.py)
    if s.get("prompt") is not None:
        settings["prompt"] = s["prompt"]  # a GCG run's (a social run's are its items')
    return TracedRun(flag, folder, settings, s.get("weights"), (s.get("ref") or {}).get("weights"),
                     int(config.get("seed") or 0), bool(config.get("allow_random_head")),
                     bool(config.get("trust_remote_code")), model.get("dtype"))


NAMES = {"rm": "models", "ref": "reference models", "score": "score modes", "logprob_reduce": "log-probability "
         "reductions", "input_method": "input methods", "system": "system prompts", "date": "dates",
         "principle": "principles"}


def with_runs(cfg: TraceConfig, runs: list[TracedRun]) -> TraceConfig:
    """The command's settings completed from the runs'. A value given on the command line that differs from a
    run's is refused, and so are two runs scored differently (a trace is scored one way)."""
    merged: dict = {}
    for run in runs:
        for k, v in run.settings.items():
            if k in merged and merged[k] != v:
                raise ProbeError(f"{runs[0].flag} {runs[0].folder} and {run.flag} {run.folder} were scored with "
                                 f"different {NAMES.get(k, k.replace('_', ' '))} ({merged[k]!r}, {v!r}): trace them one at a "
                                 "time")
            merged[k] = v
    drawn = [r for r in runs if r.allow_random_head]
    if len({r.seed for r in drawn}) > 1:  # one head is drawn for the trace, from one seed
        other = next(r for r in drawn if r.seed != drawn[0].seed)
        raise ProbeError(f"{drawn[0].flag} {drawn[0].folder} and {other.flag} {other.folder} were scored with random "
                         f"heads drawn from different seeds ({drawn[0].seed}, {other.seed}): trace them one at a time")
    unset = {"score": "auto", "beta": 1.0}  # the other fields are unset when None
    fill = {}
    for k, theirs in merged.items():
        given = getattr(cfg, k)
        if given in (None, unset.get(k)):
            fill[k] = theirs
        elif k == "ref" and theirs is None:
            raise ProbeError(f"--ref {given}: {runs[0].flag} {runs[0].folder} was scored without a reference model "
                             "(no implicit reward): leave --ref out")
        elif k not in ("rm", "ref") and (resolve_date(given) if k == "date" else given) != theirs:
            source = next(r for r in runs if r.settings.get(k) == theirs)
            flag = "--" + k.replace("_", "-")
            raise ProbeError(f"{flag} {given!r}: {source.flag} {source.folder} was scored with "
                             f"{'none' if theirs is None else repr(theirs)}; a trace "
                             f"of a run is scored as the run was: leave {flag} out (or trace --response under other "
                             "settings)")
    return replace(cfg, **fill, allow_random_head=cfg.allow_random_head or any(r.allow_random_head for r in runs),
                   trust_remote_code=cfg.trust_remote_code or any(r.trust_remote_code for r in runs))


def check_weights(loaded, runs: list[TracedRun]) -> None:
    """The loaded model (and reference) are the ones the runs were scored with, by the weights' identity."""
    from probe.models.loading import weights_identity

    for run in runs:
        for what, want, got in (("model", run.weights, loaded), ("reference", run.ref_weights, loaded.ref)):
            if want is None or got is None:
                continue
            # a run made before the random head's seed was part of the identity does not record it
            here = {k: v for k, v in weights_identity(got).items() if k != "random_head" or k in want}
            if here != want:
                raise ProbeError(f"{run.flag} {run.folder} was scored with other weights than the {what} loaded "
                                 f"here ({got.model_id}): {here} against the run's {want}")


def social_picks(folder: str, limit: int) -> tuple[list, int, int]:
    """The first ``limit`` items of a social run where the undesirable option scores above its counterpart (the
    pairs the run's undesirable rate counts: `metrics.undesirable_wins`): (item id, prompt, [(role, text, the
    run's score)]); and
    how many such items and how many items with a counterpart the run has."""
    from probe.runs.rundir import RunDir
    from probe.social.items import counterpart_of
    from probe.social.metrics import undesirable_wins

    scores = RunDir(folder).read_table("scores.parquet") if (Path(folder) / "scores.parquet").is_file() else None
    if scores is None:
        raise ProbeError(f"--social {folder}: no scores.parquet (an unfinished run? finish it with --resume)")
    if "prompt" not in scores.columns:
        raise ProbeError(f"--social {folder}: the run predates the prompts in scores.parquet; run probe social again")
    out, n_wins, n_pairs = [], 0, 0
    for (item,), part in scores.group_by("item_id", maintain_order=True):
        part = part.sort("option")
        bad = part["undesirable"][0]
        other = counterpart_of(part["gold"][0], bad, part["label"].to_list())
        if other is None:
            continue
        n_pairs += 1
        if not undesirable_wins(part["score"].to_numpy(), bad, other):
            continue
        n_wins += 1
        if len(out) < limit:
            texts, own = part["text"].to_list(), part["score"].to_list()
            out.append((item, part["prompt"][0], [("undesirable", texts[bad], own[bad]),
                                                  ("counterpart", texts[other], own[other])]))
    return out, n_wins, n_pairs


def _moves(tokens: list[str], scores: list[float]) -> str:
    """Where a trace rises and falls most: the steps from one token to the next (the first token has none)."""
    steps = [(b - a, t) for a, b, t in zip(scores, scores[1:], tokens[1:])]
    if not steps:
        return "one token: no step to compare"
    (rise, at_rise), (fall, at_fall) = max(steps), min(steps)
    said = [f"largest rise {rise:+.4f} at {at_rise!r}" if rise > 0 else "it never rises",
            f"largest fall {fall:+.4f} at {at_fall!r}" if fall < 0 else "it never falls"]
    return ", ".join(said)


def trace_page(df, meta: dict, plots: dict[str, Path]) -> str:
    """trace.html: the settings, then every traced response with its prompt, its plot, its complete score and
    where it rises and falls most."""
    import base64
    import html

    said = "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in meta["settings"].items() if v is not None)
    parts = [f"<h1>Per-token traces: {html.escape(meta['model'])}</h1><p>{html.escape(said)}; computed by "
             f"{html.escape(meta['method'])}. Each point is the score of the response cut after that token (no "
             "end-of-turn ids); the dashed line is the complete response's score.</p>"]
    for (key,), part in df.group_by("trace", maintain_order=True):
        resp = part["response"][0]
        pre = part.filter(part["kind"] == "prefix")
        img = base64.b64encode(Path(plots[key]).read_bytes()).decode()
        parts.append(
            f"<section><h2>{html.escape(key)}</h2><p class='muted'>prompt: {html.escape(part['prompt'][0])}</p>"
            f"<p>complete response {part.filter(part['kind'] == 'complete')['score'][0]:+.4f}; "
            f"{html.escape(_moves(pre['token'].to_list(), pre['score'].to_list()))}</p>"
            f"<img alt='trace of {html.escape(repr(resp))}' "
            f"src='data:image/png;base64,{img}'></section>")
    style = ("<style>body{font:14px system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
             ".muted{color:#666}img{max-width:100%}section{border-top:1px solid #ddd;margin-top:1em}</style>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>traces: {html.escape(meta['model'])}</title>"
            f"{style}</head><body>{''.join(parts)}</body></html>")


def _check_out(out: Path) -> None:
    """--out: a new or empty folder under a writable one (checked before anything loads; created only at the end)."""
    import os

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ProbeError(f"--out {out}: {'is a file' if not out.is_dir() else 'is not empty'}; give a new folder")
    above = next(p for p in (out, *out.parents) if p.exists())
    if not os.access(above, os.W_OK | os.X_OK):
        raise ProbeError(f"--out {out}: cannot write in {above}; choose another folder")


def _write_whole(out: Path, write) -> None:
    """``write(folder)`` into a hidden folder beside ``out``, renamed to ``out`` when it is done (never half a
    result under ``out``)."""
    import shutil
    import tempfile

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        write(tmp)
        tmp.replace(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _run_scores(df, runs: list[TracedRun], dtype: str) -> dict:
    """The complete responses' scores against the run's own (``run_score``: a social run's scores.parquet, a GCG
    run's best score): the largest difference, held to the float32 tolerance of probe/core/precision.py where
    both were scored in float32."""
    import numpy as np

    from probe.core.precision import FLOAT32_RTOL

    both = df.filter(df["run_score"].is_not_null()) if "run_score" in df.columns else df.clear()
    if both.is_empty():
        return {}
    got, want = both["score"].to_numpy(), both["run_score"].to_numpy()
    out = {"n": both.height, "max_abs_diff": float(np.abs(got - want).max())}
    if {r.dtype for r in runs} == {dtype} == {"torch.float32"}:
        out["equal_within_float32_tolerance"] = bool((np.abs(got - want) <= FLOAT32_RTOL * (1 + np.abs(want))).all())
    return out


def _pieces(cfg: TraceConfig) -> list[tuple[str, str, str | list[int], dict]]:
    """What to trace, read and checked before any model loads: (source, prompt, responses as text or ids, columns
    for its rows)."""
    from probe.config import PAPER_PROMPTS

    prompt = cfg.prompt or PAPER_PROMPTS["greatest"]
    responses = list(cfg.response)
    if cfg.responses:
        from probe.core.response_files import read_responses

        responses += read_responses(cfg.responses, "response")
    out = [("--response", prompt, r, {}) for r in dict.fromkeys(responses)]
    if cfg.gcg:
        result = Path(cfg.gcg) / "result.json"
        if not result.is_file():
            raise ProbeError(f"--gcg {cfg.gcg}: no result.json (a finished probe gcg run folder holds one)")
        best = json.loads(result.read_text())  # GCG's and the beam's result.json alike
        out.append(("--gcg", cfg.prompt or PAPER_PROMPTS["greatest"], best["best_ids"],
                    {"run_score": best["best_score"]}))
    if cfg.social:
        from probe.runs.distributed import launched

        picks, n_wins, n_pairs = social_picks(cfg.social, cfg.limit)
        if launched().main:  # said once under torchrun
            print(f"--social: the undesirable option scores above its counterpart in {n_wins} of the {n_pairs} items "
                  f"that have one (what the run's undesirable rate counts); tracing {len(picks)} (--limit "
                  f"{cfg.limit})", file=sys.stderr)
        if not picks:
            raise ProbeError(f"--social {cfg.social}: no item where the undesirable option scores above its "
                             "counterpart; nothing to trace")
        out += [("--social", item_prompt, text, {"item_id": item, "role": role, "run_score": own})
                for item, item_prompt, pairs in picks for role, text, own in pairs]
    return out


def _units(pieces: list) -> list[tuple[str, list, bool]]:
    """The pieces of work, in order, as (prompt, responses, whether text): each prompt's distinct text responses
    ``CHUNK`` at a time (one process's batches), then each response given as ids. Under torchrun unit u is rank
    u % world's."""
    from probe.core.trace import CHUNK

    texts: dict[str, list[str]] = {}
    for _, prompt, response, _ in pieces:
        if isinstance(response, str):
            texts.setdefault(prompt, []).append(response)
    units: list[tuple[str, list, bool]] = []
    for prompt, rs in texts.items():
        rs = list(dict.fromkeys(rs))
        units += [(prompt, rs[s : s + CHUNK], True) for s in range(0, len(rs), CHUNK)]
    return units + [(prompt, response, False) for _, prompt, response, _ in pieces if not isinstance(response, str)]


def _trace_pieces(loaded, mode, pieces: list, opts, system: str | None, dist):
    """Every piece's trace with its source, prompt, item and role, and the run's own score beside its complete
    response; ``trace`` names each trace as its plot is named. Under torchrun each rank traces its units and rank 0
    gathers them (the other ranks return None)."""
    import polars as pl

    from probe.core.trace import trace_chunk, trace_ids
    from probe.runs.distributed import gather

    units = _units(pieces)
    mine = {u: (trace_chunk if text else trace_ids)(loaded, mode, prompt, work, opts, system)
            for u, (prompt, work, text) in enumerate(units) if dist.owns(u)}
    parts = gather(dist, mine)
    if parts is None:
        return None
    done = {u: df for p in parts for u, df in p.items()}
    traced, by_ids = {}, iter(done[u] for u, (_, _, text) in enumerate(units) if not text)
    for u, (prompt, _, text) in enumerate(units):
        if text:
            traced |= {(prompt, part["response"][0]): part
                       for part in done[u].partition_by("response", maintain_order=True)}
    tables = []
    for k, (source, prompt, response, extra) in enumerate(pieces):
        part = traced[prompt, response] if isinstance(response, str) else next(by_ids)
        key = ", ".join([*(str(extra[c]) for c in ("item_id", "role") if c in extra), repr(part["response"][0])])
        tables.append(part.with_columns(
            pl.lit(f"trace_{k + 1:02d}: {key}").alias("trace"), pl.lit(source).alias("source"),
            pl.lit(prompt).alias("prompt"), *[pl.lit(v).alias(c) for c, v in extra.items() if c != "run_score"],
            pl.when(pl.col("kind") == "complete").then(pl.lit(extra.get("run_score"), dtype=pl.Float64))
            .alias("run_score")))
    return pl.concat(tables, how="diagonal")


def run(cfg: TraceConfig) -> Path:
    """Reads and checks every input, loads the model, traces, writes ``--out`` whole. Under torchrun every rank
    loads the model and traces every world-th unit of work (`_units`); rank 0 gathers them and writes the folder
    one process writes (the other ranks write nothing)."""
    from probe.config import check_rewardbench_dpo, resolve_score_mode
    from probe.runs.distributed import broadcast, destroy, device_for, init, launched
    from probe.runs.rundir import utc_stamp

    t0 = time.perf_counter()
    runs = [read_run(flag, folder) for flag, folder in (("--gcg", cfg.gcg), ("--social", cfg.social)) if folder]
    cfg = with_runs(cfg, runs)
    mode = resolve_score_mode(cfg.score, cfg.rm, cfg.ref, cfg.spec)
    if (cfg.input_method or "ids") == "rewardbench" and mode != "reward":
        check_rewardbench_dpo(mode, cfg.ref is not None, cfg.beta, cfg.logprob_reduce or "sum")
    out = Path(cfg.out or Path("results") / f"trace_{utc_stamp()}").expanduser()
    if launched().main:
        _check_out(out)
    pieces = _pieces(cfg)
    dist = init(cfg.device, cfg.device_map)
    try:
        if dist.enabled:
            cfg = replace(cfg, device=device_for(dist, cfg.device))
        return _run(cfg, dist, Path(broadcast(dist, str(out))), mode, runs, pieces, t0)
    finally:
        destroy(dist)


def _run(cfg: TraceConfig, dist, out: Path, mode: str, runs: list[TracedRun], pieces: list, t0: float) -> Path:
    import polars as pl

    from probe.config import ScoringOptions, model_kind
    from probe.core.trace import trace_method
    from probe.models.loading import load_for_config
    from probe.runs.distributed import barrier
    from probe.core.scoring import fed_system
    from probe.runs.meta import score_label, system_record

    reduce, method_in = cfg.logprob_reduce or "sum", cfg.input_method or "ids"
    # a random head is drawn from the traced run's seed, as the run drew it (probe/models/loading.py)
    loaded = load_for_config(cfg, model_kind(mode), input_method=method_in, seed=next((r.seed for r in runs), 0))
    check_weights(loaded, runs)
    method = trace_method(loaded, mode)
    opts = ScoringOptions(reduce, date_string=resolve_date(cfg.date or DEFAULT_DATE))  # type: ignore[arg-type]
    df = _trace_pieces(loaded, mode, pieces, opts, cfg.system, dist)
    if df is None:  # a rank other than 0: its traces are rank 0's to write
        barrier(dist)
        return out
    settings = {"score": score_label(loaded, mode), "logprob_reduce": reduce if mode == "logprob" else None,
                "input_method": method_in, **system_record(fed_system(loaded, mode, cfg.system, opts), cfg.system),
                "date": opts.date_string,
                "dtype": str(loaded.dtype), "device": str(loaded.device)}
    meta = {"model": loaded.model_id, "weights": _weights(loaded), "mode": mode, "method": method,
            "settings": settings, "runs": [{"flag": r.flag, "folder": r.folder} for r in runs],
            "run_scores": _run_scores(df, runs, str(loaded.dtype)),
            "traces": df.group_by("trace", maintain_order=True).agg(
                pl.col("source", "prompt", "response").first(), *[pl.col(c).first() for c in ("item_id", "role")
                                                                  if c in df.columns]).to_dicts(),
            "timing": {"wall_s": round(time.perf_counter() - t0, 2),  # reading, loading and tracing, not writing
                       **({"processes": dist.world} if dist.enabled else {})}}
    _report(df, meta)
    _write_whole(out, lambda folder: _write(df, meta, folder))
    print(f"wrote {out}")
    barrier(dist)
    return out


def _weights(loaded) -> dict:
    from probe.models.loading import weights_identity

    out = {"model": weights_identity(loaded)}
    if loaded.ref is not None:
        out["ref"] = {"id": loaded.ref.model_id, **weights_identity(loaded.ref), "beta": loaded.beta}
    return out


def _report(df, meta: dict) -> None:
    """The terminal's account: the settings, each trace under its prompt, and the comparison with the run's."""
    said = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in meta["settings"].items() if v is not None)
    print(f"== traces: {meta['model']} [{said}; {meta['method']}] ==")
    shown = None
    for (key,), part in df.group_by("trace", maintain_order=True):
        if part["prompt"][0] != shown:
            shown = part["prompt"][0]
            print(f"prompt: {shown!r}")
        steps = "  ".join(f"{t}:{s:+.3f}" for t, s in zip(part["token"].to_list(), part["score"].to_list()))
        print(f"{key}\n  {steps}")
    rs = meta["run_scores"]
    if rs:
        verdict = {True: "equal within float32's tolerance", False: "NOT equal: a setting differs from the run's",
                   None: "not held to a tolerance (not both float32)"}[rs.get("equal_within_float32_tolerance")]
        print(f"complete responses against the run's own scores ({rs['n']}): largest difference "
              f"{rs['max_abs_diff']:.3g}, {verdict}", file=sys.stderr)


def _write(df, meta: dict, out: Path) -> None:
    plots = {}
    for (key,), part in df.group_by("trace", maintain_order=True):
        name, title = key.split(": ", 1)
        plots[key] = out / f"{name}.png"
        _plot(part, plots[key], title)
    df.write_parquet(out / "trace.parquet")
    df.write_csv(out / "trace.csv")
    (out / "trace.json").write_text(json.dumps(meta, indent=1))
    (out / "trace.html").write_text(trace_page(df, meta, plots), encoding="utf-8")


def main_from_args(ns: argparse.Namespace) -> int:
    run(config_from_args(TraceConfig, ns))
    return 0


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    return command_parser(subparsers, "trace", "per-token reward traces", "python -m probe.trace", __doc__,
                          TraceConfig, main_from_args)


def main(argv: list[str] | None = None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
