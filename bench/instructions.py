"""Compile time as instructions: a synthetic graph's compile (or its fusion pass alone) counted by
valgrind's callgrind, a figure this shared machine's noise does not move.

``python bench/instructions.py 2000 --graph mixed [--stage compile|fusion] [--seed S]``

The script runs itself under ``valgrind --tool=callgrind`` with instrumentation off, and switches
it on (``callgrind_control -i on``) only around what it counts: ``compile``, a second compile of the
graph with its C kernels already built by a first (the Python alone: the C compiler runs in other
processes, which callgrind does not follow), or ``fusion``, the ``fuse_groups`` pass of a first
compile.  The kernels are built for ``x86-64-v3`` (valgrind runs no AVX-512 code).  The figure
compares two versions of fxforge on the same graph (``PYTHONPATH`` naming each checkout); it does
not measure seconds.  A graph of a few thousand nodes takes a minute or two (valgrind runs Python
about 50 times slower).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

_CHILD = "FXFORGE_INSTRUCTIONS_CHILD"


def _counting(on: bool) -> None:
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True, check=True)


def _child(n: int, graph: str, stage: str, seed: int) -> None:
    import fxforge
    import fxforge.codegen.c.build as build
    import fxforge.passes.fusion as fusion
    from fxforge.spine import compile_graph
    from synthetic import GRAPHS

    build.FLAGS = tuple("-march=x86-64-v3" if f == "-march=native" else f for f in build.FLAGS)
    config = fxforge.Config(debug=False, tiered_builds=False)
    make = GRAPHS[graph]
    if stage == "fusion":
        run = fusion.FuseGroups.run

        def counted(self, gm):
            _counting(True)
            try:
                return run(self, gm)
            finally:
                _counting(False)

        fusion.FuseGroups.run = counted
        compile_graph(make(n, seed=seed)[0], config, kind="synthetic", cache=False)
        return
    compile_graph(make(n, seed=seed)[0], config, kind="synthetic", cache=False)  # builds the kernels
    gm = make(n, seed=seed)[0]
    _counting(True)
    compile_graph(gm, config, kind="synthetic", cache=False)
    _counting(False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("nodes", type=int)
    ap.add_argument("--graph", choices=("pointwise", "mixed"), default="pointwise")
    ap.add_argument("--stage", choices=("compile", "fusion"), default="compile")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if os.environ.get(_CHILD):
        return _child(a.nodes, a.graph, a.stage, a.seed)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (with callgrind_control) is not installed: apt-get install valgrind")
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, _CHILD: "1", "FXFORGE_CACHE_DIR": os.path.join(d, "cache")}
        out = subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={d}/cg.out",
                              sys.executable, __file__, *sys.argv[1:]], env=env, capture_output=True, text=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or found is None:
        sys.exit(f"valgrind run failed ({out.returncode}):\n{out.stderr[-2000:]}")
    print(f"{a.graph} {a.nodes} (seed {a.seed}) {a.stage}: {int(found.group(1).replace(',', '')):,} instructions")


if __name__ == "__main__":
    main()
