"""The GPU paths, reached on a CPU: torchrun's process group (device and backend), out-of-memory recovery with
injected errors (no row lost, the halved size recorded and resumed with), the memory plan for every config family
against a hand count and a counted peak, device placement with part of a model elsewhere, the gated head without
a host round trip, and the half-precision tolerance of a CUDA forward."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from probe.commands.score import ScoreVocabConfig, run
from probe.core.scoring import AdaptiveBatcher, is_oom
from probe.errors import ProbeError
from probe.runs import distributed

PROMPTS = ("What, in one word, is the greatest thing ever?", "What, in one word, is the worst thing ever?")


# ---------------------------------------------------------------- 1. torchrun: device and backend of each rank


@pytest.fixture
def fake_torchrun(monkeypatch):
    """torchrun's environment for rank 1 of 2, with torch.cuda and torch.distributed replaced by recorders."""
    import torch.distributed as dist

    calls: list[tuple] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    state = {"up": False}

    def init_process_group(backend=None, **kw):
        calls.append(("init_process_group", backend))
        state["up"] = True

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "is_initialized", lambda: state["up"])
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append(("destroy_process_group",)))
    return calls


@pytest.mark.parametrize("requested", ["cuda", "auto"])
def test_a_cuda_rank_makes_its_own_gpu_current_before_nccl_starts(fake_torchrun, requested):
    d = distributed.init(requested)
    assert (d.rank, d.world, d.local_rank) == (1, 2, 1)
    # set_device first: NCCL's broadcast_object_list builds its tensors on the current device
    assert fake_torchrun == [("set_device", 1), ("init_process_group", "nccl")]
    assert distributed.device_for(d, requested) == "cuda:1"


def test_a_cpu_run_uses_gloo_even_where_cuda_is_visible(fake_torchrun):
    d = distributed.init("cpu")
    assert fake_torchrun == [("init_process_group", "gloo")]
    assert distributed.device_for(d, "cpu") == "cpu"


def test_torchrun_with_device_map_or_a_fixed_gpu_is_refused_before_the_group_starts(fake_torchrun):
    with pytest.raises(ProbeError, match="--device-map .* torchrun"):
        distributed.init("cuda", device_map="auto")
    with pytest.raises(ProbeError, match="LOCAL_RANK"):
        distributed.init("cuda:1")
    assert not any(c[0] == "init_process_group" for c in fake_torchrun)


def test_the_command_destroys_its_process_group_even_when_the_run_fails(fake_torchrun, monkeypatch, tmp_path):
    import probe.commands.score as score

    def boom(*a, **k):
        raise RuntimeError("scoring failed")

    monkeypatch.setattr(score, "_run", boom)
    with pytest.raises(RuntimeError, match="scoring failed"):
        score.run(ScoreVocabConfig(rm="x", device="cpu", output=str(tmp_path)))
    assert fake_torchrun == [("init_process_group", "gloo"), ("destroy_process_group",)]


def test_a_single_process_touches_no_process_group(fake_torchrun, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    d = distributed.init("cuda", device_map="auto")  # --device-map alone is fine
    distributed.destroy(d)
    assert not d.enabled and fake_torchrun == []


# ---------------------------------------------------------------- 4. what counts as out of memory


@pytest.mark.parametrize("err", [
    RuntimeError("CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"),
    RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried ..."),
    torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
])
def test_allocation_failures_are_out_of_memory(err):
    assert is_oom(err)


@pytest.mark.parametrize("err", [RuntimeError("CUDA error: an illegal memory access was encountered"),
                                 ValueError("out of memory"), RuntimeError("shape mismatch")])
def test_other_errors_are_not(err):
    assert not is_oom(err)


def test_out_of_memory_is_recognised_on_torch_before_2_5(monkeypatch):
    """torch 2.4 (allowed by pyproject) has no torch.OutOfMemoryError, only torch.cuda.OutOfMemoryError: the check
    must neither fail with AttributeError nor miss the error."""
    monkeypatch.delattr(torch, "OutOfMemoryError")
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory"))
    assert not is_oom(KeyError("x"))

    calls = []

    def score(rows):
        calls.append(rows.shape[0])
        if rows.shape[0] > 8:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return rows[:, 0].float()

    out = AdaptiveBatcher(32).run(score, torch.arange(40)[:, None])
    np.testing.assert_array_equal(out, np.arange(40, dtype=np.float32))
    assert calls[:3] == [32, 16, 8]


def test_memory_is_released_after_the_failed_batch_is_gone(monkeypatch):
    """empty_cache() runs once the failed batch's exception (and the tensors its traceback holds) is released."""
    import gc
    import weakref

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    alive_at_release = []
    held: list[weakref.ref] = []

    def empty_cache():
        gc.collect()
        alive_at_release.append([r() is not None for r in held])

    monkeypatch.setattr(torch.cuda, "empty_cache", empty_cache)

    def score(rows):
        if rows.shape[0] > 4:
            activations = torch.zeros(rows.shape[0], 1000)  # what a failing forward had allocated
            held.append(weakref.ref(activations))
            raise torch.OutOfMemoryError("CUDA out of memory")
        return rows[:, 0].float()

    AdaptiveBatcher(16).run(score, torch.arange(20)[:, None])
    assert alive_at_release == [[False], [False, False]]


# ---------------------------------------------------------------- 7. an injected OOM inside a real sweep, resumed


def _config(tiny_dirs, out, **kw):
    base = dict(rm=tiny_dirs["rm"], prompt=PROMPTS, device="cpu", output=str(out), shard_size=128, batch_size=64,
                progress=False, verify=2, limit=640)
    return ScoreVocabConfig(**{**base, **kw})


def _inject(monkeypatch, error: Exception, at_call: int, sizes: list[int], crash_after_shards: int | None = None):
    """PrefixScorer.score raises ``error`` on its ``at_call``-th batch of more than 16 rows; every batch size is
    recorded in ``sizes``; with ``crash_after_shards``, the run dies after that many shards (a killed session)."""
    from probe.core.engine import PrefixScorer
    from probe.runs.rundir import RunDir

    original, write = PrefixScorer.score, RunDir.write_shard
    state = {"big": 0, "shards": 0}

    def score(self, cont, lengths=None):
        sizes.append(len(cont))
        if len(cont) > 16:
            state["big"] += 1
            if state["big"] == at_call:
                raise error
        return original(self, cont, lengths)

    def write_shard(self, *a):
        if crash_after_shards is not None and state["shards"] == crash_after_shards:
            raise KeyboardInterrupt
        state["shards"] += 1
        write(self, *a)

    monkeypatch.setattr(PrefixScorer, "score", score)
    monkeypatch.setattr(RunDir, "write_shard", write_shard)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB"),
                                   RuntimeError("CUDA error: out of memory")])
def test_an_out_of_memory_batch_is_halved_recorded_and_loses_no_row(tiny_dirs, tmp_path, monkeypatch, error):
    want = run(_config(tiny_dirs, tmp_path / "plain")).read_table("scores.parquet")
    sizes: list[int] = []
    _inject(monkeypatch, error, at_call=3, sizes=sizes)
    got_dir = run(_config(tiny_dirs, tmp_path / "oom"))
    got = got_dir.read_table("scores.parquet")
    assert got.height == want.height and got["token_id"].to_list() == want["token_id"].to_list()
    np.testing.assert_allclose(got["score"].to_numpy(), want["score"].to_numpy(), rtol=1e-5, atol=1e-5)
    meta = got_dir.read_meta()
    assert meta["settings"]["batch_size"] == 32 and [h["batch_size"] for h in meta["oom_halvings"]] == [32]
    assert 64 in sizes and max(sizes[sizes.index(32):]) == 32  # after the failure, never back to 64


def test_resume_continues_with_the_halved_batch_size(tiny_dirs, tmp_path, monkeypatch):
    sizes: list[int] = []
    _inject(monkeypatch, torch.OutOfMemoryError("CUDA out of memory"), at_call=2, sizes=sizes, crash_after_shards=2)
    with pytest.raises(KeyboardInterrupt):
        run(_config(tiny_dirs, tmp_path))
    monkeypatch.undo()
    (broken,) = list(tmp_path.glob("*/exhaustive_*"))
    assert json.loads((broken / "meta.json").read_text())["settings"]["batch_size"] == 32

    from probe.core.engine import PrefixScorer

    resumed_sizes: list[int] = []
    original = PrefixScorer.score
    monkeypatch.setattr(PrefixScorer, "score", lambda self, c, l=None: resumed_sizes.append(len(c)) or original(self, c, l))
    resumed = run(_config(tiny_dirs, tmp_path, resume="latest"))
    assert resumed.path == broken and resumed.read_meta()["status"] == "complete"
    assert max(resumed_sizes) == 32  # not the 64 the run started with


def test_a_responses_run_records_its_halved_batch_size(tiny_dirs, tmp_path, monkeypatch):
    from probe.commands.responses import run_responses

    items = tmp_path / "items.txt"
    items.write_text("\n".join(f"{w} number {i}" for i in range(8) for w in ("Love", "Freedom", "a", "Peace")) + "\n")
    sizes: list[int] = []
    _inject(monkeypatch, RuntimeError("CUDA error: out of memory"), at_call=1, sizes=sizes)
    out = run_responses(_config(tiny_dirs, tmp_path / "runs", responses=str(items), batch_size=40, limit=None))
    meta = out.read_meta()
    assert meta["batch_size"] == 20 and meta["oom_halvings"][0]["batch_size"] == 20
    assert out.read_table("scores.parquet").height == 2 * 32


# ---------------------------------------------------------------- 3 and 6. the memory plan


def test_the_plan_of_llama_8b_counted_by_hand():
    """Llama-3.1-8B shape in bf16, 48 prefix + 3 new tokens, reward head, shared-prefix path (module doc of
    probe/models/memory.py): hidden 4096, MLP 14336, 32 heads, 8 KV heads of 128, 32 layers."""
    from probe.models.memory import fixed_bytes, row_cost
    from probe.models.shapes import config_for

    config = config_for("llama-3.1-8b")
    n, keys, h, inner, heads, kv, d = 3, 51, 4096, 14336, 32, 8, 128
    stream = n * 4 * h * 2  # 98,304
    mlp = stream + n * 3 * inner * 2  # + 258,048 = 356,352
    # + float32 q/k/v 147,456 + four float32 score tensors 78,336 + float32 outputs 147,456 = 471,552
    attn = stream + 2 * 4 * (heads + 2 * kv) * n * d + 4 * 4 * heads * n * keys + 3 * 4 * heads * n * d
    cost = row_cost(config, 48, 3, torch.bfloat16, "reward", "shared")
    assert (cost.layers, cost.transient, cost.head) == (0, max(attn, mlp), 0) and cost.total == 471_552
    # the prefix cache (bf16) and its float32 working copy, once: 32 layers x K and V x 8 heads x 128 x 48 tokens
    assert fixed_bytes(config, 48, torch.bfloat16, "shared") == 32 * 2 * 8 * 128 * 48 * (2 + 4)
    # the plain cache path keeps a copy of the prefix per row in every layer
    plain = row_cost(config, 48, 3, torch.bfloat16, "reward", "cache")
    assert plain.layers == 32 * 2 * 8 * 128 * 51 * 2
    # the fused log-probability head: one 4,096-entry vocabulary chunk per position, bf16 and its float32 copy
    lp = row_cost(config, 48, 3, torch.bfloat16, "logprob", "shared")
    assert lp.head == 2 * 4096 * (2 + 4)
    assert lp.total == lp.layers + max(lp.transient, lp.head)  # the head runs once the layers' transients are freed
    assert row_cost(config, 48, 3, torch.bfloat16, "logprob", "shared", fused=False).head == 2 * 3 * 128256 * 4


def _memory_model(cls_name: str, mode: str):
    import transformers

    config_cls = {"Llama": transformers.LlamaConfig, "Mistral": transformers.MistralConfig}[cls_name]
    config = config_cls(vocab_size=8192, hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                        num_attention_heads=8, num_key_value_heads=2, pad_token_id=0, num_labels=1)
    suffix = "ForSequenceClassification" if mode == "reward" else "ForCausalLM"
    torch.manual_seed(0)
    return config, getattr(transformers, cls_name + suffix)(config).eval()


@pytest.mark.parametrize("family,path", [("Llama", "shared"), ("Mistral", "cache")])
@pytest.mark.parametrize("mode", ["reward", "logprob"])
def test_the_plan_covers_the_counted_peak_of_a_batch(family, path, mode, monkeypatch):
    """What a batch row really allocates (counted tensor by tensor, 64 rows minus 32 rows) is at most the plan's
    bytes per row, and the plan is not wasteful (under 1.5x). Llama runs the shared-prefix attention, Mistral the
    plain cache path (each row's copy of the prefix in every layer). Tiles off: with them both batches are forwards
    of one shape, and a row's cost would not show (a tile's forward costs at most the plan's rows in it)."""
    monkeypatch.setenv("RM_PROBE_TILE_ROWS", "0")
    from probe.core.engine import PrefixScorer
    from probe.core.heads import LinearRewardHead, LogprobHead
    from probe.kernels.prefix_attention import supported
    from probe.models.memory import row_cost
    from tests.memory_count import peak_bytes

    config, model = _memory_model(family, mode)
    assert supported(model) == (path == "shared")
    head = LinearRewardHead(model) if mode == "reward" else LogprobHead(model, fused=True)
    n_prefix, n_new = 64, 4
    scorer = PrefixScorer(model, head, list(range(1, n_prefix + 1)))
    gen = torch.Generator().manual_seed(0)
    peaks = {b: peak_bytes(lambda b=b: scorer.score(torch.randint(1, 8000, (b, n_new), generator=gen)))
             for b in (32, 64)}
    measured = (peaks[64] - peaks[32]) / 32
    planned = row_cost(config, n_prefix, n_new, torch.float32, mode, path).total
    assert measured <= planned <= 1.5 * measured, (measured, planned)


def _config_dirs(tmp_path):
    """config.json of every family a user may bring, at their libraries' default sizes."""
    import transformers

    configs = {"gpt2": transformers.GPT2Config(), "opt": transformers.OPTConfig(),
               "falcon": transformers.FalconConfig(), "gemma2": transformers.Gemma2Config(),
               "gemma3_text": transformers.Gemma3TextConfig(), "qwen2": transformers.Qwen2Config(),
               "qwen3": transformers.Qwen3Config(), "llama": transformers.LlamaConfig(),
               "mistral": transformers.MistralConfig(), "bert": transformers.BertConfig(),
               "deberta-v2": transformers.DebertaV2Config()}
    out = {}
    for name, config in configs.items():
        config.num_labels = 1
        config.save_pretrained(tmp_path / name)
        out[name] = str(tmp_path / name)
    return out


def test_dry_run_plans_every_config_family_for_a_cuda_card(tmp_path, capsys):
    """From the config alone: GPT-2 (n_inner None), OPT (ffn_dim), Falcon (ffn_hidden_size, one KV head under
    multi-query), Gemma 2/3, Qwen 2/3, Llama, Mistral and encoders; each path named as the engine would take it."""
    from probe.commands.score import dry_run
    from probe.models.dryrun import plan

    want_path = {"gpt2": "cache", "opt": "cache", "falcon": "cache", "mistral": "cache", "bert": "full",
                 "deberta-v2": "full"}
    for name, path in _config_dirs(tmp_path).items():
        mode = "reward" if name in ("bert", "deberta-v2") else "logprob"
        p = plan(path, torch.bfloat16, 80.0, mode)
        assert p["fits"] and p["batch_size"] >= 1 and p["bytes_per_row"] > 0, name
        assert p["path"] == want_path.get(name, "shared"), name
        dry_run(ScoreVocabConfig(rm=path, device="cuda", dry_run=True, score=mode))
        assert "batch size" in capsys.readouterr().out
    from probe.models.memory import attention_heads, mlp_width
    from transformers import FalconConfig, GPT2Config, OPTConfig

    assert attention_heads(FalconConfig()) == (71, 1, 64) and mlp_width(FalconConfig()) == 4 * 4544
    assert mlp_width(GPT2Config()) == 4 * 768 and mlp_width(OPTConfig()) == 3072


def test_dry_run_counts_the_reference_model_and_the_devices_of_a_device_map():
    from probe.models.dryrun import plan

    one = plan("shape:llama-3.1-8b", torch.bfloat16, 24.0, "logprob", n_prefix=2048)
    with_ref = plan("shape:llama-3.1-8b", torch.bfloat16, 24.0, "logprob", n_prefix=2048,
                    reference="shape:llama-3.1-8b")
    assert with_ref["weights_gib"] == pytest.approx(2 * one["weights_gib"])
    assert not with_ref["fits"] and one["fits"]  # 2 x 15 GiB of weights do not fit in 24 GiB
    spread = plan("shape:llama-3.1-8b", torch.bfloat16, 24.0, "logprob", n_prefix=2048,
                  reference="shape:llama-3.1-8b", n_devices=4)
    assert spread["fits"] and spread["devices"] == 4
    cfg = ScoreVocabConfig(rm="shape:gemma-2-27b", device="cuda", device_map="auto", devices=2, device_memory=40.0)
    from probe.models.dryrun import plan_for_config

    assert plan_for_config(cfg)["devices"] == 2 and plan_for_config(replace(cfg, device_map=None))["devices"] == 1
    with pytest.raises(ValueError, match="--devices"):
        ScoreVocabConfig(devices=0)


def test_every_device_of_a_spread_model_is_planned_with_its_own_free_memory():
    """Under --device-map, the layers (and their per-row prefix copies) are divided over the GPUs, the head sits on
    the last one; the batch is what fits on the fullest device, not what the first GPU has free."""
    from probe.models.memory import Part, RowCost, plan_devices

    cost = RowCost(layers=4 << 20, transient=1 << 20, head=3 << 20)
    a, b = torch.device("cuda:0"), torch.device("cuda:1")
    parts = {a: [Part(cost, 0, 0.5, False)], b: [Part(cost, 0, 0.5, True)]}
    # per row: 2 MiB + 1 MiB on cuda:0, 2 MiB + max(1, 3) MiB on cuda:1
    assert plan_devices({a: 10 * 3 << 20, b: 10 * 5 << 20}, parts) == 4  # 0.7 x 10 = 7 rows -> 4 on both
    assert plan_devices({a: 100 << 30, b: 10 * 5 << 20}, parts) == 4  # the second GPU limits
    assert plan_devices({a: 10 * 3 << 20, b: 100 << 30}, parts) == 4  # and so does the first


def test_a_spread_model_and_its_reference_share_each_device_by_hand():
    """Both models split in half over two GPUs (--device-map), heads on the second: each GPU holds half of each
    prefix cache (2 x 8 MiB / 2) and, per row, half of each model's per-row prefix copies (8 / 2 MiB) plus the widest
    of the layer's working set (1 MiB) and, where the head is, the head (3 MiB): one model at a time."""
    from probe.models.memory import Part, RowCost, plan_devices

    mib = 1 << 20
    cost = RowCost(layers=8 * mib, transient=1 * mib, head=3 * mib)
    a, b = torch.device("cuda:0"), torch.device("cuda:1")
    parts = {a: [Part(cost, 8 * mib, 0.5, False)] * 2, b: [Part(cost, 8 * mib, 0.5, True)] * 2}
    # cuda:0: 0.7 x 100 - 8 = 62 MiB for rows of 4 + 1 = 5 MiB: 12 -> 8; cuda:1 alone: 62 / (4 + 3) = 8.9 -> 8
    assert plan_devices({a: 100 * mib, b: 1 << 40}, parts) == 8
    assert plan_devices({a: 1 << 40, b: 100 * mib}, parts) == 8
    # 60 MiB on cuda:1: 42 - 8 = 34 MiB, 34 / 7 = 4.9 rows -> 4
    assert plan_devices({a: 1 << 40, b: 60 * mib}, parts) == 4


def test_batch_parts_count_the_reference_and_a_model_split_over_devices(tiny_models):
    """The loaded model's parts: its path, its prefix cache, the reference model's part beside it, and the
    fraction of parameters and the head's device read from where the weights are."""
    import copy

    from probe.core.scoring import batch_parts, device_shares

    lm = tiny_models["llama-lm"]
    (only,) = batch_parts(lm, 40, 3, "logprob").values()
    assert len(only) == 1 and only[0].layer_share == 1 and only[0].has_head and only[0].fixed > 0
    with_ref = replace(lm, ref=lm, beta=1.0)
    (both,) = batch_parts(with_ref, 40, 3, "logprob").values()
    assert len(both) == 2
    split = copy.deepcopy(lm.model)
    split.model.layers[1].to("meta")
    split.model.norm.to("meta")
    split.lm_head = torch.nn.Linear(split.config.hidden_size, split.config.vocab_size, bias=False, device="meta")
    shares, head = device_shares(split)
    assert head.type == "meta" and set(shares) == {torch.device("cpu"), torch.device("meta")}
    assert sum(shares.values()) == pytest.approx(1.0) and 0 < shares[torch.device("meta")] < 1


def test_the_gpu_batch_is_planned_on_free_memory_with_the_reference_run_after_the_model(tiny_models, monkeypatch):
    """A model and its ``--ref`` copy on one GPU that has ``free`` bytes of ``10 x free``: both prefix caches are held
    at once, but the reference runs on the rows after the model, so one row's cost counts once. ``free`` leaves
    room for 10.5 rows: 8 (a power of two); counted together, 5.25 rows: 4; planned on the card's total: more."""
    from probe.core import scoring
    from probe.models.loading import LoadedModel
    from probe.core.invariance import tile_rows
    from probe.models.memory import fixed_bytes, row_cost, tile_floor

    lm = tiny_models["llama-lm"]
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(LoadedModel, "device", property(lambda self: gpu))
    monkeypatch.setattr(scoring, "device_shares", lambda model: ({gpu: 1.0}, gpu))
    config = lm.model.config
    per_row = row_cost(config, 40, 3, torch.float32, "logprob", "shared").total
    fixed = fixed_bytes(config, 40, torch.float32, "shared")
    floor = tile_floor(config, torch.float32, "logprob", tile_rows(gpu))  # one tile of products, once: run in turn
    assert floor > 0
    free = (2 * fixed + floor + 10.5 * per_row) / 0.7  # FREE_FRACTION of it: both caches, a tile and 10.5 rows
    seen = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: seen.append(d) or (int(free), int(10 * free)))
    with_ref = replace(lm, ref=lm, beta=1.0)
    assert scoring.default_batch_size(with_ref, 40, 3, "logprob") == 8
    assert seen == [gpu]
    assert scoring.default_batch_size(lm, 40, 3, "logprob") == 8  # alone: one cache less, still under 16 rows


# ---------------------------------------------------------------- 2. a model spread over devices (--device-map)

SPLIT_CASES = [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("qwen3-rm", "reward"), ("armo-like", "reward"),
               ("qrm-like", "reward"), ("llama-lm", "logprob"), ("gemma2-lm", "logprob"), ("llama-lm", "judge"),
               ("gemma3-lm", "logprob")]


def _split_rows(lm, mode):
    from probe.core.scoring import ScoringOptions, prompt_split

    split = prompt_split(lm, mode, PROMPTS[0], None, ScoringOptions(), len(lm.tokenizer))
    pad = lm.model.config.get_text_config().pad_token_id or 0
    rows = torch.tensor([[5, 9, *split.suffix_ids], [7, pad, *split.suffix_ids], [11, 3, *split.suffix_ids]])
    return list(split.prefix_ids), rows, torch.tensor([rows.shape[1], 1 + len(split.suffix_ids), rows.shape[1]])


@pytest.mark.parametrize("name,mode", SPLIT_CASES)
def test_every_head_keeps_to_one_device_when_the_last_layers_sit_elsewhere(tiny_models, name, mode):
    """The backbone's hidden states come out on the last layers' device while the rows were made on the first; the
    heads (the positions, the gated head's gate, the log-probability head's first token, mask and fused chunks,
    the judge's two rows) must not mix them."""
    from probe.core.engine import PrefixScorer
    from probe.core.scoring import make_head
    from tests.placement import StrictDevices, split_model

    lm = tiny_models[name]
    split = replace(lm, model=split_model(lm.model))
    prefix, rows, lengths = _split_rows(lm, mode)
    for shared in (True, False):
        scorer = PrefixScorer(split.model, make_head(split, mode), prefix, shared_attention=shared)
        with StrictDevices():
            out = scorer.score(rows, lengths)
        assert out.device.type == "meta" and out.shape == (3,)


def test_a_family_head_keeps_to_one_device(tiny_models):
    """A family's own head module (ModuleRewardHead: GRM, INF-ORM, ...) on the last device."""
    from probe.core.engine import PrefixScorer
    from probe.core.heads import ModuleRewardHead
    from probe.models.families import family_model
    from tests.placement import StrictDevices, split_model

    lm = tiny_models["llama-rm"]
    torch.manual_seed(0)
    model = family_model("grm", lm.model.config)(lm.model.config).float().eval()
    split = split_model(model)
    prefix, rows, lengths = _split_rows(lm, "reward")
    with StrictDevices():
        out = PrefixScorer(split, ModuleRewardHead(split), prefix).score(rows, lengths)
    assert out.device.type == "meta" and out.shape == (3,)


def test_gcgs_relaxed_objective_keeps_to_one_device(tiny_models):
    """GCG's differentiable forward on a spread model: one-hot rows on the embeddings' device, the score (and the
    soft targets of the log-probability head) on the last device."""
    from probe.config import GCGConfig
    from probe.core.gcg import GCG
    from probe.core.scoring import ScoringOptions, make_head, prompt_split
    from tests.placement import StrictDevices, split_model

    lm = tiny_models["llama-lm"]
    split_lm = replace(lm, model=split_model(lm.model))
    split = prompt_split(lm, "logprob", PROMPTS[0], None, ScoringOptions(), len(lm.tokenizer))
    gcg = GCG(split_lm, make_head(split_lm, "logprob"), split, GCGConfig(score="logprob", length=3),
              torch.ones(len(lm.tokenizer), dtype=torch.bool))
    ids = torch.tensor([5, 9, 11])
    with StrictDevices():
        value = gcg.relaxed_objective(gcg.onehot(ids).requires_grad_(True), ids)
    assert value.device.type == "meta" and value.shape == ()


# ---------------------------------------------------------------- 9. the gated head on the device; GCG's gradient


def _gate_reference(pattern, prefix_ids, row, n, prefix_gate):
    """The gate position as the Python loop had it: the last occurrence in (last k-1 prefix ids + the row's real
    tokens), else the prefix's."""
    k, p = len(pattern), len(prefix_ids)
    tail = list(prefix_ids[max(0, p - k + 1):])
    seq = tail + list(row[:n])
    for j in range(len(seq) - k, -1, -1):
        if seq[j:j + k] == list(pattern):
            return p - len(tail) + j
    return prefix_gate


def test_the_gate_positions_equal_the_python_loop_and_stay_on_the_device(tiny_models):
    lm = tiny_models["armo-like"]
    from probe.core.scoring import make_head
    from tests.placement import StrictDevices

    head = make_head(lm, "reward")
    pat = head.pattern
    prefix = [3, 4] + pat + [8, 9] + pat[:-1]  # the prefix ends inside a pattern occurrence
    head.prepare(prefix, torch.zeros(len(prefix), 4))
    gen = torch.Generator().manual_seed(0)
    rows, lengths = [], []
    for i in range(40):
        m = 16
        row = torch.randint(20, 200, (m,), generator=gen).tolist()
        if i % 4 == 1:
            row[0] = pat[-1]  # completes the occurrence that straddles the boundary
        if i % 4 == 2:
            row[3:3 + len(pat)] = pat  # inside the row
        if i % 4 == 3:
            row[8:8 + len(pat)] = pat  # inside, but partly past the row's real length when n < 8 + k
        rows.append(row[:m])
        lengths.append(int(torch.randint(1, m + 1, (1,), generator=gen)))
    cont, lens = torch.tensor(rows), torch.tensor(lengths)
    got = head._gate_positions(cont, lens)
    want = [_gate_reference(pat, prefix, r, n, head.prefix_gate) for r, n in zip(rows, lengths)]
    assert got.tolist() == want
    assert len(set(want)) >= 4  # prefix, straddling, and two places inside: really different positions
    with StrictDevices():  # on the device: a host copy (.tolist()) of a meta tensor would fail
        assert head._gate_positions(cont.to("meta"), lens.to("meta")).device.type == "meta"


def test_gcgs_one_hot_gradient_is_float32_in_a_bf16_model(tiny_models):
    """The gradient over the vocabulary is computed in float32 from the bf16 weights (not rounded to bf16), equal to
    (d objective / d embedding) @ W.T in float64."""
    import copy

    from probe.core.gcg import OneHotEmbedding

    weight = copy.deepcopy(tiny_models["llama-lm"].model.get_input_embeddings().weight).to(torch.bfloat16)
    onehot = torch.zeros(3, weight.shape[0], requires_grad=True)
    with torch.no_grad():
        onehot[torch.arange(3), torch.tensor([5, 9, 11])] = 1
    out = OneHotEmbedding.apply(onehot, weight, 1.5)
    assert out.dtype == torch.bfloat16 and torch.equal(out, weight[[5, 9, 11]] * 1.5)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out.backward(g)
    want = (g.double() * 1.5) @ weight.double().T
    assert onehot.grad.dtype == torch.float32
    # float32 sums of exact bf16 x bf16 products over the hidden size: |error| <= n * eps * sum|terms|
    bound = weight.shape[1] * torch.finfo(torch.float32).eps * ((g.double().abs() * 1.5) @ weight.double().abs().T)
    assert ((onehot.grad.double() - want).abs() <= bound).all()
    rounded = onehot.grad.to(torch.bfloat16).float()
    assert (rounded != onehot.grad).float().mean() > 0.5  # bf16 would have rounded most of them


def test_gcgs_gradient_runs_eager_attention_outside_the_kernel(tokenizers):
    """A family the shared-prefix attention does not support (Mistral) back-propagates through eager attention
    (deterministic on CUDA), not SDPA, and the gradient equals SDPA's."""
    from transformers import MistralConfig, MistralForCausalLM

    from probe.core.engine import PrefixScorer
    from probe.core.heads import LogprobHead
    from probe.kernels.prefix_attention import supported
    from tests import tiny

    tok = tokenizers["llama3"]
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**tiny._common(tok))).eval().requires_grad_(False)
    assert not supported(model)
    seen = []
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda mod, args: seen.append(model.config._attn_implementation))
    scorer = PrefixScorer(model, LogprobHead(model), list(range(3, 20)))
    emb = model.get_input_embeddings()(torch.tensor([[5, 9]])).detach()

    def grad():
        x = emb.clone().requires_grad_(True)
        scorer.score_embeds(x[:, :1], torch.tensor([[5, 9]])).sum().backward()
        return x.grad

    eager = grad()
    assert seen[-1] == "eager" and model.config._attn_implementation != "eager"  # switched back after
    scorer.score(torch.tensor([[5, 9]]))
    assert seen[-1] == model.config._attn_implementation  # scoring keeps the model's own
    x = emb.clone().requires_grad_(True)  # the same gradient through the model's own attention (what it was)
    scorer.head.score(scorer.hidden(inputs_embeds=x[:, :1]), torch.tensor([[5, 9]]), torch.tensor([2])).sum().backward()
    assert seen[-1] != "eager" and eager.abs().sum() > 0
    torch.testing.assert_close(eager, x.grad, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- 8. the half-precision tolerance of a CUDA forward


def test_a_cuda_half_forward_counts_the_roundings_inside_attention_and_split_k():
    from probe.core.precision import roundings_per_output

    assert roundings_per_output("cpu", torch.bfloat16) == 1 and roundings_per_output("cuda", torch.float32) == 1
    matmul = torch.backends.cuda.matmul  # a process flag (torch._C), set here and restored
    before = matmul.allow_bf16_reduced_precision_reduction
    try:
        matmul.allow_bf16_reduced_precision_reduction = True
        assert roundings_per_output("cuda", torch.bfloat16) == 3  # the store, attention's probabilities, split-K
        matmul.allow_bf16_reduced_precision_reduction = False
        assert roundings_per_output("cuda", torch.bfloat16) == 2
        assert roundings_per_output("cuda", torch.float16) == 2 + int(matmul.allow_fp16_reduced_precision_reduction)
    finally:
        matmul.allow_bf16_reduced_precision_reduction = before


def test_the_measured_noise_grows_with_the_roundings_counted(tiny_models, monkeypatch):
    """The self-check's rounding noise on a bf16 model: with three roundings per output (a CUDA forward) about three
    times the CPU's one, and each perturbed value within its amplitude."""
    import copy

    import probe.core.precision as precision
    from probe.core.engine import FullSequenceScorer
    from probe.core.scoring import make_head

    lm = tiny_models["llama-rm"]
    half = replace(lm, model=copy.deepcopy(lm.model).to(torch.bfloat16))
    prefix, rows, lengths = _split_rows(lm, "reward")
    own = FullSequenceScorer(half.model, make_head(half, "reward"), prefix)

    def reference():
        return own.score(rows, lengths).numpy()

    ref = reference()
    one = precision.rounding_noise(half.model, reference, ref, repeats=8)
    monkeypatch.setattr(precision, "roundings_per_output", lambda device_type, dtype: 3)
    three = precision.rounding_noise(half.model, reference, ref, repeats=8)
    assert 1.5 * one < three < 6 * one

    x = torch.linspace(1, 2, 4096, dtype=torch.bfloat16)
    ident = torch.nn.Identity()
    with precision.simulated_rounding(ident, seed=0, units=3):
        moved = ident(x)
    rel = ((moved.float() - x.float()) / x.float()).abs()
    u = torch.finfo(torch.bfloat16).eps / 2
    assert rel.max() <= 3 * u * 1.01 + u and rel.max() > u  # beyond one unit, within three (plus the store)
