"""One schema for every run's ``meta.json``, and one builder that every command uses.

A run's metadata says what was run (settings, the full config, the model and where it came from), how
(environment: versions, git commit, command line) and with what outcome (status, timing). The command adds
its own sections (a sweep's prompts and self-checks, a social run's label) through ``extra``; readers find the
common part under the same keys whatever wrote it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, is_dataclass
from typing import Any

from probe.runs.timing import now_iso

# experiment -> schema of its meta.json (bump the number when a reader would need to know)
SCHEMAS = {
    "exhaustive": "rm-probe/exhaustive/1",
    "responses": "rm-probe/responses/1",
    "gcg": "rm-probe/gcg/1",
    "beam": "rm-probe/gcg/1",
    "social": "rm-probe/social/2",
}


def schema_for(experiment: str) -> str:
    return SCHEMAS.get(experiment) or SCHEMAS[experiment.split("_")[0]]  # gcg_max, gcg_min -> gcg


def model_record(loaded, revision: str | None = None) -> dict:
    """The ``model`` section: id, path, source and quantization, the weights' identity, the registry spec and how
    it was matched, architecture, size, dtype, device and the tokenizer's special tokens."""
    from probe.core.invariance import describe as invariance_record
    from probe.core.scoring import path_record
    from probe.core.template import input_call
    from probe.models.attention import record as attention_record
    from probe.models.loading import weights_identity

    tok, model = loaded.tokenizer, loaded.model
    return {
        "id": loaded.model_id, "path": loaded.path, "revision": revision, "kind": loaded.kind,
        "source": loaded.source, "weights": weights_identity(loaded),
        "spec": asdict(loaded.spec), "spec_match": loaded.spec_match,
        "architecture": (getattr(model.config, "architectures", None) or [type(model).__name__])[0],
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(loaded.dtype), "device": str(loaded.device), "attention": attention_record(model),
        "batch_invariance": invariance_record(loaded.device, model), "scoring_path": path_record(loaded),
        "embedding_rows": model.get_input_embeddings().num_embeddings, "tokenizer_len": len(tok),
        "special_tokens": {k: str(v) for k, v in tok.special_tokens_map.items()},
        "pad_token_id": model.config.get_text_config().pad_token_id, "bos_token_id": tok.bos_token_id,
        "input": {"call": input_call(tok), "convention": input_convention(loaded)},
        **(loaded.pairwise.describe() if getattr(loaded, "pairwise", None) is not None else {}),
        **principle_record(loaded),
        **({"ref": model_record(loaded.ref), "beta": loaded.beta,
            "score": "implicit reward: beta x (log p under the model - log p under ref) of the same response ids"}
           if getattr(loaded, "ref", None) is not None else {}),
    }


def input_convention(loaded) -> str:
    """Where this run's ids come from, in words: the family's own convention (registry ``input_source``) or, under
    ``--input-method rewardbench``, RewardBench 0.1.4's (its pipeline, or run_dpo.py for a language model)."""
    from probe.core.template import REWARDBENCH_DPO, input_call
    from probe.models.registry import PIPELINES_WITHOUT_SPECIAL_TOKENS, REWARDBENCH_DPO_INPUT

    call = input_call(loaded.tokenizer)
    if call == REWARDBENCH_DPO:
        return REWARDBENCH_DPO_INPUT
    if call == "rewardbench" or (getattr(loaded, "pairwise", None) is not None
                                 and getattr(loaded.tokenizer, "rm_probe_input_call", None) == "rewardbench"):
        pipe = loaded.spec.rewardbench_pipeline
        how = ("encoded without the tokenizer's special tokens" if pipe in PIPELINES_WITHOUT_SPECIAL_TOKENS else
               "through tokenizer(text), with run_rm.py's add_eos_token for a dialogue format as transformers 4.51.0 "
               "applied it")
        return (f"RewardBench 0.1.4's inputs (--input-method rewardbench): {pipe} on the chat template's text {how}; "
                f"not the family's own convention ({loaded.spec.input_source})")
    if loaded.kind == "causal" and loaded.spec.judge_prompt is not None and getattr(loaded, "own_judge", None) is None:
        from probe.models.registry import CHAT_TEMPLATE_INPUT

        return (f"{CHAT_TEMPLATE_INPUT}: read without its judge prompt {loaded.spec.judge_prompt}, whose input "
                f"convention goes with that prompt only ({loaded.spec.input_source})")
    return loaded.spec.input_source


def model_settings(loaded, revision: str | None, mode: str, head) -> dict:
    """The part of a run's settings (its fingerprint) that says which model computed it, and how: the weights by
    content, the registry spec and output column, dtype, device type, score mode and the head's description.
    Sweeps and response runs add what they scored."""
    from probe.models.loading import weights_identity

    from probe.core.invariance import group_rows, tile_rows

    out = {"model": loaded.model_id, "weights": weights_identity(loaded), "revision": revision,
           "spec": loaded.spec.name, "label_index": loaded.spec.label_index, "dtype": str(loaded.dtype),
           "device_type": loaded.device.type, "mode": mode, "head": head.describe()}
    if tile_rows(loaded.device) is not None:  # the forwards' and calls' fixed shapes: another tile rounds otherwise
        out["tile_rows"], out["group_rows"] = tile_rows(loaded.device), group_rows(loaded.device)
    return out | reference_settings(loaded)


def device_setting(loaded) -> dict:
    """The device type, for the settings of a command that did not record it (social, GCG): only where it is not
    the CPU, so that their CPU runs made before keep their fingerprints, while a run is never resumed on another kind
    of device (a GPU's kernels round otherwise, its batches mixed with the CPU's in one run)."""
    return {"device_type": loaded.device.type} if loaded.device.type != "cpu" else {}


def reference_settings(loaded) -> dict:
    """An implicit reward's reference model and beta, or a pairwise model's reference response, for a run's
    settings (empty otherwise, so that runs made before these existed keep their fingerprints)."""
    from probe.models.loading import weights_identity

    if getattr(loaded, "pairwise", None) is not None:
        return loaded.pairwise.describe()
    if getattr(loaded, "principle", None) is not None:
        return principle_record(loaded)
    if getattr(loaded, "ref", None) is None:
        return {}
    return {"ref": {"model": loaded.ref.model_id, "weights": weights_identity(loaded.ref)}, "beta": loaded.beta}


def principle_record(loaded) -> dict:
    """A principle model's principle and the question its card asks with it (empty for every other model)."""
    from probe.core.template import fill

    if getattr(loaded, "principle", None) is None:
        return {}
    return {"principle": loaded.principle,
            "principle_question": fill(loaded.spec.principle_question, principle=loaded.principle)}


def system_record(fed: str | None, given: str | None) -> dict:
    """A run's ``system``: the system message the model was fed (None: none, the chat template's own default, if any,
    in its place); where that is not the run's own (``--system``, a persona's: the model card's system turn, a judge
    prompt's), the run's own beside it as ``system_given``."""
    return {"system": fed} | ({"system_given": given} if given != fed else {})


def given_system(record: dict) -> str | None:
    """The run's own ``--system`` (a persona's) from a `system_record` (a run made before it: its ``system``)."""
    return record["system_given"] if "system_given" in record else record.get("system")


def score_label(loaded, mode: str) -> str:
    """The score mode as a run's first line names it: the mode, or the implicit reward and its reference; and the
    input route where it is not the family's own (``--input-method rewardbench``)."""
    from probe.core.template import input_call

    call = input_call(loaded.tokenizer)
    route = {"rewardbench": ", RewardBench's inputs", "rewardbench-dpo": ", RewardBench's DPO inputs"}.get(call, "")
    if getattr(loaded, "pairwise", None) is not None and mode == "judge-pair":
        return f"pairwise judge ({loaded.pairwise.judge.name}) vs the reference response {loaded.pairwise.reference!r}"
    if getattr(loaded, "pairwise", None) is not None and mode == "reward":
        return f"pairwise vs the reference response {loaded.pairwise.reference!r}"  # its own inputs: no route
    if getattr(loaded, "principle", None) is not None and mode == "reward":
        return f"reward against the principle {loaded.principle!r}{route}"
    if getattr(loaded, "ref", None) is None:
        return mode + route
    return f"implicit reward vs {loaded.ref.model_id}, beta {loaded.beta:g}{route}"


@dataclass
class RunMeta:
    """The common part of every ``meta.json``; ``extra`` holds a command's own sections (top-level keys)."""

    experiment: str
    fingerprint: str
    settings: dict
    config: dict
    model: dict
    status: str = "running"
    created: str = field(default_factory=now_iso)
    environment: dict | None = None
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        from probe.runs.rundir import environment

        out = {"schema": schema_for(self.experiment), "experiment": self.experiment, "status": self.status,
               "created": self.created, "fingerprint": self.fingerprint, "settings": self.settings,
               "config": self.config, "model": self.model,
               "environment": self.environment if self.environment is not None else environment()}
        clash = set(out) & set(self.extra)
        if clash:
            raise ValueError(f"extra meta sections {sorted(clash)} would replace the common ones")
        return {**out, **self.extra}


def new_meta(experiment: str, fingerprint: str, settings: dict, config: Any, loaded=None, *,
             revision: str | None = None, model: dict | None = None, environment: dict | None = None,
             **extra) -> dict:
    """A new run's ``meta.json`` content: the one builder every command (and the test fakes) use."""
    if model is None:
        if loaded is None:
            raise ValueError("new_meta needs the loaded model or a model record")
        model = model_record(loaded, revision)
    cfg = asdict(config) if is_dataclass(config) else dict(config or {})
    return RunMeta(experiment, fingerprint, settings, cfg, model, environment=environment, extra=extra).to_json()


def batch_size_recorder(run_dir, meta: dict, holder: dict):
    """A callback for `AdaptiveBatcher(on_change=)`: a batch size halved after an out-of-memory error is stored in
    ``holder["batch_size"]`` (where this run's meta.json keeps it) and in ``meta["oom_halvings"]``, and written at
    once, so that ``--resume`` continues with the size that fitted instead of the one that failed."""

    def record(size: int) -> None:
        holder["batch_size"] = size
        meta.setdefault("oom_halvings", []).append({"batch_size": size, "at": now_iso()})
        run_dir.write_meta(meta)

    return record
