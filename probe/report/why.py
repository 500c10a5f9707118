"""The auditors' "why" section: for each explained response (explain.json, `probe explain`), a bar plot of the
layers' parts, the top heads, the prompt words that matter and the agreement with patching, in words.

`why_section(result)` returns an HTML fragment (a section other pages can embed); `why_page(result)` a whole page,
which `probe explain` writes as explain.html beside explain.json.
"""

from __future__ import annotations

import base64
import html
import io


def _bars_png(components: dict[str, float], title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in components if k != "embed"]
    layers = sorted({int(k.split(".")[0][1:]) for k in names})
    attn = [components.get(f"L{i}.attn", 0.0) for i in layers]
    mlp = [components.get(f"L{i}.mlp", 0.0) for i in layers]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.22 * len(layers) + 2), 3.2))
    w = 0.42
    ax.bar([i - w / 2 for i in layers], attn, w, label="attention")
    ax.bar([i + w / 2 for i in layers], mlp, w, label="MLP")
    ax.axhline(0, color="0.4", lw=0.6)
    ax.set_xlabel("layer")
    ax.set_ylabel("part of the score")
    ax.set_title(title if len(title) <= 70 else title[:67] + "...", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def agreement_words(rho: float | None) -> str:
    """Spearman agreement of the direct parts with patching, said in words."""
    if rho is None:
        return "not measured (no baseline to patch from)"
    if rho >= 0.7:
        how = "the direct parts rank the components much as patching does: read them as causes"
    elif rho >= 0.4:
        how = "the direct parts and patching agree in part: trust the largest parts, not their order"
    elif rho > 0.1:
        how = "weak agreement: most of the effect travels through later layers, read the parts as correlation"
    else:
        how = "no agreement: the direct parts say little about cause on this model"
    return f"Spearman {rho:+.2f}: {how}"


def why_section(result: dict, top: int = 5) -> str:
    e = html.escape
    ag = result.get("agreement", {})
    parts = [f"<section class='why'><h2>Why: {e(str(result.get('model', '')))} ({e(str(result.get('mode', '')))})</h2>",
             f"<p>{e(str(result.get('reader') or ''))}. Agreement with activation patching over all responses: "
             f"{e(agreement_words(ag.get('overall_spearman')))}.</p>"]
    for r in result.get("responses", []):
        comps = r["components"]
        big = sorted(comps.items(), key=lambda kv: -abs(kv[1]))[:top]
        outside = ", ".join(f"{k.replace('_', ' ')} {v:+.3f}" for k, v in r["rest_items"].items())
        items = [f"score {r['score']:+.4f} = the parts {sum(comps.values()):+.4f} + what lies outside them "
                 f"{r['rest']:+.4f} ({outside})",
                 "largest parts: " + ", ".join(f"{k} {v:+.3f}" for k, v in big)]
        if r.get("heads"):
            hs = sorted(((k, v) for k, v in r["heads"].items() if ".h" in k), key=lambda kv: -abs(kv[1]))[:top]
            items.append("top heads: " + ", ".join(f"{k} {v:+.3f}" for k, v in hs))
        p = r.get("patching") or {}
        if "effects" in p:
            items.append(f"against {p['baseline']!r}: {agreement_words(p.get('spearman'))}")
        g = r.get("integrated_gradients")
        if g:
            toks = g.get("tokens") or [str(x) for x in g["positions"]]
            best = sorted(zip(toks, g["attributions"]), key=lambda kv: -abs(kv[1]))[:top]
            items.append("prompt words that matter most: " + ", ".join(f"{t!r} {a:+.3f}" for t, a in best)
                         + f" (completeness residual {g['residual']:+.2e})")
        img = _bars_png(comps, f"{r['response']!r}: parts by layer")
        parts.append(f"<h3>{e(repr(r['response']))}</h3><ul>" + "".join(f"<li>{e(x)}</li>" for x in items)
                     + f"</ul><img alt='parts of {e(repr(r['response']))} by layer' src='data:image/png;base64,{img}'>")
    return "".join(parts) + "</section>"


def why_page(result: dict) -> str:
    style = ("<style>body{font:14px system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}"
             "img{max-width:100%}h3{border-top:1px solid #ddd;padding-top:.6em}</style>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>why: {html.escape(str(result.get('model')))}"
            f"</title>{style}</head><body>{why_section(result)}</body></html>")
