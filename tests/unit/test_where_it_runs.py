"""Where users run rm-probe: a GPU that cannot run, a version outside the tested span, weights loaded straight onto
their device, and the test suite's own ``--device cuda``."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from probe.errors import ModelLoadError
from probe.models import loading
from probe.models.loading import cuda_problem, resolve_device

ROOT = Path(__file__).resolve().parents[2]


def test_a_cpu_only_torch_asked_for_cuda_says_what_to_install(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    for device in ("cuda", "cuda:0"):
        with pytest.raises(ModelLoadError) as err:
            resolve_device(device)
        assert "CPU-only build" in str(err.value) and "download.pytorch.org/whl/cu" in str(err.value)
        assert "\n" not in str(err.value)


def test_a_cuda_build_the_driver_cannot_run_is_named_with_the_drivers_reason(monkeypatch):
    """torch 2.11+'s default wheels are built for CUDA 13 (driver 580+): on an older driver ``is_available`` is False
    with a warning that says why; that reason is in the one line."""
    import warnings

    monkeypatch.setattr(torch.version, "cuda", "13.0")

    def unavailable():
        warnings.warn("CUDA initialization: The NVIDIA driver on your system is too old (found version 12040).")
        return False

    monkeypatch.setattr(torch.cuda, "is_available", unavailable)
    with pytest.raises(ModelLoadError, match=r"built for CUDA 13\.0\) cannot use a GPU here \(CUDA initialization: "
                                             r"The NVIDIA driver on your system is too old"):
        resolve_device("cuda")


def test_no_driver_at_all_is_named_from_cuda_init(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def init():
        raise RuntimeError("Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU")

    monkeypatch.setattr(torch.cuda, "init", init)
    assert "Found no NVIDIA driver on your system" in cuda_problem()


def test_a_gpu_index_past_the_last_device_is_refused(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.6")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ModelLoadError, match=r"shows 2 CUDA device\(s\) \(cuda:0 to cuda:1\)"):
        resolve_device("cuda:2")


def test_auto_on_a_machine_whose_gpu_this_torch_cannot_use_warns(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(loading, "cuda_problem", lambda: "torch X cannot use a GPU here")
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda self: True if str(self) == "/dev/nvidia0" else real_exists(self))
    with caplog.at_level(logging.WARNING, logger="probe.models.loading"):
        assert resolve_device("auto") == torch.device("cpu")
    assert "although an NVIDIA GPU is present: torch X cannot use a GPU here" in caplog.text


def test_the_command_line_says_it_in_one_line_and_exits_2(tiny_dirs, tmp_path):
    if cuda_problem() is None:
        pytest.skip("this machine can run CUDA")
    out = subprocess.run([sys.executable, "-m", "probe.exhaustive", "--rm", tiny_dirs["rm"], "--device", "cuda",
                          "--limit", "8", "--output", str(tmp_path / "run")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "--device cuda:" in out.stderr and "install" in out.stderr
    assert not [f for f in (tmp_path / "run").rglob("*") if f.is_file()]  # no run folder, nothing half-written


def test_pytest_device_cuda_without_a_usable_gpu_fails_instead_of_skipping(tmp_path):
    """``make gpu-test`` on a machine whose torch cannot run CUDA: a usage error with the reason (exit 4), never
    every GPU test skipped and exit 0."""
    if cuda_problem() is None:
        pytest.skip("this machine can run CUDA")
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "--device", "cuda", "-q",
                          "-p", "no:cacheprovider"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 4, out.stdout + out.stderr
    assert "--device cuda:" in out.stderr and "install" in out.stderr and "skipped" not in out.stdout


@pytest.mark.parametrize("package,version,warn", [
    ("transformers", "4.57.1", True), ("transformers", "5.1.0", True), ("transformers", "5.2.0", False),
    ("transformers", "5.17.0", False),
    ("transformers", "5.24.3", False), ("transformers", "5.25.0", True), ("transformers", "6.0.0", True),
    ("torch", "2.5.1", True), ("torch", "2.6.0", False), ("torch", "2.11.0+cu130", False), ("torch", "2.13.0+cpu", False),
    ("torch", "2.15.0", True)])
def test_the_tested_span(package, version, warn):
    from probe.versions import outside

    assert outside(package, version) == warn


def test_a_version_outside_the_span_is_said_once_per_process(monkeypatch, caplog):
    import transformers

    from probe import versions

    versions.check_versions.cache_clear()
    monkeypatch.setattr(transformers, "__version__", "5.40.0")
    try:
        with caplog.at_level(logging.WARNING, logger="probe.versions"):
            first, second = versions.check_versions(), versions.check_versions()
    finally:
        versions.check_versions.cache_clear()
    assert first == second and len(first) == 1
    assert "transformers 5.40.0 is outside the versions rm-probe is tested with (5.2.0 to 5.24.x" in caplog.text
    assert caplog.text.count("is outside") == 1


def test_the_tested_span_is_the_ci_matrix_and_pyprojects_lower_bounds():
    """probe/versions.py, .ci/matrix/lowest.txt and pyproject.toml's lower bounds name the same lowest versions, and
    the GPU machine's set lies inside the span."""
    import re
    import tomllib

    from probe.versions import TESTED, outside

    def pins(name):
        text = (ROOT / ".ci" / "matrix" / name).read_text()
        return dict(re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", text, flags=re.M))

    lowest, gpu = pins("lowest.txt"), pins("gpu-machine.txt")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    floors = dict(re.match(r"([A-Za-z0-9_.-]+)>=([^,;\s]+)", d).groups() for d in deps)
    for package, (low, _) in TESTED.items():
        assert lowest[package] == low == floors[package]
        assert not outside(package, gpu[package])
    assert {k: v for k, v in floors.items()} == {k: lowest[k] for k in floors}  # every floor is tested


def test_weights_load_straight_onto_the_target_device(tiny_dirs, monkeypatch):
    """``from_pretrained`` is given the one device as its device map (each tensor read there, no whole copy in host
    memory first); the CPU keeps transformers' default."""
    seen = {}
    from transformers import PreTrainedModel

    original = PreTrainedModel.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        seen.update(kwargs)
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(spy))
    lm = loading.load_model(tiny_dirs["rm"], kind="reward", device="cpu")
    assert "device_map" not in seen and lm.device.type == "cpu"
    placement = loading._placement(lm.model.config, lm.spec, torch.device("cuda:1"))
    assert placement["device_map"] == torch.device("cuda:1")
    assert loading._placement(lm.model.config, lm.spec, "auto")["device_map"] == "auto"


def test_families_scored_by_their_own_forward_run_the_planned_batch_whole(tiny_models, monkeypatch):
    """Encoders and PairRM (the full-sequence path): rows of one length together, a tile's worth of token rows a
    forward (every forward of one shape per length, whatever the batch: probe/core/invariance.py), and the scores
    of one sequence at a time."""
    from probe.core.engine import FullSequenceScorer
    from probe.core.scoring import ScoringOptions, make_head
    from probe.core.template import response_conversation, split_template

    lm = tiny_models["llama-rm"]
    head = make_head(lm, "reward", ScoringOptions())
    split = split_template(lm.tokenizer, response_conversation("What, in one word, is the greatest thing ever?"))
    rows = [[t] * (1 + t % 3) + list(split.suffix_ids) for t in range(5, 205)]  # 200 rows of three lengths
    calls = []
    original = type(head).own_forward

    def counting(self, model, ids, n_prefix):
        calls.append(ids.shape[0])
        return original(self, model, ids, n_prefix)

    monkeypatch.setattr(type(head), "own_forward", counting)
    whole = FullSequenceScorer(lm.model, head, split.prefix_ids, batch_size=None).score(rows)
    from probe.core.invariance import rows_per_forward, tail_rows

    p, want = len(split.prefix_ids), []
    for n, count in Counter(len(r) for r in rows).items():  # 67, 67 and 66 rows of three lengths
        per = rows_per_forward(p + n, "cpu")
        want += [per + tail_rows(p + n, "cpu")] * -(-count // per)
    assert sorted(calls) == sorted(want) and len(want) >= 3
    with torch.inference_mode():  # each row by itself through the model's own forward, in the rows' order
        one = torch.cat([original(head, lm.model, torch.tensor([[*split.prefix_ids, *r]]), len(split.prefix_ids))
                         .float() for r in rows])
    torch.testing.assert_close(whole, one, atol=2e-5, rtol=2e-5)
    assert one.std() > 1e-3  # the rows' scores differ: a wrong order would show


def test_without_wordfreq_the_word_flag_is_empty_and_said_and_words_only_gcg_refused(tokenizers, monkeypatch, caplog):
    """The GPU machine has no wordfreq: a vocabulary table still builds (scores need no word list), its W flag empty
    (null, not False), said once; what needs the flag says so in one line."""
    from probe.core import vocab as vocab_mod
    from probe.core.gcg import allowed_tokens
    from probe.errors import ProbeError

    monkeypatch.setitem(sys.modules, "wordfreq", None)  # import wordfreq raises ImportError
    vocab_mod._warn_no_wordfreq.cache_clear()
    with caplog.at_level(logging.WARNING, logger="probe.core.vocab"):
        table = vocab_mod.build_vocab_table(tokenizers["llama3"])
        vocab_mod.build_vocab_table(tokenizers["gemma"])
    assert table["is_word"].null_count() == table.height and table["is_alpha"].sum() > 100
    assert caplog.text.count("wordfreq is not installed") == 1
    assert allowed_tokens(table, "ascii", False).sum() > 100
    with pytest.raises(ProbeError, match="--allowed words: the W flag is empty here .wordfreq is not installed"):
        allowed_tokens(table, "words", False)
    vocab_mod._warn_no_wordfreq.cache_clear()


def test_a_run_made_without_wordfreq_reports_and_regains_its_word_flag(tiny_dirs, tmp_path, monkeypatch):
    """A sweep on the GPU machine (no wordfreq) writes an empty W flag; its report still builds there, and where
    wordfreq is installed the readers recompute the flag from the decoded tokens."""
    from probe.analysis.sweeps import upgrade_vocab_columns
    from probe.commands.score import ScoreVocabConfig, run
    from probe.core import vocab as vocab_mod
    from probe.report.single import report_data

    monkeypatch.setitem(sys.modules, "wordfreq", None)
    vocab_mod._warn_no_wordfreq.cache_clear()
    rd = run(ScoreVocabConfig(rm=tiny_dirs["rm"], prompt=("What is best?",), output=str(tmp_path / "out"),
                              device="cpu", limit=300, progress=False))
    raw = rd.read_table("vocab.parquet")
    assert raw["is_word"].null_count() == raw.height
    assert report_data(rd)["prompts"]  # the page's data builds with the flag empty
    monkeypatch.delitem(sys.modules, "wordfreq")
    vocab_mod._warn_no_wordfreq.cache_clear()
    again = upgrade_vocab_columns(raw)
    want = vocab_mod.build_vocab_table(vocab_mod_tokenizer(tiny_dirs["rm"]), n_ids=raw.height)["is_word"]
    assert again["is_word"].null_count() == 0 and again["is_word"].to_list() == want.to_list()
    assert again["is_word"].sum() > 10 and again.columns == raw.columns


def vocab_mod_tokenizer(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)
