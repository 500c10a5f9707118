"""Value dictionaries over prompt grids: which categories of words (Agency vs Communion, the moral foundations) a
reward model ranks high, per prompt, as "Reward Models Inherit Value Biases from Pretraining" (arXiv 2601.20838)
computes it in its ``figures/generate_figure_1_and_A1.R``.

Inputs: score tables in long form (``model, prompt, response, score``), from the follow-up's released CSVs
(``response`` + one column per prompt key; model = the file stem without ``big2_rewards_`` / ``MFD20_rewards_``)
or from rm-probe's response runs; a dictionary (``term, category``): the Big Two nouns CSV (``Category,
token_decoded``) or the Moral Foundations Dictionary 2.0 (``.dicx``: ``DicTerm`` and ten
``Foundation_Virtue``/``Foundation_Vice`` columns marked ``X``; category = the foundation).

The computation, per model and prompt: the scores of the dictionary's terms (an inner join on the exact
response text), ``rank(-score)`` with average ties over those rows, then the median rank per category. The
published MFD computation pivots only ``Care_Virtue:Sanctity_Virtue``, which leaves the ``Sanctity_Vice`` column
out (its terms are dropped before ranking); ``published_pivot=True`` reproduces that, the default uses all ten.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from probe.analysis import stats
from probe.errors import DataFormatError

FOUNDATIONS = ("Care", "Fairness", "Loyalty", "Authority", "Sanctity")
MFD_COLUMNS = tuple(f"{f}_{side}" for f in FOUNDATIONS for side in ("Virtue", "Vice"))
# the published R script's pivot, c(Care_Virtue:Sanctity_Virtue): every column but the last
PUBLISHED_MFD_COLUMNS = MFD_COLUMNS[:-1]
POSITIVE = ("greatest", "best", "good")
NEGATIVE = ("worst", "bad", "terrible")
TABLE_PREFIXES = ("big2_rewards_", "MFD20_rewards_")


# --- inputs ------------------------------------------------------------------------------------------------------
def read_dictionary(path: str | Path, published_pivot: bool = False) -> pl.DataFrame:
    """``term, category`` from the Big Two nouns CSV or an MFD 2.0 ``.dicx`` (category = the foundation)."""
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"--dictionary {path}: no such file")
    try:
        df = pl.read_csv(path, infer_schema_length=0)
    except (pl.exceptions.ComputeError, UnicodeDecodeError) as err:
        raise DataFormatError(f"{path}: not a CSV dictionary ({str(err).splitlines()[0]})") from None
    if {"Category", "token_decoded"} <= set(df.columns):
        return df.select(pl.col("token_decoded").alias("term"), pl.col("Category").alias("category")).unique(
            maintain_order=True)
    if "DicTerm" in df.columns and set(MFD_COLUMNS) <= set(df.columns):
        cols = PUBLISHED_MFD_COLUMNS if published_pivot else MFD_COLUMNS
        long = df.unpivot(on=list(cols), index="DicTerm", variable_name="column", value_name="mark")
        long = long.filter(pl.col("mark").str.strip_chars() == "X")
        return long.select(pl.col("DicTerm").alias("term"),
                           pl.col("column").str.split("_").list.first().alias("category")).unique(maintain_order=True)
    raise DataFormatError(f"{path}: expected the Big Two nouns CSV (Category, token_decoded) or the MFD 2.0 .dicx "
                          f"(DicTerm and {', '.join(MFD_COLUMNS)}); found columns {df.columns[:12]}")


def model_from_stem(stem: str) -> str:
    for prefix in TABLE_PREFIXES:
        stem = stem.removeprefix(prefix)
    return stem


def read_score_table(path: str | Path) -> pl.DataFrame:
    """A released score table (CSV or Parquet: ``response`` + one column per prompt key) in long form."""
    path = Path(path)
    df = pl.read_parquet(path) if path.suffix == ".parquet" else pl.read_csv(path, infer_schema_length=10_000)
    if "response" not in df.columns or df.width < 2:
        raise DataFormatError(f"{path}: expected a 'response' column and one score column per prompt key")
    prompts = [c for c in df.columns if c != "response"]
    bad = [c for c in prompts if not df[c].dtype.is_numeric()]
    if bad:
        raise DataFormatError(f"{path}: prompt columns must hold numbers; {bad[:3]} do not")
    return (df.unpivot(on=prompts, index="response", variable_name="prompt", value_name="score")
            .with_columns(pl.lit(model_from_stem(path.stem)).alias("model"), pl.col("score").cast(pl.Float64))
            .select("model", "prompt", "response", "score"))


def read_scores(sources: list[str | Path]) -> pl.DataFrame:
    """``model, prompt, response, score`` from tables, folders of tables (CSV preferred over a Parquet twin),
    and rm-probe response runs (a folder with ``meta.json``). Each source keeps its own ``model``: two runs of one
    model id (two revisions, random-head seeds, input routes) or two tables of one name are labelled apart as
    ``probe analyze`` labels runs (`labels_for`: ``org/m [rewardbench input]``, ``org/m [revision abc]``, ``#2``),
    never merged into one model's rows."""
    from probe.analysis.sweeps import labels_for

    parts: list[tuple[str, dict, pl.DataFrame]] = []  # (model, meta.json or {}, its long table)
    seen: dict[str, Path] = {}  # a run's fingerprint, a table's resolved path -> where it was given first
    for src in sources:
        p = Path(src)
        if p.is_dir() and (p / "meta.json").is_file():
            meta, df = load_response_run(p)
            _once(seen, f"run {meta.get('fingerprint')}", p, "a run of the same settings (the same scores)")
            parts.append((meta["model"]["id"], meta, _long(meta["model"]["id"], df)))
        elif p.is_dir():
            files = {f.stem: f for f in sorted(p.glob("*.parquet"))} | {f.stem: f for f in sorted(p.glob("*.csv"))}
            if not files:
                raise DataFormatError(f"{p}: no CSV or Parquet score tables in this folder")
            for _, f in sorted(files.items()):
                _once(seen, str(f.resolve()), f, "the same table")
                parts.append((model_from_stem(f.stem), {}, read_score_table(f)))
        elif p.is_file():
            _once(seen, str(p.resolve()), p, "the same table")
            parts.append((model_from_stem(p.stem), {}, read_score_table(p)))
        else:
            raise DataFormatError(f"{p}: no such file or folder")
    labels = labels_for([m for m, _, _ in parts], [meta for _, meta, _ in parts], with_mode=False, short=False)
    return pl.concat([df.with_columns(pl.lit(label).alias("model")) for label, (_, _, df) in zip(labels, parts)])


def load_response_run(path: str | Path) -> tuple[dict, pl.DataFrame]:
    """A complete response run of rm-probe (``probe score --responses``): its meta and its scores table; one line
    where the folder is another kind of run or unfinished."""
    from probe.runs.rundir import RunDir

    run = RunDir(path)
    meta = run.read_meta()
    if meta.get("experiment") != "responses":
        raise DataFormatError(f"{path}: a {meta.get('experiment', 'other')} run, not a response run "
                              "(make one with probe score --responses FILE)")
    if meta.get("status") != "complete":
        raise DataFormatError(f"{path}: the run is not complete; finish it with --resume first")
    return meta, run.read_table("scores.parquet")


def _once(seen: dict[str, Path], key: str, path: Path, what: str) -> None:
    """One line where a source repeats one given before: its scores would count twice in the tests."""
    if key in seen:
        raise DataFormatError(f"{path}: {what} as {seen[key]}, given before; each model's scores count once")
    seen[key] = path


def _long(model: str, df: pl.DataFrame) -> pl.DataFrame:
    return df.select(pl.lit(model).alias("model"), pl.col("prompt_key").alias("prompt"), "response",
                     pl.col("score").cast(pl.Float64))


def read_response_run(path: str | Path) -> pl.DataFrame:
    """A response run of rm-probe (``probe score --responses``) as ``model, prompt, response, score``."""
    meta, df = load_response_run(path)
    return _long(meta["model"]["id"], df)


# --- the computation ---------------------------------------------------------------------------------------------
def framing(prompt: str) -> str | None:
    """positive (greatest/best/good), negative (worst/bad/terrible), or None, from the prompt key's first part."""
    adjective = prompt.split("_")[0].lower()
    return "positive" if adjective in POSITIVE else "negative" if adjective in NEGATIVE else None


def base_model(model: str) -> str:
    """The pretrained family a reward model was fine-tuned from, from its name (the R script's rule, ``Gem`` ->
    Gemma, else Llama, widened to Qwen and to rm-probe's registry families)."""
    low = model.lower()
    for family in ("gemma", "llama", "qwen", "mistral", "smollm"):
        if family in low:
            return {"smollm": "SmolLM"}.get(family, family.capitalize())
    from probe.analysis.agreement import family_of

    return family_of(model)


def ranked(scores: pl.DataFrame, dictionary: pl.DataFrame) -> pl.DataFrame:
    """Each dictionary term's rank per model and prompt: ``rank(-score)`` with average ties over the joined rows
    (a term in two categories counts in both, as the R script's join does)."""
    joined = scores.join(dictionary, left_on="response", right_on="term", how="inner").unique(
        ["model", "prompt", "response", "category"], maintain_order=True)
    if joined.is_empty():
        raise DataFormatError("no response matches a dictionary term (the match is on the exact text)")
    framings = {p: framing(p) for p in joined["prompt"].unique()}  # per distinct prompt and model, not per row
    bases = {m: base_model(m) for m in joined["model"].unique()}
    return joined.with_columns(
        pl.col("score").rank(method="average", descending=True).over("model", "prompt").alias("rank"),
        pl.col("prompt").replace_strict(framings, return_dtype=pl.String).alias("framing"),
        pl.col("model").replace_strict(bases, return_dtype=pl.String).alias("base_model"))


def median_ranks(ranks: pl.DataFrame) -> pl.DataFrame:
    """``model, base_model, prompt, framing, category, median_rank, n_terms`` (the R script's ``sum_value``)."""
    return (ranks.group_by("model", "base_model", "prompt", "framing", "category", maintain_order=True)
            .agg(pl.col("rank").median().alias("median_rank"), pl.len().alias("n_terms"))
            .sort("model", "prompt", "category"))


def base_model_summary(ranks: pl.DataFrame) -> pl.DataFrame:
    """The R script's "avg ranks" block: per model, the median rank over every (term, prompt) of a framing and
    category; then the mean of those over the base model's reward models."""
    per_model = (ranks.filter(pl.col("framing").is_not_null())
                 .group_by("model", "base_model", "category", "framing").agg(pl.col("rank").median().alias("m")))
    return (per_model.group_by("framing", "category", "base_model").agg(pl.col("m").mean().alias("mean_rank"),
                                                                         pl.len().alias("n_models"))
            .sort("framing", "category", "base_model", descending=[True, False, False]))


@dataclass(frozen=True)
class PanelTest:
    category: str
    framing: str
    groups: tuple[str, str]
    means: tuple[float, float]
    t: float
    p: float
    p_bonferroni: float
    p_holm: float = 1.0  # Holm's adjustment over the same panels
    n_tests: int = 1  # the panels tested together (the family the adjustments are over)


def permutation_tests(medians: pl.DataFrame, n_perm: int = 9_999, seed: int = 42) -> list[PanelTest]:
    """Per panel (category x framing): do two base models' median ranks differ? A permutation test of Welch's t
    over the prompt x model values (two-sided, p = (1 + #|t*| >= |t|) / (1 + permutations), as MKinfer's
    ``perm.t.test`` reports it), Bonferroni-corrected over the panels (the follow-up's correction) and
    Holm-adjusted (never less powerful), with the number of panels tested. Panels with other than two base models are
    left out."""
    rng = np.random.default_rng(seed)
    panels = []
    for (category, fr), part in medians.filter(pl.col("framing").is_not_null()).group_by(
            "category", "framing", maintain_order=True):
        groups = sorted(part["base_model"].unique().to_list())
        if len(groups) != 2:
            continue
        x = part["median_rank"].to_numpy().astype(float)
        is_a = (part["base_model"] == groups[0]).to_numpy()
        t_obs = stats.welch_t(x[is_a], x[~is_a])
        count = 0
        for _ in range(n_perm):
            perm = rng.permutation(is_a)
            count += abs(stats.welch_t(x[perm], x[~perm])) >= abs(t_obs) - 1e-12
        p = (count + 1) / (n_perm + 1)
        panels.append(PanelTest(category, fr, (groups[0], groups[1]), (float(x[is_a].mean()), float(x[~is_a].mean())),
                                float(t_obs), p, 1.0))
    k = len(panels)
    holm = stats.holm([t.p for t in panels])
    return [PanelTest(**{**t.__dict__, "p_bonferroni": min(1.0, t.p * k), "p_holm": float(h), "n_tests": k})
            for t, h in zip(panels, holm)]


def values_figure(medians: pl.DataFrame, tests: list[PanelTest], path: str | Path, title: str = "") -> None:
    """Violins of the median ranks per base model, one panel per framing x category, rank 1 at the top, the
    Bonferroni-corrected permutation test's stars in each panel (the follow-up's Figure 1 / A1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = medians.filter(pl.col("framing").is_not_null())
    framings = [f for f in ("positive", "negative") if f in set(data["framing"])]
    cats = sorted(set(data["category"]), key=lambda c: (FOUNDATIONS.index(c) if c in FOUNDATIONS else -1, c))
    bases = sorted(set(data["base_model"]))
    colors = {"Gemma": "#DB4437", "Llama": "#0064E0", "Qwen": "#6F42C1"}
    fig, axes = plt.subplots(len(framings), len(cats), figsize=(1.6 * len(cats) + 1, 2.6 * len(framings)),
                             squeeze=False, sharey="row")
    stars = {(t.category, t.framing): t.p_bonferroni for t in tests}
    for i, fr in enumerate(framings):
        for j, cat in enumerate(cats):
            ax = axes[i][j]
            part = data.filter((pl.col("framing") == fr) & (pl.col("category") == cat))
            vals = [part.filter(pl.col("base_model") == b)["median_rank"].to_numpy() for b in bases]
            keep = [k for k, v in enumerate(vals) if len(v)]
            if keep:
                parts = ax.violinplot([vals[k] for k in keep], positions=keep, showmeans=True, widths=0.8)
                for body, k in zip(parts["bodies"], keep):
                    body.set_facecolor(colors.get(bases[k], "#888888"))
                    body.set_alpha(0.5)
            ax.set_xticks(range(len(bases)), bases, fontsize=7)
            if (cat, fr) in stars:
                p = stars[cat, fr]
                mark = "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < 0.05 else "n.s."
                ax.text(0.5, 0.95, mark, transform=ax.transAxes, ha="center", va="top", fontsize=9)
            if i == 0:
                ax.set_title(cat, fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{fr}\nmedian rank (1 = best)", fontsize=8)
                if not ax.yaxis_inverted():
                    ax.invert_yaxis()
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
