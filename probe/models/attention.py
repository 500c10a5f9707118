"""The attention a model was trained with, on every path, whatever attention implementation transformers picks.

Gemma 2 caps its attention logits (``attn_logit_softcapping``: ``tanh(s / cap) * cap`` before the softmax). Which
implementation transformers gives a model depends on its version: 5.17 loads Gemma 2 with SDPA, which has no
soft-cap and leaves the logits uncapped without a word; 5.24 picks eager attention, which caps, and its SDPA refuses
a soft-cap. A prefix cache computed uncapped under a shared-prefix kernel that caps the new tokens (or a self-check
against an uncapped forward) gives wrong numbers, 12-14 reward units off on a model whose attention logits reach the
cap, as real Gemma 2 checkpoints' do. So a model whose config changes the attention scores in a way its current
implementation ignores is switched to one that applies it (eager: the model's own reference code), and every run
says so (`record`, in ``meta.json``'s ``model.attention``).

Sliding windows and ``query_pre_attn_scalar`` reach every implementation (masks built by transformers, and the
``scaling`` argument): only the soft-cap depends on the implementation.
"""

from __future__ import annotations

import logging

import torch

from probe.errors import ProbeError

log = logging.getLogger(__name__)

# implementations that apply ``softcap`` (transformers' eager functions of the soft-capping families, its flash and
# flex integrations; rm-probe's shared-prefix kernel, kernels/prefix_attention.py); SDPA and unknown ones do not
SOFTCAP_IMPLEMENTATIONS = frozenset({"eager", "flash_attention_2", "flash_attention_3", "flex_attention",
                                     "rm_shared_prefix"})
TRAINED = "eager"  # what a model is switched to: its own reference attention


def softcap_of(config) -> float | None:
    """The attention logit soft-cap of a model's text config (Gemma 2's ``attn_logit_softcapping``), if any."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    cap = getattr(text, "attn_logit_softcapping", None)
    return float(cap) if cap else None


def implementation(config) -> str | None:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return getattr(text, "_attn_implementation", None)


def needed(config, current: str | None = None) -> str | None:
    """The implementation to load or run the model with instead of ``current`` (its config's by default), or None
    where the current one applies everything the config asks of attention."""
    current = implementation(config) if current is None else current
    if softcap_of(config) is not None and current not in SOFTCAP_IMPLEMENTATIONS:
        return TRAINED
    return None


def load_kwargs(config, requested: str | None) -> dict:
    """``from_pretrained`` keywords for the attention: the registry's choice where it applies the config's soft-cap,
    else the trained one (no choice lets transformers pick, and some versions pick SDPA)."""
    if softcap_of(config) is None:
        return {"attn_implementation": requested} if requested else {}
    if requested is not None and requested not in SOFTCAP_IMPLEMENTATIONS:
        raise ProbeError(f"attention implementation {requested!r} does not apply this model's attention logit "
                         f"soft-cap ({softcap_of(config):g}); use eager, flex_attention or flash_attention_2")
    return {"attn_implementation": requested or TRAINED}


def mark_chosen(model: torch.nn.Module, requested: str | None) -> None:
    """After loading with `load_kwargs`: where rm-probe, not the caller, chose the implementation, say so."""
    if softcap_of(model.config) is not None and requested is None:
        model.rm_probe_attention_choice = {
            "instead_of": "transformers' default",
            "why": f"the model caps its attention logits at {softcap_of(model.config):g}; eager attention applies the "
                   "cap, and transformers' default may not (5.17 picks SDPA for Gemma 2, which ignores it)"}


def use_trained_attention(model: torch.nn.Module) -> dict:
    """Switch ``model`` to an implementation that applies its config's attention settings, where its current one
    does not (in place, with one warning); return what it runs (`record`). Idempotent."""
    before = implementation(model.config)
    want = needed(model.config)
    if want is not None:
        try:
            model.set_attn_implementation(want)
        except (AttributeError, ValueError) as err:
            raise ProbeError(f"{type(model).__name__} runs {before!r} attention, which ignores its attention logit "
                             f"soft-cap ({softcap_of(model.config):g}), and cannot be switched ({err}); load it with "
                             f"attn_implementation={TRAINED!r}") from None
        if needed(model.config) is not None:
            raise ProbeError(f"{type(model).__name__} still runs {implementation(model.config)!r} attention after a "
                             f"switch to {want!r}; load it with attn_implementation={want!r}")
        log.warning("%s: %r attention ignores the attention logit soft-cap (%g) this model was trained with; "
                    "running %r attention instead (recorded in meta.json)", type(model).__name__, before,
                    softcap_of(model.config), want)
        model.rm_probe_attention_choice = {"instead_of": before, "why": _why(model.config, before)}
    return record(model)


def require_trained_attention(model: torch.nn.Module) -> None:
    """The engine's guard: a model whose current attention ignores what its config asks is refused in one line
    (`use_trained_attention` switches it; `probe.load` and the API do so)."""
    if needed(model.config) is not None:
        raise ProbeError(f"{type(model).__name__}: {_why(model.config, implementation(model.config))}; switch it "
                         f"with probe.models.attention.use_trained_attention(model), or load it with "
                         f"attn_implementation={TRAINED!r}")


def _why(config, current: str | None) -> str:
    return (f"{current!r} attention does not apply the attention logit soft-cap ({softcap_of(config):g}) the model "
            "was trained with")


def record(model: torch.nn.Module) -> dict:
    """``meta.json``'s ``model.attention``: the implementation that ran, the soft-cap it applied, and, where rm-probe
    chose it, the one transformers had picked and why it was replaced."""
    out: dict = {"implementation": implementation(model.config), "softcap": softcap_of(model.config)}
    choice = getattr(model, "rm_probe_attention_choice", None)
    out["chosen_by"] = "rm-probe" if choice else "transformers"
    return out | (choice or {})
