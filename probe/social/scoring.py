"""Score every option of every item through the prefix-cache engine.

Options are whole text responses, so each is rendered by the tokenizer's own chat template (text in, ids
out: how a reward model is used on text). The ids before the response slot, found once per distinct prompt
by `split_template`, are the shared prefix; items with the same prompt share one cache and one batch. An
option whose rendering does not start with that prefix (the template merged it with the text before it)
falls back to the longest prefix its item's options share.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import polars as pl
import torch

from probe.config import ScoreMode, ScoringOptions
from probe.core.engine import pad_rows
from probe.core.invariance import tile_rows
from probe.core.packing import full_tile_batches, score_mixed
from probe.core.paper_method import common_prefix
from probe.core.responses import second_order_from_text
from probe.core.scoring import AdaptiveBatcher, build_scorer, check_rows, conversation, make_head
from probe.models.loading import LoadedModel
from probe.social.items import Item
from probe.core.template import TemplateSplit, render, split_template
from probe.errors import ProbeError
from probe.runs.distributed import Dist, broadcast, deal, gather
from probe.runs.rundir import RunDir


def _groups(loaded: LoadedModel, mode: ScoreMode, items: list[Item], opts: ScoringOptions, system: str | None):
    """prefix ids -> list of (item index, option index, continuation ids)."""
    tok = loaded.tokenizer
    splits: dict[str, TemplateSplit] = {}
    groups: dict[tuple[int, ...], list] = defaultdict(list)
    scored: dict[tuple[int, ...], int] = {}  # prefix -> its last ids scored with the options (RewardBench's DPO)
    for i, item in enumerate(items):
        build = conversation(mode, item.prompt, system, opts, loaded)
        if item.prompt not in splits:
            splits[item.prompt] = split_template(tok, build, n_verify=0)
        split = splits[item.prompt]
        prefix = split.prefix_ids
        full = [render(tok, build, o) for o in item.options]
        if not all(f[: len(prefix)] == list(prefix) and len(f) > len(prefix) for f in full):
            lcp = common_prefix(full)
            prefix = tuple(lcp[: min(len(lcp), min(len(f) for f in full) - 1)])
        k = split.scored_within(len(prefix), f"item {item.item_id}")
        if scored.setdefault(tuple(prefix), k) != k:
            raise ProbeError(f"item {item.item_id}: two prompts share a prefix but not its scored part")
        for j, f in enumerate(full):
            if loaded.pairwise is not None and loaded.pairwise.two_orders:  # the second order rendered from text
                second_order_from_text(loaded, build, prefix, item.options[j], f[len(prefix):])
            groups[tuple(prefix)].append((i, j, f[len(prefix):]))
    return groups, scored


@dataclass
class ChunkFiles:
    """Where a run keeps one data set's finished chunks (`RunDir.write_chunks` under ``key``); `score_items` sets
    ``kept_rows`` (on rank 0): how many rows it found kept there, not scored again."""

    run: RunDir
    key: str
    kept_rows: int = 0


FLUSH_ROWS = 256  # a process keeps its finished chunks in a file each time this many rows have finished


def score_items(loaded: LoadedModel, mode: ScoreMode, items: list[Item], opts: ScoringOptions = ScoringOptions(),
                system: str | None = None, batch_size: int | None = None, verify: int = 4, progress=None,
                dist: Dist = Dist(), keep: ChunkFiles | None = None, fill=None) -> pl.DataFrame | None:
    """One row per item x option: dataset, domain, source file, item_id, the data set's own example id, social
    group, option, label, score, gold, undesirable, text, and the item's prompt (what `probe trace --social` reads).

    Each prefix's rows, sorted by length, are cut into chunks of 256; a process scores its chunks' rows in windows of
    at most ``batch_size`` rows (None: the device's tile, `probe.core.invariance.tile_rows`), the rows of a window's
    many prompts packed together into full tiles (`score_mixed`; ``fill``, a `TileFill`, counts how full the tiles
    were); the rows of a window's last tile, where it is not full, wait for the next window's;
    the first two rows of the first chunks are self-checked. With ``keep`` the finished chunks are kept in
    the run folder as they finish (every `FLUSH_ROWS` rows of a process) and the chunks kept there are not scored
    again. Under torchrun (``dist``) the chunks left to score are dealt to the ranks by their cost (`deal`: rows
    x padded length, costliest first; every batch is the one a single process scores); rank 0 gathers the scores
    and returns the table (the other ranks return None)."""
    groups, scored = _groups(loaded, mode, items, opts, system)
    chunks = [(prefix, rows[s : s + 256]) for prefix, all_rows in groups.items()
              for rows in [sorted(all_rows, key=lambda r: len(r[2]))]  # similar lengths together: less padding
              for s in range(0, len(rows), 256)]
    kept = keep.run.read_chunks(keep.key, [len(part) for _, part in chunks]) if keep and dist.main else {}
    left = broadcast(dist, [c for c in range(len(chunks)) if c not in kept] if dist.main else None)
    if keep:
        keep.kept_rows = sum(len(chunks[c][1]) for c in kept)
        if progress and kept:
            progress(keep.kept_rows)
    scores: dict[tuple[int, int], float] = {}
    pending: dict[int, np.ndarray] = {}
    batch_size = batch_size or tile_rows(loaded.device) or 512
    batcher = AdaptiveBatcher(batch_size)
    built: dict[tuple[int, ...], tuple] = {}
    # dealt by cost (rows x their padded length, the longest chunks first), not round robin: a prefix's last, short
    # chunk and a data set's long options no longer pile up on one rank; every batch is still a single process's
    costs = [float(len(chunks[c][1]) * max(len(r[2]) for r in chunks[c][1])) for c in left]
    mine = [left[k] for k in deal(costs, dist.world)[dist.rank]]
    got = {c: np.empty(len(chunks[c][1]), dtype=np.float32) for c in mine}
    waiting = {c: len(chunks[c][1]) for c in mine}
    drop = int(make_head(loaded, mode, opts, response_in_prefix=next(iter(scored.values()), 0)).drops_last_input)
    # windows of rows, of many prompts, packed together into full tiles (probe/core/packing.py): each row's bits are
    # its own whatever shares its tile, so windows, batches and ranks change no score
    for window in full_tile_batches([(c, k) for c in mine for k in range(len(chunks[c][1]))],
                                    lambda: batcher.batch_size, lambda ck: len(chunks[ck[0]][1][ck[1]][2]) - drop,
                                    tile_rows(loaded.device), loaded.device):
        prefixes = list(dict.fromkeys(chunks[c][0] for c, _ in window))
        built = {p: built[p] for p in prefixes if p in built}  # keep only this window's caches
        for prefix in prefixes:
            if prefix not in built:
                head = make_head(loaded, mode, opts, response_in_prefix=scored[prefix])
                built[prefix] = (head, build_scorer(loaded, head, list(prefix)))
        slot = {p: j for j, p in enumerate(built)}
        scorers = [sc for _, sc in built.values()]
        rows = [chunks[c][1][k][2] for c, k in window]
        which = [slot[chunks[c][0]] for c, _ in window]
        flat = batcher.run(lambda sel: score_mixed(scorers, [rows[i] for i in sel.tolist()],
                                                   [which[i] for i in sel.tolist()], fill),
                           torch.arange(len(rows)))
        finished = []
        for (c, k), v in zip(window, flat):
            got[c][k] = v
            waiting[c] -= 1
            if waiting[c] == 0:
                finished.append(c)
        for c in finished:
            prefix, part = chunks[c]
            out = got.pop(c)
            if 2 * c < verify:
                head, scorer = built[prefix]
                cont, lengths = pad_rows([r[2] for r in part[:2]])
                names = [f"item {items[i].item_id} option {j}" for i, j, _ in part[:2]]
                check_rows(loaded, head, list(prefix), scorer, cont, lengths, names, got=out[:2])
            for (i, j, _), v in zip(part, out):
                scores[(i, j)] = float(v)
            pending[c] = out
            if keep and sum(len(v) for v in pending.values()) >= FLUSH_ROWS:
                keep.run.write_chunks(keep.key, pending)
                pending = {}
            if progress:
                progress(len(part))
    if keep and pending:  # this process's last chunks: kept while the others finish theirs
        keep.run.write_chunks(keep.key, pending)
    parts = gather(dist, scores)
    if parts is None:
        return None
    scores = {key: v for p in parts for key, v in p.items()}
    scores |= {(i, j): float(v) for c, arr in kept.items() for (i, j, _), v in zip(chunks[c][1], arr)}
    return pl.DataFrame([
        {"dataset": it.dataset, "domain": it.domain, "source": it.source, "item_id": it.item_id,
         "example_id": str(it.meta.get("example_id", "")), "group": str(it.meta.get("bbq_group") or
                                                                       it.meta.get("bias_type") or ""),
         "option": j, "label": it.labels[j], "score": scores[(i, j)], "gold": it.gold, "undesirable": it.undesirable,
         "text": it.options[j], "prompt": it.prompt}
        for i, it in enumerate(items) for j in range(len(it.options))
    ], schema_overrides={"gold": pl.Int64, "undesirable": pl.Int64})
