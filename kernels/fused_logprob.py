"""Log-probabilities of target tokens under a language-model head, without materialising the logits.

A sweep's log-probability head needs log p(target) = logit[target] - logsumexp(logits) at every position of
every row. The plain path materialises rows x positions x vocabulary logits (3 x 256k floats per row for
Gemma); this one walks the vocabulary in chunks, keeping a running max and sum of exponentials per position
(the online log-sum-exp of Liger-Kernel's fused linear cross-entropy), and picks the target's logit from the
chunk that holds it. Peak extra memory: positions x chunk instead of positions x vocabulary.

Shapes: hidden [N, d] (positions flattened), weight [V, d], targets [N] -> [N] float32.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

Transform = Callable[[Tensor], Tensor]  # elementwise, monotone logit transform (soft-cap, scale); identity if None


def reference_token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None,
                             transform: Transform | None = None) -> Tensor:
    logits = torch.nn.functional.linear(hidden, weight, bias).float()
    if transform is not None:
        logits = transform(logits)
    return torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]


def fused_token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, bias: Tensor | None = None,
                         transform: Transform | None = None, chunk: int = 8192) -> Tensor:
    n, vocab = hidden.shape[0], weight.shape[0]
    running_max = torch.full((n,), -float("inf"), device=hidden.device)
    running_sum = torch.zeros(n, device=hidden.device)
    target_logit = torch.empty(n, device=hidden.device)
    for start in range(0, vocab, chunk):
        stop = min(start + chunk, vocab)
        logits = torch.nn.functional.linear(hidden, weight[start:stop], None if bias is None else bias[start:stop])
        logits = logits.float()  # [n, chunk]
        if transform is not None:
            logits = transform(logits)
        chunk_max = logits.amax(1)
        new_max = torch.maximum(running_max, chunk_max)
        running_sum = running_sum * torch.exp(running_max - new_max) + torch.exp(logits - new_max[:, None]).sum(1)
        running_max = new_max
        inside = (targets >= start) & (targets < stop)
        if inside.any():
            rows = inside.nonzero()[:, 0]
            target_logit[rows] = logits[rows, targets[rows] - start]
    return target_logit - (running_max + torch.log(running_sum))
