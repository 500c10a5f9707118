"""Checkpoints recognised by what they are: a tiny QRM-Llama3.1 checkpoint with the authors' kind of remote code
(tests/remote_code/modeling_qrm_llama31.py: the removed LLAMA_INPUTS_DOCSTRING import, a from_pretrained override
that forces flash-attention and drops every argument) on the real Llama 3.1 tokenizer, loaded from a Hugging
Face cache snapshot path, from a folder with another name, and under an unknown class name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from probe.core.engine import FullSequenceScorer, PrefixScorer
from probe.models.loading import load_model
from probe.core.scoring import make_head
from probe.core.template import response_conversation, split_template
from tests import real_tokenizers
from tests.tiny import F32_FORWARD

pytestmark = pytest.mark.slow
PROMPT = "What, in one word, is the greatest thing ever?"
REMOTE = Path(__file__).resolve().parents[1] / "remote_code" / "modeling_qrm_llama31.py"


@pytest.fixture(scope="module")
def qrm_folder(tmp_path_factory):
    """A saved tiny QRM-Llama3.1 (5 objectives x 5 quantiles, BatchNorm gating with non-trivial statistics)."""
    import importlib.util

    from transformers import AutoTokenizer, LlamaConfig

    root = tmp_path_factory.mktemp("qrm")
    tok = AutoTokenizer.from_pretrained(real_tokenizers.build("llama3.1", root / "tok"))
    import transformers.models.llama.modeling_llama as llama

    llama.LLAMA_INPUTS_DOCSTRING = getattr(llama, "LLAMA_INPUTS_DOCSTRING", "")  # to build it here
    spec = importlib.util.spec_from_file_location("modeling_qrm_llama31", REMOTE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    del llama.LLAMA_INPUTS_DOCSTRING  # as in transformers 5: the loader's shim must put it back
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=tok.convert_tokens_to_ids("<|finetune_right_pad_id|>"),
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, num_labels=1, num_objectives=5,
                      num_quantiles=5, gating_hidden_dim=16, gating_n_hidden=3)
    torch.manual_seed(0)
    model = module.LlamaForRewardModelWithGating31(cfg).eval()
    with torch.no_grad():
        for layer in model.gating.layers:
            if isinstance(layer, torch.nn.BatchNorm1d):
                layer.running_mean.normal_(0, 0.3)
                layer.running_var.uniform_(0.5, 2.0)
        model.regression_layer.weight.normal_(0, 1.0)
    folder = root / "models--nicolinho--QRM-Llama3.1-8B" / "snapshots" / "0123456789abcdef"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    shutil.copy(REMOTE, folder / "modeling_qrm_llama31.py")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["LlamaForRewardModelWithGating31"]
    config["auto_map"] = {"AutoModelForSequenceClassification": "modeling_qrm_llama31.LlamaForRewardModelWithGating31"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def _cached_equals_own_forward(lm) -> None:
    split = split_template(lm.tokenizer, response_conversation(PROMPT))
    head = make_head(lm, "reward")
    ids = [128001, 128009, 128006] + list(range(1000, 60000, 3000))
    rows = [[t, *split.suffix_ids] for t in ids]
    fast = PrefixScorer(lm.model, head, split.prefix_ids).score(rows).cpu()
    ref = FullSequenceScorer(lm.model, head, split.prefix_ids, batch_size=1).score(rows)
    torch.testing.assert_close(fast, ref, atol=2e-5, rtol=2e-5)
    assert ref.std() > 1e-4
    # the reference is the remote code's own forward: its score output for one whole conversation
    full = torch.tensor([split.full_ids([ids[0]])])
    own = lm.model(input_ids=full).score
    assert own.shape == (1, 1) and float(own[0, 0]) == pytest.approx(float(ref[0]), **F32_FORWARD)


def test_snapshot_path_is_recognised_and_its_remote_code_loads(qrm_folder, tmp_path, caplog):
    lm = load_model(str(qrm_folder), kind="reward", device="cpu", trust_remote_code=True)
    assert lm.spec.name == "nicolinho/QRM-Llama3.1-8B" and lm.spec_match == "snapshot path"
    assert "overrides from_pretrained" in caplog.text  # QRM's override would force flash-attention
    assert lm.model.dtype == torch.float32  # our dtype held, although the override drops it
    _cached_equals_own_forward(lm)
    from probe.commands.score import main

    assert main(["--rm", str(qrm_folder), "--trust-remote-code", "--device", "cpu", "--limit", "128",
                 "--prompt", PROMPT, "--output", str(tmp_path), "--no-progress", "--top", "3"]) == 0
    meta = json.loads(next(tmp_path.glob("*/exhaustive_*/meta.json")).read_text())
    assert meta["model"]["spec_match"] == "snapshot path" and meta["self_check"]["greatest"]["max_abs_diff"] < 1e-4


def test_other_folder_names_and_class_names(qrm_folder, tmp_path):
    renamed = tmp_path / "my-reward-model"
    shutil.copytree(qrm_folder, renamed)
    lm = load_model(str(renamed), kind="reward", device="cpu", trust_remote_code=True)
    assert lm.spec.name == "LlamaForRewardModelWithGating31" and lm.spec_match == "architecture"
    _cached_equals_own_forward(lm)
    unknown = tmp_path / "unknown-class"
    shutil.copytree(qrm_folder, unknown)
    cfg = json.loads((unknown / "config.json").read_text())
    cfg["architectures"] = ["SomeLabsGatedRewardModel"]
    (unknown / "config.json").write_text(json.dumps(cfg))
    lm = load_model(str(unknown), kind="reward", device="cpu", trust_remote_code=True)
    assert lm.spec_match == "structure" and lm.spec.reader == "gated"
    _cached_equals_own_forward(lm)


def test_remote_code_without_the_flag_is_refused(qrm_folder, capsys):
    from probe.commands.score import main

    assert main(["--rm", str(qrm_folder), "--device", "cpu", "--limit", "8", "--no-progress"]) == 2
    assert "--trust-remote-code" in capsys.readouterr().err


def test_lookup_by_snapshot_repo_id():
    from probe.models.registry import REGISTRY, lookup, repo_id_of

    snap = "/home/u/.cache/huggingface/hub/models--Skywork--Skywork-Reward-V2-Qwen3-8B/snapshots/ab12"
    assert repo_id_of(snap) == "Skywork/Skywork-Reward-V2-Qwen3-8B"
    assert lookup(snap) == (REGISTRY["Skywork/Skywork-Reward-V2-Qwen3-8B"], "snapshot path")
    assert lookup("/x/y", ["LlamaForSequenceClassificationWithNormal_Weights"])[0].reader == "forward"
    assert lookup("/x/y", ["LlamaForRewardModelWithGating"])[0].reader == "gated"
