"""The README's Python examples run as printed.

A reader copies them first, and nothing else would notice when an argument
they use is renamed. Each block runs in a fresh process, in an empty folder
with the checkout on the path, since one of them registers a kernel that must
not leak into other tests.
"""

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_has_its_python_examples():
    assert len(BLOCKS) >= 2 and any("create_model" in block for block in BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_python_block_runs(index):
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run([sys.executable, "-c", BLOCKS[index]], cwd=folder, capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "PYTHONPATH": str(ROOT),
                                   "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, f"README block {index}:\n{BLOCKS[index]}\n{done.stderr[-2000:]}"
