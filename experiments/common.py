"""Shared pieces of the figure scripts: finding runs, the paper's model nicknames, colours, saving."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from probe.analysis.sweeps import Sweep, load_sweep, mode_name, short_name
from probe.runs.rundir import run_metas

FIGURES = Path(__file__).resolve().parents[1] / "figures"
# The paper's data release: $RM_PROBE_PAPER_RELEASE, else ../shared/data/paper-release beside this checkout.
PAPER_RELEASE = Path(os.environ.get("RM_PROBE_PAPER_RELEASE")
                     or Path(__file__).resolve().parents[2] / "shared" / "data" / "paper-release")

# Christian et al., Table 1: nickname = developer initial - base model - size
NICKNAMES = {
    "nicolinho/QRM-Gemma-2-27B": "N-Gem-27B",
    "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": "S-Gem-27B-v0.2",
    "Skywork/Skywork-Reward-Gemma-2-27B": "S-Gem-27B",
    "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2": "S-Lla-8B-v0.2",
    "nicolinho/QRM-Llama3.1-8B": "N-Lla-8B",
    "LxzGordon/URM-LLaMa-3.1-8B": "L-Lla-8B",
    "Ray2333/GRM-Llama3-8B-rewardmodel-ft": "R-Lla-8B",
    "Ray2333/GRM-Llama3.2-3B-rewardmodel-ft": "R-Lla-3B",
    "RLHFlow/ArmoRM-Llama3-8B-v0.1": "F-Lla-8B-v0.1",
    "Ray2333/GRM-gemma2-2B-rewardmodel-ft": "R-Gem-2B",
}
SIZES_B = {"nicolinho/QRM-Gemma-2-27B": 27, "Skywork/Skywork-Reward-Gemma-2-27B-v0.2": 27,
           "Skywork/Skywork-Reward-Gemma-2-27B": 27, "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2": 8,
           "nicolinho/QRM-Llama3.1-8B": 8, "LxzGordon/URM-LLaMa-3.1-8B": 8, "Ray2333/GRM-Llama3-8B-rewardmodel-ft": 8,
           "Ray2333/GRM-Llama3.2-3B-rewardmodel-ft": 3, "RLHFlow/ArmoRM-Llama3-8B-v0.1": 8,
           "Ray2333/GRM-gemma2-2B-rewardmodel-ft": 2}


@dataclass(frozen=True)
class SweepFigureConfig:
    """Settings every figure drawn from saved sweeps shares."""

    runs: tuple[str, ...] = field(default=(), metadata={"help": "run directories (required)",
                                                        "repeat": True, "flag": "--runs", "metavar": "DIR"})
    out: str = field(default="figures", metadata={"help": "output folder"})


def nickname(model_id: str) -> str:
    return NICKNAMES.get(model_id, short_name(model_id))


def sweep_label(sweep: Sweep) -> str:
    """Nickname plus the score mode when it is not a reward (e.g. SmolLM2-135M-Instruct [logprob])."""
    mode = mode_name(sweep.meta, default="reward")
    method = sweep.meta.get("settings", {}).get("input_method", "ids")
    tag = [m for m in (mode if mode != "reward" else "", "paper inputs" if method == "paper" else "") if m]
    return nickname(sweep.model) + (f" [{', '.join(tag)}]" if tag else "")


def colors(n: int) -> list:
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def named_runs(runs) -> tuple[str, ...]:
    """The runs a figure script was given (``--runs DIR ...``); none is one line and exit 2, never every run that
    happens to lie under results/ (a run made for another purpose would become the paper's figure)."""
    if not runs:
        print("error: name the runs to draw from: --runs DIR [DIR ...] (a figure is drawn from the runs it is given, "
              "never from whatever is under results/)", file=sys.stderr)
        raise SystemExit(2)
    return tuple(str(r) for r in runs)


def whole_vocabulary_runs(paths) -> list[Sweep]:
    """Named sweep runs, each complete and of the whole vocabulary, or one line (DataFormatError) naming the run."""
    from probe.errors import DataFormatError

    sweeps = load_runs(paths)
    for s in sweeps:
        if s.responses:
            raise DataFormatError(f"{s.path} is a response run (probe score --responses); the sweep figures need "
                                  "runs over the whole vocabulary (EloEverything response runs: --response-runs)")
        limit = (s.meta.get("config") or {}).get("limit")
        if limit is not None:
            raise DataFormatError(f"{s.path}: a run of part of the vocabulary (--limit {limit}); figures use "
                                  "whole-vocabulary runs")
    return sweeps


def load_runs(paths) -> list[Sweep]:
    return [load_sweep(p) for p in paths]


def save(fig, out_dir: str | Path, name: str) -> Path:
    """The figure as a PNG, written atomically (an interrupted run leaves the old file, never half a new one)
    and without a software-version stamp, so an unchanged figure is byte-identical."""
    import io

    from probe.runs.rundir import atomic_write_bytes

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=150, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    path = Path(out_dir) / name
    atomic_write_bytes(path, buf.getvalue())
    return path


def save_csv(df, out_dir: str | Path, name: str) -> Path:
    """A table as CSV, written atomically."""
    from probe.runs.rundir import atomic_write_bytes

    path = Path(out_dir) / name
    atomic_write_bytes(path, df.write_csv().encode())
    return path


def place_labels(ax, xy, labels, colors_, fontsize=8) -> None:
    """Label points without overlaps: for each point, the offset (of 8 around it) farthest from the other
    points and from the labels already placed, in display coordinates."""
    import numpy as np

    fig = ax.figure
    fig.canvas.draw()
    pts = ax.transData.transform(np.asarray(xy, dtype=float))
    placed: list[np.ndarray] = []
    offsets = [(8, 8), (8, -12), (-8, 8), (-8, -12), (10, -2), (-10, -2), (0, 12), (0, -16)]
    for i, (p, lab, c) in enumerate(zip(pts, labels, colors_)):
        width = 6.2 * len(lab) * fontsize / 8
        best, best_cost = offsets[0], -1.0
        for dx, dy in offsets:
            centre = p + np.array([dx + (width / 2 if dx >= 0 else -width / 2), dy])
            others = [q for j, q in enumerate(pts) if j != i] + placed
            cost = min((np.hypot(*((centre - q) / np.array([max(width / 2, 1), 8]))) for q in others), default=9.0)
            if cost > best_cost:
                best, best_cost = (dx, dy), cost
        dx, dy = best
        placed.append(p + np.array([dx + (width / 2 if dx >= 0 else -width / 2), dy]))
        ax.annotate(lab, xy[i], xytext=(dx, dy), textcoords="offset points", fontsize=fontsize, color=c,
                    fontweight="bold", ha="left" if dx >= 0 else "right", va="center",
                    bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="0.7", alpha=0.85))


def script_config(config_cls, doc: str | None, script: str):
    """The config of an experiment script run as ``python -m experiments.<name>``, from its command line."""
    from probe.commands.cli import command_parser
    from probe.commands.args import config_from_args

    name = Path(script).stem
    parser = command_parser(None, name, (doc or "").splitlines()[0], f"experiments/{name}.py", doc, config_cls,
                            verbose=False)
    return config_from_args(config_cls, parser.parse_args())


def run_script(config_cls, doc: str | None, script: str, body) -> int:
    """``python -m experiments.<name>``: its config from the command line, then ``body(config)``; a missing or
    malformed input (the paper's data release, a run) is one line and exit 2, as in the commands."""
    from probe.errors import ProbeError

    cfg = script_config(config_cls, doc, script)
    try:
        body(cfg)
    except ProbeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def write_results(stem: str, title: str, intro: str, columns, rows: list[dict]) -> str:
    """``experiments/results/<stem>.json`` (the rows) and ``.md`` (the title, a line saying how it was made, and a
    table whose ``columns`` are (header, row -> cell text)); returns the markdown, which the caller prints."""
    import json

    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    (results / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    lines = [f"# {title}", "", intro, "", "| " + " | ".join(h for h, _ in columns) + " |",
             "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r) for _, cell in columns) + " |" for r in rows]
    text = "\n".join(lines) + "\n"
    (results / f"{stem}.md").write_text(text)
    return text
