"""What `probe explain` explains: whole responses under a prompt (rendered and scored as `probe score --responses`
renders and scores them), or a sweep run's best and worst N tokens (under the run's own prefix ids, with the scores
the sweep printed)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from probe.errors import ProbeError
from probe.attribution.explain import Item, check_explainable, explain_items


def response_items(loaded, mode, prompt: str, responses: Sequence[str], opts, system: str | None = None,
                   batch_size: int = 64) -> tuple[list[Item], object]:
    """Items of whole responses, each with the score `probe score --responses` gives it (the same rendering,
    template split, head and engine: probe/core/responses.py)."""
    from probe.core.responses import prepare, score_rows

    rows = prepare(loaded, mode, "prompt", prompt, list(responses), opts, system)
    scores = score_rows(loaded, mode, rows, opts=opts, batch_size=batch_size, verify=0)
    items = [Item(text, tuple(rows.prefixes[i]), list(rows.continuations[i]), float(scores[i]),
                  rows.head_offset(tuple(rows.prefixes[i])), {"n_tokens": rows.n_tokens[i]})
             for i, text in enumerate(rows.responses)]
    return items, rows


def explain_responses(loaded, mode, prompt: str, responses: Sequence[str], opts, system: str | None = None, *,
                      baseline: str | None = None, heads: bool = False, patch: bool = True, atp: bool = True,
                      ig_steps: int = 128, ig_target: float = 0.01, ig_baseline: str = "zero",
                      batch: int = 64) -> dict:
    """Each response explained; patching against ``baseline`` (default: the response of median score among them,
    where there are 3 or more; else none)."""
    from probe.core.scoring import make_head

    if not isinstance(prompt, str) or not prompt.strip():
        raise ProbeError("the prompt is empty: give the user prompt the responses answer")

    head_for = lambda k: make_head(loaded, mode, opts, response_in_prefix=k)  # noqa: E731
    check_explainable(loaded, head_for(0))
    given = list(dict.fromkeys(responses))
    items, _ = response_items(loaded, mode, prompt, given + ([baseline] if baseline and baseline not in given else []),
                              opts, system)
    base_item, why = None, None
    if baseline is not None:
        base_item = next(it for it in items if it.label == baseline)
        items = [it for it in items if it.label in given]
    elif len(items) >= 3 and patch:
        order = np.argsort([it.engine_score for it in items], kind="stable")
        base_item = items[int(order[len(order) // 2])]
        why = "the response of median score among those given"
    elif patch:
        why = "no patching: name a --baseline response (or give 3 or more responses: the median one is taken)"
    result = explain_items(loaded, head_for, items, base_item, heads=heads, patch_components=patch, atp=atp,
                           ig_steps=ig_steps, ig_target=ig_target,
                           ig_baseline_id=ig_baseline_id(loaded.tokenizer, ig_baseline), batch=batch,
                           tokenizer=loaded.tokenizer, source="the score probe score --responses gives")
    result["baseline"] = {"response": base_item.label if base_item else None,
                          "score": base_item.engine_score if base_item else None,
                          "chosen": "named (--baseline)" if baseline is not None else why}
    result["prompt"] = prompt
    return result


def ig_baseline_id(tokenizer, baseline: str) -> int | None:
    """``zero``: zero embeddings; ``pad``: the pad token's embedding; else a text that must be one token."""
    if baseline == "zero":
        return None
    if baseline == "pad":
        if tokenizer.pad_token_id is None:
            raise ProbeError("--ig-baseline pad: this tokenizer has no pad token; use zero or a one-token text")
        return int(tokenizer.pad_token_id)
    ids = tokenizer.encode(baseline, add_special_tokens=False)
    if len(ids) != 1:
        raise ProbeError(f"--ig-baseline {baseline!r}: {len(ids)} tokens; give zero, pad or a text that is one token")
    return int(ids[0])


SEARCHES = ("gcg_max", "gcg_min", "beam")


def read_sweep(folder: str) -> tuple[dict, object]:
    """A sweep run's meta.json and scores.parquet, or a GCG or beam run's meta.json and result.json; one line where
    the folder is neither, or unfinished."""
    import polars as pl

    from probe.runs.rundir import RunDir

    path = Path(folder)
    if not (path / "meta.json").is_file():
        raise ProbeError(f"--run {folder}: no meta.json: not a probe score, gcg or beam run folder")
    meta = RunDir(folder).read_meta()
    experiment = meta.get("experiment")
    if experiment in SEARCHES:
        if not (path / "result.json").is_file():
            raise ProbeError(f"--run {folder}: no result.json (an unfinished search? finish it with --resume)")
        return meta, json.loads((path / "result.json").read_text())
    if experiment != "exhaustive":
        raise ProbeError(f"--run {folder}: a {experiment} run; --run explains a probe score sweep's best and worst "
                         "tokens or a gcg or beam search's best response")
    if not (path / "scores.parquet").is_file():
        raise ProbeError(f"--run {folder}: no scores.parquet (an unfinished sweep? finish it with --resume)")
    return meta, pl.read_parquet(path / "scores.parquet")


def run_inputs(meta: dict, folder: str) -> dict:
    """What the run's scores were computed with beyond its ids (its template, system turn, date, principle, input
    method, spec, reference), as the loader's and the head's settings; one line where the decomposition cannot take
    the run's score: an implicit reward (``--ref``: a difference of two models' log-probabilities) or a sweep made
    with ``--input-method paper`` (rows decoded, re-rendered and re-tokenized: not the prefix + token ids)."""
    config = meta.get("config") or {}
    settings = meta.get("settings") or {}
    ref = config.get("ref") or (settings.get("ref") or {}).get("model")
    if ref:
        beta = config.get("beta", settings.get("beta", 1.0))
        raise ProbeError(f"--run {folder}: an implicit reward (--ref {ref}, beta {beta:g}): its score is beta x the "
                         "difference of two models' log-probabilities, which one decomposition cannot take; explain "
                         "the model's --score logprob (probe explain --rm MODEL --score logprob) instead")
    method = config.get("input_method") or settings.get("input_method") or "ids"
    if method == "paper":
        raise ProbeError(f"--run {folder}: swept with --input-method paper (each row decoded, re-rendered and "
                         "re-tokenized, so its rows are not the run's prefix + token ids): explain a sweep made with "
                         "--input-method ids")
    keep = ("chat_template", "principle", "reference_response", "unit_test", "revision", "spec", "label_index")
    out = {k: config[k] for k in keep if config.get(k) is not None}
    if method == "rewardbench":
        out["input_method"] = "rewardbench"
    if config.get("judge_question"):
        out["judge_question"] = config["judge_question"]
    return out


def search_config(meta: dict):
    """The GCG or beam run's own settings as the command's config (its prompt, system turn, date, score mode)."""
    from dataclasses import fields

    from probe.config import GCGConfig

    names = {f.name for f in fields(GCGConfig)} - {"beam", "init", "output", "resume"}
    return GCGConfig(**{k: v for k, v in meta["settings"].items() if k in names})


def search_items(meta: dict, result: dict, loaded, baseline: str | None) -> tuple[list[Item], Item | None, object]:
    """A GCG or beam run's best response as an item under the run's own prompt, system turn and date (its settings
    rebuilt into the command's config, the split made as the search made it), with the score the search reported
    (its own full forward); a ``baseline`` text as the response patched from (none: no patching, one response)."""
    from probe.core.scoring import prompt_split

    config = search_config(meta)
    opts = config.scoring_options()
    split = prompt_split(loaded, config.mode, config.prompt, config.system, opts, len(loaded.tokenizer))
    best = [int(t) for t in result["best_ids"]]
    item = Item(result.get("best_text") or loaded.tokenizer.decode(best), tuple(split.prefix_ids),
                [*best, *split.suffix_ids], float(result["best_score"]), 0, {"token_ids": best, "role": "search"})
    base = None
    if baseline is not None:
        ids = loaded.tokenizer.encode(baseline, add_special_tokens=False)
        base = Item(baseline, tuple(split.prefix_ids), [*ids, *split.suffix_ids], None, 0,
                    {"token_ids": ids, "role": "baseline"})
    return [item], base, opts


def sweep_items(meta: dict, scores, top: int, prompt_key: str | None, tokenizer) -> tuple[list[Item], Item, str]:
    """The best and worst ``top`` tokens of one prompt of a sweep, and its median token (the default baseline), as
    items under the run's own prefix and suffix ids, with the scores the sweep printed."""
    import polars as pl

    prompts = meta["settings"]["prompts"]
    key = prompt_key or next(iter(prompts))
    if key not in prompts:
        raise ProbeError(f"--prompt-key {key!r}: the run's prompts are {sorted(prompts)}")
    prefix, suffix = prompts[key]
    k_fixed = int((meta["settings"].get("head") or {}).get("response_in_prefix", 0) or 0)
    df = scores.filter(pl.col("prompt_key") == key).sort("rank", "token_id")
    if df.height < 3:
        raise ProbeError(f"--run: prompt {key!r} has {df.height} scored tokens; explaining needs at least 3")
    n = min(top, df.height // 2)

    def item(row: dict, role: str) -> Item:
        t = int(row["token_id"])
        return Item(tokenizer.decode([t]), tuple(prefix), [t, *suffix], float(row["score"]), k_fixed,
                    {"token_id": t, "rank": int(row["rank"]), "role": role})
    rows = df.to_dicts()
    items = [item(r, "best") for r in rows[:n]] + [item(r, "worst") for r in rows[-n:]]
    return items, item(rows[len(rows) // 2], "median"), key
