"""Persona grids (``probe score --systems FILE``): each prompt scored under several system prompts, one of them the
control. Per prompt and persona, against the control: Kendall tau-b, Spearman and rank-biased overlap at the top
and the bottom over every scored string (tokens, or a response file's responses), the mean shift of the score, and
the strings that move most (by the change of their standardised score: each run's scores as z-scores, so that a
persona that moves every score alike moves no string)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from probe.analysis import stats
from probe.errors import DataFormatError


@dataclass(frozen=True)
class Cell:
    """One prompt under one persona: its key in the run, and the grid coordinates."""

    key: str
    prompt: str
    persona: str


def grid_cells(meta: dict) -> tuple[str, list[Cell]]:
    """A run's control and its grid cells, read from ``meta.json`` (one line where the run is not a grid)."""
    section = meta.get("personas")
    if not section:
        raise DataFormatError("the run is not a persona grid (made without --systems): nothing to compare; run "
                              "probe score --systems FILE")
    cells = [Cell(k, v["base_prompt"], v["persona"]) for k, v in meta["prompts"].items() if v.get("persona")]
    return section["control"], cells


def standardised(x: np.ndarray) -> np.ndarray:
    sd = x.std()
    return (x - x.mean()) / sd if sd > 0 else np.zeros_like(x)


def compare(control: pl.DataFrame, persona: pl.DataFrame, p: float = 0.9) -> tuple[dict, pl.DataFrame]:
    """One persona against the control on the strings both scored (joined by ``token_id``): the agreement
    numbers, and every string with its ranks, scores and the change of its standardised score (``dz``)."""
    cols = ["token_id", "decoded", "score", "rank"] + (["is_word"] if "is_word" in control.columns else [])
    both = control.select(cols).join(persona.select("token_id", "score", "rank"), on="token_id", suffix="_persona")
    a, b = both["score"].to_numpy().astype(np.float64), both["score_persona"].to_numpy().astype(np.float64)
    if both.height < 3:
        raise DataFormatError(f"only {both.height} strings scored under both: too few to compare rankings")
    row = {"n": both.height, "kendall_tau_b": stats.kendall_tau_b(a, b), "spearman": stats.spearman(a, b),
           f"rbo_top_p{p:g}": stats.rbo(a, b, p), f"rbo_bottom_p{p:g}": stats.rbo(a, b, p, bottom=True),
           "mean_shift": float(b.mean() - a.mean()),
           "same_best": bool(both["token_id"][int(np.argmax(a))] == both["token_id"][int(np.argmax(b))])}
    moved = both.with_columns(pl.Series("dz", standardised(b) - standardised(a))).rename(
        {"score": "score_control", "rank": "rank_control"})
    return row, moved


def movers(moved: pl.DataFrame, n: int, words_only: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The ``n`` strings that rise most (largest ``dz`` > 0) and fall most (smallest ``dz`` < 0); ``words_only``:
    word-like tokens. Fewer than ``n`` where fewer rise or fall (a grid of a few responses): a string is never in
    both lists, and none that fell is called rising."""
    pool = moved.filter(pl.col("is_word")) if words_only and "is_word" in moved.columns else moved
    cols = ["decoded", "rank_control", "rank_persona", "score_control", "score_persona", "dz"]
    ordered = pool.sort("dz", "token_id", descending=[True, False])
    return (ordered.filter(pl.col("dz") > 0).head(n).select(cols),
            ordered.filter(pl.col("dz") < 0).tail(n).reverse().select(cols))


def persona_grid_table(scores: pl.DataFrame, meta: dict, p: float = 0.9, n_movers: int = 10,
                       words_only: bool = True) -> tuple[pl.DataFrame, dict]:
    """Every (prompt, persona) against its prompt's control: one row each (``prompt, persona, n, kendall_tau_b,
    spearman, rbo_top, rbo_bottom, mean_shift, same_best``), and per cell the strings that move most."""
    control, cells = grid_cells(meta)
    by_cell = {(c.prompt, c.persona): c.key for c in cells}
    rows, moves = [], {}
    for cell in cells:
        if cell.persona == control:
            continue
        base = by_cell.get((cell.prompt, control))
        if base is None:
            raise DataFormatError(f"prompt {cell.prompt!r} has no control cell ({cell.prompt}@{control})")
        row, moved = compare(scores.filter(pl.col("prompt_key") == base),
                             scores.filter(pl.col("prompt_key") == cell.key), p)
        rows.append({"prompt": cell.prompt, "persona": cell.persona, **row})
        up, down = movers(moved, n_movers, words_only)
        moves[f"{cell.prompt}@{cell.persona}"] = {"up": up.to_dicts(), "down": down.to_dicts()}
    if not rows:
        raise DataFormatError(f"the grid has no persona besides the control persona {control!r}")
    return pl.DataFrame(rows), moves
