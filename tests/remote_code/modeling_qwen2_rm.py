"""A stand-in, written for rm-probe's tests, for the remote code of Qwen's process reward models
(``Qwen/Qwen2.5-Math-PRM-7B``, ``-72B``, ``Qwen2.5-Math-7B-PRM800K``: ``modeling_qwen2_rm.py``,
``Qwen2ForProcessRewardModel``), built from that file's description as its users' copies show it (the Hub file
itself is not at hand offline):

* registered under ``AutoModel`` in the config's ``auto_map``;
* ``self.model`` a ``Qwen2Model``; ``self.score = Sequential(Linear(hidden, hidden), ReLU(), Linear(hidden,
  num_labels))`` with ``num_labels`` 2, applied at every position;
* ``forward`` returns ``TokenClassifierOutput(logits=score(last hidden states))``, ``[batch, length, 2]``: the model
  card's ``outputs[0]``.
"""

from torch import nn
from transformers import Qwen2Model, Qwen2PreTrainedModel
from transformers.modeling_outputs import TokenClassifierOutput


class Qwen2ForProcessRewardModel(Qwen2PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = Qwen2Model(config)
        self.score = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.ReLU(),
                                   nn.Linear(config.hidden_size, self.num_labels))
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return TokenClassifierOutput(logits=self.score(hidden))
