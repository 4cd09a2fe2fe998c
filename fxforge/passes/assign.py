"""Assign every compute node a codegen backend (or the eager fallback) and a kernel group.

One group per compute node; the fusion pass merges groups afterwards.  A node the selected
backend refuses goes to the backend it names for its extern calls (``CodegenBackend.extern``:
the triton backend's matmuls, sorts and custom ops run as the torch backend's out= calls into
planned buffers).  A node both refuse, or that the config forces to fallback, runs as a plain
eager call: its reason is kept in ``meta[FALLBACK]`` and logged.
"""

from __future__ import annotations

import logging

import torch.fx as fx

from ..codegen.api import CodegenBackend
from ..core.config import Config
from ..core.graph import ALLOCATES, BACKEND, FALLBACK, FALLBACK_BACKEND, GROUP, free_symbols, node_kind, op_display
from ..infra.pass_manager import PassResult

log = logging.getLogger("fxforge")


def bound_symbols(gm: fx.GraphModule) -> set:
    """Size symbols the generated code can read off its inputs."""
    out = set()
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            out |= free_symbols(n.meta.get("val"))
    return out


class AssignBackends:
    name = "assign_backends"

    def __init__(self, backend: CodegenBackend, config: Config, extern: CodegenBackend | None = None):
        self.backend = backend
        self.config = config
        self.extern = extern  # runs what ``backend`` refuses (its ``extern`` entry), if any

    def refusal(self, node: fx.Node, inputs_bound: set) -> str | None:
        """Why no backend may run ``node`` (None: the selected backend or its extern backend may)."""
        name = op_display(node.target)
        if name in self.config.fallback_ops or name.rsplit(".", 1)[0] in self.config.fallback_ops:
            return "listed in Config.fallback_ops"
        if not free_symbols(node.meta.get("val")) <= inputs_bound:
            return "output size depends on values computed inside the graph"
        return None

    def accepted(self, backend: CodegenBackend, node: fx.Node) -> str | None:
        try:
            return backend.accepts(node, self.config)
        except Exception as e:  # a backend's capability check must not take the model down
            if self.config.debug:  # ... but a bug in it must show, not pass as slower kernels
                raise
            return f"{backend.name}.accepts raised {type(e).__name__}: {e}"

    def choose(self, node: fx.Node, inputs_bound: set) -> tuple[CodegenBackend | None, str | None]:
        """The backend running ``node`` (None: eager fallback) and why the selected one does not."""
        reason = self.refusal(node, inputs_bound)
        if reason is not None:
            return None, reason
        reason = self.accepted(self.backend, node)
        if reason is None:
            return self.backend, None
        if self.extern is not None:
            why = self.accepted(self.extern, node)
            if why is None:
                log.debug("fxforge: %s (%s) runs as a %s extern call: %s", node.name, op_display(node.target),
                          self.extern.name, reason)
                return self.extern, reason
            reason = f"{reason}; {self.extern.name}: {why}"
        return None, reason

    def place(self, node: fx.Node, bound: set, gid: int) -> CodegenBackend | None:
        """Give compute node ``node`` group ``gid`` and its backend (``choose``), in its metadata;
        returns the backend (None: an eager fallback).  Passes inserting nodes later use it too."""
        backend, reason = self.choose(node, bound)
        GROUP.set(node, gid)
        if backend is not None:
            BACKEND.set(node, backend.name)
            if backend.allocates is not None and backend.allocates(node, self.config):
                ALLOCATES.set(node, True)
        else:
            BACKEND.set(node, FALLBACK_BACKEND)
            FALLBACK.set(node, reason)
            log.info("fxforge: %s (%s) runs as eager fallback: %s", node.name, op_display(node.target), reason)
        return backend

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        bound = bound_symbols(gm)
        gid = 0
        fallbacks = externs = 0
        for node in gm.graph.nodes:
            for k in (GROUP, BACKEND, FALLBACK, ALLOCATES):
                node.meta.pop(k, None)
            if node_kind(node) != "compute":
                continue
            backend = self.place(node, bound, gid)
            gid += 1
            fallbacks += backend is None
            externs += backend is not None and backend is not self.backend
        # metadata only: the module's code stays as it is
        return PassResult(gm, True, {"groups": gid, "fallback_nodes": fallbacks, "extern_nodes": externs}, recompile=False)
