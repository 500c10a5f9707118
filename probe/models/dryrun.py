"""``--dry-run``: build the model on the meta device from its config alone (no weights), and print the memory
per batch row and the batch size a sweep would pick for a device and dtype.

The config comes from the model's directory or the Hub; for the paper's ten reward models it falls back to
their base models' published shapes (probe/models/shapes.py), so it works offline.
"""

from __future__ import annotations

from pathlib import Path

import torch

from probe.errors import ModelLoadError
from probe.core.invariance import tile_rows
from probe.models.memory import Part, fixed_bytes, plan_devices, row_cost, tile_floor
from probe.models.shapes import PAPER_RM_SHAPES, config_for


def resolve_config(ref: str | None, revision: str | None = None, trust_remote_code: bool = False):
    """(config, where it came from)."""
    from transformers import AutoConfig

    from probe.models.embedded import packaged

    if (model := packaged(ref)) is not None:
        shape = {"smollm2": "smollm2-135m", "gemma3-270m": "gemma-3-270m"}[model.name]
        return config_for(shape), f"published shape of {model.model_id}"
    if ref.startswith("shape:"):
        return config_for(ref.removeprefix("shape:")), f"published shape {ref.removeprefix('shape:')}"
    from pathlib import Path

    from probe.models.loading import hub_or_offline

    if not Path(ref).is_dir():
        hub_or_offline()
    try:
        return AutoConfig.from_pretrained(ref, revision=revision, trust_remote_code=trust_remote_code), "config.json"
    except (OSError, ValueError) as err:
        if ref in PAPER_RM_SHAPES:
            return config_for(PAPER_RM_SHAPES[ref]), f"published shape {PAPER_RM_SHAPES[ref]} (config not reachable)"
        raise ModelLoadError(f"--dry-run: cannot read the config of {ref!r} ({str(err).splitlines()[0]})") from None


def meta_parameters(config, kind: str = "reward") -> int:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForSequenceClassification if kind == "reward" else AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


def path_for_config(config, mode: str) -> str:
    """The scoring path (probe/models/memory.py) a model of this config takes: encoders run whole sequences, the
    families of the shared-prefix attention share it, other causal models replicate the prefix cache, and a model
    whose cache cannot be continued (probe/core/cache.py) runs whole too; one line (`UnsupportedCache`) for a layer
    type without a rule, as the run itself says it."""
    from probe.core.cache import plan as prefix_plan
    from probe.kernels.prefix_attention import supported_config
    from probe.models.registry import ENCODER_TYPES

    if mode == "reward" and getattr(config, "model_type", None) in ENCODER_TYPES:
        return "full"
    if prefix_plan(config).path == "full":
        return "full"
    return "shared" if supported_config(config) else "cache"


def plan(ref: str | None, dtype: torch.dtype, device_memory_gib: float, mode: str = "reward", n_prefix: int = 48,
         n_new: int = 3, n_prompts: int = 3, tflops: float | None = None, device_type: str = "cuda",
         reference: str | None = None, n_devices: int = 1) -> dict:
    """The memory plan on ``n_devices`` devices of ``device_memory_gib`` each (``--device-map`` spreads the weights
    and layers evenly over them, the head on the last); ``reference``: ``--ref``'s model, on the same devices. On a
    CPU the batch size is the one a run uses there (256), when it fits."""
    config, source = resolve_config(ref)
    text = config.get_text_config()
    label = ref or "embedded"
    reuse = _prefix_reuse(label, config, mode)
    elem = torch.empty((), dtype=dtype).element_size()
    models = [(config, mode)]
    if reference is not None:
        models.append((resolve_config(reference)[0], "logprob"))
    free_each = device_memory_gib * 2**30 * 0.9
    parts: dict[int, list[Part]] = {d: [] for d in range(n_devices)}
    n_params = weights = 0
    costs = []
    for cfg, m in models:
        params = meta_parameters(cfg, "reward" if m == "reward" else "causal")
        n_params, weights = (n_params or params), weights + params * elem
        free_each -= params * elem / n_devices
        path = path_for_config(cfg, m)
        cost = row_cost(cfg, n_prefix, n_new, dtype, m, path)
        costs.append((path, cost))
        floor = tile_floor(cfg, dtype, m, tile_rows(torch.device(device_type)))  # a GPU's fixed product tiles
        for d in range(n_devices):
            parts[d].append(Part(cost, fixed_bytes(cfg, n_prefix, dtype, path) + floor * n_devices, 1 / n_devices,
                                 d == n_devices - 1))
    batch = plan_devices(dict.fromkeys(parts, free_each), parts) if free_each > 0 else 0
    if device_type == "cpu" and batch:
        batch = min(batch, 256)  # probe.core.scoring.default_batch_size: the CPU runs use 256
    emb = text.vocab_size * text.hidden_size
    tied = getattr(text, "tie_word_embeddings", False) or mode == "reward"
    non_embedding = n_params - emb - (0 if tied else emb)
    flops = 2 * non_embedding * n_new * text.vocab_size * n_prompts
    path, cost = costs[0]
    out = {"model": ref or "embedded", "config_source": source, "architecture": type(config).__name__,
           "parameters": n_params, "weights_gib": weights / 2**30, "dtype": str(dtype), "device_memory_gib": device_memory_gib,
           "device_type": device_type, "devices": n_devices, "reference": reference, "path": path,
           "prefix_tokens": n_prefix, "new_tokens_per_row": n_new, "bytes_per_row": cost.total,
           "prefix_cache_bytes": fixed_bytes(config, n_prefix, dtype, path),
           "batch_size": batch, "fits": batch > 0, "vocab_size": text.vocab_size,
           "sweep_flops": flops, "n_prompts": n_prompts}
    if reuse is not None:
        out["prefix_reuse"] = reuse.to_json()
    if tflops:
        out["floor_seconds_at_tflops"] = {str(tflops): flops / (tflops * 1e12)}
    return out


def _prefix_reuse(label: str, config, mode: str):
    """How this model's rows continue a shared prefix (probe/core/cache.py), for decoders; the run's one-line refusal
    of a layer type without a rule, here too."""
    from probe.core.cache import UnsupportedCache, plan as prefix_plan
    from probe.models.registry import ENCODER_TYPES

    if mode == "reward" and getattr(config, "model_type", None) in ENCODER_TYPES:
        return None
    try:
        return prefix_plan(config)
    except UnsupportedCache as err:
        raise UnsupportedCache(f"{label}: {err}") from None


def describe(p: dict) -> str:
    devices = p.get("devices", 1)
    on = f"{devices} x {p['device_memory_gib']:g}" if devices > 1 else f"{p['device_memory_gib']:g}"
    lines = [f"{p['model']}: {p['architecture']} ({p['config_source']}), {p['parameters'] / 1e9:.2f} B parameters, "
             f"{p['weights_gib']:.1f} GiB of weights in {p['dtype']}"
             + (f" (with the reference {p['reference']})" if p.get("reference") else ""),
             *([f"  per batch row ({r['prefix_tokens']} prefix + {r['new_tokens_per_row']} new tokens, "
                f"{p.get('path', 'shared')} path; {', '.join(r['prompts'])}): {r['bytes_per_row'] / 2**20:.2f} MiB"
                for r in p["rows"]] if p.get("rows") else
               [f"  per batch row ({p['prefix_tokens']} prefix + {p['new_tokens_per_row']} new tokens"
                + (" (a typical chat prefix: the tokenizer was not read)" if p.get("estimated_lengths") else "")
                + f", {p.get('path', 'shared')} path): {p['bytes_per_row'] / 2**20:.2f} MiB"]),
             f"  on {on} GiB of {p.get('device_type', 'cuda')} memory: "
             + (f"batch size {p['batch_size']}" if p["fits"] else
                                                         "does NOT fit: use --device-map auto over several GPUs"),
             # sweep_flops is the work of the run's prompts (1 with one --prompt), not always the paper's 3
             f"  one prompt over {p['vocab_size']:,} tokens: "
             f"{p['sweep_flops'] / p.get('n_prompts', 3) / 1e15:.2f} PFLOP"]
    reuse = p.get("prefix_reuse") or {}
    if reuse.get("recurrent_state") or reuse.get("why"):
        kinds = ", ".join(f"{n} {t}" for t, n in reuse["layers"].items())
        lines.append(f"  layers: {kinds}" + ("; recurrent state copied per row from the prefix's"
                                             if reuse.get("recurrent_state") else "")
                     + (f"; {reuse['why']}" if reuse.get("why") else ""))
    for t, s in p.get("floor_seconds_at_tflops", {}).items():
        lines.append(f"  floor for the {p.get('n_prompts', 3)} prompt(s) at {t} TFLOP/s: {s:.0f} s")
    return "\n".join(lines)


def host_memory_gib() -> float:
    """This machine's physical memory (what a CPU run's batches live in); 80 where the system does not say."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (AttributeError, ValueError, OSError):
        return 80.0


def plan_for_config(config) -> dict:
    """The plan for a sweep's settings on the named device type, without needing that device: --device-memory,
    else the visible card's memory for a GPU plan (80 GiB where none is visible), and this machine's RAM for a CPU
    plan."""
    from probe.core.prompts import grid_for
    from probe.models.loading import resolve_dtype
    from probe.config import family_of
    from probe.models.registry import lookup

    wants_gpu = config.device.startswith("cuda") or (config.device == "auto" and torch.cuda.is_available())
    memory = config.device_memory
    if memory is None and not wants_gpu:
        memory = host_memory_gib()
    if memory is None:
        memory = torch.cuda.get_device_properties(0).total_memory / 2**30 if torch.cuda.is_available() else 80.0
    spec = lookup(config.rm or "embedded")[0] if config.spec is None else family_of(config.rm, config.spec)
    dtype = resolve_dtype(config.dtype, torch.device("cuda" if wants_gpu else "cpu"), spec)
    n_devices = 1
    if config.device_map is not None and wants_gpu:
        n_devices = config.devices or (torch.cuda.device_count() if torch.cuda.is_available() else 1)
    prompts = grid_for(config)
    shapes = prompt_shapes(config, prompts)
    kw = dict(n_prompts=len(prompts), device_type="cuda" if wants_gpu else "cpu", reference=config.ref,
              n_devices=n_devices)
    if shapes is None:  # no tokenizer here: a typical chat prefix, said so
        return plan(config.rm, dtype, memory, config.mode, **kw) | {"estimated_lengths": True}
    plans = {shape: plan(config.rm, dtype, memory, config.mode, n_prefix=shape[0], n_new=shape[1], **kw)
             for shape in shapes}
    out = max(plans.values(), key=lambda q: q["bytes_per_row"])  # the largest row bounds the run's one batch size
    out = dict(out, batch_size=min(q["batch_size"] for q in plans.values()))
    out["fits"] = out["batch_size"] > 0
    if len(plans) > 1:  # prompts (or modes) whose rows differ: a line each
        out["rows"] = [{"prompts": keys, "prefix_tokens": q["prefix_tokens"], "new_tokens_per_row":
                        q["new_tokens_per_row"], "bytes_per_row": q["bytes_per_row"]}
                       for keys, q in ((shapes[sh], q) for sh, q in plans.items())]
    return out


def prompt_shapes(config, prompts) -> dict[tuple[int, int], list[str]] | None:
    """(prefix tokens, new tokens per row) -> the prompt keys whose rows have that shape, from the tokenizer and
    the chat template (no weights): the rendered prefix, and one token plus the template's closing ids. None where
    the tokenizer cannot be read here (a Hub id not in the cache, offline)."""
    from probe.core.scoring import conversation
    from probe.core.template import split_template
    from probe.errors import ProbeError
    from probe.models.embedded import packaged, packaged_tokenizer_dir
    from probe.models.loading import load_tokenizer
    from probe.models.registry import lookup

    try:
        path = str(packaged_tokenizer_dir(config.rm)) if packaged(config.rm) is not None else config.rm
        if path is None:
            path = str(packaged_tokenizer_dir("smollm2"))
        folder = Path(path).expanduser()
        if packaged(config.rm) is None and config.rm is not None and not any(
                (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            return None  # a Hub id (its config is read, or its published shape, never its tokenizer), or no tokenizer
        from probe.config import model_kind
        from probe.models.loading import family_template

        spec = lookup(config.rm or "embedded")[0]
        family, replaces = (family_template(spec, config.input_method) if model_kind(config.mode) == "reward"
                            else (None, False))
        tok = load_tokenizer(path, config.revision, config.trust_remote_code, config.chat_template, family,
                             need_template=False, family_replaces=replaces)
        opts = config.scoring_options()
        out: dict[tuple[int, int], list[str]] = {}
        for p in prompts:
            split = split_template(tok, conversation(config.mode, p.text, p.system_or(config.system), opts),
                                   n_verify=0)
            out.setdefault((len(split.prefix_ids), 1 + len(split.suffix_ids)), []).append(p.key)
        return out
    except (ProbeError, OSError, ValueError, AttributeError, ImportError):  # a tokenizer this install cannot read
        return None
