"""Figure 2: agreement between reward models. (a) Kendall tau-b heatmap, (b) MDS map from 1 - tau,
(c) representational-similarity analysis: hypothesis matrices (same base family, same developer) against the
observed tau matrix, with RSA tau and permutation p-values.

Input: sweeps of at least two models (compared on their shared vocabulary), or an item table (``--table``,
e.g. an EloEverything CSV of the paper's release: one score column per model).

    python -m experiments.fig2_agreement --runs RUN_A --runs RUN_B --prompt greatest
    python -m experiments.fig2_agreement --table ../shared/data/paper-release/elo_greatest_one_word.csv
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl


from experiments.common import (
    SweepFigureConfig,
    colors,
    named_runs,
    load_runs,
    nickname,
    place_labels,
    plt,
    save,
    run_script,
    sweep_label,
)
from probe.analysis import stats
from probe.analysis.agreement import base_architecture_of, developer_of, family_of
from probe.analysis.sweeps import shared_vocabulary
from probe.runs.rundir import atomic_write_json


@dataclass(frozen=True)
class Fig2Config(SweepFigureConfig):
    table: str | None = field(default=None, metadata={"help": "item table with one score column per model"})
    prompt: str = field(default="greatest", metadata={"help": "prompt key or text (sweeps)"})
    normalise: str = field(default="exact", metadata={"help": "string matching across tokenizers"})
    suffix: str = field(default="", metadata={"help": "added to the file names"})
    permutations: int = field(default=10_000, metadata={"help": "permutations for RSA p-values"})


def scores_matrix(cfg: Fig2Config) -> tuple[list[str], list[str], np.ndarray, int]:
    """(labels, model ids, items x models array, n items)."""
    if cfg.table:
        df = pl.read_csv(cfg.table)
        models = [c for c in df.columns if c not in ("elo_rank", "elo_score", "name", "elo_matches")]
        df = df.drop_nulls(models)  # the items every model scored (an empty cell: NaN tau, and the MDS raised)
        return [nickname(m) for m in models], models, df.select(models).to_numpy(), df.height
    sweeps = load_runs(named_runs(cfg.runs))
    sweeps = [s for s in sweeps if cfg.prompt in s.prompts or cfg.prompt in s.prompts.values()]
    if len(sweeps) < 2:
        raise SystemExit("figure 2 needs at least two runs with the prompt (or --table)")
    labels = [sweep_label(s) for s in sweeps]
    wide = shared_vocabulary({lab: s.prompt(s.key_for(cfg.prompt)) for lab, s in zip(labels, sweeps)}, cfg.normalise)
    return labels, [s.model for s in sweeps], wide.select(labels).to_numpy(), wide.height


def heatmap(ax, mat, labels, title, vmin=-1, vmax=1, cmap="RdBu_r", numbers=True):
    im = ax.imshow(mat, vmin=vmin, vmax=vmax, cmap=cmap)
    n = len(labels)
    if numbers and n <= 16:
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{mat[i, j]:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if abs(mat[i, j]) > 0.6 * max(abs(vmin), abs(vmax)) else "black")
    ax.set_xticks(range(n), labels, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(n), labels, fontsize=8)
    ax.set_title(title, fontsize=9)
    return im


def main(cfg: Fig2Config) -> dict:
    labels, ids, x, n_items = scores_matrix(cfg)
    tau = stats.matrix([x[:, i] for i in range(x.shape[1])], stats.kendall_tau_b)
    fig, ax = plt.subplots(figsize=(0.55 * len(labels) + 3, 0.5 * len(labels) + 2.5))
    im = heatmap(ax, tau, labels, f"Kendall tau-b over {n_items:,} shared items")
    fig.colorbar(im, ax=ax, shrink=0.8)
    save(fig, cfg.out, f"fig2a_kendall_heatmap{cfg.suffix}.png")

    coords = stats.classical_mds(1 - tau) if len(labels) > 2 else np.column_stack([np.arange(len(labels)), np.zeros(len(labels))])
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    cols = colors(len(labels))
    ax.scatter(coords[:, 0], coords[:, 1], s=90, color=cols, zorder=3)
    ax.margins(0.3)
    place_labels(ax, coords, labels, cols)
    ax.set_title("Classical MDS of 1 - Kendall tau-b (distance between models' rankings)", fontsize=9)
    ax.grid(ls="--", alpha=0.4)
    ax.set_xlabel("dimension 1")
    ax.set_ylabel("dimension 2")
    save(fig, cfg.out, f"fig2b_mds{cfg.suffix}.png")

    hyps = {"same base architecture": [base_architecture_of(m) for m in ids],
            "same base model": [family_of(m) for m in ids], "same developer": [developer_of(m) for m in ids]}
    rsa = {}
    fig, axes = plt.subplots(1, len(hyps) + 1, figsize=(4.2 * (len(hyps) + 1), 4.6))
    for ax, (name, lab) in zip(axes, hyps.items()):
        h = (np.asarray(lab)[:, None] == np.asarray(lab)[None]).astype(float)
        if len(set(lab)) > 1 and len(set(lab)) < len(lab):
            r, p = stats.rsa(tau, h, cfg.permutations)
            rsa[name] = {"tau": r, "p_value": p}
            title = f"{name}\nRSA tau = {r:.2f}, p = {p:.3f}"
        else:
            title = f"{name}\n(not testable: {len(set(lab))} group(s))"
        heatmap(ax, h, labels, title, 0, 1, "viridis", numbers=False)
    heatmap(axes[-1], tau, labels, "observed Kendall tau-b", 0, 1, "viridis")
    fig.tight_layout()
    save(fig, cfg.out, f"fig2c_rsa{cfg.suffix}.png")
    summary = {"labels": labels, "n_items": n_items, "kendall_tau_b": tau.round(6).tolist(), "rsa": rsa,
               "mds": coords.round(6).tolist()}
    atomic_write_json(Path(cfg.out) / f"fig2_agreement{cfg.suffix}.json", summary)
    return summary


if __name__ == "__main__":
    sys.exit(run_script(Fig2Config, __doc__, __file__, lambda cfg: print(main(cfg)["rsa"])))
