"""The rules that make a score's bits its own (probe/core/invariance.py), and the GPU's tiles run on the CPU: they
change no bit of any score (tests/unit/test_batch_invariance.py holds every path to batch invariance)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from probe.core.invariance import bucket_length, buckets, dot_rows, in_tiles, running_sum, tree_sum
from probe.core.scoring import sweep_rows
from tests.unit.test_batch_invariance import PATHS, _at, _responses, _scorer, _setup

pytestmark = pytest.mark.parity


@pytest.fixture
def cpu_tiles(monkeypatch):
    """The GPU's fixed product tiles, on the CPU (64 token rows: several tiles and a padded one per batch)."""
    from probe.core import invariance

    monkeypatch.setitem(invariance.TILE_ROWS, "cpu", 64)
    return 64


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("qwen3-rm", "reward"),
                                       ("llama-lm", "logprob"), ("gemma3-lm", "logprob"), ("llama-lm", "judge")])
def test_the_gpus_tiles_change_no_bit_and_hold_every_batch_alike(tiny_models, name, mode, path, device, cpu_tiles,
                                                                  monkeypatch):
    """What runs on a GPU (every linear layer, the shared-prefix attention, the model's own attention and the fused
    head in fixed tiles of token rows) run on the CPU, whose products give a row the same bits at any row count: the
    tiles change no bit of any score, and a batch of any size gives each row the same bits."""
    if device.type != "cpu":
        pytest.skip("the CPU's tiles against its untiled products")
    from probe.core import invariance

    lm, head, split = _setup(tiny_models, name, mode)
    rows = _responses(lm.tokenizer, split, 20, seed=13)
    sweep = sweep_rows(np.arange(0, len(lm.tokenizer), 25), split.suffix_ids)
    tiled = _scorer(lm, head, split, path)
    assert path == "full" or tiled.tiles == cpu_tiles
    got = (_at(tiled.score, rows, 20), _at(tiled.score, sweep, 256))
    assert torch.equal(_at(tiled.score, rows, 3), got[0]) and torch.equal(_at(tiled.score, sweep, 7), got[1])
    monkeypatch.delitem(invariance.TILE_ROWS, "cpu")
    plain = _scorer(lm, head, split, path)
    assert torch.equal(_at(plain.score, rows, 20), got[0]) and torch.equal(_at(plain.score, sweep, 256), got[1])


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
    record = describe(torch.device("cpu"))
    assert record["batch_invariant"] is True and record["cpu_blas"]["blas"] == "MKL"


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
            "from probe.core.invariance import describe\nprint(describe(torch.device('cpu')))\n" % tiny_dirs["rm"])
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"} | {"HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.count("MKL ran a product before rm-probe could set MKL_CBWR") == 1
    assert "'batch_invariant': False" in done.stdout
