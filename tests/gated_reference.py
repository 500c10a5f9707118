"""A miniature ArmoRM/QRM-style gated reward model, written for the tests from the published description.

It is the *reference*: its forward searches ``input_ids`` for the gating pattern and pools before the first
pad token, as the published remote code does, and rm-probe's cached `GatedRewardHead` must agree with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig, LlamaModel, LlamaPreTrainedModel
from transformers.modeling_outputs import ModelOutput


class TinyGating(nn.Module):
    def __init__(self, d: int, n_out: int, hidden: int = 32, n_hidden: int = 2, temperature: float = 10.0):
        super().__init__()
        dims = [d] + [hidden] * n_hidden
        self.layers = nn.ModuleList([nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])] + [nn.Linear(dims[-1], n_out)])
        self.temperature = temperature
        self.logit_scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return F.softmax(x / self.temperature, dim=1) * self.logit_scale[0]


@dataclass
class GatedOutput(ModelOutput):
    score: torch.Tensor | None = None
    logits: torch.Tensor | None = None


class TinyGatedRM(LlamaPreTrainedModel):
    def __init__(self, config: LlamaConfig, pattern: list[int], n_objectives: int = 5, n_quantiles: int | None = None):
        super().__init__(config)
        self.model = LlamaModel(config)
        self.pattern = pattern
        if n_quantiles:
            config.num_quantiles = n_quantiles
        self.n_obj, self.n_q = n_objectives, n_quantiles
        self.regression_layer = nn.Linear(config.hidden_size, n_objectives * (n_quantiles or 1), bias=False)
        self.gating = TinyGating(config.hidden_size, n_objectives)
        t = torch.eye(n_objectives) + 0.1 * torch.randn(n_objectives, n_objectives)
        self.reward_transform_matrix = nn.Parameter(t, requires_grad=False)
        self.post_init()

    def _gate_position(self, ids: list[int]) -> int:
        k = len(self.pattern)
        for j in range(len(ids) - k, -1, -1):
            if ids[j : j + k] == self.pattern:
                return j
        raise ValueError("pattern not found")

    def forward(self, input_ids, **kwargs):
        h = self.model(input_ids=input_ids).last_hidden_state
        b, length = input_ids.shape
        pad = self.config.pad_token_id
        last = (torch.eq(input_ids, pad).int().argmax(-1) - 1) % length
        rows = torch.arange(b)
        rewards = self.regression_layer(h[rows, last])
        if self.n_q:
            rewards = rewards.reshape(b, self.n_obj, self.n_q).mean(2)
        gate_pos = [self._gate_position(r.tolist()) for r in input_ids]
        gate = self.gating(h[rows, gate_pos])
        score = (gate * (rewards @ self.reward_transform_matrix)).sum(1, keepdim=True)
        return GatedOutput(score=score, logits=score)
