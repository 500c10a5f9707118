"""Figure 3: framing and mere exposure. (a, b) score against human valence for one model under the positive and
the negative prompt, with separate fits for positive and negative words; (c) the valence slopes of every model x
prompt x affect; (d) the slope of score on log word frequency (controlling for valence), per model x prompt.

    python -m experiments.fig3_framing --runs RUN... [--valence afinn111] [--freq wordfreq|bnc --bnc PATH]
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass, field

import numpy as np
import polars as pl


from experiments.common import SweepFigureConfig, colors, named_runs, load_runs, plt, save, save_csv
from experiments.common import run_script, sweep_label
from probe.analysis.lexicons import valence
from probe.analysis.regressions import exposure_slopes, framing_slopes, lexicon_matches


@dataclass(frozen=True)
class Fig3Config(SweepFigureConfig):
    positive: str = field(default="greatest", metadata={"help": "the positively framed prompt (key or text)"})
    negative: str = field(default="worst", metadata={"help": "the negatively framed prompt (key or text)"})
    valence_source: str = field(default="afinn111", metadata={"help": "afinn111, afinn165 or warriner",
                                                             "flag": "--valence"})
    freq: str = field(default="wordfreq", metadata={"help": "wordfreq or bnc"})
    bnc: str | None = field(default=None, metadata={"help": "path of the BNC list for --freq bnc"})


def scatter_panel(ax, m: pl.DataFrame, title: str) -> None:
    for sign, color in ((1, "#3A6E97"), (-1, "#B95C5A")):
        sub = m.filter(pl.col("valence") * sign > 0)
        x, y = sub["valence"].to_numpy(), sub["score"].to_numpy()
        jitter = np.random.default_rng(0).uniform(-0.15, 0.15, x.size)
        ax.scatter(x + jitter, y, s=6, alpha=0.35, color=color)
        if x.size > 2 and np.unique(x).size > 1:
            slope, icpt = np.polyfit(x, y, 1)
            xs = np.linspace(x.min(), x.max(), 2)
            ax.plot(xs, icpt + slope * xs, color=color, lw=2, label=f"slope {slope:.3f} (n={x.size})")
    ax.axvline(0, color="0.6", lw=0.8)
    ax.set_xlabel("human valence")
    ax.set_ylabel("score")
    ax.set_title(textwrap.fill(title, 52), fontsize=9)
    ax.legend(fontsize=8)


def main(cfg: Fig3Config) -> dict:
    sweeps = load_runs(named_runs(cfg.runs))
    have = lambda s, p: p in s.prompts or p in s.prompts.values()  # noqa: E731
    sweeps = [s for s in sweeps if have(s, cfg.positive) and have(s, cfg.negative)]
    if not sweeps:
        raise SystemExit(f"no run has both prompts {cfg.positive!r} and {cfg.negative!r}")
    labels = [sweep_label(s) for s in sweeps]
    lex = valence(cfg.valence_source)
    first = sweeps[0]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2), sharey=False)
    for ax, p in zip(axes, (cfg.positive, cfg.negative)):
        key = first.key_for(p)
        scatter_panel(ax, lexicon_matches(first.prompt(key), lex), f"{labels[0]}: {first.prompts[key]!r}")
    save(fig, cfg.out, "fig3ab_valence_scatter.png")

    frames = {(lab, p): s.prompt(s.key_for(p)) for lab, s in zip(labels, sweeps) for p in (cfg.positive, cfg.negative)}
    slopes = framing_slopes(frames, cfg.valence_source)
    save_csv(slopes, cfg.out, "fig3c_framing_slopes.csv")
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), sharey=True)
    cols = dict(zip(labels, colors(len(labels))))
    for ax, p in zip(axes, (cfg.positive, cfg.negative)):
        sub = slopes.filter(pl.col("prompt") == p)
        for lab in labels:
            pts = sub.filter(pl.col("model") == lab).sort("affect", descending=True)  # positive, then negative
            x = [0 if a == "positive" else 1 for a in pts["affect"]]
            ax.errorbar(x, pts["estimate"], yerr=[pts["estimate"] - pts["ci_low"], pts["ci_high"] - pts["estimate"]],
                        fmt="-o", color=cols[lab], label=lab, capsize=3, alpha=0.85)
        ax.axhline(0, color="black", ls="--", lw=0.8)
        ax.set_xticks([0, 1], ["positive words", "negative words"])
        ax.set_xlim(-0.4, 1.4)
        ax.set_title(f"prompt: {p}", fontsize=9)
    axes[0].set_ylabel(f"slope of score on valence ({cfg.valence_source}), 95% CI")
    axes[1].legend(fontsize=7, loc="best")
    save(fig, cfg.out, "fig3c_framing_slopes.png")

    expo = exposure_slopes(frames, cfg.valence_source, cfg.freq, cfg.bnc)
    expo = expo.filter(pl.col("controls") == "valence")  # the paper's model (length held fixed: probe analyze)
    save_csv(expo, cfg.out, "fig3d_frequency_slopes.csv")
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    prompts = [cfg.positive, cfg.negative]
    for i, lab in enumerate(labels):
        sub = expo.filter(pl.col("model") == lab)
        x = [prompts.index(p) + (i - len(labels) / 2) * 0.06 for p in sub["prompt"]]
        ax.errorbar(x, sub["estimate"], yerr=[sub["estimate"] - sub["ci_low"], sub["ci_high"] - sub["estimate"]],
                    fmt="o", color=cols[lab], label=lab, capsize=3)
    ax.axhline(0, color="black", ls="--", lw=0.8)
    ax.set_xticks(range(len(prompts)), prompts)
    ax.set_xlim(-0.5, len(prompts) - 0.5)
    ax.set_ylabel(f"slope of score on log frequency ({cfg.freq}), 95% CI")
    ax.set_title("mere exposure: score ~ log frequency + valence", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, cfg.out, "fig3d_frequency_slopes.png")
    return {"framing": slopes.to_dicts(), "exposure": expo.to_dicts()}


if __name__ == "__main__":
    sys.exit(run_script(Fig3Config, __doc__, __file__, lambda cfg: main(cfg)))
