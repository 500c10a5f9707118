"""Persona grids (issue 35): ``--systems FILE`` crosses the prompts with system prompts; each cell equals a run with
that one ``--system``; ``probe analyze personas`` compares each persona with the control by numbers the test
recomputes with scipy; the report shows the grid."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from probe.commands.analyze import main as analyze_main
from probe.commands.report import main as report_main
from probe.commands.score import main as score_main
from probe.core.prompts import Prompt, persona_grid, read_systems_file
from probe.errors import DataFormatError
from tests.unit.test_stats import _rbo_brute

PROMPT = "What, in one word, is the greatest thing ever?"
SYSTEMS = {"pirate": "You are a pirate.", "monk": "You are a calm monk.", "plain": None}


def _systems_file(tmp_path: Path, control: str = "plain") -> Path:
    path = tmp_path / "systems.yaml"
    path.write_text("pirate: You are a pirate.\nmonk: You are a calm monk.\n" + f"{control}:\n")
    return path


def _run(root: Path) -> str:
    (found,) = [str(p) for p in root.glob("*/*_*")]
    return found


def test_the_grid_crosses_prompts_and_personas_control_first(tmp_path):
    systems = read_systems_file(_systems_file(tmp_path))
    assert systems == SYSTEMS  # an empty value: no system message
    grid = persona_grid([Prompt("a", "A?"), Prompt("b", "B?")], systems, "plain")
    assert [p.key for p in grid] == ["a@plain", "a@pirate", "a@monk", "b@plain", "b@pirate", "b@monk"]
    assert grid[1].system_or("ignored") == "You are a pirate." and grid[0].system_or("ignored") is None
    assert Prompt("a", "A?").system_or("run's own") == "run's own"
    assert grid[4].meta() == {"persona": "pirate", "base_prompt": "b"}


@pytest.mark.parametrize("text,needle", [("pirate: x\nmonk: y\n", "no persona 'control'"),
                                         ("control:\n", "only the control"),
                                         ("control:\nbad key: x\n", "letters, digits"),
                                         ("control:\npirate: [1, 2]\n", "not a system prompt"),
                                         ("- a\n- b\n", "mapping")])
def test_bad_systems_files_are_one_line(tmp_path, text, needle):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(DataFormatError, match=needle):
        persona_grid([Prompt("a", "A?")], read_systems_file(path))


@pytest.mark.parametrize("args,needle", [(["--system", "x"], "--system and --systems"),
                                         (["--control", "plain"], "--control names the control")])
def test_conflicting_flags_are_one_line(tmp_path, capsys, args, needle):
    systems = [] if "--control" in args else ["--systems", str(_systems_file(tmp_path))]
    assert score_main(["--prompt", PROMPT, *systems, *args, "--output", str(tmp_path / "o")]) == 2
    assert needle in capsys.readouterr().err


@pytest.fixture(scope="module")
def grid_run(tiny_dirs, tmp_path_factory):
    """A sweep of the first 400 ids under three personas (the control 'plain', no system message)."""
    root = tmp_path_factory.mktemp("grid")
    systems = _systems_file(root)
    assert score_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--prompt", PROMPT, "--systems", str(systems),
                       "--control", "plain", "--limit", "400", "--device", "cpu", "--no-progress",
                       "--output", str(root / "grid")]) == 0
    return root, _run(root / "grid")


def test_each_cell_equals_a_run_with_that_system(tiny_dirs, grid_run):
    root, run = grid_run
    meta = json.loads((Path(run) / "meta.json").read_text())
    assert list(meta["prompts"]) == ["greatest@plain", "greatest@pirate", "greatest@monk"]
    assert meta["personas"]["control"] == "plain" and meta["personas"]["systems"] == SYSTEMS
    assert meta["prompts"]["greatest@monk"]["system"] == "You are a calm monk."
    grid = pl.read_parquet(Path(run) / "scores.parquet")
    for key, system in (("greatest@pirate", ["--system", "You are a pirate."]), ("greatest@plain", [])):
        out = root / key.replace("@", "_")
        assert score_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--prompt", PROMPT, *system, "--limit", "400",
                           "--device", "cpu", "--no-progress", "--output", str(out)]) == 0
        alone = pl.read_parquet(Path(_run(out)) / "scores.parquet").sort("token_id")
        cell = grid.filter(pl.col("prompt_key") == key).sort("token_id")
        np.testing.assert_array_equal(cell["score"].to_numpy(), alone["score"].to_numpy())
    pirate = grid.filter(pl.col("prompt_key") == "greatest@pirate")["score"].to_numpy()
    plain = grid.filter(pl.col("prompt_key") == "greatest@plain")["score"].to_numpy()
    assert not np.allclose(pirate, plain)  # the system prompt reached the model


def test_analyze_personas_against_scipy(grid_run, tmp_path, capsys):
    _, run = grid_run
    assert analyze_main(["personas", run, "--out", str(tmp_path / "a"), "--top", "3", "--rbo-p", "0.8"]) == 0
    printed = capsys.readouterr().out
    assert "Kendall tau-b, prompt x persona" in printed and "rising most" in printed
    table = pl.read_csv(tmp_path / "a" / "personas.csv")
    assert table["persona"].to_list() == ["pirate", "monk"] and "rbo_top_p0.8" in table.columns
    scores = pl.read_parquet(Path(run) / "scores.parquet")
    wide = (scores.filter(pl.col("prompt_key") == "greatest@plain").select("token_id", pl.col("score").alias("c"))
            .join(scores.filter(pl.col("prompt_key") == "greatest@monk").select("token_id", pl.col("score").alias("m")),
                  on="token_id")).sort("token_id")
    c, m = wide["c"].to_numpy().astype(float), wide["m"].to_numpy().astype(float)
    row = table.filter(pl.col("persona") == "monk").row(0, named=True)
    assert row["n"] == 400
    assert row["kendall_tau_b"] == pytest.approx(stats.kendalltau(c, m).statistic, abs=1e-9)
    assert row["spearman"] == pytest.approx(stats.spearmanr(c, m).statistic, abs=1e-9)
    assert row["mean_shift"] == pytest.approx(m.mean() - c.mean(), rel=1e-5)
    assert row["same_best"] == (wide["token_id"][int(np.argmax(c))] == wide["token_id"][int(np.argmax(m))])
    assert len(set(c)) == len(set(m)) == 400  # no ties: RBO does not depend on the order of the rows
    for side, bottom in (("top", False), ("bottom", True)):
        assert row[f"rbo_{side}_p0.8"] == pytest.approx(_rbo_brute(c, m, 0.8, bottom=bottom), abs=1e-12), side
    assert row["rbo_top_p0.8"] != pytest.approx(row["rbo_bottom_p0.8"], abs=1e-3)
    moved = json.loads((tmp_path / "a" / "movers.json").read_text())["greatest@monk"]
    dz = (m - m.mean()) / m.std() - (c - c.mean()) / c.std()
    words = scores.filter(pl.col("prompt_key") == "greatest@plain").sort("token_id")["is_word"].to_numpy()
    assert wide["token_id"].is_sorted()
    assert moved["up"][0]["dz"] == pytest.approx(dz[words].max(), rel=1e-4)
    assert moved["down"][0]["dz"] == pytest.approx(dz[words].min(), rel=1e-4)
    assert len(moved["up"]) == 3


def test_report_shows_the_grid(grid_run, tmp_path):
    _, run = grid_run
    assert report_main([run, "--out", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "Persona grid" in page and "You are a calm monk." in page
    # the tiny Llama 3 template writes no system block without a system message
    assert "plain</b>: no system message, and the chat template wrote no system text" in page


def test_the_control_says_what_the_template_wrote_in_its_place(tmp_path, capsys):
    """SmolLM2's template writes its own system prompt where the conversation has none: the run records it, and the
    analysis and the report say that this is the control's system text."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from probe.core.template import template_system_text
    from probe.models.embedded import packaged_dir
    from tests import real_tokenizers, tiny

    smol = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    tok = AutoTokenizer.from_pretrained(packaged_dir("smollm2"))
    assert template_system_text(tok, PROMPT) == smol
    found = {name: template_system_text(real_tokenizers.load(name, tmp_path / name), PROMPT)
             for name in ("qwen2.5", "llama3.1", "gemma3")}
    assert found == {"qwen2.5": "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
                     "llama3.1": "", "gemma3": None}  # Llama 3.1: its date lines, empty; Gemma 3: no system block
    tiny.build(LlamaForCausalLM, tiny.llama_config(tok, hidden_size=32, intermediate_size=64)).save_pretrained(
        tmp_path / "lm")
    tok.save_pretrained(tmp_path / "lm")
    responses = tmp_path / "r.txt"
    responses.write_text("Love\nWar\nThe sea\n")
    assert score_main(["--rm", str(tmp_path / "lm"), "--score", "logprob", "--responses", str(responses), "--prompt",
                       PROMPT, "--systems", str(_systems_file(tmp_path, control="control")), "--device", "cpu",
                       "--no-progress", "--output", str(tmp_path / "o")]) == 0
    run = _run(tmp_path / "o")
    meta = json.loads((Path(run) / "meta.json").read_text())
    assert meta["personas"]["template_system"] == smol and smol in meta["prompts"]["greatest@control"]["prefix_text"]
    assert smol not in meta["prompts"]["greatest@pirate"]["prefix_text"]
    said = f"no system message: the chat template wrote its own default system prompt, {smol!r}"
    capsys.readouterr()
    assert analyze_main(["personas", run, "--out", str(tmp_path / "a")]) == 0
    assert f"the control persona 'control': {said}" in capsys.readouterr().out
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())["summary"]
    assert summary["template_system"] == smol and summary["control_system"] == said
    assert report_main([run, "--out", str(tmp_path / "r.html")]) == 0
    assert f"control</b>: {html.escape(said)}" in (tmp_path / "r.html").read_text()


def test_a_response_grid_and_its_report(tiny_dirs, tmp_path, capsys):
    responses = tmp_path / "r.txt"
    responses.write_text("Love\nWar\nThe sea\nGold\nNothing at all\n")
    systems = _systems_file(tmp_path, control="control")
    assert score_main(["--rm", tiny_dirs["rm"], "--allow-random-head", "--responses", str(responses), "--prompt", PROMPT,
                       "--systems", str(systems), "--device", "cpu", "--no-progress",
                       "--output", str(tmp_path / "o")]) == 0
    run = _run(tmp_path / "o")
    assert analyze_main(["personas", run, "--out", str(tmp_path / "a")]) == 0
    assert "over 5 scored responses" in capsys.readouterr().out
    assert report_main([run, "--out", str(tmp_path / "r.html")]) == 0
    assert "Persona grid" in (tmp_path / "r.html").read_text()


def test_personas_on_a_run_without_a_grid_is_one_line(grid_run, tiny_dirs, tmp_path, capsys):
    out = tmp_path / "o"
    assert score_main(["--rm", tiny_dirs["lm"], "--score", "logprob", "--prompt", PROMPT, "--limit", "50",
                       "--device", "cpu", "--no-progress", "--output", str(out)]) == 0
    capsys.readouterr()
    assert analyze_main(["personas", _run(out), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "not a persona grid" in err and not (tmp_path / "a").exists()


def test_the_api_grid_equals_the_command(tiny_dirs, grid_run):
    import probe
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, run = grid_run
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs["lm"])
    tok = AutoTokenizer.from_pretrained(tiny_dirs["lm"])
    df = probe.sweep(model, tok, {"greatest": PROMPT}, score="logprob", limit=400, verify=0, systems=SYSTEMS,
                     control="plain")
    cli = pl.read_parquet(Path(run) / "scores.parquet")
    for key in ("greatest@plain", "greatest@monk"):
        a = df.filter(pl.col("prompt_key") == key).sort("token_id")["score"].to_numpy()
        b = cli.filter(pl.col("prompt_key") == key).sort("token_id")["score"].to_numpy()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="system and systems"):
        probe.sweep(model, tok, PROMPT, score="logprob", limit=5, system="x", systems=SYSTEMS)


def test_a_persona_that_reverses_the_responses_is_a_reversal(tiny_dirs, tmp_path, capsys):
    """A response grid whose persona scores every response as the control's negative (the order reversed): the
    cells join the responses themselves, not their ranks (issue 49: joined by rank, this read tau 1.0, "same best"
    true and "Love" with Gold's persona score)."""
    responses = ["Love", "War", "The sea", "Gold", "Nothing at all"]
    (tmp_path / "r.txt").write_text("\n".join(responses) + "\n")
    systems = _systems_file(tmp_path, control="control")
    assert score_main(["--rm", tiny_dirs["rm"], "--allow-random-head", "--responses", str(tmp_path / "r.txt"),
                       "--prompt", PROMPT, "--systems", str(systems), "--device", "cpu", "--no-progress",
                       "--output", str(tmp_path / "o")]) == 0
    run = Path(_run(tmp_path / "o"))
    scores = pl.read_parquet(run / "scores.parquet")
    control = dict(scores.filter(pl.col("prompt_key") == "greatest@control").select("response", "score").iter_rows())
    assert len(set(control.values())) == len(responses)
    reversed_ = (scores.filter(pl.col("prompt_key") == "greatest@pirate")
                 .with_columns(pl.col("response").replace_strict(control, return_dtype=pl.Float32).neg().alias("score"))
                 .with_columns(pl.col("score").rank(method="min", descending=True).cast(pl.UInt32).alias("rank"))
                 .sort("rank"))
    scores = pl.concat([scores.filter(pl.col("prompt_key") != "greatest@pirate"), reversed_])
    scores.write_parquet(run / "scores.parquet")
    assert analyze_main(["personas", str(run), "--out", str(tmp_path / "a"), "--top", "2"]) == 0
    row = pl.read_csv(tmp_path / "a" / "personas.csv").filter(pl.col("persona") == "pirate").row(0, named=True)
    assert row["n"] == 5 and row["kendall_tau_b"] == pytest.approx(-1.0) and row["spearman"] == pytest.approx(-1.0)
    assert row["same_best"] is False
    by_hand = sorted(responses, key=control.get)  # the control's worst first: the persona's best, rising most
    moved = json.loads((tmp_path / "a" / "movers.json").read_text())["greatest@pirate"]
    assert [m["decoded"] for m in moved["up"]] == by_hand[:2]
    assert [m["decoded"] for m in moved["down"]] == by_hand[::-1][:2]
    rank = {r: k + 1 for k, r in enumerate(sorted(responses, key=control.get, reverse=True))}
    values = np.array(list(control.values()), dtype=np.float64)
    for m in moved["up"] + moved["down"]:
        assert m["score_control"] == pytest.approx(control[m["decoded"]])
        assert m["score_persona"] == pytest.approx(-control[m["decoded"]])
        assert (m["rank_control"], m["rank_persona"]) == (rank[m["decoded"]], len(responses) + 1 - rank[m["decoded"]])
        # the persona's z-score is the control's negated: dz = -2 z
        z = (control[m["decoded"]] - values.mean()) / values.std()
        assert m["dz"] == pytest.approx(-2 * z, rel=1e-9)
    # --top (10) over five responses: each list holds only what rose, or fell (issue 45: all five were in both)
    assert analyze_main(["personas", str(run), "--out", str(tmp_path / "b")]) == 0
    moved = json.loads((tmp_path / "b" / "movers.json").read_text())["greatest@pirate"]
    up, down = [m["decoded"] for m in moved["up"]], [m["decoded"] for m in moved["down"]]
    assert all(m["dz"] > 0 for m in moved["up"]) and all(m["dz"] < 0 for m in moved["down"])
    mean = float(np.mean(list(control.values())))  # dz = -2 z(control): those below the control's mean rise
    assert up == [r for r in by_hand if control[r] < mean] and down == [r for r in by_hand[::-1] if control[r] > mean]
