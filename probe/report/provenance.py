"""The provenance table of a run, shared by the single-run and the multi-run report."""

from __future__ import annotations

import html
import json

from probe.report.text import model_label


def provenance_table(meta: dict) -> str:
    """A run's provenance as an HTML table: model, spec, score, dtype, coverage, timing, versions, command,
    and per prompt the verified template split and the self-check."""
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
        if isinstance(check, list):  # a response run checks each prefix group: the worst of them
            check = {"max_abs_diff": max((c["max_abs_diff"] for c in check), default=None),
                     "tolerance": min((c["tolerance"] for c in check), default=None)}
        out.append(f"<tr><th>prompt {html.escape(key)}</th><td><b>{html.escape(p.get('text', ''))}</b><br>"
                   f"prefix ids ({len(p.get('prefix_ids', []))}): <code>{html.escape(repr(p.get('prefix_text')))}</code><br>"
                   f"suffix ids {p.get('suffix_ids')}: <code>{html.escape(repr(p.get('suffix_text')))}</code><br>"
                   f"template: leading space {p.get('leading_space')}, trailing space {p.get('trailing_space')}, "
                   f"BOS count {p.get('bos_count')}, split verified on {p.get('verified_tokens')} tokens; "
                   f"self-check max |diff| {check.get('max_abs_diff')} (tolerance {check.get('tolerance')})</td></tr>")
    out.append("</table>")
    return "\n".join(out)
