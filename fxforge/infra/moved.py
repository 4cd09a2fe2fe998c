"""The import paths of modules that moved (docs/architecture.md, "Where things moved").

``import fxforge.graph`` still works: it is the module now at ``fxforge.core.graph``, the same
object, so a name set through either path is one.  ``python -m fxforge.cli`` runs
``fxforge.entry.cli``.  ``install`` (called by ``fxforge/__init__.py``) puts the modules already
imported under their old names and a finder on ``sys.meta_path`` for the others.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    "fxforge.backend": "fxforge.entry.dynamo",
    "fxforge.export": "fxforge.entry.export",
    "fxforge.spmd": "fxforge.entry.spmd",
    "fxforge.cli": "fxforge.entry.cli",
    "fxforge.demo": "fxforge.entry.demo",
    "fxforge.graph": "fxforge.core.graph",
    "fxforge.plan": "fxforge.core.plan",
    "fxforge.iteration": "fxforge.core.iteration",
    "fxforge.regions": "fxforge.core.regions",
    "fxforge.copies": "fxforge.core.copies",
    "fxforge.collectives": "fxforge.core.collectives",
    "fxforge.dtensor": "fxforge.core.dtensor",
    "fxforge.config": "fxforge.core.config",
    "fxforge.stats": "fxforge.artifact.stats",
    "fxforge.compiler": "fxforge.spine",
    "fxforge.compiled": "fxforge.artifact.compiled",
    "fxforge.inputs": "fxforge.artifact.inputs",
    "fxforge.pipeline": "fxforge.infra.pass_manager",
    "fxforge.progress": "fxforge.infra.progress",
    "fxforge.logs": "fxforge.infra.logs",
    "fxforge.host": "fxforge.infra.host",
    "fxforge.timing": "fxforge.infra.timing",
    "fxforge.codegen.c.ops": "fxforge.codegen.c.dtypes",
    "fxforge.codegen.triton.ops": "fxforge.codegen.triton.dtypes",
    "fxforge.lowering.ops": "fxforge.lowering.fxforge_ops",
    "fxforge.codegen.symmetric": "fxforge.codegen.symmetric_runtime",
    "fxforge.codegen.ir.emitter": "fxforge.codegen.ir.lowering",
}


class _OldPath(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module at its new one."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass  # the module ran under its new name

    def get_code(self, name):  # ``python -m`` with an old name
        new = MOVED[name]
        return importlib.util.find_spec(new).loader.get_code(new)


def install() -> None:
    for old, new in MOVED.items():
        if new in sys.modules:
            module = sys.modules.setdefault(old, sys.modules[new])
            parent, _, leaf = old.rpartition(".")
            if parent in sys.modules and not hasattr(sys.modules[parent], leaf):  # (fxforge.backend: the function)
                setattr(sys.modules[parent], leaf, module)
    if not any(isinstance(f, _OldPath) for f in sys.meta_path):
        sys.meta_path.append(_OldPath())
