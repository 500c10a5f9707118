"""A stand-in, written for rm-probe's tests, for WorldPM's remote reward class (``Qwen/WorldPM-72B``'s modelling file
is not readable offline), with what a loader and a reader meet in it, as the WorldPM card describes its use:

* it is registered under ``AutoModel`` in the config's ``auto_map`` (the card loads ``AutoModel`` with
  ``trust_remote_code=True``);
* ``forward(input_ids)`` returns a tuple whose first element is the score, shape [batch, 1] (the card reads
  ``model(input_ids=...)[0].cpu().item()``);
* a Qwen2 backbone as ``self.model`` and a Linear-ReLU-Linear ``score`` head (Qwen2.5-Math-RM's ``modeling_qwen2_rm.py``
  layout) read at the last token.

rm-probe reads this family through the model's own forward only, so the class's own pooling is what runs.
"""

from torch import nn
from transformers import Qwen2Model, Qwen2PreTrainedModel


class WorldPMStandInForRewardModel(Qwen2PreTrainedModel):
    def __init__(self, config):
        super().__init__(config)
        self.model = Qwen2Model(config)
        self.score = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.ReLU(),
                                   nn.Linear(config.hidden_size, 1))
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def forward(self, input_ids=None, attention_mask=None, **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return (self.score(hidden[:, -1]),)
