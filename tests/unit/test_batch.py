"""The batch runner skips complete jobs, resumes unfinished ones and starts new ones; dry runs need no weights."""

import json

import pytest
import yaml

from probe.commands.batch import main, read_jobs, state
from probe.errors import DataFormatError
from probe.runs.rundir import RunDir


def _jobs(tmp_path, tiny_dirs, n_models=2):
    data = {"defaults": {"device": "cpu", "output": str(tmp_path / "out"), "shard_size": 256, "progress": False,
                         "verify": 2},
            "prompts": ["What, in one word, is the greatest thing ever?"],
            "models": [{"rm": tiny_dirs["rm"]}, {"rm": tiny_dirs["rm3"], "label_index": 1}][:n_models]}
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_runs_then_skips_then_resumes(tmp_path, tiny_dirs, capsys, monkeypatch):
    path = _jobs(tmp_path, tiny_dirs)
    assert main([str(path)]) == 0
    assert capsys.readouterr().out.count("[run]") == 2
    assert main([str(path)]) == 0
    assert capsys.readouterr().out.count("[skip]") == 2
    runs = sorted((tmp_path / "out").glob("*/exhaustive_*"))
    assert len(runs) == 2
    # make the first job unfinished: it must be resumed in place, not started again
    meta = json.loads((runs[0] / "meta.json").read_text())
    meta["status"] = "running"
    (runs[0] / "meta.json").write_text(json.dumps(meta))
    RunDir(runs[0]).shard_path("greatest", 2).unlink()
    assert main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "[resume]" in out and out.count("[skip]") == 1
    assert sorted((tmp_path / "out").glob("*/exhaustive_*")) == runs
    assert json.loads((runs[0] / "meta.json").read_text())["status"] == "complete"


def test_bad_job_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - rm: x\n    colour: red\n")
    with pytest.raises(DataFormatError, match=r"models\[1\]: unknown settings \['colour'\]"):
        read_jobs(bad)


def test_state_distinguishes_jobs(tmp_path, tiny_dirs):
    jobs = read_jobs(_jobs(tmp_path, tiny_dirs))
    assert [state(j)[0] for j in jobs] == ["new", "new"]


def test_dry_run_of_the_papers_ten_models(capsys):
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "experiments" / "paper_ten_rms.yaml"
    assert len(read_jobs(path)) == 10
    assert main([str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert out.count("[new]") == 10 and out.count("B parameters") == 10 and "error" not in out
    assert "27.23 B parameters" in out and "Gemma2Config" in out and "LlamaConfig" in out
