"""fxforge's logging under TORCH_LOGS (fxforge/infra/logs.py): the plan and the generated code each on
their own name, apart from "fxforge" / "+fxforge"; a subprocess each (torch reads TORCH_LOGS when
it is imported)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import torch, fxforge
m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU())
with torch.no_grad():
    torch.compile(m, backend=fxforge.backend(fxforge.Config(codegen="torch")))(torch.randn(4, 8))
"""


def _stderr(setting: str | None) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    env.pop("TORCH_LOGS", None)
    if setting is not None:
        env["TORCH_LOGS"] = setting
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr


PLAN, CODE, GRAPH = "memory plan of the inference graph", "def call(args):", "fxforge: compiled inference graph"


@pytest.mark.parametrize("setting, shown, hidden", [
    ("fxforge_plan", [PLAN, "buffer"], [CODE, GRAPH]),
    ("fxforge_code", ["generated code of the inference graph", CODE], [PLAN, GRAPH]),
    ("+fxforge", [GRAPH], [PLAN, CODE]),
    (None, [], [PLAN, CODE, GRAPH]),
])
def test_each_torch_logs_name_shows_its_own(setting, shown, hidden):
    err = _stderr(setting)
    for text in shown:
        assert text in err, (setting, text, err[-2000:])
    for text in hidden:
        assert text not in err, (setting, text, err[-2000:])
