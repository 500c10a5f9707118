"""Analyses of saved results (never a model): ``python -m probe.analyze <analysis> RUN_DIR... [options]``.

  top           best and worst tokens per model x prompt, raw and words-only, and on the shared vocabulary
  agreement     Kendall tau-b, Spearman, RBO (top and bottom) matrices, MDS, same-family permutation tests
  framing       slope of score on human valence, positive and negative words separately (AFINN-111 default)
  exposure      slope of score on log word frequency, controlling for valence (wordfreq default, or --freq bnc)
  misalignment  human vs model ranks on an item table (--table, e.g. EloEverything) or a sweep's words
  contrast      a reward model's ranking against a language model's log-probabilities (two run dirs)
  input-method  raw-id scoring against the paper's re-tokenized inputs (two runs of one model)
  personas      a persona grid (probe score --systems FILE): per prompt and persona against the control, Kendall
                tau-b, Spearman, RBO (top and bottom), the mean shift and the words (responses) that move most
  values        median rank per value-dictionary category (Big Two nouns, MFD 2.0) per model and prompt, from
                released score tables or response runs; per base model, permutation tests and the figure

misalignment with --table and response runs (probe score --responses) joins each run's scores to the table's
items by name: several runs are several models, beside the table's own columns named with --model.

Each writes JSON/CSV tables under --out (default results/analysis/<analysis>_<time>/) and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import polars as pl

from probe.commands.args import config_from_args
from probe.config import check_at_least, check_not_blank
from probe.errors import DataFormatError, ProbeError
from probe.report.text import plain_table
from probe.runs.rundir import atomic_write_json, utc_stamp, writable_dir

ANALYSES = ("top", "agreement", "framing", "exposure", "misalignment", "contrast", "input-method", "values", "personas")
# analyses whose positional arguments are response runs or score tables, not exhaustive sweeps
NOT_SWEEPS = ("values",)


@dataclass(frozen=True)
class AnalysisConfig:
    analysis: str = field(default="top", metadata={})
    runs: tuple[str, ...] = field(default=(), metadata={})
    prompt: str | None = field(default=None, metadata={
        "help": "prompt key or text (default: every prompt the runs share)"})
    top: int = field(default=20, metadata={"help": "rows in best/worst tables"})
    normalise: Literal["exact", "strip", "lower"] = field(default="exact", metadata={
        "help": "how decoded strings are matched across tokenizers (exact keeps leading spaces)"})
    rbo_p: float = field(default=0.9, metadata={"help": "persistence of rank-biased overlap"})
    valence_source: Literal["afinn111", "afinn165", "warriner"] = field(default="afinn111", metadata={
        "help": "human valence ratings", "flag": "--valence"})
    per: Literal["token", "word"] = field(default="token", metadata={
        "help": "one observation per matching token (the paper) or per word (mean of its tokens)"})
    freq: Literal["wordfreq", "bnc"] = field(default="wordfreq", metadata={"help": "word-frequency source"})
    bnc: str | None = field(default=None, metadata={"help": "path of the BNC list (1_1_all_alpha.txt)"})
    table: str | None = field(default=None, metadata={
        "help": "misalignment: CSV of items with a human score column and model score columns"})
    human: str | None = field(default=None, metadata={
        "help": "misalignment --table: the human score column (default elo_score)"})
    name_column: str = field(default="name", metadata={"help": "misalignment: the item name column"})
    models: tuple[str, ...] = field(default=(), metadata={
        "help": "misalignment: model columns (repeatable; default: every column after the first four)",
        "repeat": True, "flag": "--model", "metavar": "COLUMN"})
    center: Literal["median", "mean"] = field(default="median", metadata={
        "help": "misalignment: centre of the model ranks that the human rank is subtracted from"})
    identity_terms_file: str | None = field(default=None, metadata={
        "help": "CSV (term, category) of identity terms (default: the shipped list)", "flag": "--identity-terms"})
    permutations: int = field(default=10_000, metadata={"help": "permutations for group tests"})
    dictionary: str | None = field(default=None, metadata={
        "help": "values: the dictionary, the Big Two nouns CSV (Category, token_decoded) or MFD 2.0 (.dicx)",
        "metavar": "FILE"})
    published_pivot: bool = field(default=False, metadata={
        "help": "values, MFD 2.0: the published script's pivot (Care_Virtue:Sanctity_Virtue, which leaves out "
                "Sanctity_Vice) instead of all ten columns"})
    out: str | None = field(default=None, metadata={"help": "output folder"})

    def __post_init__(self) -> None:
        if self.analysis not in ANALYSES:
            raise ValueError(f"unknown analysis {self.analysis!r}; choose from {ANALYSES}")
        if not 0 < self.rbo_p < 1:
            raise ValueError("--rbo-p must be in (0, 1)")
        # --top -1 wrote every token but the last as "best" (head(-1)); --top 0, empty tables
        check_at_least(self, 1, "top", "permutations")
        check_not_blank(self, "prompt", "bnc", "table", "human", "name_column", "models", "identity_terms_file",
                        "dictionary", "out")


def _out_dir(config: AnalysisConfig) -> Path:
    path = Path(config.out or Path("results") / "analysis" / f"{config.analysis.replace('-', '_')}_{utc_stamp()}")
    _refuse_another_analysis(path, config)
    return writable_dir(path, "--out")


def _refuse_another_analysis(path: Path, config: AnalysisConfig) -> None:
    """An --out that holds another analysis (another kind, runs or setting) would mix its files with this one's and
    lose its summary.json: refused in one line. The same analysis again rewrites its own files."""
    import json

    old = path / "summary.json"
    if not old.is_file():
        return
    try:
        before = json.loads(old.read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        before = None
    if before != json.loads(json.dumps(asdict(config))):
        what = f"{before.get('analysis')} of {len(before.get('runs') or [])} run(s)" if isinstance(before, dict) else "?"
        raise ProbeError(f"--out {path} holds another analysis ({what}, its summary.json): give a new folder, "
                         "or none for a fresh one under results/analysis/")


def _prompt_keys(sweeps: list, prompt: str | None) -> dict[str, list[str]]:
    """Common prompt label -> each sweep's key for it. Prompts are matched by text across runs."""
    if prompt is not None:
        return {prompt: [s.key_for(prompt) for s in sweeps]}
    texts = [set(s.prompts.values()) for s in sweeps]
    shared = sorted(set.intersection(*texts))
    if not shared:
        raise DataFormatError("the runs share no prompt text; pick one with --prompt")
    first = sweeps[0]
    return {first.key_for(t): [s.key_for(t) for s in sweeps] for t in shared}


def _names(sweeps: list) -> list[str]:
    from probe.analysis.sweeps import run_labels

    return run_labels(sweeps, with_mode=False)


def run_top(config, sweeps, out) -> dict:
    from probe.analysis.sweeps import shared_vocabulary

    from probe.report.text import format_top_bottom

    summary = {}
    for label, keys in _prompt_keys(sweeps, config.prompt).items():
        for sweep, key, name in zip(sweeps, keys, _names(sweeps)):
            df = sweep.prompt(key)
            if sweep.responses:  # whole responses: no vocabulary flags, no words-only tables
                summary[f"{name}/{label}"] = _top_responses(df, key, sweep, name, label, config.top, out)
                continue
            print(format_top_bottom(df, key, sweep.prompts[key], sweep.meta, config.top))
            best = df.sort("score", descending=True)
            words = best.filter(pl.col("is_word"))
            cols = ["rank", "token_id", "decoded", "score", "is_special", "is_word", "leading_space", "roundtrips"]
            # as the terminal table (format_top_bottom): where there are fewer than 2 x --top, each side holds half,
            # so that no token is both best and worst (a 200-id run's 4 words were all in both files)
            k, k_words = min(config.top, best.height // 2), min(config.top, words.height // 2)
            for tag, part in (("best", best.head(k)), ("worst", best.tail(k).reverse()),
                              ("best_words", words.head(k_words)), ("worst_words", words.tail(k_words).reverse())):
                part.select(cols).write_csv(out / safe_name(f"{name}__{label}__{tag}.csv"))
            k10 = min(10, k)
            summary[f"{name}/{label}"] = {"n_tokens": best.height, "n_words": words.height, "per_side": k,
                                          "per_side_words": k_words, "best": best["decoded"].head(k10).to_list(),
                                          "worst": best["decoded"].tail(k10).reverse().to_list()}
        if len(sweeps) > 1:
            wide = shared_vocabulary({n: s.prompt(k) for s, k, n in zip(sweeps, keys, _names(sweeps))}, config.normalise)
            wide.write_csv(out / safe_name(f"shared_vocabulary__{label}.csv"))
            summary[f"shared/{label}"] = {"n_strings": wide.height}
    return summary


def _top_responses(df, key: str, sweep, name: str, label: str, n: int, out: Path) -> dict:
    """A response run's best and worst responses (one table of all where there are few), printed and written."""
    from probe.analysis.sweeps import mode_name
    from probe.report.text import model_label, plural

    best = df.sort("rank", "token_id")
    print(f"\n== {key}: {sweep.prompts[key]!r}  [{model_label(sweep.meta)}, {mode_name(sweep.meta)}, "
          f"{plural(df.height, 'response')}] ==")
    parts = (("all", best),) if best.height <= 2 * n else (("best", best.head(n)), ("worst", best.tail(n).reverse()))
    for tag, part in parts:
        print(f"{tag} {part.height}")
        for row in part.iter_rows(named=True):
            print(f"  {row['rank']:>7} {row['score']:>11.4f} {row['n_tokens']:>3} tok  {row['response']!r}")
        part.select("rank", "response", "n_tokens", "score").write_csv(out / safe_name(f"{name}__{label}__{tag}.csv"))
    k10 = min(10, best.height // 2)  # the summary's lists never share a response either
    return {"n_responses": best.height, "best": best["response"].head(k10).to_list(),
            "worst": best["response"].tail(k10).reverse().to_list()}


def safe_name(name: str) -> str:
    """A file name of letters, digits, '.', '-' and '_' (model names and prompt labels may hold spaces, brackets
    and slashes)."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", name) or "run"


def run_agreement(config, sweeps, out) -> dict:
    from probe.analysis import agreement as agreement_mod
    from probe.analysis.sweeps import shared_vocabulary
    from probe.report.text import plural

    if len(sweeps) < 2:
        raise ProbeError("agreement needs at least two run directories")
    summary = {}
    names = _names(sweeps)
    groupings = {"family": [s.meta["model"]["spec"].get("family") or agreement_mod.family_of(s.model)
                            for s in sweeps],
                 "developer": [agreement_mod.developer_of(s.model) for s in sweeps]}
    for label, keys in _prompt_keys(sweeps, config.prompt).items():
        wide = shared_vocabulary({n: s.prompt(k) for s, k, n in zip(sweeps, keys, names)}, config.normalise)
        if wide.height < 3:
            raise ProbeError(f"the runs share {plural(wide.height, 'string')} under {label!r}: too few to compare "
                             "rankings (agreement needs at least 3)")
        constant = [n for n in names if wide[n].n_unique() < 2]
        if constant:
            raise ProbeError(f"{', '.join(constant)}: every score is the same over the {wide.height:,} shared strings "
                             f"of {label!r} (a --ref equal to --rm?), so no ranking agrees or disagrees with it; "
                             "leave that run out")
        res = agreement_mod.agreement(wide, names, config.rbo_p, groupings, config.permutations)
        pairs = agreement_mod.pairwise_agreement({n: s.prompt(k) for s, k, n in zip(sweeps, keys, names)},
                                                 config.normalise, config.rbo_p)
        summary[label] = {**res.to_json(), "pairwise": pairs}
        from probe.analysis.misalignment import FEW_ITEMS

        if wide.height < FEW_ITEMS:
            print(f"warning: {label}: only {wide.height} strings shared by all runs: the correlations rest on too few "
                  "to say much", file=sys.stderr)
        print(f"{label}: {wide.height:,} strings shared by all runs; Kendall tau-b:")
        print(plain_table([{"model": n, **{m: float(res.kendall[i, j]) for j, m in enumerate(names)}}
                           for i, n in enumerate(names)]))
        print("each pair on its own shared vocabulary:")
        print(plain_table(pairs))
    atomic_write_json(out / "agreement.json", summary)
    return {k: {"n_strings": v["n_strings"], "groups": v["groups"]} for k, v in summary.items()}


def run_personas(config, sweeps, out) -> dict:
    """A persona grid against its control: the agreement table, and the strings that move most per cell."""
    from probe.analysis.personas import persona_grid_table

    if len(sweeps) != 1:
        raise ProbeError("personas reads one persona-grid run (probe score --systems FILE)")
    sweep = sweeps[0]
    try:
        table, moves = persona_grid_table(sweep.scores, sweep.meta, config.rbo_p, config.top,
                                          words_only=not sweep.responses)
    except DataFormatError as err:
        raise DataFormatError(f"{sweep.path}: {err}") from None
    table.write_csv(out / "personas.csv")
    atomic_write_json(out / "movers.json", moves)
    from probe.core.prompts import system_label

    personas = sweep.meta["personas"]
    control, control_is = personas["control"], system_label(personas, personas["control"])
    what = "responses" if sweep.responses else "word-like tokens"
    print(f"persona grid of {sweep.model}: each persona against the control persona {control!r} "
          f"(over {table['n'][0]:,} scored {'responses' if sweep.responses else 'tokens'})")
    print(f"the control persona {control!r}: {control_is}")
    from probe.analysis.misalignment import FEW_ITEMS

    if table["n"][0] < FEW_ITEMS:
        print(f"warning: only {table['n'][0]} scored {'responses' if sweep.responses else 'tokens'} per cell: the "
              "agreement of each persona with the control rests on too few to say much", file=sys.stderr)
    print(plain_table(table))
    print("Kendall tau-b, prompt x persona:")
    print(plain_table(table.pivot("persona", index="prompt", values="kendall_tau_b")))
    for cell, m in moves.items():
        up = ", ".join(repr(r["decoded"]) for r in m["up"][:5])
        down = ", ".join(repr(r["decoded"]) for r in m["down"][:5])
        print(f"{cell}: {what} rising most {up}; falling most {down}")
    return {"control": control, "control_system": control_is, "template_system": personas.get("template_system"),
            "table": table.to_dicts()}


def _frames(sweeps, prompt) -> dict[tuple[str, str], pl.DataFrame]:
    out = {}
    for label, keys in _prompt_keys(sweeps, prompt).items() if len(sweeps) > 1 else \
            ((k, [k]) for k in ([sweeps[0].key_for(prompt)] if prompt else sweeps[0].prompts)):
        for sweep, key, name in zip(sweeps, keys, _names(sweeps)):
            out[(name, label)] = sweep.prompt(key)
    return out


def run_framing(config, sweeps, out) -> dict:
    from probe.analysis.regressions import framing_slopes

    df = framing_slopes(_frames(sweeps, config.prompt), config.valence_source, config.per)
    _enough(df, sweeps, config, "framing fits a slope per affect on at least 5 words rated by")
    df.write_csv(out / "framing.csv")
    print(plain_table(df))
    return {"rows": df.height}


def run_exposure(config, sweeps, out) -> dict:
    from probe.analysis.regressions import exposure_slopes

    df = exposure_slopes(_frames(sweeps, config.prompt), config.valence_source, config.freq, config.bnc, config.per)
    _enough(df, sweeps, config, "exposure fits a slope on at least 5 words with a frequency and a rating in")
    df.write_csv(out / "exposure.csv")
    print(plain_table(df))
    return {"rows": df.height}


def _enough(df: pl.DataFrame, sweeps: list, config, what: str) -> None:
    """One line where no run had the words a slope needs (response runs: only their one-word responses count)."""
    if df.height:
        return
    hint = (" (a response run counts its one-word responses only; score a word list, or sweep the vocabulary)"
            if any(s.responses for s in sweeps) else "")
    raise ProbeError(f"{what} {config.valence_source}; no run has them{hint}")


VALENCE_NAMES = {"afinn111": "AFINN-111", "afinn165": "AFINN-165", "warriner": "Warriner et al. (2013)"}


def run_misalignment(config, sweeps, out) -> dict:
    from probe.analysis import stats
    from probe.analysis.lexicons import valence
    from probe.analysis.misalignment import ELO_TABLE_PROMPTS, FEW_ITEMS
    from probe.analysis.misalignment import identity_ranks
    from probe.analysis.misalignment import identity_terms
    from probe.analysis.misalignment import misalignment
    from probe.analysis.regressions import lexicon_matches
    from probe.analysis.sweeps import short_name
    from probe.report.text import plural

    warnings: list[str] = []
    if config.table:
        table = read_table_csv(config.table)
        human, name = config.human or "elo_score", config.name_column
        human_source = f"the column {human!r} of {Path(config.table).name}"
        models = list(config.models) or ([] if config.runs else table.columns[4:])
        if config.runs:
            table, run_models, texts = join_response_runs(table, name, config.runs, config.prompt)
            models += run_models
            want = ELO_TABLE_PROMPTS.get(Path(config.table).stem)
            for label, text in zip(run_models, texts):
                if want is not None and text != want:
                    warnings.append(f"{label} was scored under {text!r}, not under the prompt of "
                                    f"{Path(config.table).name} ({want!r}, the one its model columns were scored "
                                    "under): its ranks answer another question")
    else:
        if len(sweeps) != 1:
            raise ProbeError("misalignment without --table takes exactly one run directory")
        if config.human is not None:
            raise ProbeError("--human names a column of --table; without --table the human scores are the valence "
                             "lexicon's (--valence)")
        key = sweeps[0].key_for(config.prompt) if config.prompt else next(iter(sweeps[0].prompts))
        m = lexicon_matches(sweeps[0].prompt(key), valence(config.valence_source), per="word")
        table = m.rename({"score": short_name(sweeps[0].model), "valence": "human_valence"})
        models, human, name = [short_name(sweeps[0].model)], "human_valence", "word"
        human_source = f"{VALENCE_NAMES[config.valence_source]} valence (--valence {config.valence_source})"
    res = misalignment(table, human, models, name, config.center)
    ids = identity_ranks(res, identity_terms(config.identity_terms_file))
    res.items.write_csv(out / "items.csv")
    ids.write_csv(out / "identity_terms.csv")
    n = res.items.height
    intervals = {m: stats.rank_correlation_interval(t, n) for m, t in res.tau_human.items()}
    if n < FEW_ITEMS:
        warnings.append(f"only {n} item(s): Kendall's tau rests on too few to say much "
                        + ("(too few for an interval)" if n <= 4 else
                           "(95% intervals: " + "; ".join(f"{m} [{iv[0]:.2f}, {iv[1]:.2f}]" for m, iv in
                                                          intervals.items() if iv) + ")"))
    summary = {"n_items": n, "human": human_source, "kendall_tau_human": res.tau_human,
               "kendall_tau_human_interval": intervals, "interval": stats.INTERVAL_METHOD,
               "warnings": warnings,
               "most_undervalued": res.most_undervalued(config.top), "most_overvalued": res.most_overvalued(config.top),
               "n_items_by_side": res.counts(), "identity_terms_found": ids["name"].to_list()}
    atomic_write_json(out / "misalignment.json", summary)
    print(f"{n:,} items; human scores: {human_source}; Kendall tau-b of each model's scores with them, and its 95% "
          "interval (Fisher z):")
    print(plain_table([{"model": m, "tau_b": t, "interval": f"[{iv[0]:.3f}, {iv[1]:.3f}]" if iv else "too few items"}
                       for (m, t), iv in zip(res.tau_human.items(), intervals.values())]))
    show, sides = min(10, config.top), res.counts()
    for side, where in (("undervalued", "furthest below humans"), ("overvalued", "furthest above humans")):
        names = summary[f"most_{side}"][:show]
        print(f"most {side} ({len(names)} of the {plural(sides[side], 'item')} models rank {where.split()[1]} "
              f"humans, {where.split()[0]} first): {', '.join(names) or 'none'}")
    if sides["level"]:
        print(f"{plural(sides['level'], 'item')} ranked as humans rank them (in neither list)")
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    return summary


def _ordered_pair(analysis: str, sweeps: list) -> tuple[list, tuple[str, str]]:
    """The two runs a pair analysis compares, in its order, with their labels; one line where they are not
    what it compares (contrast: a reward or judge run and a logprob run; input-method: two runs of one model,
    raw ids and --input-method paper)."""
    if len(sweeps) != 2:
        raise ProbeError(f"{analysis} takes exactly two run directories")
    if analysis == "contrast":
        modes = [s.meta.get("score", {}).get("mode", "reward") for s in sweeps]
        if sorted(modes) not in (["logprob", "reward"], ["judge", "logprob"]):
            raise ProbeError(f"contrast compares a reward-model (or judge) run with a language model's logprob run; "
                             f"these are {modes[0]} and {modes[1]} runs")
        pair = sorted(sweeps, key=lambda s: s.meta.get("score", {}).get("mode") == "logprob")
        return pair, (pair[0].meta["score"]["mode"], "logprob")
    methods = [s.meta.get("settings", {}).get("input_method") or "ids" for s in sweeps]
    if sorted(methods) != ["ids", "paper"]:
        raise ProbeError(f"input-method compares a raw-id run with a --input-method paper run of the same model; "
                         f"these are {methods[0]} and {methods[1]} runs")
    ident = [s.meta["model"].get("weights") or s.meta["model"]["id"] for s in sweeps]
    if ident[0] != ident[1] or sweeps[0].meta["model"]["id"] != sweeps[1].meta["model"]["id"]:
        raise ProbeError(f"input-method compares two runs of one model; these are runs of "
                         f"{sweeps[0].meta['model']['id']} and {sweeps[1].meta['model']['id']}")
    pair = sorted(sweeps, key=lambda s: (s.meta.get("settings", {}).get("input_method") or "ids") == "paper")
    return pair, ("raw_ids", "paper_method")


def _interval(iv) -> str:
    return f" [{iv[0]:.2f}, {iv[1]:.2f}]" if iv else " [no interval: n too small]"


def _pair_contrast(config, sweeps, out) -> dict:
    from probe.analysis.misalignment import FEW_ITEMS
    from probe.analysis.contrast import contrast
    from probe.analysis.contrast import contrast_strings

    sweeps, labels = _ordered_pair(config.analysis, sweeps)
    summary = {}
    for label, keys in _prompt_keys(sweeps, config.prompt).items():
        a, b = sweeps[0].prompt(keys[0]), sweeps[1].prompt(keys[1])
        same_vocab = a.height == b.height and (a.sort("token_id")["decoded"] == b.sort("token_id")["decoded"]).all()
        res = (contrast(a, b, k=100, n_moved=config.top, labels=labels) if same_vocab
               else contrast_strings(a, b, config.normalise, k=100, n_moved=config.top, labels=labels))
        summary[label] = res.to_json()
        res.moved.write_csv(out / safe_name(f"moved__{label}.csv"))
        js = summary[label]
        print(f"{label}: n={res.n} tau-b={res.kendall:.4f}{_interval(js['kendall_tau_b_interval'])} "
              f"spearman={res.spearman:.4f}{_interval(js['spearman_interval'])} "
              f"top-{res.k} overlap={res.top_overlap:.2f} bottom-{res.k} overlap={res.bottom_overlap:.2f}")
        if res.n < FEW_ITEMS:
            print(f"warning: {label}: only {res.n} shared string(s): the correlations rest on too few to say much "
                  "(intervals: 95%, Fisher z)", file=sys.stderr)
        if config.analysis == "input-method":
            stats = [s.meta["prompts"][k].get("paper_method") for s, k in zip(sweeps, keys)]
            stats = next((x for x in stats if x and "slot_survives" in x), None)
            if stats:
                summary[label]["paper_method"] = stats
                print(describe_paper_statistics(stats))
    atomic_write_json(out / f"{config.analysis}.json", summary)
    return {k: {x: v[x] for x in ("n", "kendall_tau_b", "top_k_overlap", "bottom_k_overlap")} for k, v in summary.items()}


def join_response_runs(table: pl.DataFrame, name: str, runs: tuple[str, ...],
                       prompt: str | None) -> tuple[pl.DataFrame, list[str], list[str]]:
    """The table with one score column per response run (joined on the item name = the response text), those
    columns' names, and the text of the prompt each run's column was scored under; items some run did not score
    are dropped, and the count is printed."""
    from probe.analysis.misalignment import join_scores, response_run_scores
    from probe.analysis.sweeps import labels_for
    from probe.runs.rundir import RunDir

    columns: dict[str, pl.DataFrame] = {}
    texts: list[str] = []
    scored = [response_run_scores(path) for path in runs]  # each a complete response run, or one line
    metas = [RunDir(path).read_meta() for path in runs]
    # two runs of one model are named by what differs (revision, random-head seed, route, ...), as analyze names runs
    names = labels_for([m["model"]["id"] for m in metas], metas, with_mode=False)
    for path, label, (_, prompts) in zip(runs, names, scored):
        if prompt is None and len(prompts) > 1:
            raise ProbeError(f"{path} scored {len(prompts)} prompts ({', '.join(prompts)}); pick one with --prompt")
        key = next(iter(prompts)) if prompt is None else next(
            (k for k, p in prompts.items() if prompt in (k, p["text"])), None)
        if key is None:
            raise ProbeError(f"{path}: no prompt {prompt!r}; it has {', '.join(prompts)}")
        while label in table.columns:  # a column of the table itself
            label += "'"
        columns[label] = prompts[key]["scores"]
        texts.append(prompts[key]["text"])
        print(f"{label}: {prompts[key]['scores'].height:,} responses under {key!r}", file=sys.stderr)
    before = table.height
    table = join_scores(table, name, columns)
    print(f"{table.height:,} of {before:,} items of the table were scored by every run", file=sys.stderr)
    return table, list(columns), texts


def run_values(config, sweeps, out) -> dict:
    from probe.analysis import values as v

    if not config.dictionary:
        raise ProbeError("values needs --dictionary FILE (the Big Two nouns CSV or the MFD 2.0 .dicx)")
    scores = v.read_scores(list(config.runs))
    dictionary = v.read_dictionary(config.dictionary, config.published_pivot)
    ranks = v.ranked(scores, dictionary)
    medians = v.median_ranks(ranks)
    medians.select("model", "prompt", "category", "median_rank").write_csv(out / "values_median_ranks.csv")
    summary = v.base_model_summary(ranks)
    summary.write_csv(out / "values_base_models.csv")
    tests = v.permutation_tests(medians, n_perm=config.permutations)
    v.values_figure(medians, tests, out / "values.png", title=Path(config.dictionary).name)
    result = {"n_models": medians["model"].n_unique(), "n_prompts": medians["prompt"].n_unique(),
              "n_terms": int(ranks.group_by("model", "prompt").len()["len"].max()),
              "categories": sorted(medians["category"].unique().to_list()),
              "base_models": summary.to_dicts(), "tests": [t.__dict__ for t in tests]}
    if Path(config.dictionary).suffix == ".dicx":
        other_dictionary = v.read_dictionary(config.dictionary, not config.published_pivot)
        other = v.median_ranks(v.ranked(scores, other_dictionary))
        joined = medians.join(other, on=["model", "prompt", "category"], how="full", suffix="_other", coalesce=True)
        diff = (joined["median_rank"] - joined["median_rank_other"]).abs()
        result["pivot_difference"] = {
            "this": "published pivot (9 columns)" if config.published_pivot else "all ten columns",
            "other": "all ten columns" if config.published_pivot else "published pivot (9 columns)",
            "max_abs_median_rank_difference": float(diff.max()), "mean_abs": float(diff.mean()),
            "terms": {"this": int(dictionary.height),
                      "other": int(other_dictionary.height)}}
    atomic_write_json(out / "values.json", result)
    print(plain_table(summary, digits=2))
    if tests:
        print(f"{len(tests)} permutation tests (one per panel); p-values adjusted over all {len(tests)}:")
    for t in tests:
        print(f"{t.category} / {t.framing}: {t.groups[0]} {t.means[0]:.2f} vs {t.groups[1]} {t.means[1]:.2f}, "
              f"t = {t.t:.2f}, permutation p = {t.p:.4f}, Bonferroni p = {t.p_bonferroni:.4f}, "
              f"Holm p = {t.p_holm:.4f}")
    if "pivot_difference" in result:
        d = result["pivot_difference"]
        print(f"MFD 2.0, {d['this']} ({d['terms']['this']} term-category rows) against {d['other']} "
              f"({d['terms']['other']}): median ranks differ by up to {d['max_abs_median_rank_difference']:.1f} "
              f"(mean {d['mean_abs']:.2f})")
    return result


def read_table_csv(path: str) -> pl.DataFrame:
    """A user's item table: a missing or unreadable file is one line naming it."""
    from probe.textfile import read_text

    text = read_text(Path(path))
    try:
        return pl.read_csv(text.encode())
    except (pl.exceptions.ComputeError, pl.exceptions.NoDataError) as err:
        raise DataFormatError(f"--table {path}: not a CSV table ({str(err).splitlines()[0]})") from None


def describe_paper_statistics(stats: dict) -> str:
    """What the paper's decode-render-re-tokenize route did to the response slots (probe/paper_method.py)."""
    lines = [f"  paper's route over {stats['n_ids']:,} ids: response slot survives for {stats['slot_survives']:.1%}, "
             f"whole sequence identical for {stats['sequence_identical']:.1%}, doubled BOS in "
             f"{stats['doubled_bos_rows']:,} rows"]
    for reason, v in stats.get("slot_changed", {}).items():
        ex = ", ".join(f"{e[1]!r}" for e in v["examples"][:3])
        lines.append(f"    slot changed: {reason}: {v['n']:,} ({v['fraction']:.1%}), e.g. {ex}")
    return "\n".join(lines)


def run(config: AnalysisConfig) -> Path:
    from probe.analysis.sweeps import load_sweep

    takes_runs = config.analysis in NOT_SWEEPS or (config.analysis == "misalignment" and config.table)
    sweeps = [] if takes_runs else [load_sweep(p) for p in config.runs]
    if not config.runs and not (config.analysis == "misalignment" and config.table):
        raise ProbeError(f"{config.analysis} needs at least one run directory"
                         + (" or score table" if config.analysis == "values" else ""))
    if config.table:
        read_table_csv(config.table)  # a bad table fails before the output folder is made
    if config.analysis in ("contrast", "input-method"):
        _ordered_pair(config.analysis, sweeps)  # so do runs the pair analysis cannot compare
    out = _out_dir(config)
    fn = {"top": run_top, "agreement": run_agreement, "framing": run_framing, "exposure": run_exposure,
          "misalignment": run_misalignment, "values": run_values, "personas": run_personas,
          "contrast": _pair_contrast, "input-method": _pair_contrast}[config.analysis]
    try:
        summary = fn(config, sweeps, out)
    except ProbeError:
        if not any(out.iterdir()):  # nothing written: no empty folder left behind
            out.rmdir()
        raise
    atomic_write_json(out / "summary.json", {"config": asdict(config), "summary": summary,
                                             "runs": list(config.runs)})
    print(f"wrote {out}")
    return out


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.commands.cli import command_parser

    return command_parser(subparsers, "analyze", "analyses of saved runs", "python -m probe.analyze", __doc__,
                          AnalysisConfig, main_from_args, verbose=False, positional=(
                              ("analysis", {"choices": ANALYSES, "help": "which analysis"}),
                              ("runs", {"nargs": "*", "help": "run directories written by probe score (values: also score tables or "
                                               "folders of them)"})))


def main_from_args(ns: argparse.Namespace) -> int:
    ns.runs = tuple(ns.runs)
    run(config_from_args(AnalysisConfig, ns))
    return 0


def main(argv: list[str] | None = None) -> int:
    from probe.commands.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
