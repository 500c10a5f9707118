"""The wheel a user installs: every data file of the package is in it, and building it says nothing alarming (the
data folders were once left out of `packages`, which setuptools warned about at every install and will drop)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA_DIRS = ("probe/data", "probe/report/templates")


def test_the_wheel_ships_every_data_file_without_setuptools_warnings(tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
                          str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "would be ignored" not in out.stdout + out.stderr
    (wheel,) = tmp_path.glob("rm_probe-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    want = {str(p.relative_to(ROOT)) for d in DATA_DIRS for p in (ROOT / d).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    assert want and want <= shipped, sorted(want - shipped)
    assert "probe/kernels/prefix_attention.py" in shipped  # the card's kernels/ folder, inside the package
