"""RewardBench's own model classes and pipelines (the ``rewardbench`` 0.1.4 package from PyPI, installed without
its dependencies), loaded file by file: the package's ``__init__`` imports fastchat and datasets, which the
models do not need. A test helper, the reference the families of probe/models/families.py are checked against.

Its pipelines move the batch to CUDA (``.to("cuda")``); `on_cpu` lets them run here unchanged otherwise.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from contextlib import contextmanager
from pathlib import Path

STUB = "rewardbench_models"


def models_dir() -> Path:
    spec = importlib.util.find_spec("rewardbench")  # finds the package without running its __init__
    assert spec is not None and spec.submodule_search_locations, (
        "the rewardbench package is expected (pip install --no-deps rewardbench==0.1.4; make venv installs it)")
    return Path(spec.submodule_search_locations[0]) / "models"


def load(name: str) -> types.ModuleType:
    """``rewardbench/models/<name>.py`` as a module (relative imports resolve inside a stub package)."""
    import transformers.models.llama.modeling_llama as llama

    # docstring constants transformers 5 removed, which beaver.py and qrm.py import
    for attr, value in (("_CONFIG_FOR_DOC", "LlamaConfig"), ("LLAMA_INPUTS_DOCSTRING", "")):
        if not hasattr(llama, attr):
            setattr(llama, attr, value)
    if STUB not in sys.modules:
        pkg = types.ModuleType(STUB)
        pkg.__path__ = [str(models_dir())]
        sys.modules[STUB] = pkg
    full = f"{STUB}.{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, models_dir() / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


@contextmanager
def on_cpu():
    """RewardBench's pipelines call ``BatchEncoding.to("cuda")``: keep the batch where it is."""
    from transformers import BatchEncoding

    original = BatchEncoding.to
    BatchEncoding.to = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        BatchEncoding.to = original


def load_dpo() -> types.ModuleType:
    """``rewardbench/dpo.py`` (DPOInference: RewardBench's DPO implicit-reward scoring)."""
    full = f"{STUB}_dpo"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, models_dir().parent / "dpo.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]
