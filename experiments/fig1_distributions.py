"""Figure 1 (and A1): distribution of every token's score per model for one prompt, as violins, plus the moments
of the paper's Table 3 (mean, variance, skewness) in a CSV beside it.

    python -m experiments.fig1_distributions --runs results/*/exhaustive_* --prompt greatest
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from scipy import stats as sps


from experiments.common import SweepFigureConfig, colors, named_runs, load_runs, plt, save, save_csv
from experiments.common import run_script, sweep_label


@dataclass(frozen=True)
class Fig1Config(SweepFigureConfig):
    prompt: str = field(default="greatest", metadata={"help": "prompt key or text"})
    name: str = field(default="", metadata={"help": "file name (default fig1_distributions_<prompt>.png)"})


def moments(scores: np.ndarray) -> dict:
    return {"n": int(scores.size), "mean": float(scores.mean()), "variance": float(scores.var(ddof=1)),
            "skewness": float(sps.skew(scores))}


def main(cfg: Fig1Config) -> Path:
    sweeps = load_runs(named_runs(cfg.runs))
    sweeps = [s for s in sweeps if cfg.prompt in s.prompts or cfg.prompt in s.prompts.values()]
    if not sweeps:
        raise SystemExit(f"no complete run has the prompt {cfg.prompt!r}")
    data = [s.prompt(s.key_for(cfg.prompt))["score"].to_numpy() for s in sweeps]
    labels = [sweep_label(s) for s in sweeps]
    fig, ax = plt.subplots(figsize=(max(4.5, 1.3 * len(sweeps) + 2), 5))
    parts = ax.violinplot(data, showextrema=True, showmedians=True, widths=0.8)
    for body, c in zip(parts["bodies"], colors(len(sweeps))):
        body.set_facecolor(c)
        body.set_alpha(0.75)
    for i, d in enumerate(data, start=1):
        q1, q3 = np.percentile(d, [25, 75])
        ax.vlines(i, q1, q3, color="black", lw=4)
    ax.set_xticks(range(1, len(sweeps) + 1), labels, rotation=30, ha="right")
    ax.set_ylabel("score")
    text = sweeps[0].prompts[sweeps[0].key_for(cfg.prompt)]
    ax.set_title(f"Scores of every vocabulary token: {text!r}\n(bar: interquartile range, line: median)", fontsize=10)
    key = sweeps[0].key_for(cfg.prompt)
    path = save(fig, cfg.out, cfg.name or f"fig1_distributions_{key}.png")
    rows = [{"model": lab, "prompt": key, **moments(d)} for lab, d in zip(labels, data)]
    save_csv(pl.DataFrame(rows), cfg.out, f"table3_moments_{key}.csv")
    return path


if __name__ == "__main__":
    sys.exit(run_script(Fig1Config, __doc__, __file__, lambda cfg: print(main(cfg))))
