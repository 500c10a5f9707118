"""One run's auditors' report: a self-contained HTML page (the page template is probe/report/templates/single.html).

Per prompt: the best and worst tokens (all tokens, or words only) with their flags, a search box over the whole
vocabulary (where does " love" rank?), filters (hide special/added tokens, non-words, tokens that do not
round-trip, byte fragments), the score distribution, and the run's provenance (model, template split, versions,
command). Filters can be preset from the address: ``report.html#prompt=worst&words=1&q=love``.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import polars as pl

from probe.analysis.sweeps import upgrade_vocab_columns
from probe.report import page_template
from probe.report.audit import findings, measured_box, personas_html, plot_png
from probe.report.provenance import provenance_table
from probe.report.text import score_decimal, shown_text
from probe.runs.rundir import RunDir

FLAG_BITS = {"is_special": 1, "is_added": 2, "is_word": 4, "leading_space": 8, "roundtrips": 16, "valid_utf8": 32,
             "is_alpha": 64}


def report_data(run: RunDir) -> dict:
    """What the page's script needs, and only that: per prompt the ids in rank order with scores and ranks, and
    the vocabulary rows of the ids the run scored (a partial run embeds its own ids, not the whole vocabulary)."""
    meta = run.read_meta()
    scores = run.read_table("scores.parquet")
    vocab = upgrade_vocab_columns(run.read_table("vocab.parquet"))
    vocab = vocab.filter(pl.col("token_id").is_in(scores["token_id"].unique().implode())).sort("token_id")
    flags = np.zeros(vocab.height, dtype=np.int64)
    for col, bit in FLAG_BITS.items():
        flags |= vocab[col].fill_null(False).to_numpy().astype(np.int64) * bit  # (is_word is empty without wordfreq)
    prompts = {}
    for key, info in meta["prompts"].items():
        part = scores.filter(pl.col("prompt_key") == key).sort("rank", "token_id")
        prompts[key] = {"text": info["text"], "ids": part["token_id"].to_list(),
                        "scores": [score_decimal(x) for x in part["score"].to_numpy()],
                        "ranks": part["rank"].to_list()}
    shown = [shown_text(d, p, v) for d, p, v in zip(vocab["decoded"], vocab["piece"], vocab["valid_utf8"])]
    return {"vocab": {"ids": vocab["token_id"].to_list(), "text": vocab["decoded"].to_list(), "shown": shown,
                      "flags": flags.tolist()}, "prompts": prompts}


def findings_html(run: RunDir, data: dict) -> str:
    """Per prompt: the findings in sentences and the plots (the page shows the selected prompt's)."""
    meta = run.read_meta()
    scores = run.read_table("scores.parquet")
    shown = dict(zip(data["vocab"]["ids"], data["vocab"]["shown"]))
    out = []
    for key, info in meta["prompts"].items():
        df = scores.filter(pl.col("prompt_key") == key)
        items = "".join(f"<li>{html.escape(line)}</li>" for line in findings(df, shown, key))
        img = plot_png(df, shown, key)
        out.append(f"<section class='findings' data-prompt='{html.escape(key)}'><p><b>{html.escape(key)}</b>: "
                   f"{html.escape(info['text'])}</p><ul>{items}</ul>"
                   f"<img alt='score distribution, best and worst words, score by kind of token for {html.escape(key)}'"
                   f" src='data:image/png;base64,{img}'></section>")
    return personas_html(scores, meta) + "\n".join(out)


PAGE = page_template("single.html")


def build(run_dir: str | Path, rows: int = 50, why: str = "") -> str:
    """The page; ``why``: an HTML section to add after the findings (probe/report/why.py, `probe report --explain`)."""
    run = RunDir(run_dir)
    meta = run.read_meta()
    data = report_data(run)
    payload = json.dumps(data, ensure_ascii=True, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(str(meta["model"]["id"]))
    return (PAGE.replace("__TITLE__", title).replace("__ROWS__", str(int(rows)))
            .replace("__MEASURED__", measured_box(meta)).replace("__FINDINGS__", findings_html(run, data) + why)
            .replace("__PROVENANCE__", provenance_table(meta)).replace("__DATA__", payload))
