"""The shared prefix's cache, given to every row of a batch: one rule per kind of cache layer.

The prefix runs once (batch 1); every batch then continues from what its layers kept. What a row gets depends on
what the layer keeps:

* **attention keys and values** (`DynamicLayer`) and **sliding or chunked windows** (`DynamicSlidingWindowLayer`):
  a view ``expand(rows, ...)``, no copy. The model's update concatenates the row's new keys and values onto it into a
  new tensor; nothing is written into the prefix's.
* **the recurrent state and the short convolution's window** of a linear-attention or state-space layer
  (`LinearAttentionLayer`: the gated delta nets of Qwen3.5, Qwen3-Next and OLMo hybrid, Kimi's delta attention,
  Mamba-2 in Nemotron-H, Granite 4, Bamba, Zamba2, Mamba-1 in Jamba, LFM2's convolutions): a copy per row. These
  layers update their states in place (``copy_``), so a view would have every row, and the next batch, write into
  the prefix's state; a row's copy is its own, is never seen by another row or another call, and is dropped with
  the batch. The copy costs memory by row, not by prefix length (`row_state_bytes`; the memory plan counts it).
* **both** (`LinearAttentionAndFullAttentionLayer`, `...SlidingWindowAttentionLayer`: Falcon-H1's parallel layers,
  Zamba2's hybrid ones): both rules.
* **nothing** (`DummyLayer`: Gemma 4's shared key-value layers, Nemotron-H's MLP and MoE layers): shared as is.
* **MiniMax's lightning-attention states**, kept outside ``.layers`` (`MiniMaxCache.linear_cache`): a copy per row (a
  shallow copy of the cache shared them: each batch started from the previous batch's end states, up to 2.3e-2 off,
  and crashed where two batches differed in size). The never-filled attention layers at those indices become dummy
  layers: transformers' mask builder reads the first attention layer's length as the past's, and MiniMax-Text-01's
  first layer is a lightning one, so its softmax layers masked out the whole prefix (7e-2 off on a tiny MiniMax).

Two kinds of model continue otherwise (`plan`, from the config alone, before any weights are read):

* **Mamba-1** (Jamba, Mamba, Falcon-Mamba, Zamba): transformers' selective scan starts every multi-token call from a
  zero state (only its one-token step reads the cached one), so the continuation runs one token at a time through the
  whole model (`STEPWISE`; 4e-3 off on a tiny Jamba otherwise, exact so).
* **indexed sparse attention** (`DynamicIndexedLayer`, DeepSeek-V3.2): its indexer keeps the top-k keys of the whole
  sequence, which a cached continuation does not reproduce; such a model runs every sequence through its own
  forward (the ``full`` path), recorded in meta.json.

Any other layer type is refused in one line naming the architecture and the layer type, before any sweep starts
(`UnsupportedCache`, a `ProbeError`); so is a cache that turns out otherwise at run time.
"""

from __future__ import annotations

import copy
import inspect
import types
from dataclasses import dataclass, field

import torch
import transformers
import transformers.cache_utils as cu

from probe.core.invariance import tail_rows
from probe.errors import ModelLoadError

# present from transformers 5.2x on; absent classes match nothing
_LINEAR = getattr(cu, "LinearAttentionCacheLayerMixin", None)
_DUMMY = getattr(cu, "DummyLayer", None)
_INDEXED = getattr(cu, "DynamicIndexedLayer", None)


class UnsupportedCache(ModelLoadError):
    """A model whose cache rm-probe cannot give to every row of a batch: one line naming the architecture and the
    layer type."""


# --- the rules, by the cache layer's exact class ------------------------------------------------------------------

def _keys_values(layer, new, rows: int) -> None:
    if layer.is_initialized and layer.keys is not None:
        new.keys = layer.keys.expand(rows, *layer.keys.shape[1:])
        new.values = layer.values.expand(rows, *layer.values.shape[1:])


def _per_row(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``rows`` copies of a batch-1 state, contiguous, each row's own."""
    return x.expand(rows, *x.shape[1:]).clone(memory_format=torch.contiguous_format)


def _states(layer, new, rows: int, autograd: bool = False) -> None:
    for name in ("conv_states", "recurrent_states", "is_conv_states_initialized", "is_recurrent_states_initialized",
                 "has_previous_state", "conv_kernel_size"):
        setattr(new, name, dict(getattr(layer, name)))  # the prefix's dicts are never written
    for states in (new.conv_states, new.recurrent_states):
        for i, x in states.items():
            if x is not None:
                states[i] = _per_row(x, rows)
    if autograd:
        # GCG back-propagates through the continuation: a state the forward read must not be written in place
        # afterwards. The layer's updates assign instead (the convolution's as it does when recording the past, which
        # also keeps the model off its in-place one-token convolution)
        new.record_past = True
        new.update_recurrent_state = types.MethodType(_assign_recurrent, new)


def _assign_recurrent(layer, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
    layer.recurrent_states[state_idx] = recurrent_states
    layer.is_recurrent_states_initialized[state_idx] = True
    return recurrent_states


def _state_bytes(layer) -> int:
    return sum(x.numel() * x.element_size() for d in (layer.conv_states, layer.recurrent_states)
               for x in d.values() if x is not None)


@dataclass(frozen=True)
class Rule:
    kind: str  # in words, for meta.json and the messages
    views: bool = False  # attention keys and values: per-row views
    states: bool = False  # recurrent and convolution states: per-row copies


def _rules() -> dict[type, Rule]:
    attention = Rule("attention keys and values", views=True)
    out = {cu.DynamicLayer: attention, cu.DynamicSlidingWindowLayer: Rule("sliding-window keys and values", views=True)}
    recurrent = Rule("recurrent and convolution state", states=True)
    for name, rule in (("LinearAttentionLayer", recurrent),
                       ("LinearAttentionAndFullAttentionLayer",
                        Rule("recurrent state and attention keys and values", views=True, states=True)),
                       ("LinearAttentionAndSlidingWindowAttentionLayer",
                        Rule("recurrent state and sliding-window keys and values", views=True, states=True)),
                       ("DummyLayer", Rule("nothing (a layer that reads another's keys and values, or none)"))):
        if (cls := getattr(cu, name, None)) is not None:
            out[cls] = rule
    return out


RULES = _rules()


def rule_for(layer) -> Rule:
    rule = RULES.get(type(layer))
    if rule is None:
        raise UnsupportedCache(f"cache layer {type(layer).__name__}: rm-probe has no rule to give it to every row of a "
                               "batch; not supported")
    return rule


def _minimax(cache) -> bool:
    return hasattr(cache, "linear_cache") and hasattr(cache, "set_linear_cache")


def check_replicable(cache) -> None:
    """Raise `UnsupportedCache` unless every layer of ``cache`` (a batch-1 prefix cache) has a rule."""
    if not isinstance(cache, cu.DynamicCache):
        raise UnsupportedCache(f"the model returned a {type(cache).__name__}, not a DynamicCache: not supported")
    for layer in cache.layers:
        rule = rule_for(layer)
        if rule.views and layer.is_initialized and layer.keys is not None and layer.keys.shape[0] != 1:
            raise UnsupportedCache("the prefix cache must have batch size 1")


def replicate(cache, rows: int, autograd: bool = False):
    """A fresh cache over ``rows`` rows that all start where the prefix ended; ``cache`` is left untouched (module
    doc: views of keys and values, copies of recurrent states); ``autograd``: states updated by assignment, never in
    place (a backward pass follows)."""
    out = copy.copy(cache)
    out.layers = []
    linear = getattr(cache, "linear_cache", None) if _minimax(cache) else None
    for i, layer in enumerate(cache.layers):
        if linear is not None and i < len(linear) and isinstance(linear[i], torch.Tensor):
            # a lightning layer's never-filled placeholder
            out.layers.append(_DUMMY() if _DUMMY is not None else _past_only(cache, rows))
            continue
        rule = rule_for(layer)
        new = copy.copy(layer)  # keeps per-layer state such as the sliding window's cumulative length
        if rule.views:
            _keys_values(layer, new, rows)
        if rule.states:
            _states(layer, new, rows, autograd)
        out.layers.append(new)
    if linear is not None:
        out.linear_cache = [_per_row(x, rows) if isinstance(x, torch.Tensor) else x for x in linear]
    return out


def _past_only(cache, rows: int):
    """A MiniMax lightning layer's placeholder before transformers had `DummyLayer`: an empty `DynamicLayer` there
    made the first layer report no past, and the model's mask (read from the first layer) then hid the prefix from
    the full-attention layers (its own continuation, generate's too, was off by 5e-2 on the tests' tiny model). This
    one reports the prefix's length through zero-stride keys that no layer reads."""
    like = next(x.keys for x in cache.layers if x.is_initialized and x.keys is not None and x.keys.numel())
    new = cu.DynamicLayer()
    new.keys = new.values = like.new_zeros(()).expand(rows, 1, like.shape[-2], 1)
    new.dtype, new.device, new.is_initialized = like.dtype, like.device, True
    return new


def row_state_bytes(cache) -> int:
    """Bytes of recurrent state one row copies from ``cache`` (a batch-1 prefix cache): 0 for attention alone."""
    total = sum(_state_bytes(layer) for layer in cache.layers if RULES.get(type(layer), Rule("")).states)
    for x in getattr(cache, "linear_cache", None) or []:
        if isinstance(x, torch.Tensor):
            total += x.numel() * x.element_size()
    return total


# --- the plan, from the config alone --------------------------------------------------------------------------------

# Mamba-1's selective scan in transformers starts a multi-token call from a zero state: model type -> its mixer
STEPWISE = {"jamba": "JambaMambaMixer", "mamba": "MambaMixer", "falcon_mamba": "FalconMambaMixer",
            "zamba": "ZambaMambaMixer"}
# The delta nets' chunked kernels (transformers' reference, the CPU's) pad every call to a 64-token chunk: a sweep
# row of 6 tokens pays for 64. Their one-token step is exact too (the same recurrence, another rounding), and up to
# a number of new tokens one step per token is cheaper (the tests' layouts at hidden 256, one thread): the gated delta
# nets up to 8 (256 rows of 6 tokens on Qwen3.5's, 2.9x; at 12 tokens and 64 rows the chunk wins); Kimi's delta
# attention, whose chunk runs a Python loop over the chunk's 64 positions, up to 32 (34x at 6 tokens, 2.7x at 32).
# A function of the row's own length: the same path whatever the batch. model type -> most new tokens stepped
SHORT_STEPWISE = {"qwen3_5_text": 8, "qwen3_5_moe_text": 8, "qwen3_next": 8, "olmo_hybrid": 8, "kimi_linear": 32}
ATTENTION_TYPES = ("full_attention", "sliding_attention", "chunked_attention")
STATE_TYPES = ("linear_attention", "conv")
BOTH_TYPES = ("hybrid", "hybrid_sliding")
NOTHING_TYPES = ("dummy", "moe", "mlp")
# layer types whose model is scored whole (each sequence through its own forward), and why
_INDEXED_WHY = ("indexed sparse attention (DynamicIndexedLayer): its indexer keeps the top-k keys of the whole "
                "sequence, which a cached continuation does not reproduce")
# (DeepSeek V3.2's layers were "deepseek_sparse_attention" before transformers named the kind "indexed_attention")
FULL_PATH_TYPES = {"indexed_attention": _INDEXED_WHY, "deepseek_sparse_attention": _INDEXED_WHY}


@dataclass(frozen=True)
class PrefixReuse:
    """How a model's rows continue the prefix: ``path`` "cache" (on the prefix's cache, ``stepwise``: one token at a
    time) or "full" (each whole sequence through the model's own forward); ``layers``: layer type -> count;
    ``why``: the reason where it is not the plain cache path."""

    path: str
    layers: dict[str, int] = field(default_factory=dict)
    stepwise: bool = False
    why: str | None = None
    short_stepwise: int = 0  # continuations of at most this many tokens run one token at a time (`SHORT_STEPWISE`)

    def steps(self, n_tokens: int, autograd: bool = False) -> bool:
        """Whether a continuation of ``n_tokens`` runs one token at a time (not under GCG's gradient, whose chunked
        path needs no in-place step)."""
        return self.stepwise or (not autograd and n_tokens <= self.short_stepwise)

    @property
    def recurrent(self) -> bool:
        return any(t in STATE_TYPES + BOTH_TYPES or t == "lightning_attention" for t in self.layers)

    def to_json(self) -> dict:
        out = {"layers": dict(self.layers)}
        if self.stepwise:
            out["continuation"] = "one token at a time"
        elif self.short_stepwise:
            out["continuation"] = f"one token at a time up to {self.short_stepwise} new tokens, else chunked"
        if self.recurrent:
            out["recurrent_state"] = "copied per row from the prefix's (probe/core/cache.py)"
        if self.why:
            out["why"] = self.why
        return out


def layer_types(config) -> list[str]:
    """The cache layer type of each decoder layer, as transformers' DynamicCache reads them from ``config``
    ("full_attention", "linear_attention", "dummy", ...); MiniMax's lightning layers "lightning_attention"."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    get = getattr(cu, "get_layer_types_and_kwargs", None)
    types = None
    if get is not None:
        try:
            types = list(get(text)[0])
        except (AttributeError, TypeError, ValueError, IndexError):
            types = None
    if types is None:
        types = list(getattr(text, "layer_types", None) or ["full_attention"] * int(text.num_hidden_layers))
    if getattr(text, "model_type", None) == "minimax":
        types = ["lightning_attention" if t == "linear_attention" else t for t in types]
    return types


def architecture(config) -> str:
    return (getattr(config, "architectures", None) or [type(config).__name__.removesuffix("Config")])[0]


# the hybrids' and state-space models' own model types: before transformers 5.5 each kept its own cache class (and the
# Mamba models none in their output), with no shared-prefix rule here; some of their configs name no layer types then
HYBRID_MODEL_TYPES = ("jamba", "mamba", "mamba2", "falcon_mamba", "bamba", "falcon_h1", "zamba", "zamba2", "nemotron_h",
                      "granitemoehybrid", "lfm2", "lfm2_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe",
                      "qwen3_5_moe_text", "minimax", "olmo_hybrid", "kimi_linear")
# The first transformers whose hybrid and state-space caches continue a prefix exactly in every layout of
# tests/tiny_hybrid.py: 5.5 brought the unified LinearAttentionLayer, but up to 5.14 some families still kept caches
# of their own or broke in their continuation (experiments/results/versions_hybrid.md)
UNIFIED_CACHE = "5.15"


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import Version

    return Version(version).release


HAS_UNIFIED = _LINEAR is not None and _release(transformers.__version__)[:2] >= _release(UNIFIED_CACHE)


def require_unified_cache(config) -> None:
    """`UnsupportedCache` (one line, before any weights) for a hybrid or state-space model under a transformers older
    than `UNIFIED_CACHE`: its prefix state cannot be given to every row there."""
    if HAS_UNIFIED:
        return
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    kinds = {getattr(config, "model_type", None), getattr(text, "model_type", None)}
    types = set(getattr(text, "layer_types", None) or ())
    if kinds & set(HYBRID_MODEL_TYPES) or types - set(ATTENTION_TYPES + NOTHING_TYPES) - set(FULL_PATH_TYPES):
        raise UnsupportedCache(
            f"{architecture(config)}: a hybrid linear-attention or state-space model needs transformers >= "
            f"{UNIFIED_CACHE} (the first whose hybrid caches continue a prefix exactly); "
            f"this is {transformers.__version__}: "
            f"pip install -U 'transformers>={UNIFIED_CACHE}'")


def plan(config) -> PrefixReuse:
    """How rows of a model of ``config`` continue a shared prefix (module doc); `UnsupportedCache` for a layer type
    without a rule."""
    require_unified_cache(config)
    types = layer_types(config)
    counts: dict[str, int] = {}
    for t in types:
        counts[t] = counts.get(t, 0) + 1
    known = ATTENTION_TYPES + STATE_TYPES + BOTH_TYPES + NOTHING_TYPES + ("lightning_attention",)
    for t in counts:
        if t in FULL_PATH_TYPES:
            return PrefixReuse("full", counts, why=FULL_PATH_TYPES[t])
        if t not in known:
            raise UnsupportedCache(f"{architecture(config)}: layer type {t!r} has no rule for continuing a shared "
                                   "prefix (probe/core/cache.py); not supported")
    model_type = getattr(config.get_text_config(decoder=True), "model_type", None)
    if model_type in STEPWISE:
        return PrefixReuse("cache", counts, stepwise=True,
                           why=f"Mamba-1's scan ({STEPWISE[model_type]}) takes no initial state over several tokens: "
                               "the continuation runs one token at a time")
    return PrefixReuse("cache", counts, short_stepwise=SHORT_STEPWISE.get(model_type, 0))


# --- the continuation -----------------------------------------------------------------------------------------------

def _takes_positions(module) -> bool:
    return "position_ids" in inspect.signature(module.forward).parameters


def continue_prefix(backbone, cache_kw: str, cache, start: int, input_ids=None, inputs_embeds=None,
                    stepwise: bool | PrefixReuse = False):
    """Final hidden states of the new tokens on top of a prefix of ``start`` tokens whose batch-1 cache is ``cache``:
    each row on its own `replicate` of it, at explicit positions ``start`` onward (the model's own count of the past
    reads the first layer's cache, which a hybrid's first layer may not keep); ``stepwise`` (or the `PrefixReuse`
    that decides it by the row's length): one token at a time. On the CPU, `tail_rows` copies of the last row go
    after the rows (and are dropped)."""
    x = input_ids if input_ids is not None else inputs_embeds
    b, n = x.shape[0], x.shape[1]
    autograd = torch.is_grad_enabled() and x.requires_grad
    if isinstance(stepwise, PrefixReuse):
        stepwise = stepwise.steps(n, autograd)
    if autograd and stepwise:
        raise UnsupportedCache("GCG and the beam back-propagate through the continuation, which a Mamba-1 model runs "
                               "one token at a time through steps that update their state in place: not supported")
    pad = tail_rows(1 if stepwise else n, x.device)
    if pad:
        x = torch.cat([x, x[-1:].expand(pad, *x.shape[1:])])
    rows = replicate(cache, b + pad, autograd)
    pos = torch.arange(start, start + n, device=x.device)[None].expand(b + pad, n)
    positions = _takes_positions(backbone)
    steps = [(j, j + 1) for j in range(n)] if stepwise else [(0, n)]
    outs = []
    for i, j in steps:
        kw = {"position_ids": pos[:, i:j]} if positions else {}
        feed = {"input_ids": x[:, i:j]} if input_ids is not None else {"inputs_embeds": x[:, i:j]}
        out = backbone(**feed, use_cache=True, **{cache_kw: rows}, **kw)
        outs.append(out.last_hidden_state[:b])
    return outs[0] if len(outs) == 1 else torch.cat(outs, 1)
