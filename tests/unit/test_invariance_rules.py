"""The rules that make a score's bits its own (probe/core/invariance.py), and the GPU's tiles run on the CPU: they
change no bit of any score (tests/unit/test_batch_invariance.py holds every path to batch invariance)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe.core.invariance import bucket_length, buckets, dot_rows, in_tiles, running_sum, tail_rows, tree_sum
from probe.core.scoring import sweep_rows
from tests.unit.test_batch_invariance import PATHS, _at, _responses, _scorer, _setup

pytestmark = pytest.mark.parity


@pytest.fixture
def gpu_rules(monkeypatch):
    """A GPU's constants on the CPU: tiles of 4,096 token rows, attention and head groups of 2,048 query rows, length
    buckets of 8, prefix buckets of 64 (probe/core/invariance.py, kernels/packed_attention.py)."""
    from probe.core import invariance
    from probe.kernels import packed_attention

    for table in (invariance.TILE_ROWS, invariance.GROUP_ROWS, invariance.BUCKET, packed_attention.PREFIX_BUCKET):
        monkeypatch.setitem(table, "cpu", table["cuda"])
    monkeypatch.delenv("RM_PROBE_TILE_ROWS", raising=False)
    return invariance.TILE_ROWS["cuda"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("qwen3-rm", "reward"),
                                       ("gemma3-lm", "logprob"), ("llama-lm", "judge")])
def test_the_gpus_rules_hold_every_batch_alike_on_the_cpu(tiny_models, name, mode, path, device, gpu_rules):
    """What runs on a GPU (tiles of 4,096 token rows, groups of 2,048, buckets of 8), run on the CPU under a BLAS
    that rounds by the row count: each row the same bits at every batch size."""
    if device.type != "cpu":
        pytest.skip("the GPU's rules, run on the CPU")
    from tests.hostile_blas import HostileBLAS

    lm, head, split = _setup(tiny_models, name, mode)
    rows = _responses(lm.tokenizer, split, 12, seed=13)
    sweep = sweep_rows(np.arange(0, len(lm.tokenizer), len(lm.tokenizer) // 40), split.suffix_ids)
    with HostileBLAS():
        sc = _scorer(lm, head, split, path)
        assert path == "full" or sc.tiles == gpu_rules
        got = (_at(sc.score, rows, 12), _at(sc.score, sweep, 256))
        assert torch.equal(_at(sc.score, rows, 5), got[0]) and torch.equal(_at(sc.score, rows[:3], 1), got[0][:3])
        assert torch.equal(_at(sc.score, sweep, 7), got[1])


def _shapes(monkeypatch, lm):
    """Record each backbone forward's input shape and each packed attention call's query shape."""
    from probe.kernels import packed_attention

    seen = {"forward": [], "attention": []}
    backbone = lm.model.get_decoder() if hasattr(lm.model, "get_decoder") else lm.model.model
    def record(module, args, kwargs):
        x = next(t for t in (kwargs.get("input_ids"), *args, kwargs.get("inputs_embeds")) if t is not None)
        seen["forward"].append(tuple(x.shape[:2]))

    hook = backbone.register_forward_pre_hook(record, with_kwargs=True)
    attend = packed_attention._attend
    monkeypatch.setattr(packed_attention, "_attend",
                        lambda module, q, *a: seen["attention"].append(tuple(q.shape)) or attend(module, q, *a))
    return seen, hook


@pytest.mark.parametrize("path", ("shared", "cache", "uncached", "full"))
def test_under_the_gpus_rules_every_forward_and_attention_call_has_a_shape_set_by_the_row(tiny_models, path,
                                                                                         gpu_rules, monkeypatch):
    """Packed (the shared-prefix families): every forward is one tile of 4,096 positions, every attention call
    2,048 // bucket rows of one bucket; elsewhere a forward holds 4,096 // tokens rows of one length."""
    lm, head, split = _setup(tiny_models, "llama-rm", "reward")
    rows = _responses(lm.tokenizer, split, 30, seed=21, longest=40)
    sc = _scorer(lm, head, split, path)
    seen, hook = _shapes(monkeypatch, lm)
    try:
        sc.score(rows[:17])
        sc.score(rows[17:])
    finally:
        hook.remove()
    p = len(split.prefix_ids)
    lengths = {len(r) for r in rows}
    if path == "shared":
        assert seen["forward"] and set(seen["forward"]) == {(1, gpu_rules)}  # one tile each, the last padded
        # (and on a CPU, where the model caps its attention logits, `tail_rows` more: no scored row in the tanh's
        # scalar tail; Llama caps none)
        tail = (lambda n: tail_rows(n, "cpu")) if sc.softcap else (lambda n: 0)
        assert not sc.softcap and seen["attention"] and all(
            q[0] == 2048 // q[2] + tail(q[2]) and (q[2] % 8 == 0 or q[2] <= 8) for q in seen["attention"])
        assert sc.fill.real == sum(len(r) for r in rows) and sc.fill.computed == gpu_rules * len(seen["forward"])
    elif path == "full":
        assert {(b, n - p) for b, n in seen["forward"]} <= {(4096 // (p + n) + tail_rows(p + n, "cpu"), n)
                                                            for n in lengths}
    else:
        tokens = (lambda s: s) if path == "cache" else (lambda s: p + s)
        widths = {bucket_length(n, "cuda") for n in lengths}
        assert {f for f in seen["forward"]} <= {(4096 // tokens(w) + tail_rows(tokens(w), "cpu"),
                                                 w if path == "cache" else p + w) for w in widths}


def test_a_tile_plan_puts_every_row_token_once_and_pads_only_the_tile_end():
    """first_fit places rows longest first without splitting one, a tile's positions past its rows are padding,
    and each attention group reads its rows' own positions (past a row's length, its last) and writes back exactly
    the real ones."""
    from probe.core.packing import first_fit
    from probe.kernels.packed_attention import plan
    from probe.kernels.prefix_attention import SharedPrefix

    n_in = [5, 0, 3, 9, 1, 4, 600]
    tiles = first_fit(n_in, 16, "cuda")
    placed = sorted((r, s) for _, _, members in tiles for r, s in members)
    assert [r for r, _ in placed] == [0, 2, 3, 4, 5, 6]  # the empty row needs no place
    assert (600, 600, [(6, 0)]) in tiles  # longer than a tile: its own, of its bucket's length (600 = 75 x 8)
    for used, length, members in tiles:
        spans = sorted((s, s + n_in[r]) for r, s in members)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])) and used == sum(n_in[r] for r, _ in members)
        assert length == (16 if used <= 16 else 600) and spans[-1][1] <= length
    prefix = SharedPrefix([], [], 7)
    rows = [(0, 5, 0), (5, 3, 0), (8, 1, 0), (9, 4, 0)]
    pack = plan(rows, 16, torch.device("cpu"), prefix=prefix)
    dst = torch.cat([g.dst for g in pack.groups]).sort().values
    assert dst.tolist() == list(range(13))  # every real token once, none of the padding (13-15)
    for g in pack.groups:
        n = g.index.shape[1]
        assert g.index.shape[0] == max(1, 64 // n) + tail_rows(n, "cpu")  # the CPU's 64 query rows a call, its tail
        flat = g.index.reshape(-1)
        assert torch.equal(flat[g.src], g.dst)  # each real token read from its own place, written back there
    # a model that caps no attention logits has no tanh over the scores: its groups need no padding rows after them
    bare = plan(rows, 16, torch.device("cpu"), prefix=prefix, softcap=False)
    assert [g.index.shape[0] for g in bare.groups] == [max(1, 64 // g.index.shape[1]) for g in bare.groups]
    assert torch.equal(torch.cat([g.dst for g in bare.groups]).sort().values, dst)


def test_whole_tiles_and_fixed_groups(monkeypatch):
    from probe.core import invariance
    from probe.core.invariance import fixed_groups, rows_per_forward, whole_tiles

    monkeypatch.delenv("RM_PROBE_TILE_ROWS", raising=False)
    assert rows_per_forward(3, "cpu") == 512 // 3 and rows_per_forward(4096, "cuda") == 1
    assert rows_per_forward(10_000, "cpu") == 1
    assert whole_tiles(256, 3, "cpu", nearest=True) == 340 and whole_tiles(300, 3, "cpu") == 170
    assert whole_tiles(100, 3, "cpu") == 100  # fewer than a tile's rows: as asked (a GPU short of memory)
    assert fixed_groups([4, 5, 6, 7, 8], 2) == [([4, 5], 2), ([6, 7], 2), ([8, 8], 1)]
    assert fixed_groups([3, 1], None) == [([3, 1], 2)] and fixed_groups([], 4) == []
    monkeypatch.setenv("RM_PROBE_TILE_ROWS", "0")
    assert invariance.tile_rows("cpu") is None and rows_per_forward(3, "cpu") is None


def test_the_record_states_the_tiles_and_what_was_checked(tiny_models, gpu_rules, monkeypatch):
    from probe.core.invariance import describe
    from probe.runs.meta import model_settings

    lm, head, _ = _setup(tiny_models, "llama-rm", "reward")
    record = describe("cpu", lm.model)
    assert (record["tile_rows"], record["group_rows"]) == (4096, 2048)
    assert record["padding"] == "per-row length buckets of 8" and record["row_check"]["tile_rows"] == 4096
    settings = model_settings(lm, None, "reward", head)
    assert (settings["tile_rows"], settings["group_rows"]) == (4096, 2048)  # another tile rounds otherwise
    monkeypatch.setenv("RM_PROBE_TILE_ROWS", "0")
    off = describe("cpu", lm.model)
    assert off["batch_invariant"] is False and "RM_PROBE_TILE_ROWS=0" in off["why_not"]
    assert "tile_rows" not in model_settings(lm, None, "reward", head)


def test_tree_sum_is_one_order_for_every_row_count_and_for_padding():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 77, generator=gen) * torch.logspace(-3, 3, 77)  # terms whose order matters
    whole = tree_sum(x)
    assert all(torch.equal(tree_sum(x[:n]), whole[:n]) for n in (1, 2, 7, 85, 299))
    padded = torch.cat([x, torch.zeros(300, 50)], 1)
    assert torch.equal(tree_sum(padded), whole)  # zeros after a row's terms add nothing, in any number
    assert torch.equal(tree_sum(x.t().contiguous(), 0), whole)  # along the first dimension, the same order
    scratch = x.t().contiguous()
    assert torch.equal(tree_sum(scratch, 0, inplace=True), whole)
    torch.testing.assert_close(whole, x.double().sum(1).float(), rtol=1e-5, atol=1e-3)  # it is a sum
    assert torch.equal(dot_rows(x[:3], x[3]), tree_sum(x[:3] * x[3]))
    assert tree_sum(torch.zeros(4, 0)).shape == (4,)


def test_a_dot_product_is_the_same_at_every_row_count():
    """What moved the reward head's scores was ``h @ w``, a matrix-vector product, which MKL sums in another order at
    another row count (even in its strict mode: 226 of the row counts 1-299 against 3,000 rows, this CPU); the
    tree is the same at every count, on any device."""
    gen = torch.Generator().manual_seed(1)
    h, w = torch.randn(3000, 64, generator=gen), torch.randn(64, generator=gen)
    assert all(torch.equal(dot_rows(h[:n], w), dot_rows(h, w)[:n]) for n in range(1, 300))


def test_buckets_depend_on_the_row_alone():
    gpu = torch.device("cuda")  # only its type: no GPU needed
    assert [bucket_length(n, gpu) for n in (1, 2, 8, 9, 16, 17, 100)] == [1, 2, 8, 16, 16, 24, 104]
    assert buckets([3, 9, 3, 16, 40], gpu) == {3: [0, 2], 16: [1, 3], 40: [4]}
    assert [bucket_length(n, "cpu") for n in (1, 9, 17, 100)] == [1, 9, 17, 100]  # the CPU: no padding at all
    assert buckets([3, 9, 3, 16, 9]) == {3: [0, 2], 9: [1, 4], 16: [3]}


def test_in_tiles_gives_every_call_one_shape():
    seen = []

    def fn(a, b):
        seen.append((a.shape, b.shape))
        return a[:, 0] + b

    a, b = torch.arange(20.0).reshape(10, 2), torch.arange(10.0)
    assert torch.equal(in_tiles(fn, 4, a, b), a[:, 0] + b)
    assert seen == [((4, 2), (4,))] * 3


def test_the_cpu_blas_runs_in_its_reproducible_mode():
    """The commands and the API set MKL_CBWR before MKL's first product (tests/conftest.py as they do); the run's
    record says what MKL runs with."""
    from probe.core.invariance import describe
    from probe.runs.cpu import blas_mode

    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    mode = blas_mode()
    assert mode["strict"], mode
    record = describe(torch.device("cpu"), torch.nn.Linear(8, 8))
    assert record["cpu_blas"]["blas"] == "MKL" and record["row_check"]["thread_stable"] in (True, None)


def test_running_sum_is_cumsum_one_term_after_another():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 40, generator=gen) * torch.logspace(-3, 3, 40)
    got = running_sum(x, 1)
    want = torch.stack([x[:, : j + 1].double().sum(1) for j in range(40)], 1).float()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-3)
    assert torch.equal(running_sum(x[:2], 1), got[:2]) and torch.equal(running_sum(x.t(), 0), got.t())




@pytest.mark.parametrize("path", ("shared", "cache", "uncached"))
def test_the_gpus_length_buckets_hold_every_batch_alike_on_the_cpu(tiny_models, path, device, monkeypatch):
    """A GPU pads a whole response to a multiple of 8 ids (fewer, fuller forwards); the same rule on the CPU: every
    batch gives a row the same bits, and the padding changes a score by float32 rounding at most."""
    if device.type != "cpu":
        pytest.skip("the GPU's rule, run on the CPU")
    from probe.core import invariance

    lm, head, split = _setup(tiny_models, "llama-rm", "reward")
    rows = _responses(lm.tokenizer, split, 24, seed=17)
    exact = _at(_scorer(lm, head, split, path).score, rows, 24)
    monkeypatch.setitem(invariance.BUCKET, "cpu", 8)
    assert len({bucket_length(len(r)) for r in rows}) < len({len(r) for r in rows})  # rows really padded
    score = _scorer(lm, head, split, path).score
    base = _at(score, rows, 24)
    assert torch.equal(_at(score, rows, 5), base) and torch.equal(_at(score, rows[:6], 1), base[:6])
    torch.testing.assert_close(base, exact, rtol=2e-5, atol=2e-5)


def test_a_process_that_multiplied_before_importing_the_api_is_told(tiny_dirs):
    """MKL reads its mode once, at its first product: a script that multiplied float32 matrices before rm-probe's API
    could set it scores with MKL's default mode; it is warned once, and its runs record it."""
    import os
    import subprocess
    import sys

    if not torch.backends.mkl.is_available():
        pytest.skip("this torch has no MKL")
    code = ("import torch\nx = torch.randn(64, 64)\nx @ x\nimport probe\nlm = probe.load(%r, device='cpu')\n"
            "probe.sweep(lm, None, 'What is best?', limit=8, verify=0)\n"
            "from probe.core.invariance import describe\nprint(describe(torch.device('cpu'), lm.model))\n"
            % tiny_dirs["rm"])
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("MKL ran a product before rm-probe could set MKL_CBWR") == 1
    assert "'batch_invariant': False" in done.stdout
