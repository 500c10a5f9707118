"""``probe --list-models``: every registry entry, its reader and its input source (or why it is refused)."""

from __future__ import annotations

import io
import subprocess
import sys

from probe.commands.models import list_models
from probe.models.registry import REGISTRY


def test_every_entry_is_listed_with_its_input_source_or_its_refusal():
    out = io.StringIO()
    assert list_models(out, width=100) == len(REGISTRY)
    blocks = {}
    for line in out.getvalue().splitlines():
        if not line.startswith(" "):
            name = line.split("  [")[0]
            blocks[name] = [line]
        else:
            blocks[name].append(line.strip())
    assert set(blocks) == set(REGISTRY)
    for name, spec in REGISTRY.items():
        text = " ".join(blocks[name])
        assert f"[{spec.reader}" in blocks[name][0], name
        if spec.unsupported:
            assert "REFUSED" in blocks[name][0] and "refused: " + spec.unsupported[:40] in text, name
        elif name != "default":
            assert "input: " + " ".join(spec.input_source.split())[:60] in text, name
    assert list(blocks)[-1] == "default"
    assert all(len(line) <= 100 for line in out.getvalue().splitlines())


def test_the_console_script_lists_them_without_loading_torch():
    code = ("import sys; from probe.commands.cli import main; rc = main(['--list-models']); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Skywork/Skywork-Reward-V2-Llama-3.1-8B  [linear; Llama 3.1]" in done.stdout
    assert "input: model card (Skywork/Skywork-Reward-V2-*" in done.stdout
