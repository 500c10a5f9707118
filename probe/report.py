"""The auditors' report: one self-contained HTML file per sweep run, or one across several runs.

    python -m probe.report results/<model>/exhaustive_<time>/     # writes report.html inside the run
    python -m probe.report RUN_A RUN_B ... --out audit.html      # several models side by side (probe/report_multi.py)

Per prompt: the best and worst tokens (all tokens, or words only) with their flags, a search box over the whole
vocabulary (where does " love" rank?), filters (hide special/added tokens, non-words, tokens that do not
round-trip, byte fragments), the score distribution, and the run's provenance (model, template split, versions,
command). Filters can be preset from the address: ``report.html#prompt=worst&words=1&q=love``.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from probe.cliargs import config_from_args
from probe.analysis.sweeps import upgrade_vocab_columns
from probe.report_text import model_label, score_decimal
from probe.results import RunDir, atomic_write_bytes, writable_file

FLAG_BITS = {"is_special": 1, "is_added": 2, "is_word": 4, "leading_space": 8, "roundtrips": 16, "valid_utf8": 32,
             "is_alpha": 64}


@dataclass(frozen=True)
class ReportConfig:
    run: tuple[str, ...] = field(default=(), metadata={})
    out: str | None = field(default=None, metadata={
        "help": "output file (default: <run>/report.html; for several runs results/report_<time>.html)"})
    rows: int = field(default=50, metadata={"help": "rows shown in each best/worst table (several runs: 25)"})


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


def _provenance(meta: dict) -> str:
    m, env = meta.get("model", {}), meta.get("environment", {})
    rows = [("model", model_label(meta)), ("path", m.get("path")), ("revision", m.get("revision")),
            ("registry spec", f"{m.get('spec', {}).get('name')} (matched by {m.get('spec_match')})"),
            ("score", json.dumps(meta.get("score"))), ("dtype / device", f"{m.get('dtype')} / {m.get('device')}"),
            ("tokens scored", meta.get("settings", {}).get("n_tokens")),
            ("input method", meta.get("settings", {}).get("input_method", "ids")),
            ("created / finished", f"{meta.get('created')} / {meta.get('finished')}"),
            ("sweep time", f"{meta.get('timing', {}).get('sweep_s')} s, {meta.get('timing', {}).get('tokens_per_s')} tokens/s"),
            ("versions", json.dumps(env.get("versions"))), ("git commit", env.get("git_commit")),
            ("command", env["command"] if isinstance(env.get("command"), str) else " ".join(env.get("command") or []))]
    out = ["<table class='prov'>"] + [f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                                      for k, v in rows]
    for key, p in meta.get("prompts", {}).items():
        check = (meta.get("self_check") or {}).get(key) or {}
        out.append(f"<tr><th>prompt {html.escape(key)}</th><td><b>{html.escape(p.get('text', ''))}</b><br>"
                   f"prefix ids ({len(p.get('prefix_ids', []))}): <code>{html.escape(repr(p.get('prefix_text')))}</code><br>"
                   f"suffix ids {p.get('suffix_ids')}: <code>{html.escape(repr(p.get('suffix_text')))}</code><br>"
                   f"template: leading space {p.get('leading_space')}, trailing space {p.get('trailing_space')}, "
                   f"BOS count {p.get('bos_count')}, split verified on {p.get('verified_tokens')} tokens; "
                   f"self-check max |diff| {check.get('max_abs_diff')} (tolerance {check.get('tolerance')})</td></tr>")
    out.append("</table>")
    return "\n".join(out)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rm-probe report: __TITLE__</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;max-width:1400px}
h1{font-size:20px} h2{font-size:16px;margin-top:1.5em} table{border-collapse:collapse}
td,th{padding:2px 8px;border-bottom:1px solid #e4e4e4;text-align:left;vertical-align:top}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1.5em} .num{text-align:right;font-variant-numeric:tabular-nums}
.tok{font-family:ui-monospace,monospace;white-space:pre;background:#f4f4f4;padding:0 3px;border-radius:3px}
.flag{font-family:ui-monospace,monospace;color:#666} .controls label{margin-right:1em}
.prov th{white-space:nowrap;color:#555} .prov td{font-size:13px} code{font-size:12px}
#matches td{font-size:13px} .muted{color:#777}
</style></head><body>
<h1>rm-probe report: __TITLE__</h1>
<p class="muted">Every token id of the vocabulary scored as the one-token response. Flags: S special (control
token), A added, W English word, L letters only, _ leading space, R round-trips (decode then encode gives the same id), ! not valid UTF-8 on its own.
Whitespace is shown as ␣ (space), ⏎ (newline), → (tab).</p>
<div class="controls">
 prompt <select id="prompt"></select>
 <label><input type="checkbox" id="hideSpecial"> hide special/added</label>
 <label><input type="checkbox" id="words"> words only</label>
 <label><input type="checkbox" id="roundtrip"> round-tripping only</label>
 <label><input type="checkbox" id="utf8"> hide byte fragments</label>
 search <input id="q" size="24" placeholder="token text, e.g. love">
</div>
<p id="promptText"></p>
<div class="grid"><div><h2>Best</h2><table id="best"></table></div><div><h2>Worst</h2><table id="worst"></table></div></div>
<h2>Search</h2><p id="matchInfo" class="muted">type in the search box to find tokens and their ranks</p>
<table id="matches"></table>
<h2>Score distributions</h2><img alt="score histograms" src="data:image/png;base64,__PLOT__" style="max-width:100%">
<h2>Provenance</h2>__PROVENANCE__
<script id="data" type="application/json">__DATA__</script>
<script>
const D = JSON.parse(document.getElementById('data').textContent);
const ROWS = __ROWS__;
const F = {special:1, added:2, word:4, space:8, rt:16, utf8:32, alpha:64};
const $ = id => document.getElementById(id);
function show(t){return t.replace(/ /g,'␣').replace(/\\n/g,'⏎').replace(/\\t/g,'→');}
function flags(f){return (f&F.special?'S':'.')+(f&F.added?'A':'.')+(f&F.word?'W':'.')+(f&F.alpha?'L':'.')+(f&F.space?'_':'.')+(f&F.rt?'R':'.')+(f&F.utf8?'.':'!');}
function keep(id){const f=D.vocab.flags[id];
  if($('hideSpecial').checked && (f&(F.special|F.added))) return false;
  if($('words').checked && !(f&F.word)) return false;
  if($('roundtrip').checked && !(f&F.rt)) return false;
  if($('utf8').checked && !(f&F.utf8)) return false; return true;}
function row(tbl,p,i,filteredRank){const id=p.ids[i];const tr=tbl.insertRow();tr.dataset.id=id;
  const cells=[filteredRank,p.ranks[i],p.scores[i].toFixed(4),id,flags(D.vocab.flags[id])];
  cells.forEach((c,k)=>{const td=tr.insertCell();td.textContent=c;td.className=k==4?'flag':'num';});
  const td=tr.insertCell();const s=document.createElement('span');s.className='tok';s.textContent=show(D.vocab.text[id]);td.appendChild(s);}
function header(tbl){const tr=tbl.insertRow();['#','rank','score','id','flags','token'].forEach(h=>{const th=document.createElement('th');th.textContent=h;tr.appendChild(th);});}
function render(){const p=D.prompts[$('prompt').value];$('promptText').textContent='Prompt: '+p.text;
  for(const [name,dir] of [['best',1],['worst',-1]]){const tbl=$(name);tbl.innerHTML='';header(tbl);let n=0;
    const N=p.ids.length;for(let k=0;k<N&&n<ROWS;k++){const i=dir>0?k:N-1-k;if(keep(p.ids[i])){n++;row(tbl,p,i,n);}}}
  const q=$('q').value;const m=$('matches');m.innerHTML='';
  if(!q){$('matchInfo').textContent='type in the search box to find tokens and their ranks';return;}
  header(m);let n=0,total=0;const ql=q.toLowerCase();
  for(let i=0;i<p.ids.length;i++){const id=p.ids[i];if(!keep(id))continue;
    if(D.vocab.text[id].toLowerCase().includes(ql)){total++;if(n<200){n++;row(m,p,i,n);}}}
  $('matchInfo').textContent=total+' tokens contain "'+q+'"'+(total>200?' (first 200 by rank shown)':'');}
function applyHash(){const h=new URLSearchParams(location.hash.slice(1));
  if(h.get('prompt')&&D.prompts[h.get('prompt')])$('prompt').value=h.get('prompt');
  for(const [k,id] of [['special','hideSpecial'],['words','words'],['roundtrip','roundtrip'],['utf8','utf8']]) if(h.get(k)==='1')$(id).checked=true;
  if(h.get('q'))$('q').value=h.get('q');}
for(const k of Object.keys(D.prompts)){const o=document.createElement('option');o.value=k;o.textContent=k;$('prompt').appendChild(o);}
applyHash();render();
for(const id of ['prompt','hideSpecial','words','roundtrip','utf8'])$(id).addEventListener('change',render);
$('q').addEventListener('input',render);
</script></body></html>
"""


def build(run_dir: str | Path, rows: int = 50) -> str:
    run = RunDir(run_dir)
    meta = run.read_meta()
    data = report_data(run)
    plot = _plot_png({k: np.asarray(v["scores"]) for k, v in data["prompts"].items()})
    payload = json.dumps(data, ensure_ascii=True, separators=(",", ":")).replace("</", "<\\/")
    title = html.escape(str(meta["model"]["id"]))
    return (PAGE.replace("__TITLE__", title).replace("__ROWS__", str(int(rows))).replace("__PLOT__", plot)
            .replace("__PROVENANCE__", _provenance(meta)).replace("__DATA__", payload))


def main_from_args(ns: argparse.Namespace) -> int:
    from probe.errors import ProbeError
    from probe.results import utc_stamp

    ns.run = tuple(ns.run)
    cfg = config_from_args(ReportConfig, ns)
    if cfg.out:
        writable_file(cfg.out, "--out")
    runs = [RunDir(r) for r in cfg.run]
    for run in runs:
        meta = run.read_meta()
        if meta.get("experiment", "exhaustive") != "exhaustive" or "prompts" not in meta:
            raise ProbeError(f"{run.path}: not an exhaustive sweep run (it is a {meta.get('experiment', 'other')} run); "
                             "the report shows sweeps (GCG results are in its result.json)")
        if meta.get("status") != "complete":
            raise ProbeError(f"{run.path}: the run is not complete; finish it with --resume first")
    if len(runs) == 1:
        out = Path(cfg.out) if cfg.out else runs[0].path / "report.html"
        page = build(runs[0].path, cfg.rows)
    else:
        from probe import report_multi

        out = Path(cfg.out) if cfg.out else Path("results") / f"report_{utc_stamp()}.html"
        page = report_multi.build([r.path for r in runs], cfg.rows if "rows" in vars(ns) else 25)
    atomic_write_bytes(out, page.encode("utf-8"))
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")
    return 0


def make_parser(subparsers=None) -> argparse.ArgumentParser:
    from probe.cli import command_parser

    return command_parser(subparsers, "report", "the auditors' HTML report of a run", "python -m probe.report",
                          __doc__, ReportConfig, main_from_args,
                          positional=(("run", {"nargs": "+", "help": "one or more complete exhaustive run directories"}),),
                          verbose=False)


def main(argv: list[str] | None = None) -> int:
    from probe.cli import run_command

    return run_command(make_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
