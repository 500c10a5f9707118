"""A re-implementation, written for rm-probe's tests, of QRM-Llama3.1's remote modelling code as the authors
publish it (``nicolinho/QRM-Llama3.1-8B``; the same class is in allenai/reward-bench
``rewardbench/models/qrm.py``). Kept faithful in everything a loader meets:

* it imports ``LLAMA_INPUTS_DOCSTRING`` from transformers' Llama module (removed in transformers 5);
* ``from_pretrained`` is overridden: it forces ``trust_remote_code`` and ``flash_attention_2`` and drops every
  other argument (dtype, device map, ``output_loading_info``), so it returns a model, not (model, info);
* the gating network is Linear(no bias) -> ReLU -> BatchNorm1d, three times, then Linear(bias), a softmax at
  temperature 10 scaled by ``logit_scale``, read at the last occurrence of the Llama 3 token pattern
  ``<|eot_id|><|start_header_id|>assistant<|end_header_id|>\\n\\n`` (ids hard-coded, as theirs are);
* the score is read before the first pad token; quantiles are averaged per objective, the objectives go
  through ``reward_transform_matrix`` and are mixed by the gate; ``score`` has shape [batch, 1].
"""

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaModel, LlamaPreTrainedModel
from transformers.models.llama.modeling_llama import LLAMA_INPUTS_DOCSTRING
from transformers.utils import ModelOutput, add_start_docstrings_to_model_forward

GATE_PATTERN = [128009, 128006, 78191, 128007, 271]


class GatingNetwork(nn.Module):
    def __init__(self, d_in, d_out, temperature=10.0, hidden=1024, n_hidden=3):
        super().__init__()
        self.temperature = temperature
        self.logit_scale = nn.Parameter(torch.ones(1))
        layers = []
        for _ in range(n_hidden):
            layers += [nn.Linear(d_in, hidden, bias=False), nn.ReLU(), nn.BatchNorm1d(hidden)]
            d_in = hidden
        layers.append(nn.Linear(d_in, d_out, bias=True))
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return F.softmax(x / self.temperature, dim=1) * self.logit_scale[0]


def gate_position(ids):
    k = len(GATE_PATTERN)
    for j in range(len(ids) - k, -1, -1):
        if ids[j : j + k] == GATE_PATTERN:
            return j
    raise ValueError("Token pattern not found in the list.")


@dataclass
class QuantileOutput(ModelOutput):
    reward_quantiles: Optional[torch.FloatTensor] = None
    rewards: Optional[torch.FloatTensor] = None
    gating_output: Optional[torch.FloatTensor] = None
    score: Optional[torch.FloatTensor] = None
    logits: Optional[torch.FloatTensor] = None


class LlamaForRewardModelWithGating31(LlamaPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = LlamaModel(config)
        cfg = config.to_dict()
        self.num_objectives = cfg.get("num_objectives", 19)
        self.num_quantiles = config.num_quantiles
        self.regression_layer = nn.Linear(config.hidden_size, self.num_objectives * self.num_quantiles, bias=False)
        self.post_init()
        eye = torch.zeros(self.num_objectives, self.num_objectives)
        eye[range(self.num_objectives), range(self.num_objectives)] = 1.0
        self.reward_transform_matrix = nn.Parameter(eye, requires_grad=False)
        self.gating = GatingNetwork(config.hidden_size, self.num_objectives, cfg.get("gating_temperature", 10),
                                    cfg.get("gating_hidden_dim", 1024), cfg.get("gating_n_hidden", 3))

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        return super().from_pretrained(pretrained_model_name_or_path, trust_remote_code=True,
                                       attn_implementation="flash_attention_2")

    @add_start_docstrings_to_model_forward(LLAMA_INPUTS_DOCSTRING)
    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids, attention_mask=attention_mask)[0]
        b, length = input_ids.shape
        last = (torch.eq(input_ids, self.config.pad_token_id).int().argmax(-1) - 1) % length
        rows = torch.arange(b, device=hidden.device)
        rewards = self.regression_layer(hidden[rows, last].float())
        rewards = rewards.reshape(-1, self.num_objectives, self.num_quantiles)
        gate = self.gating(hidden[rows, [gate_position(r.tolist()) for r in input_ids]].float())
        quantiles = torch.matmul(rewards.float().transpose(1, 2), self.reward_transform_matrix)
        reward_quantiles = (gate.unsqueeze(-1).repeat(1, 1, self.num_objectives) * quantiles.transpose(1, 2)).sum(1)
        expected = rewards.float().mean(dim=2) @ self.reward_transform_matrix
        score = torch.sum(gate * expected, dim=1, keepdim=True)
        return QuantileOutput(reward_quantiles=reward_quantiles, rewards=expected, gating_output=gate, score=score,
                              logits=score)
