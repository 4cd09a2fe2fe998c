"""The examples of the README and of docs/ marked ``<!-- runs in tests/test_readme.py -->`` run as
written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
MARKER = "<!-- runs in tests/test_readme.py -->"
# README lines at most (a guide; the reference is in docs/)
README_MAX_LINES = 350


def examples(paths=(README, *DOCS)) -> list[str]:
    out = []
    for path in paths:
        text = open(path, encoding="utf-8").read()
        out += re.findall(re.escape(MARKER) + r"\n```python\n(.*?)```", text, flags=re.S)
    return out


def test_readme_marks_its_runnable_examples():
    assert len(examples([README])) >= 3
    text = open(README, encoding="utf-8").read()
    assert text.count("\n") <= README_MAX_LINES
    # every python block of the README runs: here, or with torchrun (tests/test_partition.py)
    blocks = re.findall(r"(?:<!-- [^\n]* -->\n)?```python\n", text)
    assert all(b.startswith("<!-- runs ") for b in blocks), blocks


@pytest.mark.parametrize("index", range(len(examples())))
def test_readme_example_runs(index, tmp_path):
    code = examples()[index]
    env = dict(os.environ, FXFORGE_DEBUG="1", PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert p.returncode == 0, f"README example {index} failed:\n{code}\n--- stderr ---\n{p.stderr[-3000:]}"
