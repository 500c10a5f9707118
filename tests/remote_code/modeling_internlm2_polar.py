"""A stand-in, written for rm-probe's tests, for the remote code POLAR's checkpoints load (``internlm/POLAR-*``: its
card calls ``AutoModel.from_pretrained(..., trust_remote_code=True)``, then ``model(**tokenizer(texts,
padding=True))[0]``). The Hub's ``modeling_internlm2.py`` cannot be read offline; the class as xtuner converts POLAR's
checkpoints to it (xtuner/tools/model_converters/modeling_internlm2_reward/modeling_internlm2.py,
``InternLM2ForRewardModel``) is what this copies the behaviour of:

* registered under ``AutoModel`` in the config's ``auto_map``;
* ``forward`` puts a bias-free ``v_head`` on every position and returns its value at
  ``attention_mask.cumsum(1).argmax(1)``: the last id the mask covers (so it needs the mask, as the card passes it),
  as ``SequenceClassifierOutputWithPast(logits=[batch, 1])``; it checks no reward token;
* the backbone is ``self.model``. InternLM2's own backbone (remote too: fused ``wqkv``, ``w1``/``w2``/``w3``) is not at
  hand offline; a ``LlamaModel`` of the same shape stands in, which is why rm-probe reads this family through the
  model's own forward only.
"""

import torch
from torch import nn
from transformers import LlamaModel, LlamaPreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutputWithPast


class InternLM2ForRewardModel(LlamaPreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = LlamaModel(config)
        self.v_head = nn.Linear(config.hidden_size, 1, bias=False)
        self.reward_token_id = config.reward_token_id
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        values = self.v_head(hidden).squeeze(-1)
        ends = attention_mask.cumsum(dim=1).argmax(dim=1).view(-1, 1)
        return SequenceClassifierOutputWithPast(logits=torch.gather(values, 1, ends))
