"""The README's examples marked ``<!-- runs in tests/test_readme.py -->`` run as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
MARKER = "<!-- runs in tests/test_readme.py -->"


def examples() -> list[str]:
    text = open(README, encoding="utf-8").read()
    return re.findall(re.escape(MARKER) + r"\n```python\n(.*?)```", text, flags=re.S)


def test_readme_marks_its_runnable_examples():
    assert len(examples()) >= 3


@pytest.mark.parametrize("index", range(len(examples())))
def test_readme_example_runs(index, tmp_path):
    code = examples()[index]
    env = dict(os.environ, FXFORGE_DEBUG="1", PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert p.returncode == 0, f"README example {index} failed:\n{code}\n--- stderr ---\n{p.stderr[-3000:]}"
