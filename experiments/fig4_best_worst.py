"""Figure 4: every token's score under the "best" prompt against its score under the "worst" prompt, per model.
Tokens above the diagonal score higher when asked for the worst thing.

    python -m experiments.fig4_best_worst --runs RUN... [--x best --y worst]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np


from experiments.common import SweepFigureConfig, colors, named_runs, load_runs, plt, save
from experiments.common import run_script, sweep_label
from probe.analysis import stats


@dataclass(frozen=True)
class Fig4Config(SweepFigureConfig):
    x: str = field(default="best", metadata={"help": "prompt on the x axis"})
    y: str = field(default="worst", metadata={"help": "prompt on the y axis"})


def main(cfg: Fig4Config) -> list[dict]:
    sweeps = [s for s in load_runs(named_runs(cfg.runs))
              if all(p in s.prompts or p in s.prompts.values() for p in (cfg.x, cfg.y))]
    if not sweeps:
        raise SystemExit(f"no run has both prompts {cfg.x!r} and {cfg.y!r}")
    ncol = min(5, len(sweeps))
    nrow = -(-len(sweeps) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.4 * ncol, 3.4 * nrow), squeeze=False)
    out = []
    for ax, s, c in zip(axes.flat, sweeps, colors(len(sweeps))):
        a = s.prompt(s.key_for(cfg.x)).sort("token_id")
        b = s.prompt(s.key_for(cfg.y)).sort("token_id")
        x, y = a["score"].to_numpy(), b["score"].to_numpy()
        ax.scatter(x, y, s=1, alpha=0.25, color=c, rasterized=True)
        lo, hi = min(x.min(), y.min()), max(x.max(), y.max())
        ax.plot([lo, hi], [lo, hi], ls="--", color="0.3", lw=1)
        tau = stats.kendall_tau_b(x, y)
        above = float(np.mean(y > x))
        ax.set_title(f"{sweep_label(s)}\ntau-b {tau:.2f}; {above:.0%} of tokens above the diagonal", fontsize=8)
        ax.set_xlabel(f"score, prompt '{cfg.x}'")
        ax.set_ylabel(f"score, prompt '{cfg.y}'")
        out.append({"model": sweep_label(s), "kendall_tau_b": tau, "fraction_above_diagonal": above})
    for ax in list(axes.flat)[len(sweeps):]:
        ax.axis("off")
    fig.tight_layout()
    save(fig, cfg.out, "fig4_best_vs_worst.png")
    return out


if __name__ == "__main__":
    sys.exit(run_script(Fig4Config, __doc__, __file__, lambda cfg: print(main(cfg))))
