"""Agreement between reward models on a shared vocabulary: Kendall tau-b, Spearman, rank-biased overlap at the
top and at the bottom, an MDS map, and whether models of the same base family (or developer) agree more."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from probe.analysis import stats
from probe.models.registry import REGISTRY


@dataclass
class Agreement:
    models: list[str]
    n_strings: int
    kendall: np.ndarray
    spearman: np.ndarray
    rbo_top: np.ndarray
    rbo_bottom: np.ndarray
    mds: np.ndarray  # models x 2, from 1 - tau
    groups: dict[str, dict]  # grouping -> {labels, statistic, p_value, ...}

    def to_json(self) -> dict:
        def mat(m: np.ndarray) -> dict:
            return {a: {b: round(float(m[i, j]), 6) for j, b in enumerate(self.models)} for i, a in enumerate(self.models)}

        return {"models": self.models, "n_strings": self.n_strings, "kendall_tau_b": mat(self.kendall),
                "spearman": mat(self.spearman), "rbo_top_p0.9": mat(self.rbo_top),
                "rbo_bottom_p0.9": mat(self.rbo_bottom),
                "mds": {m: [float(x) for x in self.mds[i]] for i, m in enumerate(self.models)}, "groups": self.groups}


def family_of(model_id: str) -> str:
    """The registry's base family ("Llama 3.1 8B"); a model the registry does not know is its own group, so two
    unknown models are never counted as one family."""
    spec = REGISTRY.get(model_id)
    return spec.family if spec and spec.family else f"unknown:{model_id}"


def base_architecture_of(model_id: str) -> str:
    """The family's first word ("Llama", "Gemma"); unknown models stay their own group."""
    family = family_of(model_id)
    return family if family.startswith("unknown:") else family.split(" ")[0]


def developer_of(model_id: str) -> str:
    return model_id.split("/")[0] if "/" in model_id else "unknown"


def agreement(wide: pl.DataFrame, models: list[str], p: float = 0.9, groupings: dict[str, list[str]] | None = None,
              n_perm: int = 10_000, seed: int = 0) -> Agreement:
    """``wide``: one row per shared string, one score column per model (see sweeps.shared_vocabulary)."""
    cols = [wide[m].to_numpy() for m in models]
    tau = stats.matrix(cols, stats.kendall_tau_b)
    rho = stats.matrix(cols, stats.spearman)
    top = stats.matrix(cols, lambda a, b: stats.rbo(a, b, p))
    bottom = stats.matrix(cols, lambda a, b: stats.rbo(a, b, p, bottom=True))
    mds = stats.classical_mds(1 - tau) if len(models) > 2 else np.zeros((len(models), 2))
    groups = {}
    for name, labels in (groupings or {}).items():
        if len(set(labels)) < 2 or len(set(labels)) == len(labels):
            continue  # nothing to test: one group, or every model alone
        test = stats.group_permutation_test(tau, labels, n_perm, seed)
        groups[name] = {"labels": dict(zip(models, labels)), "same_minus_different_tau": test.statistic,
                        "p_value": test.p_value, "n_permutations": test.n_permutations, "exact": test.exact}
    holm = stats.holm([g["p_value"] for g in groups.values()])  # the groupings tested together (family, developer)
    for g, h in zip(groups.values(), holm):
        g.update(p_holm=float(h), n_tests=len(groups))
    return Agreement(models, wide.height, tau, rho, top, bottom, mds, groups)


def pairwise_agreement(frames: dict[str, pl.DataFrame], mode: str = "exact", p: float = 0.9) -> list[dict]:
    """Every pair of runs on its own shared vocabulary (token ids where the pair shares a tokenizer, else the
    strings both have as one id): its size, Kendall tau-b, Spearman and rank-biased overlap at top and bottom."""
    from probe.analysis.sweeps import shared_vocabulary

    names = list(frames)
    out = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            wide, kind = shared_vocabulary({a: frames[a], b: frames[b]}, mode, by="auto", with_kind=True)
            x, y = wide[a].to_numpy(), wide[b].to_numpy()
            out.append({"a": a, "b": b, "matched_on": kind, "n": wide.height, "kendall_tau_b": stats.kendall_tau_b(x, y),
                        "spearman": stats.spearman(x, y), f"rbo_top_p{p}": stats.rbo(x, y, p),
                        f"rbo_bottom_p{p}": stats.rbo(x, y, p, bottom=True)})
    return out
