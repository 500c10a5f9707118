"""Reward models whose head is not transformers' linear ``score``: a backbone (``LlamaModel``, ``Gemma2Model``,
...) under the attribute the family's code gives it, and a head of the family's own shape, read at the family's
pooling position. Written from the families' published modelling code as RewardBench runs it
(``rewardbench/models/*.py`` of the ``rewardbench`` package, 0.1.4) and checked against those classes on tiny
models (tests/unit/test_rewardbench_families.py):

| layout | family (RewardBench class) | backbone | head (checkpoint keys) | read at |
|---|---|---|---|---|
| ``grm`` | GRM ``-sftreg`` (``GRewardModel``) | ``model`` | ``v_head.summary``: linear, or Linear-ReLU (x layers)-Linear (config ``vhead_*``) | last real token |
| ``inform`` | INF-ORM (``INFORMForSequenceClassification``) | ``model`` | ``score``: Linear-ReLU-Linear | token before the first pad id, else last |
| ``ultrarm`` | UltraRM, Eurus-RM (``LlamaRewardModel``) | ``model`` | ``regression_head``: linear, no bias | last real token |
| ``starling`` | Starling-RM-34B (its ``LlamaForSequenceClassification``) | ``transformer`` | ``v_head``: linear, no bias | token before the first id 0, else last |
| ``starling7b`` | Starling-RM-7B-alpha (the card's ``GPTRewardModel`` on Llama-2-7b-chat; weights in one ``.pt``/``model.bin``) | ``transformer`` | ``v_head``: linear, no bias | last token (see `starling7b_state_dict`) |
| ``beaver`` | Beaver reward/cost (``LlamaForScore``) | ``model`` | ``score_head`` (+ the config's normaliser when ``do_normalize``) | last real token |
| ``ldl`` | LDL-Reward (``LDLRewardModel27B``) | ``model`` | ``regression_layer`` (10-bin distributions) and ``gating_layer``, in their own ``.pt`` files | token before the first pad id, else last |
| ``pairrm`` | PairRM (``DebertaV2PairRM``; pairwise) | ``pretrained_model`` | ``head_layer`` on (source, candidate) pairs | the source and candidate prefix ids |

`family_model(layout)` builds a ``PreTrainedModel`` whose modules carry the checkpoint's own names, so the
weights load by name (a missing head weight is an error, not a random head), and whose ``forward`` reads the
score as the family's code does: the reference for the self-check. `reward_head` is the same head on pooled
hidden states: the engine's cached reader (probe/core/heads.py, ``ModuleRewardHead``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn


@dataclass(frozen=True)
class HeadLayout:
    name: str
    backbone: str  # attribute of the backbone (and its checkpoint prefix)
    pooling: str  # "last" (last real token) or "before_first_pad"
    pad_id: int | None = None  # fixed pad id of the pooling rule (Starling: 0); None: config.pad_token_id


LAYOUTS = {layout.name: layout for layout in [
    HeadLayout("grm", "model", "last"),
    HeadLayout("inform", "model", "before_first_pad"),
    HeadLayout("ultrarm", "model", "last"),
    HeadLayout("starling", "transformer", "before_first_pad", pad_id=0),
    HeadLayout("starling7b", "transformer", "last"),
    HeadLayout("beaver", "model", "last"),
    HeadLayout("ldl", "model", "before_first_pad"),
    HeadLayout("pairrm", "pretrained_model", "prefix_ids"),  # a pairwise model (pairrm_model below)
]}


# --- the heads: modules named as in the checkpoints, and how each layout reads one score [b] from [b, d] ----------
def _mlp(sizes: list[int], act) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers += act()
    return nn.Sequential(*layers)


class GRMValueHead(nn.Module):
    """``v_head.summary``: one linear layer, or Linear-ReLU blocks then Linear (config ``vhead_layer_type``,
    ``vhead_num_neurons``, ``vhead_num_layers``; GRM's ValueHead, whose dropout is off in evaluation)."""

    def __init__(self, config):
        super().__init__()
        d = config.hidden_size
        if getattr(config, "vhead_layer_type", "mlp") == "linear":
            self.summary = nn.Linear(d, 1)
        else:
            width, layers = getattr(config, "vhead_num_neurons", 1024), getattr(config, "vhead_num_layers", 1)
            self.summary = _mlp([d] + [width] * layers + [1], lambda: [nn.ReLU()])


class LDLNetwork(nn.Module):
    """LDL-Reward's ``regression_layer`` / ``gating_layer``: a ``network`` of Linear layers with LeakyReLU (the
    gating one with Dropout(0) after each, which holds no weights and keeps the indices of its keys)."""

    def __init__(self, d: int, out: int, width: int, dropout: bool):
        super().__init__()
        act = (lambda: [nn.LeakyReLU(), nn.Dropout(0.0)]) if dropout else (lambda: [nn.LeakyReLU()])
        self.network = _mlp([d, width, width, out], act)


def _heads(layout: HeadLayout, config) -> dict[str, nn.Module]:
    d = config.hidden_size
    if layout.name == "grm":
        return {"v_head": GRMValueHead(config)}
    if layout.name == "inform":
        return {"score": _mlp([d, d, 1], lambda: [nn.ReLU()])}
    if layout.name == "ultrarm":
        return {"regression_head": nn.Linear(d, 1, bias=False)}
    if layout.name in ("starling", "starling7b"):
        return {"v_head": nn.Linear(d, 1, bias=False)}
    if layout.name == "beaver":
        return {"score_head": nn.Linear(d, getattr(config, "score_dim", 1), bias=getattr(config, "bias", False))}
    if layout.name == "ldl":
        n, width = getattr(config, "num_objectives", 220), 4096  # RewardBench's widths are fixed
        return {"regression_layer": LDLNetwork(d, n, width, dropout=False),
                "gating_layer": LDLNetwork(d, n // 10, width, dropout=True)}
    raise KeyError(layout.name)


def _linear_in_dtype(module: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """``module(h)`` in the module's dtype, on its device: called directly, a head's inner module gets no device hook
    from accelerate under --device-map, so ``h`` (on the last layers' device) is moved here."""
    first = next(m for m in module.modules() if isinstance(m, nn.Linear))
    return module(h.to(first.weight.device, first.weight.dtype)).float()


def _beaver(model, h: torch.Tensor) -> torch.Tensor:
    """End score, normalised as the config's ``do_normalize`` says: reward affine, cost scale, critic none."""
    cfg = model.config
    s = _linear_in_dtype(model.score_head, h)[:, 0]
    if getattr(cfg, "do_normalize", False):
        kind = getattr(cfg, "score_type", "reward")
        mean = torch.as_tensor(getattr(cfg, "mean", None) or [0.0], device=s.device)[0]
        std = torch.as_tensor(getattr(cfg, "var", None) or [1.0], device=s.device)[0].sqrt() + 1e-8
        s = (s - mean) / std if kind == "reward" else s / std if kind == "cost" else s
    return s


def ldl_gating(config) -> tuple[bool, float]:
    """LDL's gating ``softmax`` and ``temperature`` as its GatingNN reads them from the config (defaults False,
    1.0). transformers 5 moves ``temperature``, a generation parameter to it, out of a loaded model config: the
    value the checkpoint's config.json holds is kept at load (`load_side_files`) as ``ldl_temperature``."""
    temperature = getattr(config, "ldl_temperature", None)
    if temperature is None:
        temperature = getattr(config, "temperature", None)
    return bool(getattr(config, "softmax", False)), float(1.0 if temperature is None else temperature)


def _ldl(model, h: torch.Tensor) -> torch.Tensor:
    """The gated mixture of 10-bin distributions, weighted by linspace(0, 1, 10); in float32."""
    h = h.float()
    regression, gating = model.regression_layer.network, model.gating_layer.network  # each on its own device
    dist = torch.softmax(regression(h.to(next(regression.parameters()).device)).view(h.shape[0], -1, 10), -1)
    w = gating(h.to(next(gating.parameters()).device)).to(dist.device)
    softmax, temperature = ldl_gating(model.config)
    if softmax:
        w = torch.softmax(w / temperature, dim=1)
    mix = torch.bmm(w[:, None], dist)[:, 0]
    return (mix * torch.linspace(0, 1, mix.shape[-1], device=mix.device)).sum(-1)


READ = {
    "grm": lambda m, h: _linear_in_dtype(m.v_head.summary, h)[:, 0],
    "inform": lambda m, h: _linear_in_dtype(m.score, h)[:, 0],
    "ultrarm": lambda m, h: _linear_in_dtype(m.regression_head, h)[:, 0],
    "starling": lambda m, h: _linear_in_dtype(m.v_head, h)[:, 0],
    "starling7b": lambda m, h: _linear_in_dtype(m.v_head, h)[:, 0],
    "beaver": _beaver,
    "ldl": _ldl,
}


# --- the model --------------------------------------------------------------------------------------------------
def pooled_index(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, layout: HeadLayout,
                 pad_id: int | None) -> torch.Tensor:
    """Per row, the position the family reads: the last real token (attention mask), or the token before the
    first pad id (the last token where there is none)."""
    b, n = input_ids.shape
    if layout.pooling == "last" or pad_id is None:
        if attention_mask is None:
            return torch.full((b,), n - 1, device=input_ids.device)
        positions = torch.arange(n, device=input_ids.device)[None].expand(b, n)
        return torch.where(attention_mask.bool(), positions, -1).amax(1)
    first = torch.eq(input_ids, pad_id).int().argmax(-1) - 1
    return first % n


def _init_linear(model, module) -> None:
    """``_init_weights`` of the family models: Linear layers drawn as the config's ``initializer_range`` says (a
    checkpoint's weights replace them; a head it lacks is an error, never these)."""
    if isinstance(module, nn.Linear):
        module.weight.data.normal_(0.0, getattr(model.config, "initializer_range", 0.02))
        if module.bias is not None:
            module.bias.data.zero_()


SUPPORT_FLAGS = ("_supports_sdpa", "_supports_flash_attn", "_supports_flex_attn", "_supports_attention_backend",
                 "_no_split_modules", "_can_compile_fullgraph")


def family_model(layout_name: str, config):
    """A ``PreTrainedModel`` class for one layout on ``config``'s backbone: backbone and head modules named as the
    family's checkpoints name them; ``forward`` returns ``logits`` [b, 1] read as the family's code reads them.
    The backbone class's attention support (SDPA, flash, ...) is the model's."""
    from transformers import AutoConfig, AutoModel, PreTrainedModel
    from transformers.modeling_outputs import SequenceClassifierOutput
    from transformers.models.auto.auto_factory import _get_model_class

    layout = LAYOUTS[layout_name]
    backbone_cls = _get_model_class(config, AutoModel._model_mapping)

    class FamilyRewardModel(PreTrainedModel):
        config_class = AutoConfig
        base_model_prefix = layout.backbone

        def __init__(self, config):
            super().__init__(config)
            setattr(self, layout.backbone, AutoModel.from_config(config))
            for name, module in _heads(layout, config).items():
                setattr(self, name, module)
            self.layout = layout
            self.post_init()

        _init_weights = _init_linear

        def get_input_embeddings(self):
            return getattr(self, layout.backbone).get_input_embeddings()

        @property
        def pad_id(self) -> int | None:
            return layout.pad_id if layout.pad_id is not None else self.config.pad_token_id

        def reward_head(self, h: torch.Tensor) -> torch.Tensor:
            """Scores [b] (float32) of pooled final hidden states [b, d]."""
            return READ[layout.name](self, h)

        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            hidden = getattr(self, layout.backbone)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            pos = pooled_index(input_ids, attention_mask, layout, self.pad_id)
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), pos.to(hidden.device)]
            return SequenceClassifierOutput(logits=self.reward_head(pooled)[:, None])

    for flag in SUPPORT_FLAGS:  # the backbone's attention support is the model's
        if hasattr(backbone_cls, flag):
            setattr(FamilyRewardModel, flag, getattr(backbone_cls, flag))
    FamilyRewardModel.__name__ = FamilyRewardModel.__qualname__ = f"{layout_name.capitalize()}RewardModel"
    return FamilyRewardModel


def load_side_files(model, path: str | Path) -> list[str]:
    """Head weights a family keeps outside the safetensors (LDL's ``regression_layer.pt``, ``gating_layer.pt``);
    returns what was loaded. A missing file is an error: the head would stay random."""
    if model.layout.name != "ldl":
        return []
    from probe.errors import ModelLoadError

    import json

    raw = json.loads((Path(path) / "config.json").read_text()) if (Path(path) / "config.json").is_file() else {}
    model.config.ldl_temperature = raw.get("temperature", 1.0)  # as the checkpoint's config.json has it
    loaded = []
    for name in ("regression_layer", "gating_layer"):
        file = Path(path) / f"{name}.pt"
        if not file.is_file():
            raise ModelLoadError(f"{path}: LDL-Reward keeps its {name} in {file.name}, which is missing")
        try:  # plain tensors only: a pickle's own code is never run
            state = torch.load(file, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 (UnpicklingError, a corrupt zip, ...: all one answer)
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ModelLoadError(f"{file}: not loadable as plain tensors with torch.load(weights_only=True) ({first}); "
                                 "rm-probe never runs a pickle's code: save the head's state_dict") from None
        getattr(model, name).load_state_dict(state)
        getattr(model, name).float()
        loaded.append(file.name)
    return loaded


# --- Starling-RM-7B-alpha: GPTRewardModel's state dict in one torch file -----------------------------------------
STARLING7B_BACKBONES = ("transformer.", "model.model.")  # GPTRewardModel's backbone, under both of its names


def starling7b_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Starling-RM-7B-alpha's weights as the card loads them (``torch.load`` of the one file in the repository whose
    name ends in ``.pt`` or ``model.bin``, into GPTRewardModel: Llama-2-7b-chat's causal LM as ``model``, its
    ``model.model`` also as ``transformer``, and ``v_head``), renamed to this layout's modules: the backbone under
    ``transformer.`` (from either name), ``v_head``; the LM head, which the reward does not read, dropped.

    The card and RewardBench read ``rewards[i, c_ind - 1]`` where ``c_ind`` is the first position of
    ``tokenizer(unk_token)["input_ids"][0]``, which for Llama-2's tokenizer (it adds BOS) is the BOS id: position 0,
    so index -1, the row's last position. On a row without padding that is its last token, which this layout reads;
    padded rows (the card pads to 2,048 ids, RewardBench's pipeline to the batch's longest, on the right) are read
    at a pad there."""
    from probe.errors import ModelLoadError

    files = sorted(f for f in Path(path).iterdir() if f.is_file() and f.name.endswith((".pt", "model.bin")))
    if len(files) != 1:
        raise ModelLoadError(f"{path}: Starling-RM-7B-alpha keeps its weights in one file ending in .pt or model.bin "
                             f"(found {len(files)}: {', '.join(f.name for f in files) or 'none'})")
    try:  # plain tensors only: a pickle's own code is never run
        state = torch.load(files[0], map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 (UnpicklingError, a corrupt zip, ...: all one answer)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelLoadError(f"{files[0]}: not loadable as plain tensors with torch.load(weights_only=True) ({first})"
                             ) from None
    out = {}
    for prefix in reversed(STARLING7B_BACKBONES):  # "transformer." wins where both names are saved
        out.update({"transformer." + k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    if "v_head.weight" in state:
        out["v_head.weight"] = state["v_head.weight"]
    return out


# --- PairRM (a pairwise model: probe/core/pairwise.py) ---------------------------------------------------------
def pairrm_model(config):
    """``DebertaV2PairRM`` (llm-blender's PairRM, as RewardBench's pairrm.py defines it): a DeBERTa-v2 encoder as
    ``pretrained_model``; ``head_layer`` (Dropout, Linear 2d->d, Tanh, Dropout, Linear d->n_tasks) on the hidden
    states at the source prefix id concatenated with each candidate prefix id; ``logits`` = the mean over tasks of
    head(source, candidate 1) - head(source, candidate 2).

    Each prefix id is read where the input's structure puts it: its occurrence right after the row's first id
    ([CLS]), as each of the three encodings starts. PairRM's own code takes every occurrence (and fails on a
    response that holds a prefix id); on any other input the two read the same positions."""
    from transformers import AutoConfig, AutoModel, PreTrainedModel
    from transformers.modeling_outputs import SequenceClassifierOutput

    class PairRMModel(PreTrainedModel):
        config_class = AutoConfig
        base_model_prefix = "pretrained_model"

        def __init__(self, config):
            super().__init__(config)
            self.pretrained_model = AutoModel.from_config(config)
            d, drop = config.hidden_size, getattr(config, "drop_out", 0.0)
            self.head_layer = nn.Sequential(nn.Dropout(drop), nn.Linear(2 * d, d), nn.Tanh(), nn.Dropout(drop),
                                            nn.Linear(d, getattr(config, "n_tasks", 1)))
            self.layout = LAYOUTS["pairrm"]
            self.post_init()

        _init_weights = _init_linear

        def get_input_embeddings(self):
            return self.pretrained_model.get_input_embeddings()

        def prefix_positions(self, input_ids: torch.Tensor, prefix_id: int) -> torch.Tensor:
            after_cls = torch.eq(input_ids[:, 1:], prefix_id) & torch.eq(input_ids[:, :-1], input_ids[:, :1])
            if not bool(after_cls.any(1).all()):
                raise ValueError(f"PairRM: a row lacks its prefix id {prefix_id} after [CLS]")
            return after_cls.int().argmax(1) + 1

        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            hidden = self.pretrained_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            src, c1, c2 = (hidden[rows, self.prefix_positions(input_ids, getattr(self.config, name)).to(hidden.device)]
                           for name in ("source_prefix_id", "cand1_prefix_id", "cand2_prefix_id"))
            left = self.head_layer(torch.cat([src, c1], -1))
            right = self.head_layer(torch.cat([src, c2], -1))
            return SequenceClassifierOutput(logits=(left - right).mean(-1).float())

    PairRMModel.__name__ = PairRMModel.__qualname__ = "PairRMModel"
    return PairRMModel
