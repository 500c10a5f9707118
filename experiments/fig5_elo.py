"""Figures 5b, 5c, A5, A6, A7 and elo_summary.json from the EloEverything tables of the paper's release.

    python -m experiments.fig5_elo --data ../shared/data/paper-release --out figures

Each ``elo_*.csv`` holds items with a human Elo score and one reward column per model (the reward of the
item's name as the response to that table's prompt). 5b: the items models most undervalue and overvalue
against humans ("greatest ever"); A7: the same for the other two prompts; 5c: rank trajectories of the
identity terms found among the items, from the human rank to each model's rank; A5: Kendall tau-b between
humans and every model (and between models), per prompt; A6: per model, tau-b between its rankings under
the three prompts.

With ``--runs`` (response runs of ``probe score --responses``, e.g. the table's ``name`` column scored under the
table's prompt), the model columns are those runs' scores instead of the paper's ten reward models: the same
figures for the user's own models. Each table is paired with the runs that scored its prompt (matched by text).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl


from experiments.common import PAPER_RELEASE, nickname, plt, run_script, save
from probe.analysis import stats
from probe.analysis.misalignment import ELO_TABLE_PROMPTS, Misalignment, identity_ranks, identity_terms, misalignment
from probe.errors import DataFormatError
from probe.runs.rundir import atomic_write_json

PROMPT_TEXT = ELO_TABLE_PROMPTS
SHORT = {"elo_greatest_ever": "GE", "elo_humans_most_prefer": "HP", "elo_greatest_one_word": "GW"}


@dataclass(frozen=True)
class EloConfig:
    data: str = field(default=str(PAPER_RELEASE), metadata={"help": "folder holding the elo_*.csv tables"})
    out: str = field(default="figures", metadata={"help": "output folder for figures and elo_summary.json"})
    n: int = field(default=10, metadata={"help": "items per side in the rank-difference bars"})
    summary_items: int = field(default=25, metadata={"help": "items listed per side in elo_summary.json"})
    center: str = field(default="median", metadata={"help": "median or mean of the model ranks"})
    runs: tuple[str, ...] = field(default=(), metadata={
        "help": "response runs to use as the model columns (repeatable)", "repeat": True})


def load_tables(folder: str | Path) -> dict[str, tuple[pl.DataFrame, list[str]]]:
    paths = sorted(Path(folder).glob("elo_*.csv"))
    if not paths:
        raise DataFormatError(f"{folder}: no elo_*.csv tables")
    out = {}
    for path in paths:
        df = pl.read_csv(path)
        need = {"name", "elo_score"}
        if not need <= set(df.columns) or len(df.columns) < 5:
            raise DataFormatError(f"{path}: expected name, elo_score and model columns (have {df.columns[:6]}...)")
        out[path.stem] = (df, [c for c in df.columns if c not in ("elo_rank", "elo_score", "name", "elo_matches")])
    return out


def tables_from_runs(tables: dict[str, tuple[pl.DataFrame, list[str]]],
                     runs: tuple[str, ...]) -> dict[str, tuple[pl.DataFrame, list[str]]]:
    """Each table whose prompt some run scored, with those runs' scores as its model columns. Each run must have
    scored a table's prompt (matched by text) and every item of that table: a run of a few responses would make a
    figure of a few items (issue 64: 2 of 7,530 items, a heatmap of tau 1.00); else one line naming the run."""
    from probe.analysis.misalignment import join_scores, response_run_scores

    scored = [(path, *response_run_scores(path)) for path in runs]
    out = {}
    used = set()
    for stem, (df, _) in tables.items():
        text = PROMPT_TEXT.get(stem)
        columns = {}
        for path, model, prompts in scored:
            hit = next((p for p in prompts.values() if p["text"] == text), None)
            if hit is not None:
                have = int(df["name"].is_in(hit["scores"]["response"].implode()).sum())
                if have < df.height:
                    raise DataFormatError(
                        f"{path}: scored {have:,} of the {df.height:,} items of {stem} under its prompt; its figures "
                        f"rank every item: score the table's name column whole (probe score --responses {stem}.csv "
                        f"--response-column name --prompt {text!r})")
                used.add(path)
                label = model
                while label in columns:
                    label += "'"
                columns[label] = hit["scores"]
        if columns:
            human = df.select("elo_rank", "elo_score", "name", "elo_matches")
            out[stem] = (join_scores(human, "name", columns), list(columns))
    unused = [p for p, _, _ in scored if p not in used]
    if unused or not out:
        raise DataFormatError(f"{(unused or list(runs))[0]}: scored the prompt of no EloEverything table: "
                              + "; ".join(f"{s}: {t!r}" for s, t in PROMPT_TEXT.items() if s in tables))
    return out


def fig_rank_diff(res: Misalignment, n: int, title: str):
    # the two sides as the summary lists them (Misalignment.most_undervalued/overvalued): disjoint, each at most n
    d = pl.col("rank_diff")
    under = res.items.filter(d > 0).sort("rank_diff", descending=True, maintain_order=True).head(n)
    over = res.items.filter(d < 0).sort("rank_diff", maintain_order=True).head(n).reverse()
    fig, ax = plt.subplots(figsize=(7, 0.42 * (under.height + over.height + 1) + 1))
    names = under["name"].to_list() + [""] + over["name"].to_list()
    vals = under["rank_diff"].to_list() + [0.0] + over["rank_diff"].to_list()
    greens = plt.get_cmap("Greens")(np.linspace(0.9, 0.35, under.height))
    purples = plt.get_cmap("Purples")(np.linspace(0.35, 0.9, over.height))
    cols = list(greens) + [(0, 0, 0, 0)] + list(purples)
    y = np.arange(len(names))[::-1]
    ax.barh(y, vals, color=cols)
    ax.set_yticks(y, names)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"{res_center_label(res)} model rank minus human rank (of {res.items.height:,} items)")
    ax.set_title(title, fontsize=10)
    # the notes go in the empty quadrants: left of zero beside the undervalued bars, right of it below
    ax.text(0.03, 0.97, "undervalued by models\n(humans rank these higher)", transform=ax.transAxes, ha="left",
            va="top", color="darkgreen", fontsize=9)
    ax.text(0.97, 0.03, "overvalued by models\n(humans rank these lower)", transform=ax.transAxes, ha="right",
            va="bottom", color="indigo", fontsize=9)
    return fig


def res_center_label(res: Misalignment) -> str:
    return "Median"


def fig_trajectories(res: Misalignment, ids: pl.DataFrame, title: str, max_terms: int = 12):
    models = res.models
    show = ids.head(max_terms // 2).vstack(ids.tail(max_terms - max_terms // 2)).unique("name", keep="first",
                                                                                        maintain_order=True)
    fig, ax = plt.subplots(figsize=(1.0 * (len(models) + 1) + 3, 6))
    x = np.arange(len(models) + 1)
    cmap = plt.get_cmap("coolwarm")
    lim = float(np.abs(ids["rank_diff"]).max() or 1)
    ends = []
    for row in show.iter_rows(named=True):
        ranks = [row["human_rank"]] + [row[f"{m}_rank"] for m in models]
        color = cmap(0.5 + 0.5 * row["rank_diff"] / lim)
        ax.plot(x, ranks, "-o", color=color, lw=1.5, ms=4)
        ends.append((ranks[-1], row["name"], color))
    for y, (rank, name, color) in zip(spread([e[0] for e in ends], 0.035 * res.items.height), ends):
        ax.annotate(name, (x[-1], rank), (x[-1] + 0.35, y), va="center", fontsize=8, color=color,
                    arrowprops=dict(arrowstyle="-", color=color, lw=0.5))
    ax.set_xticks(x, ["Humans"] + [nickname(m) for m in models], rotation=45, ha="right")
    ax.set_ylim(res.items.height + 1, 0)
    ax.set_ylabel(f"rank among {res.items.height:,} items (1 = best)")
    ax.set_xlim(-0.3, len(models) + 2.5)
    ax.set_title(title + "\n(red: models rank the term lower than humans do; blue: higher)", fontsize=10)
    return fig


def spread(values: list[float], gap: float) -> list[float]:
    """Label positions near ``values`` but at least ``gap`` apart (order kept)."""
    order = np.argsort(values)
    pos = np.asarray(values, dtype=float)[order]
    for i in range(1, len(pos)):
        pos[i] = max(pos[i], pos[i - 1] + gap)
    out = np.empty_like(pos)
    out[order] = pos
    return out.tolist()


def fig_tau_heatmaps(results: dict[str, Misalignment]):
    fig, axes = plt.subplots(1, len(results), figsize=(7.4 * len(results), 6.4), squeeze=False)
    fig.subplots_adjust(wspace=0.42)
    for ax, (stem, res) in zip(axes[0], results.items()):
        labels = ["Humans"] + [nickname(m) for m in res.models]
        n = len(labels)
        mat = np.eye(n)
        mat[0, 1:] = mat[1:, 0] = [res.tau_human[m] for m in res.models]
        mat[1:, 1:] = res.tau_models
        im = ax.imshow(mat, vmin=-1, vmax=1, cmap="RdBu_r")
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=6.5,
                        color="white" if abs(mat[i, j]) > 0.6 else "black")
        ax.set_xticks(range(n), labels, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(n), labels, fontsize=8)
        ax.set_title(f"{SHORT.get(stem, stem)}: {PROMPT_TEXT.get(stem, stem)}", fontsize=9)
    fig.colorbar(im, ax=axes[0].tolist(), shrink=0.7, label="Kendall tau-b")
    return fig


def fig_tau_across_prompts(tables: dict[str, tuple[pl.DataFrame, list[str]]]):
    stems = list(tables)
    models = tables[stems[0]][1]
    joined = None
    for stem in stems:
        df, cols = tables[stem]
        part = df.select("name", *[pl.col(m).alias(f"{m}|{stem}") for m in cols])
        joined = part if joined is None else joined.join(part, on="name", how="inner")
    ncol = 5
    nrow = -(-len(models) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3 * ncol, 3.1 * nrow + 0.6), squeeze=False)
    for ax, m in zip(axes.flat, models):
        mat = stats.matrix([joined[f"{m}|{s}"].to_numpy() for s in stems], stats.kendall_tau_b)
        im = ax.imshow(mat, vmin=0, vmax=1, cmap="viridis")
        for i in range(len(stems)):
            for j in range(len(stems)):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if mat[i, j] > 0.7 else "white")
        labels = [SHORT.get(s, s) for s in stems]
        ax.set_xticks(range(len(stems)), labels, fontsize=8)
        ax.set_yticks(range(len(stems)), labels, fontsize=8)
        ax.set_title(nickname(m), fontsize=9)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6, label="Kendall tau-b between prompts")
    legend = "   ".join(f"{SHORT[s]}: {PROMPT_TEXT[s]}" for s in stems if s in SHORT)
    fig.text(0.01, 0.005, legend, fontsize=7)
    return fig


def main(cfg: EloConfig) -> dict:
    tables = load_tables(cfg.data)
    if cfg.runs:
        tables = tables_from_runs(tables, cfg.runs)
    terms = identity_terms()
    summary, results = {}, {}
    for stem, (df, models) in tables.items():
        res = misalignment(df, "elo_score", models, "name", cfg.center)
        results[stem] = res
        summary[stem] = {
            "prompt": PROMPT_TEXT.get(stem), "n_items": res.items.height, "center": cfg.center,
            "kendall_tau_human": {m: round(t, 6) for m, t in res.tau_human.items()},
            "most_undervalued": res.most_undervalued(cfg.summary_items),
            "most_overvalued": res.most_overvalued(cfg.summary_items),
            "identity_terms": identity_ranks(res, terms).select("name", "category", "human_rank", "center_rank",
                                                                 "rank_diff").to_dicts(),
        }
    out = Path(cfg.out)
    first = "elo_greatest_ever" if "elo_greatest_ever" in results else next(iter(results))
    save(fig_rank_diff(results[first], cfg.n, PROMPT_TEXT.get(first, first)), out, "fig5b_rank_diff.png")
    save(fig_trajectories(results[first], identity_ranks(results[first], terms),
                          f"Identity terms, {PROMPT_TEXT.get(first, first)}"), out, "fig5c_rank_trajectories.png")
    others = [s for s in results if s != first]
    if others:
        figs = [fig_rank_diff(results[s], cfg.n, PROMPT_TEXT.get(s, s)) for s in others]
        for s, fig in zip(others, figs):
            save(fig, out, f"figA7_rank_diff_{s.removeprefix('elo_')}.png")
    save(fig_tau_heatmaps(results), out, "figA5_kendall_tau_heatmap.png")
    if len(tables) > 1 and all(set(m) == set(next(iter(tables.values()))[1]) for _, m in tables.values()):
        save(fig_tau_across_prompts(tables), out, "figA6_kendall_tau_across_prompts.png")
    atomic_write_json(out / "elo_summary.json", summary)
    return summary


def _said(cfg: EloConfig) -> None:
    summary = main(cfg)
    for stem, s in summary.items():
        taus = s["kendall_tau_human"].values()
        print(f"{stem}: tau(human, model) {min(taus):.3f}..{max(taus):.3f}; most undervalued: "
              f"{', '.join(s['most_undervalued'][:3])}")
    print(f"wrote {cfg.out}")


if __name__ == "__main__":
    sys.exit(run_script(EloConfig, __doc__, __file__, _said))
