"""Figure scripts run from saved results only; the EloEverything check agrees with the paper."""

import json

import pytest

from experiments import make_figures
from tests.fake_runs import hashed_score, write_fake_run
from probe.core.prompts import PAPER_PROMPTS


def test_elo_summary_agrees_with_the_paper(tmp_path, paper_release):
    from experiments.fig5_elo import EloConfig, main

    summary = main(EloConfig(data=str(paper_release), out=str(tmp_path)))
    on_disk = json.loads((tmp_path / "elo_summary.json").read_text())
    assert set(on_disk) == {"elo_greatest_ever", "elo_humans_most_prefer", "elo_greatest_one_word"}
    # the paper: human-model tau 0.20-0.38, 0.10-0.30, 0.22-0.39
    for stem, (lo, hi) in {"elo_greatest_ever": (0.20, 0.38), "elo_humans_most_prefer": (0.10, 0.30),
                           "elo_greatest_one_word": (0.22, 0.39)}.items():
        taus = list(on_disk[stem]["kendall_tau_human"].values())
        assert len(taus) == 10
        assert round(min(taus), 2) == lo and round(max(taus), 2) == hi
        assert len(on_disk[stem]["most_undervalued"]) >= 20 and len(on_disk[stem]["most_overvalued"]) >= 20
    assert "Black people" in on_disk["elo_greatest_ever"]["most_undervalued"][:3]
    assert summary["elo_greatest_ever"]["most_undervalued"] == on_disk["elo_greatest_ever"]["most_undervalued"]
    for name in ("fig5b_rank_diff.png", "fig5c_rank_trajectories.png", "figA5_kendall_tau_heatmap.png",
                 "figA6_kendall_tau_across_prompts.png", "figA7_rank_diff_humans_most_prefer.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_make_figures_from_fake_runs(tmp_path, paper_release):
    words = ["love", "hate", "good", "bad", "happy", "sad", "peace", "war", "joy", "pain", "nice", "awful",
             "great", "terrible", "kind", "cruel", "hope", "fear", "win", "lose", " love", " hate", "zzq", "<s>"]
    runs = [str(write_fake_run(tmp_path / "results", f"org{i}/model{i}", words, PAPER_PROMPTS,
                               lambda k, t, i=i: hashed_score(f"{k}/{i % 2}", t), family=fam, special=["<s>"]).path)
            for i, fam in enumerate(["Llama 3", "Llama 3", "Gemma 2"])]
    elo = tmp_path / "elo"
    elo.mkdir()
    src = (paper_release / "elo_greatest_ever.csv").read_text().splitlines()
    (elo / "elo_greatest_ever.csv").write_text("\n".join(src[:400]) + "\n")
    out = tmp_path / "figures"
    assert make_figures.main(["--runs", *runs, "--elo-data", str(elo), "--out", str(out),
                              "--permutations", "100"]) == 0
    made = {p.name for p in out.iterdir()}
    for name in ("fig1_distributions_greatest.png", "figA1_distributions_worst.png", "fig2a_kendall_heatmap.png",
                 "fig2b_mds.png", "fig2c_rsa.png", "fig3ab_valence_scatter.png", "fig3c_framing_slopes.png",
                 "fig3d_frequency_slopes.png", "fig4_best_vs_worst.png", "fig5b_rank_diff.png", "elo_summary.json",
                 "fig2a_kendall_heatmap_elo_greatest_ever.png", "table3_moments_greatest.csv"):
        assert name in made, name
    agreement = json.loads((out / "fig2_agreement.json").read_text())
    tau = agreement["kendall_tau_b"]
    # models 0 and 2 were given the same score function, model 1 another one
    assert tau[0][2] == pytest.approx(1.0) and abs(tau[0][1]) < 0.9
    # the numbers behind the figures, recomputed here from the runs' scores.parquet
    import numpy as np
    import polars as pl
    from scipy import stats as sps

    scores = {}
    for i in range(3):
        (run,) = (tmp_path / "results").glob(f"org{i}__model{i}/exhaustive_*")
        df = pl.read_parquet(run / "scores.parquet").filter(pl.col("prompt_key") == "greatest").sort("token_id")
        scores[i] = df
    assert tau[0][1] == pytest.approx(sps.kendalltau(scores[0]["score"], scores[1]["score"]).statistic, abs=1e-6)
    moments = pl.read_csv(out / "table3_moments_greatest.csv")
    assert moments.height == 3
    for row in moments.iter_rows(named=True):
        i = int(row["model"][-1])
        x = scores[i]["score"].to_numpy().astype(np.float64)
        assert row["n"] == x.size and row["mean"] == pytest.approx(x.mean(), rel=1e-6)
        assert row["variance"] == pytest.approx(x.var(ddof=1), rel=1e-5)
        assert row["skewness"] == pytest.approx(np.mean((x - x.mean()) ** 3) / x.std() ** 3, rel=1e-4, abs=1e-6)
    # every figure is a real picture: it decodes, and it is not one flat colour
    import matplotlib.image as mpimg

    for png in out.glob("*.png"):
        pixels = mpimg.imread(png)
        assert pixels.ndim == 3 and min(pixels.shape[:2]) > 200 and pixels[..., :3].std() > 0.02, png.name


def test_figures_come_from_the_runs_named_never_from_results(tmp_path, paper_release, capsys, monkeypatch):
    """Issue 64: a 5-response run under the "greatest ever" table's prompt, lying in results/, became the
    EloEverything figure (n_items 2, a heatmap of tau 1.00). The figures are drawn from the runs named (or the ones
    MANIFEST.json names); a named response run of part of the table is refused in one line, exit 2, before any
    figure is drawn; a sweep script with no runs named refuses too."""
    from experiments import fig1_distributions
    from experiments.fig5_elo import PROMPT_TEXT
    from tests.fake_runs import write_fake_response_run

    elo = tmp_path / "elo"
    elo.mkdir()
    src = (paper_release / "elo_greatest_ever.csv").read_text().splitlines()
    (elo / "elo_greatest_ever.csv").write_text("\n".join(src[:60]) + "\n")
    names = [line.split(",")[2] for line in src[1:3]] + ["a", "b", "c"]
    few = write_fake_response_run(tmp_path / "results", "org/lm", names,
                                  {"prompt1": PROMPT_TEXT["elo_greatest_ever"]})
    out = tmp_path / "figures"
    common = ["--elo-data", str(elo), "--out", str(out), "--permutations", "20"]
    monkeypatch.chdir(tmp_path)  # results/ beside the command, as `make figures` finds it
    assert make_figures.main(common) == 0
    assert not (out / "responses").exists() and "response_runs" not in json.loads((out / "MANIFEST.json").read_text())[
        "groups"]
    capsys.readouterr()
    made = sorted(p.name for p in out.iterdir())
    assert make_figures.main(["--response-runs", str(few.path), *common]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "scored 2 of the 59 items of elo_greatest_ever" in err, err
    assert sorted(p.name for p in out.iterdir()) == made  # nothing drawn
    with pytest.raises(SystemExit) as stop:
        fig1_distributions.main(fig1_distributions.Fig1Config(out=str(tmp_path / "f1")))
    assert stop.value.code == 2 and "--runs" in capsys.readouterr().err


def test_make_figures_is_one_consistent_set(tmp_path, paper_release):
    """Figures from four sweeps, then from one named run: the sweep figures are replaced, the ones the single run
    cannot make are removed (not left from the old set), the manifest names the inputs; with no runs named, the
    manifest's are drawn again, and where they are gone the sweep figures are kept as the manifest describes them."""
    words = ["love", "hate", "good", "bad", "happy", "sad", "peace", "war", "joy", "pain", " love", "zzq"]
    runs = [write_fake_run(tmp_path / "results", f"org{i}/model{i}", words, PAPER_PROMPTS,
                           lambda k, t, i=i: hashed_score(f"{k}/{i}", t)) for i in range(4)]
    elo = tmp_path / "elo"
    elo.mkdir()
    src = (paper_release / "elo_greatest_ever.csv").read_text().splitlines()
    (elo / "elo_greatest_ever.csv").write_text("\n".join(src[:200]) + "\n")
    out = tmp_path / "figures"
    common = ["--elo-data", str(elo), "--out", str(out), "--permutations", "50"]
    assert make_figures.main(["--runs", *[str(r.path) for r in runs], *common]) == 0
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert len(manifest["groups"]["sweeps"]["inputs"]) == 4 and "fig2a_kendall_heatmap.png" in manifest["groups"][
        "sweeps"]["files"]
    assert len((out / "table3_moments_greatest.csv").read_text().splitlines()) == 5  # header + 4 models
    one = write_fake_run(tmp_path / "other", "org9/model9", words, {"greatest": PAPER_PROMPTS["greatest"]})
    assert make_figures.main(["--runs", str(one.path), *common]) == 0
    assert len((out / "table3_moments_greatest.csv").read_text().splitlines()) == 2  # header + the one model
    for gone in ("fig2a_kendall_heatmap.png", "figA1_distributions_worst.png", "fig4_best_vs_worst.png",
                 "table3_moments_worst.csv"):
        assert not (out / gone).exists(), gone  # made from the four-run set: removed, not left beside the new one
    assert (out / "fig5b_rank_diff.png").exists() and (out / "fig2a_kendall_heatmap_elo_greatest_ever.png").exists()
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert [r["model"] for r in manifest["groups"]["sweeps"]["inputs"]] == ["org9/model9"]
    assert make_figures.main(common) == 0  # no runs named: the ones the manifest names, drawn again
    assert json.loads((out / "MANIFEST.json").read_text())["groups"]["sweeps"] == manifest["groups"]["sweeps"]
    import shutil

    shutil.rmtree(one.path)
    assert make_figures.main(common) == 0
    assert (out / "fig1_distributions_greatest.png").exists()  # its runs are gone: the group is kept as it was
    assert json.loads((out / "MANIFEST.json").read_text())["groups"]["sweeps"] == manifest["groups"]["sweeps"]
    assert runs  # the four runs were really made


@pytest.mark.parametrize("script", ["fig1_distributions", "fig5_elo"])
def test_a_figure_script_without_its_inputs_says_so_in_one_line(tmp_path, script):
    """Run as `python -m experiments.<name>` on a checkout without the paper's data release beside it (or without
    --runs): one line and exit 2, not a traceback."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "RM_PROBE_PAPER_RELEASE": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", f"experiments.{script}", "--out", str(tmp_path / "figs")], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: ") and "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1
