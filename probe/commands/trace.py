"""Per-token reward traces: where in a response the reward moves (probe/core/trace.py).

    python -m probe.trace --rm MODEL --prompt "What is the greatest thing ever?" --response "Love and peace"
    python -m probe.trace --rm MODEL --responses answers.txt
    python -m probe.trace --gcg results/<model>/gcg_max_<time>/      # the best response a GCG or beam run found

For each response: the score of every prefix of it (the assistant turn cut after each token, without the
end-of-turn ids) and of the complete response. Reward heads and log-probabilities take one forward per response;
the families whose score is the model's own forward (encoders, remote code) re-score every prefix, and say so.
Writes ``trace.parquet`` (one row per prefix), ``trace.csv`` and a plot per response into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from probe.commands.args import config_from_args
from probe.config import DEFAULT_DATE, ModelOptions, resolve_date
from probe.errors import ProbeError


@dataclass(frozen=True)
class TraceConfig(ModelOptions):
    prompt: str | None = field(default=None, metadata={
        "help": "the user prompt (default: the paper's greatest-thing prompt; with --gcg: the run's)"})
    response: tuple[str, ...] = field(default=(), metadata={"help": "a response to trace (repeatable)",
                                                            "repeat": True, "metavar": "TEXT"})
    responses: str | None = field(default=None, metadata={
        "help": "a text file of responses, one per line", "metavar": "FILE"})
    gcg: str | None = field(default=None, metadata={
        "help": "a GCG or beam run folder: trace its best response (its ids, under its prompt)", "metavar": "DIR"})
    system: str | None = field(default=None, metadata={"help": "system prompt"})
    date: str = field(default=DEFAULT_DATE, metadata={"help": "date for chat templates that write one"})
    score: str = field(default="auto", metadata={
        "help": "reward or logprob (auto: logprob for the packaged language models, reward otherwise)"})
    logprob_reduce: str = field(default="sum", metadata={"help": "sum or mean (the running mean) of log-probabilities"})
    out: str | None = field(default=None, metadata={"help": "output folder (default: results/trace_<time>)"})

    def __post_init__(self) -> None:
        self.check_reference()
        if not (self.response or self.responses or self.gcg):
            raise ValueError("give --response TEXT, --responses FILE or --gcg RUN_DIR")
        if self.logprob_reduce not in ("sum", "mean"):
            raise ValueError("--logprob-reduce is sum or mean")
        if self.score not in ("auto", "reward", "logprob"):
            raise ValueError(f"--score {self.score}: a trace cuts the response after each token; a judge's question "
                             "would be cut with it: trace a reward model, or a log-probability (--score logprob)")
        resolve_date(self.date)


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


def run(cfg: TraceConfig) -> Path:
    import polars as pl

    from probe.commands.analyze import safe_name
    from probe.config import PAPER_PROMPTS, ScoringOptions, model_kind, resolve_score_mode
    from probe.core.trace import trace, trace_ids
    from probe.models.loading import load_for_config
    from probe.runs.rundir import RunDir, utc_stamp, writable_dir

    prompt, responses, ids = cfg.prompt, list(cfg.response), None
    if cfg.responses:
        from probe.core.response_files import read_responses

        responses += read_responses(cfg.responses, "response")
    if cfg.gcg:
        result = Path(cfg.gcg) / "result.json"
        if not result.is_file():
            raise ProbeError(f"--gcg {cfg.gcg}: no result.json (a finished probe gcg run folder holds one)")
        ids = json.loads(result.read_text())["best_ids"]  # GCG's and the beam's result.json alike
        prompt = prompt or RunDir(cfg.gcg).read_meta().get("config", {}).get("prompt")
    prompt = prompt or PAPER_PROMPTS["greatest"]
    out = writable_dir(Path(cfg.out or Path("results") / f"trace_{utc_stamp()}"), "--out")
    mode = resolve_score_mode(cfg.score, cfg.rm, cfg.ref)
    loaded = load_for_config(cfg, model_kind(mode))
    opts = ScoringOptions(cfg.logprob_reduce, date_string=resolve_date(cfg.date))  # type: ignore[arg-type]
    tables = []
    if responses:
        df, seconds = trace(loaded, mode, prompt, responses, opts, cfg.system)
        tables.append(df)
        print(f"traced {len(responses)} response(s) in {seconds:.2f} s", file=sys.stderr)
    if ids:
        tables.append(trace_ids(loaded, mode, prompt, ids, opts, cfg.system))
    df = pl.concat(tables)
    df.write_parquet(out / "trace.parquet")
    df.write_csv(out / "trace.csv")
    print(f"== {prompt!r}  [{loaded.model_id}, {mode}, {df['method'][0]}] ==")
    for k, (resp, part) in enumerate(df.group_by("response", maintain_order=True)):
        name = resp[0]
        _plot(part, out / safe_name(f"trace_{k + 1:02d}.png"), f"{name!r}")
        steps = "  ".join(f"{t}:{s:+.3f}" for t, s in zip(part["token"].to_list(), part["score"].to_list()))
        print(f"{name!r}\n  {steps}")
    atomic = {"prompt": prompt, "model": loaded.model_id, "mode": mode, "method": df["method"][0],
              "responses": df["response"].unique(maintain_order=True).to_list()}
    (out / "trace.json").write_text(json.dumps(atomic, indent=1))
    print(f"wrote {out}")
    return out


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
