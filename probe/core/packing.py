"""Rows packed into full tiles: forwards of exactly ``TILE_ROWS`` token positions, whatever the rows' lengths.

The engine's batch-invariance rule (probe/core/invariance.py) gives every forward one shape. Rows of one length in
fixed groups would pad short and few rows to a whole tile (whole responses, social items); packed, a tile holds rows
of any lengths back to back and pads only its end (kernels/packed_attention.py computes each row's attention in calls
set by the row alone). `run_tiles` packs rows first-fit, longest first, runs each tile through the backbone with
every row's own positions and returns every row's final hidden states; `TileFill` counts how full the tiles were
(the GPU kit and experiments/bench_invariance.py report it). `score_mixed` scores rows of many prefixes together
(social items: a prompt each), each row's prefix gathered from a pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from probe.core.invariance import bucket_length, cpu_activations


def pad_rows(rows: Sequence[Sequence[int]]) -> tuple[Tensor, Tensor]:
    """Rows of different lengths as one right-padded tensor and their true lengths. The padding repeats each
    row's last id: a real token never attends to what comes after it, so any id would do."""
    rows = [list(r) for r in rows]
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("empty continuation")
    m = max(len(r) for r in rows)
    return torch.tensor([r + [r[-1]] * (m - len(r)) for r in rows]), torch.tensor([len(r) for r in rows])


def _as_batch(cont: Tensor | Sequence[Sequence[int]], lengths, device) -> tuple[Tensor, Tensor]:
    if not isinstance(cont, Tensor):
        cont, lengths = pad_rows(cont)
    cont = cont.to(device=device, dtype=torch.long)
    if lengths is None:
        lengths = torch.full((cont.shape[0],), cont.shape[1])
    return cont, torch.as_tensor(lengths, device=device, dtype=torch.long)


def _on(hidden: Tensor, *tensors: Tensor) -> tuple[Tensor, ...]:
    """``tensors`` on the device of the final hidden states: the last layers' device when ``--device-map`` spread
    the model over several GPUs (the backbone's outputs stay where its last layer ran), where the heads read."""
    return tuple(t.to(hidden.device) for t in tensors)


class TileFill:
    """Token rows scored over token rows computed in fixed-shape forwards (1.0: every tile full)."""

    def __init__(self):
        self.real = self.computed = 0

    def add(self, real: int, computed: int) -> None:
        self.real += real
        self.computed += computed

    @property
    def ratio(self) -> float | None:
        return self.real / self.computed if self.computed else None

    def to_json(self) -> dict:
        return {"real_rows": self.real, "computed_rows": self.computed,
                "fill": None if self.ratio is None else round(self.ratio, 4)}


def first_fit(n_in: Sequence[int], size: int, device) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """Tiles of ``size`` positions for rows of ``n_in`` tokens (rows of 0 tokens need none), first fit, longest first:
    (positions used, tile length, [(row, start), ...]) each. A row longer than a tile gets a tile of its own, its
    length set by the row alone (`bucket_length`). Where a row goes changes no bit of it, only how full tiles are."""
    tiles: list[list] = []
    for i in sorted((i for i, n in enumerate(n_in) if n > 0), key=lambda i: (-n_in[i], i)):
        n = n_in[i]
        if n > size:
            tiles.append([n, bucket_length(n, device), [(i, 0)]])
            continue
        for t in tiles:
            if t[1] == size and t[0] + n <= size:
                t[2].append((i, t[0]))
                t[0] += n
                break
        else:
            tiles.append([n, size, [(i, 0)]])
    return [(used, length, members) for used, length, members in tiles]


def last_partial(n_in: Sequence[int], size: int, device) -> list[int]:
    """The rows `first_fit` puts in its last tile of ``size`` positions where that tile is not full: a caller with
    more rows to come lets them wait for its next tiles (taking them out leaves every other row where it was: the
    rows placed after them never reached that tile). [] where every tile is full or there is only one."""
    tiles = [t for t in first_fit(n_in, size, device) if t[1] == size]
    if len(tiles) < 2 or tiles[-1][0] == size:
        return []
    return sorted(i for i, _ in tiles[-1][2])


def full_tile_batches(items: Sequence, size: Callable[[], int], n_in: Callable[[object], int], tile: int | None,
                      device) -> Iterator[list]:
    """``items`` in order, in batches of at most ``size()`` (read before each batch: an `AdaptiveBatcher` may have
    halved it). Where ``tile`` is given, the items of a batch's last tile left part empty (`last_partial` over their
    ``n_in``) go first into the next batch instead: every tile is full but the last batch's. A row's bits do not
    depend on its batch, so this changes no score, only how much padding is computed."""
    queue = deque(items)
    while queue:
        batch = [queue.popleft() for _ in range(min(size(), len(queue)))]
        if queue and tile:
            later = set(last_partial([n_in(x) for x in batch], tile, device))
            queue.extendleft(reversed([x for j, x in enumerate(batch) if j in later]))
            batch = [x for j, x in enumerate(batch) if j not in later]
        yield batch


@dataclass
class Layout:
    """Where rows of given lengths go in their tiles, as device tensors built once (a sweep's batches all share one;
    a CUDA graph replays one without a host copy): per tile (positions used, length, each place's row and column,
    its positions, its attention plan); each row's first place; and, built when first asked, the index tensors of
    the heads' reads (`gather_hidden`, `token_table`)."""

    n_in: list[int]
    tiles: list[tuple[int, int, Tensor, Tensor, Tensor, object]]
    start: list[int]
    row_of: Tensor | None
    col_of: Tensor | None
    reads: dict = field(default_factory=dict)


def layout(n_in: Sequence[int], first_position: Sequence[int], size: int, device: torch.device,
           rows_device: torch.device, prefix=None, pool=None, which: Sequence[int] | None = None,
           softcap: bool = True) -> Layout:
    """The tiles of rows of ``n_in`` ids at positions ``first_position[i]`` onward (`first_fit` into ``size``
    positions), with the packed shared-prefix attention's plan: one ``prefix``, or a ``pool`` and each row's
    prefix ``which[i]``; ``softcap``: the model caps its attention logits (`plan`)."""
    from probe.kernels.packed_attention import plan

    out = Layout(list(n_in), [], [0] * len(n_in), None, None)
    rows_all, cols_all, offset = [], [], 0
    for used, length, members in first_fit(n_in, size, device):
        row_of, col_of = [members[0][0]] * length, [0] * length
        for i, s in members:
            row_of[s : s + n_in[i]] = [i] * n_in[i]
            col_of[s : s + n_in[i]] = range(n_in[i])
            out.start[i] = offset + s
        pos = torch.tensor([first_position[r] + c for r, c in zip(row_of, col_of)], device=device)[None]
        pack = plan([(s, n_in[i], which[i] if which is not None else 0) for i, s in members], length, device,
                    prefix=prefix, pool=pool, softcap=softcap)
        out.tiles.append((used, length, torch.tensor(row_of, device=rows_device),
                          torch.tensor(col_of, device=rows_device), pos, pack))
        rows_all += row_of
        cols_all += col_of
        offset += length
    out.row_of = torch.tensor(rows_all, device=rows_device, dtype=torch.long)
    out.col_of = torch.tensor(cols_all, device=rows_device, dtype=torch.long)
    return out


@dataclass
class Tiles:
    """What `run_tiles` computed: every tile's final hidden states one after another (``flat``; None where no row had
    a token) and the layout they were computed in."""

    flat: Tensor | None
    layout: Layout


def run_tiles(backbone: torch.nn.Module, device: torch.device, cont: Tensor, where: Layout,
              fill: TileFill | None = None) -> Tiles:
    """The rows of ``cont`` through ``backbone`` in the tiles of ``where``, with the packed shared-prefix attention:
    device work only (no host copy or sync)."""
    from probe.kernels.packed_attention import using_packed

    outs = []
    for used, length, rows_t, cols_t, pos, pack in where.tiles:
        ids = cont[rows_t, cols_t][None].to(device)
        with using_packed(backbone):
            outs.append(backbone(input_ids=ids, position_ids=pos, use_cache=False, rm_pack=pack).last_hidden_state[0])
        if fill is not None:
            fill.add(used, length)
    return Tiles(torch.cat(outs) if outs else None, where)


def gather_hidden(tiles: Tiles, rows: Sequence[int], width: int, like: Tensor) -> Tensor:
    """Rows' final hidden states [len(rows), width, d] from `run_tiles` (past a row's own tokens, its last)."""
    if width == 0 or tiles.flat is None:
        return like.new_zeros(len(rows), width, like.shape[-1])
    where = tiles.layout
    key = ("hidden", tuple(rows), width)
    if key not in where.reads:
        where.reads[key] = torch.tensor([[where.start[i] + min(j, max(where.n_in[i], 1) - 1) for j in range(width)]
                                         for i in rows], device=tiles.flat.device)
    return tiles.flat[where.reads[key]]


def token_table(tiles: Tiles, head, cont: Tensor) -> Tensor | None:
    """For a head that reads each position's next token (the fused log-probability head: ``head.reads_tokens``),
    every row's token log-probabilities [rows, width - 1] (zeros past a row's own), read a whole tile at a time
    (`tile_logprobs`: one call of the tile's fixed shape, no row padded to another's length). None where the rows
    have one token each."""
    width = cont.shape[1] - 1
    if width <= 0:
        return None
    if tiles.flat is None:
        return torch.zeros(cont.shape[0], width, device=cont.device)
    where, dev = tiles.layout, tiles.flat.device
    if ("table", width) not in where.reads:
        index = torch.tensor([[where.start[i] + min(j, max(n, 1) - 1) for j in range(width)]
                              for i, n in enumerate(where.n_in)], device=dev)
        real = torch.arange(width, device=dev)[None, :] < torch.tensor(where.n_in, device=dev)[:, None]
        where.reads[("table", width)] = (index, real)
    index, real = where.reads[("table", width)]
    targets = cont[where.row_of, where.col_of.clamp(max=width - 1) + 1].to(dev)
    parts, offset = [], 0
    for _, length, *_ in where.tiles:
        parts.append(head.tile_logprobs(tiles.flat[offset : offset + length], targets[offset : offset + length]))
        offset += length
    lp = torch.cat(parts)
    return torch.where(real, lp[index], torch.zeros((), device=dev, dtype=lp.dtype))


def score_mixed(scorers: Sequence, rows: Sequence[Sequence[int]], which: Sequence[int],
                fill: TileFill | None = None) -> Tensor:
    """Rows of several prefixes, each row ``rows[i]`` a continuation of ``scorers[which[i]]``'s prefix (PrefixScorers
    of one model and one kind of head), packed together into full tiles; each row read by its own scorer's head in
    a call of its own shape. Scorers off the packed layout (no shared-prefix attention, or tiles off) score each
    prefix's rows through their own `score` instead. Returns float32 scores on the CPU, in row order."""
    from probe.kernels.packed_attention import PrefixPool

    if not rows:
        return torch.empty(0, dtype=torch.float32)
    if not all(getattr(s, "packed", False) for s in scorers):  # an implicit reward's pair: each on its own
        out = torch.empty(len(rows), dtype=torch.float32)
        for k, sc in enumerate(scorers):
            mine = [i for i, w in enumerate(which) if w == k]
            if mine:
                out[torch.tensor(mine)] = sc.score([rows[i] for i in mine]).float().cpu()
        return out
    first = scorers[0]
    device = first.device
    cont, lengths = _as_batch(*pad_rows(rows), device)
    n_drop = int(first.head.drops_last_input)
    sizes = lengths.tolist()
    n_in = [max(0, n - n_drop) for n in sizes]
    used = sorted(set(which))
    slot = {k: j for j, k in enumerate(used)}
    pool = PrefixPool([scorers[k].shared for k in used], device)
    with torch.inference_mode(), cpu_activations(first.model):
        where = layout(n_in, [scorers[w].n_prefix for w in which], first.tiles, device, cont.device, pool=pool,
                       which=[slot[w] for w in which], softcap=first.softcap)
        tiles = run_tiles(first.backbone, device, cont, where, fill)
        table = token_table(tiles, first.head, cont) if getattr(first.head, "reads_tokens", False) else None
        scores = []
        for i, n in enumerate(sizes):
            head = scorers[which[i]].head
            if table is not None:  # each row's own head (its prompt's first token and scored part) on its tokens
                c, n_t = _on(table, cont[i : i + 1, :n], lengths[i : i + 1])
                scores.append(head.from_tokens(c, n_t, table[i : i + 1, : n - 1] if n > 1 else None).float())
                continue
            hidden = gather_hidden(tiles, [i], n_in[i], scorers[which[i]].prefix_hidden)
            scores.append(head.score(hidden, *_on(hidden, cont[i : i + 1, :n], lengths[i : i + 1])).float())
    return torch.cat([s.to(scores[0].device) for s in scores]).cpu()
