"""One run's auditors' report: a self-contained HTML page (the page template is probe/report/templates/single.html).

Per prompt: the best and worst tokens (all tokens, or words only) with their flags, a search box over the whole
vocabulary (where does " love" rank?), filters (hide special/added tokens, non-words, tokens that do not
round-trip, byte fragments), the score distribution, and the run's provenance (model, template split, versions,
command). Filters can be preset from the address: ``report.html#prompt=worst&words=1&q=love``.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import numpy as np
import polars as pl

from probe.analysis.sweeps import upgrade_vocab_columns
from probe.report import page_template
from probe.report.provenance import provenance_table
from probe.report.text import score_decimal
from probe.runs.rundir import RunDir

FLAG_BITS = {"is_special": 1, "is_added": 2, "is_word": 4, "leading_space": 8, "roundtrips": 16, "valid_utf8": 32,
             "is_alpha": 64}


def _plot_png(scores: dict[str, np.ndarray]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(scores), figsize=(4.2 * len(scores), 3.0), squeeze=False)
    for ax, (key, s) in zip(axes[0], scores.items()):
        ax.hist(s, bins=120, color="#3A6E97", alpha=0.85)
        ax.axvline(np.median(s), color="black", lw=1, ls="--", label=f"median {np.median(s):.3g}")
        ax.set_title(key, fontsize=10)
        ax.set_xlabel("score")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("tokens")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def report_data(run: RunDir) -> dict:
    meta = run.read_meta()
    scores = run.read_table("scores.parquet")
    vocab = upgrade_vocab_columns(run.read_table("vocab.parquet")).sort("token_id")
    flags = np.zeros(vocab.height, dtype=np.int64)
    for col, bit in FLAG_BITS.items():
        flags |= vocab[col].to_numpy().astype(np.int64) * bit
    prompts = {}
    for key, info in meta["prompts"].items():
        part = scores.filter(pl.col("prompt_key") == key).sort("rank", "token_id")
        prompts[key] = {"text": info["text"], "ids": part["token_id"].to_list(),
                        "scores": [score_decimal(x) for x in part["score"].to_numpy()],
                        "ranks": part["rank"].to_list()}
    return {"vocab": {"text": vocab["decoded"].to_list(), "flags": flags.tolist()}, "prompts": prompts}


PAGE = page_template("single.html")


def build(run_dir: str | Path, rows: int = 50) -> str:
    run = RunDir(run_dir)
    meta = run.read_meta()
    data = report_data(run)
    plot = _plot_png({k: np.asarray(v["scores"]) for k, v in data["prompts"].items()})
    payload = json.dumps(data, ensure_ascii=True, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(str(meta["model"]["id"]))
    return (PAGE.replace("__TITLE__", title).replace("__ROWS__", str(int(rows))).replace("__PLOT__", plot)
            .replace("__PROVENANCE__", provenance_table(meta)).replace("__DATA__", payload))
