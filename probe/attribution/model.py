"""The decoder stack as `probe explain` reads it: where each block's attention and MLP outputs enter the residual
stream, the per-head inputs of ``o_proj``, the final norm; hooks that capture them and hooks that patch them.

A block of the families read here adds two things to the residual stream: ``x + attn`` then ``+ mlp``. For Llama,
Qwen, Mistral and SmolLM2 these are the outputs of ``self_attn`` and ``mlp``; for Gemma 2/3 (and OLMo 2) the
post-attention and post-feed-forward norms sit inside the block's contribution, so the part is that norm's output
(`Block.attn_out`, `Block.mlp_out`). Granite (and HyperCLOVA X) add ``residual_multiplier x`` each output, MiniCPM3
``residual_scale x`` it: `Block.scale`. The embedding is read where block 0 receives it, after any
``embedding_multiplier`` or Gemma's ``sqrt(d)``. The residual stream the final norm reads is then
``embedding + sum over blocks scale (attn + mlp)`` up to the rounding of each addition, which `residual_rounding`
checks on every decomposed forward against the bound of the model's dtype: an architecture that writes into its
stream otherwise is refused, naming the settings of its config that scale the stream.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from probe.core.engine import backbone_of
from probe.errors import ProbeError


@dataclass
class Block:
    index: int
    layer: nn.Module
    attn_out: nn.Module  # the module whose output is the block's attention contribution
    mlp_out: nn.Module  # ... its MLP contribution
    o_proj: nn.Linear | None  # the attention's output projection (per-head split), None where absent
    post_attn_norm: nn.Module | None  # Gemma 2/3: the norm between o_proj and the residual stream
    n_heads: int
    head_dim: int
    scale: float = 1.0  # the residual stream adds ``scale x`` each output (Granite's residual_multiplier)


@dataclass
class Stack:
    backbone: nn.Module
    blocks: list[Block]
    final_norm: nn.Module


# a decoder layer's attribute that multiplies both its outputs before they enter the residual stream
RESIDUAL_SCALES = ("residual_multiplier", "residual_scale")  # Granite, GraniteMoe*, HyperCLOVA X; MiniCPM3
# config settings that scale the residual stream or the logits (named where a decomposition does not close)
STREAM_SETTINGS = ("residual_multiplier", "embedding_multiplier", "logits_scaling", "logit_scale", "scale_depth",
                   "scale_emb", "dim_model_base", "mup_width_multiplier", "attention_multiplier",
                   "use_post_norm", "final_logit_softcapping")


def stream_settings(model: nn.Module) -> str:
    """The config's settings that scale the residual stream or the logits, as ``name=value`` (empty: none)."""
    cfg = model.config.get_text_config()
    found = [f"{k}={getattr(cfg, k)!r}" for k in STREAM_SETTINGS if getattr(cfg, k, None) not in (None, False)]
    return ", ".join(found)


def _block_scale(layer: nn.Module) -> float:
    for name in RESIDUAL_SCALES:
        value = getattr(layer, name, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return 1.0


def stack_of(model: nn.Module) -> Stack:
    """The decoder stack, or one line saying why this model's inside is not read here."""
    bb = backbone_of(model)
    layers = getattr(bb, "layers", None)
    norm = getattr(bb, "norm", None)
    if layers is None or norm is None:
        raise ProbeError(f"{type(model).__name__}: probe explain reads decoder stacks with `layers` and a final "
                         "`norm` (Llama, Gemma 2/3, Qwen 2/3, Mistral families); this model's inside is laid out "
                         "otherwise")
    cfg = model.config.get_text_config()
    blocks = []
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        if attn is None or not hasattr(layer, "mlp"):
            raise ProbeError(f"{type(model).__name__}: block {i} has no self_attn and mlp; not read by probe explain")
        sandwich = hasattr(layer, "post_feedforward_layernorm")  # Gemma 2/3, OLMo 2: the norms inside the part
        o_proj = getattr(attn, "o_proj", None)
        n_heads = int(getattr(cfg, "num_attention_heads"))
        head_dim = int(getattr(attn, "head_dim", None) or getattr(cfg, "head_dim", None)
                       or cfg.hidden_size // n_heads)
        if not isinstance(o_proj, nn.Linear) or o_proj.in_features != n_heads * head_dim:
            o_proj = None
        blocks.append(Block(i, layer, layer.post_attention_layernorm if sandwich else attn,
                            layer.post_feedforward_layernorm if sandwich else layer.mlp, o_proj,
                            layer.post_attention_layernorm if sandwich else None, n_heads, head_dim,
                            _block_scale(layer)))
    return Stack(bb, blocks, norm)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@dataclass
class Captured:
    embed: Tensor  # [b, L, d]: the residual stream entering block 0
    attn: list[Tensor]  # per block [b, L, d]
    mlp: list[Tensor]
    o_in: list[Tensor | None]  # per block [b, L, H*dh]: o_proj's input (the heads' outputs before projection)
    attn_raw: list[Tensor | None]  # Gemma: o_proj's output, before the post-attention norm
    resid: Tensor  # [b, L, d]: what the final norm reads
    normed: Tensor  # [b, L, d]: the final norm's output
    own: Tensor | None = None  # [b] float32: the model's own score of this forward, where it was run with its head


@contextlib.contextmanager
def capture(stack: Stack, heads: bool = False):
    """Record every part of one forward (the tensors as computed, in the model's dtype) into the yielded dict."""
    rec: dict = {"attn": {}, "mlp": {}, "o_in": {}, "attn_raw": {}}
    handles = []

    def pre_first(module, args, kwargs):
        rec["embed"] = (args[0] if args else kwargs["hidden_states"]).detach()

    def pre_norm(module, args):
        rec["resid"] = args[0].detach()

    def post_norm(module, args, out):
        rec["normed"] = _first(out).detach()

    handles.append(stack.blocks[0].layer.register_forward_pre_hook(pre_first, with_kwargs=True))
    handles.append(stack.final_norm.register_forward_pre_hook(pre_norm))
    handles.append(stack.final_norm.register_forward_hook(post_norm))
    for b in stack.blocks:
        handles.append(b.attn_out.register_forward_hook(
            lambda m, a, o, i=b.index: rec["attn"].__setitem__(i, _first(o).detach())))
        handles.append(b.mlp_out.register_forward_hook(
            lambda m, a, o, i=b.index: rec["mlp"].__setitem__(i, _first(o).detach())))
        if heads and b.o_proj is not None:
            handles.append(b.o_proj.register_forward_pre_hook(
                lambda m, a, i=b.index: rec["o_in"].__setitem__(i, a[0].detach())))
            if b.post_attn_norm is not None:
                handles.append(b.o_proj.register_forward_hook(
                    lambda m, a, o, i=b.index: rec["attn_raw"].__setitem__(i, o.detach())))
    out: dict = {}
    try:
        yield out
    finally:
        for h in handles:
            h.remove()
    n = len(stack.blocks)
    if "resid" not in rec or len(rec["attn"]) != n or len(rec["mlp"]) != n:
        raise ProbeError("probe explain: the forward did not pass every block's attention and MLP (a layer skipped?)")
    out["captured"] = Captured(rec["embed"], [rec["attn"][i] for i in range(n)], [rec["mlp"][i] for i in range(n)],
                               [rec["o_in"].get(i) for i in range(n)], [rec["attn_raw"].get(i) for i in range(n)],
                               rec["resid"], rec["normed"])


@dataclass
class FrozenNorm:
    """A norm at the scale it really had at some positions: ``norm(x) = (x - centre(x)) * scale * weight + bias``,
    linear in ``x`` once ``scale`` is held (TransformerLens's ``apply_ln_to_stack``)."""

    scale: Tensor  # [..., 1] float32
    weight: Tensor  # [d] float32
    bias: Tensor | None  # [d] float32 (LayerNorm), else None
    centre: bool

    def apply(self, part: Tensor) -> Tensor:
        """The frozen norm on one additive part (its bias not added: it is the norm's own item)."""
        part = part.float()
        if self.centre:
            part = part - part.mean(-1, keepdim=True)
        return part * self.scale * self.weight


def freeze(norm: nn.Module, x: Tensor, y: Tensor | None = None) -> FrozenNorm:
    """``norm`` frozen at the scale it had on ``x`` ([..., d], the real input); checked against its real output
    ``y`` (computed here where not given): one line where the norm is neither RMSNorm nor LayerNorm."""
    xf = x.float()
    d = x.shape[-1]
    with torch.no_grad():
        if isinstance(norm, nn.LayerNorm):
            eps = norm.eps
            scale = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + eps)
            weight = norm.weight.float() if norm.weight is not None else torch.ones(d, device=x.device)
            bias = norm.bias.float() if norm.bias is not None else None
            frozen = FrozenNorm(scale, weight, bias, True)
        else:
            eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
            if eps is None or "rmsnorm" not in type(norm).__name__.lower():
                raise ProbeError(f"{type(norm).__name__}: probe explain freezes RMSNorm and LayerNorm only")
            scale = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            # the elementwise weight as the module applies it (w, or 1 + w for Gemma), read off a vector of ones
            ones = torch.ones(d, device=x.device, dtype=torch.float32)
            weight = norm(ones).float() * math.sqrt(1.0 + eps)
            frozen = FrozenNorm(scale, weight, None, False)
        real = norm(x).float() if y is None else y.float()
    got = frozen.apply(xf) + (frozen.bias if frozen.bias is not None else 0)
    eps_dtype = torch.finfo(x.dtype).eps
    if not torch.allclose(got, real, rtol=8 * eps_dtype, atol=8 * eps_dtype * float(real.abs().max()) + 1e-30):
        raise ProbeError(f"{type(norm).__name__}: its output is not (x - centre) * scale * weight (+ bias): the norm "
                         "cannot be frozen, so the parts would not sum to the score")
    return frozen


@dataclass(frozen=True)
class Window:
    """Where a patch lands: the forward's positions ``[start, start + n)`` (clipped to the positions it computes: a
    log-probability's forward on the prefix cache does not feed the last id) take the baseline's
    ``[base_start, base_start + n)``."""

    start: int
    n: int
    base_start: int

    def slices(self, length: int) -> tuple[slice, slice]:
        k = max(0, min(self.n, length - self.start))
        return slice(self.start, self.start + k), slice(self.base_start, self.base_start + k)


def _hooks_by_name(stack: Stack, name: str):
    """(module, kind, head) of a component name: ``embed`` (block 0's input), ``L3.attn``, ``L3.mlp`` (outputs),
    ``L3.attn.h2`` (o_proj's input columns of head 2)."""
    if name == "embed":
        return stack.blocks[0].layer, "embed", None
    layer, kind, *head = name.split(".")
    b = stack.blocks[int(layer[1:])]
    if head:
        if b.o_proj is None:
            raise ProbeError(f"{name}: this model's attention has no per-head output projection")
        return b.o_proj, "head", (int(head[0][1:]), b.head_dim)
    return (b.attn_out if kind == "attn" else b.mlp_out), "out", None


def _register(module: nn.Module, kind: str, edit):
    """A hook that replaces the tensor of a component (``edit(t) -> t``): block 0's input, a module's output or
    o_proj's input."""
    if kind == "embed":
        def pre(m, args, kwargs):
            if args:
                return (edit(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": edit(kwargs["hidden_states"])}
        return module.register_forward_pre_hook(pre, with_kwargs=True)
    if kind == "head":
        return module.register_forward_pre_hook(lambda m, args: (edit(args[0]), *args[1:]))

    def post(m, args, out):
        t = edit(_first(out))
        return (t, *out[1:]) if isinstance(out, tuple) else t
    return module.register_forward_hook(post)


def _base_values(base: Captured, stack: Stack, name: str) -> Tensor:
    if name == "embed":
        return base.embed
    layer, kind, *head = name.split(".")
    i = int(layer[1:])
    if head:
        if base.o_in[i] is None:
            raise ProbeError("the baseline's per-head outputs were not captured")
        return base.o_in[i]
    return base.attn[i] if kind == "attn" else base.mlp[i]


@contextlib.contextmanager
def patching(stack: Stack, plan: dict, base: Captured, window: Window):
    """Replace, per batch row, one component by its value in ``base`` (the baseline response's forward) at the
    ``window``'s positions.

    ``plan``: row -> component name (``L3.attn``, ``L3.mlp``, ``L3.attn.h2``, ``embed``; None: unpatched). Rows of
    one component share one hook. The prefix is the same text in both forwards, so its parts are equal and only
    the continuation's positions are patched, aligned from the right end (the read position and the template's
    closing ids line up)."""
    by_name: dict = {}
    for row, name in plan.items():
        if name is not None:
            by_name.setdefault(name, []).append(row)
    handles = []
    try:
        for name, rows in by_name.items():
            module, kind, head = _hooks_by_name(stack, name)
            values = _base_values(base, stack, name)

            def edit(t, rows=rows, values=values, head=head):
                here, there = window.slices(t.shape[1])
                t = t.clone()
                if head is None:
                    t[rows, here] = values[0, there].to(t.dtype)
                else:
                    h, dh = head
                    t[rows, here, h * dh:(h + 1) * dh] = values[0, there, h * dh:(h + 1) * dh].to(t.dtype)
                return t
            handles.append(_register(module, kind, edit))
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def tapped(stack: Stack, heads: bool, window: Window):
    """For attribution patching: a zero tensor that requires grad added to every component's output (and, with
    ``heads``, to each o_proj's input) at the ``window``'s positions of a one-row forward, so that one backward
    gives d score / d (each component's output) there, through every later layer. Yields ``{name: {"delta": the
    zero tensor, "clean": the component's value there}}`` (``L3.o_in`` for a layer's heads)."""
    taps: dict[str, dict] = {}
    handles = []

    def tap(key: str):
        def edit(t):
            here, _ = window.slices(t.shape[1])
            d = torch.zeros(t.shape[0], here.stop - here.start, t.shape[-1], dtype=t.dtype, device=t.device,
                            requires_grad=True)
            taps[key] = {"delta": d, "clean": t[:, here].detach()}
            t = t.clone()
            t[:, here] = t[:, here] + d
            return t
        return edit
    try:
        handles.append(_register(stack.blocks[0].layer, "embed", tap("embed")))
        for b in stack.blocks:
            handles.append(_register(b.attn_out, "out", tap(f"L{b.index}.attn")))
            handles.append(_register(b.mlp_out, "out", tap(f"L{b.index}.mlp")))
            if heads and b.o_proj is not None:
                handles.append(_register(b.o_proj, "head", tap(f"L{b.index}.o_in")))
        yield taps
    finally:
        for h in handles:
            h.remove()
