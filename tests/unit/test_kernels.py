"""Each kernel equals its plain reference on random inputs."""

import pytest
import torch

from kernels.fused_logprob import fused_token_logprobs, reference_token_logprobs


@pytest.mark.parametrize("vocab,chunk", [(1000, 128), (1000, 1000), (1037, 100), (50, 8192)])
@pytest.mark.parametrize("cap", [None, 5.0])
def test_fused_logprob_equals_reference(vocab, chunk, cap):
    g = torch.Generator().manual_seed(vocab + chunk)
    hidden = torch.randn(33, 48, generator=g) * 3
    weight = torch.randn(vocab, 48, generator=g)
    bias = torch.randn(vocab, generator=g)
    targets = torch.randint(0, vocab, (33,), generator=g)
    targets[:3] = torch.tensor([0, vocab - 1, chunk % vocab])  # edges of the first, last and a middle chunk
    transform = None if cap is None else (lambda x: torch.tanh(x / cap) * cap)
    ref = reference_token_logprobs(hidden, weight, targets, bias, transform)
    got = fused_token_logprobs(hidden, weight, targets, bias, transform, chunk=chunk)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-5)


def test_fused_logprob_head_in_the_engine(tiny_models):
    from probe.engine import PrefixScorer
    from probe.heads import LogprobHead
    from probe.template import response_conversation, split_template

    for name in ("llama-lm", "gemma2-lm"):
        lm = tiny_models[name]
        split = split_template(lm.tokenizer, response_conversation("What is best?"))
        rows = [[t, *split.suffix_ids] for t in range(0, len(lm.tokenizer), 50)]
        plain = PrefixScorer(lm.model, LogprobHead(lm.model), split.prefix_ids).score(rows)
        fused = PrefixScorer(lm.model, LogprobHead(lm.model, fused=True), split.prefix_ids).score(rows)
        torch.testing.assert_close(fused, plain, atol=1e-4, rtol=1e-5)
