"""The decoder stack as `probe explain` reads it: where each block's attention and MLP outputs enter the residual
stream, the per-head inputs of ``o_proj``, the final norm; hooks that capture them and hooks that patch them.

A block of the families read here adds two things to the residual stream: ``x + attn`` then ``+ mlp``. For Llama,
Qwen, Mistral and SmolLM2 these are the outputs of ``self_attn`` and ``mlp``; for Gemma 2/3 (and OLMo 2) the
post-attention and post-feed-forward norms sit inside the block's contribution, so the part is that norm's output
(`Block.attn_out`, `Block.mlp_out`). The residual stream the final norm reads is then exactly
``embedding + sum over blocks (attn + mlp)``, which `capture` checks on every forward (to the dtype's rounding).
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


@dataclass
class Stack:
    backbone: nn.Module
    blocks: list[Block]
    final_norm: nn.Module


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
                            layer.post_attention_layernorm if sandwich else None, n_heads, head_dim))
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


@contextlib.contextmanager
def patching(stack: Stack, plan: dict, base: Captured, n_prefix: int, n_base_prefix: int):
    """Replace, per batch row, one component's output by its value in ``base`` (the baseline response's forward).

    ``plan``: row -> component name (``L3.attn``, ``L3.mlp``, ``L3.attn.h2``, ``embed``; None: unpatched). The
    patched positions are the continuation's (the prefix is the same text in both, so its parts are equal),
    aligned from the right end: the read position and the template's closing ids line up; where the two
    continuations differ in length only the last ``min`` positions are replaced (the function's caller says so).
    """
    handles = []
    by_module: dict = {}
    for row, name in plan.items():
        if name is None:
            continue
        by_module.setdefault(name, []).append(row)

    def window(total: int) -> tuple[slice, slice]:
        n = min(total - n_prefix, base.resid.shape[1] - n_base_prefix)
        return slice(total - n, total), slice(base.resid.shape[1] - n, base.resid.shape[1])

    def replacer(values: Tensor, rows: list[int]):
        def hook(module, args, out):
            t = _first(out)
            here, there = window(t.shape[1])
            t = t.clone()
            t[rows, here] = values[0, there].to(t.dtype)
            return (t, *out[1:]) if isinstance(out, tuple) else t
        return hook

    def head_replacer(values: Tensor, rows: list[int], h: int, dh: int):
        def hook(module, args):
            t = args[0]
            here, there = window(t.shape[1])
            t = t.clone()
            t[rows, here, h * dh:(h + 1) * dh] = values[0, there, h * dh:(h + 1) * dh].to(t.dtype)
            return (t, *args[1:])
        return hook

    try:
        for name, rows in by_module.items():
            if name == "embed":
                def pre(module, args, kwargs, rows=rows):
                    t = (args[0] if args else kwargs["hidden_states"])
                    here, there = window(t.shape[1])
                    t = t.clone()
                    t[rows, here] = base.embed[0, there].to(t.dtype)
                    if args:
                        return (t, *args[1:]), kwargs
                    return args, {**kwargs, "hidden_states": t}
                handles.append(stack.blocks[0].layer.register_forward_pre_hook(pre, with_kwargs=True))
                continue
            layer, kind, *head = name.split(".")
            b = stack.blocks[int(layer[1:])]
            if head:
                if base.o_in[b.index] is None:
                    raise ProbeError("the baseline's per-head outputs were not captured")
                handles.append(b.o_proj.register_forward_pre_hook(
                    head_replacer(base.o_in[b.index], rows, int(head[0][1:]), b.head_dim)))
            else:
                values = base.attn[b.index] if kind == "attn" else base.mlp[b.index]
                handles.append((b.attn_out if kind == "attn" else b.mlp_out).register_forward_hook(
                    replacer(values, rows)))
        yield
    finally:
        for h in handles:
            h.remove()
