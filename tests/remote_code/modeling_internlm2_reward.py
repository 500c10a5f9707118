"""A stand-in, written for rm-probe's tests, for InternLM2's reward-model remote code (``internlm/internlm2-7b-reward``,
``modeling_internlm2.py``: ``InternLM2ForRewardModel``), with what a loader and a reader meet in it:

* it is registered under ``AutoModel`` in the config's ``auto_map`` (not as a sequence classifier);
* ``forward`` asserts that every row ends with ``config.reward_token_id`` and returns
  ``SequenceClassifierOutputWithPast(logits=v_head(h)[:, -1])``: a bias-free linear head on the last position;
* the backbone is ``self.model``. InternLM2's own backbone (``InternLM2Model``, remote too: fused ``wqkv``, ``w1``/
  ``w2``/``w3``) is not at hand offline; a ``LlamaModel`` of the same shape stands in, which is why rm-probe reads this
  family through the model's own forward only.
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
        assert input_ids[:, -1].eq(self.reward_token_id).all().item(), "The last token of input_ids mast be the reward token"
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return SequenceClassifierOutputWithPast(logits=self.v_head(hidden)[:, -1].view(-1, 1))
