"""Each kernel equals its plain reference on random inputs."""

import dataclasses

import pytest
import torch

from probe.kernels.fused_logprob import fused_token_logprobs, reference_token_logprobs

pytestmark = pytest.mark.parity


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
    from probe.core.engine import PrefixScorer
    from probe.core.heads import LogprobHead
    from probe.core.template import response_conversation, split_template

    for name in ("llama-lm", "gemma2-lm"):
        lm = tiny_models[name]
        split = split_template(lm.tokenizer, response_conversation("What is best?"))
        rows = [[t, *split.suffix_ids] for t in range(0, len(lm.tokenizer), 50)]
        plain = PrefixScorer(lm.model, LogprobHead(lm.model), split.prefix_ids).score(rows)
        fused = PrefixScorer(lm.model, LogprobHead(lm.model, fused=True), split.prefix_ids).score(rows)
        torch.testing.assert_close(fused, plain, atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("name,mode", [("llama-rm", "reward"), ("gemma2-rm", "reward"), ("gemma2-lm", "logprob"),
                                       ("armo-like", "reward"), ("llama-lm", "judge"), ("qwen2-rm", "reward"),
                                       ("qwen3-rm", "reward"), ("qwen3-lm", "logprob"), ("gemma3-rm", "reward"),
                                       ("gemma3-lm", "logprob")])
def test_shared_prefix_attention_equals_the_plain_path(tiny_models, name, mode):
    """Gemma-2's sliding window (8) is shorter than the prompt and its soft-caps are on; Gemma 3 mixes sliding and
    full layers with query_pre_attn_scalar scaling; Qwen3 normalises q and k: both paths must agree."""
    import random

    from probe.core.engine import FullSequenceScorer, PrefixScorer
    from probe.core.scoring import ScoringOptions, make_head, prompt_split

    lm = tiny_models[name]
    split = prompt_split(lm, mode, "What, in one word, is the greatest thing ever?", None, ScoringOptions(),
                         len(lm.tokenizer))
    rng = random.Random(1)
    rows = [[rng.randrange(len(lm.tokenizer)) for _ in range(rng.randint(1, 4))] + list(split.suffix_ids)
            for _ in range(20)]
    plain = PrefixScorer(lm.model, make_head(lm, mode), split.prefix_ids, shared_attention=False)
    shared = PrefixScorer(lm.model, make_head(lm, mode), split.prefix_ids, shared_attention=True)
    assert plain.shared is None
    assert shared.shared is not None  # the fast path is really taken for these families
    ref = FullSequenceScorer(lm.model, make_head(lm, mode), split.prefix_ids).score(rows)
    torch.testing.assert_close(shared.score(rows).cpu(), ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(plain.score(rows).cpu(), ref, atol=2e-5, rtol=2e-5)
    assert lm.model.config._attn_implementation != "rm_shared_prefix"  # restored after each forward


def test_shared_prefix_attention_gradients(tiny_models):
    """GCG's gradients through the shared-prefix kernel equal the model's own attention's, to float32's rounding.

    Both float32 gradients are compared with the same model's float64 gradient, each within the first-order bound of
    float32 rounding for a dot product of the hidden size's length at the gradient's scale (n * eps * max|g|): the two
    sum in different orders, and a fixed atol does not travel (torch 2.6 on one CPU put them 14 ulps of max|g| apart,
    torch 2.11 on another 3)."""
    import copy

    from probe.core.engine import PrefixScorer
    from probe.core.scoring import make_head, prompt_split, ScoringOptions

    lm = tiny_models["gemma2-rm"]
    split = prompt_split(lm, "reward", "What is best?", None, ScoringOptions(), len(lm.tokenizer))
    rows = torch.tensor([[5, 6, *split.suffix_ids]] * 2, device=lm.model.device)
    wide = dataclasses.replace(lm, model=copy.deepcopy(lm.model).double())

    def grad(loaded, shared):
        sc = PrefixScorer(loaded.model, make_head(loaded, "reward"), split.prefix_ids, shared_attention=shared)
        emb = loaded.model.get_input_embeddings()(rows).detach().requires_grad_(True)
        sc.score_embeds(emb, rows).sum().backward()
        return emb.grad

    exact = grad(wide, False)
    assert exact.dtype == torch.float64 and exact.abs().max() > 1  # a gradient worth comparing
    bound = lm.model.config.hidden_size * torch.finfo(torch.float32).eps * exact.abs().max()
    plain, shared = (grad(lm, s).double() for s in (False, True))
    assert (plain - exact).abs().max() < bound  # the model's own path: float32 rounding of the exact gradient
    assert (shared - exact).abs().max() < bound  # the kernel: the same, summed in its own order
