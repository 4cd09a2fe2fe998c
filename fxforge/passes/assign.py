"""Assign every compute node a codegen backend (or the eager fallback) and a kernel group.

One group per compute node; the fusion pass merges groups afterwards.  A node the selected
backend refuses, or that the config forces to fallback, runs as a plain eager call: its reason
is kept in ``meta[FALLBACK]`` and logged.
"""

from __future__ import annotations

import logging

import torch.fx as fx

from ..codegen.api import CodegenBackend
from ..config import Config
from ..graph import ALLOCATES, BACKEND, FALLBACK, FALLBACK_BACKEND, GROUP, free_symbols, node_kind, op_display
from ..pipeline import PassResult

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

    def __init__(self, backend: CodegenBackend, config: Config):
        self.backend = backend
        self.config = config

    def refusal(self, node: fx.Node, inputs_bound: set) -> str | None:
        name = op_display(node.target)
        if name in self.config.fallback_ops or name.rsplit(".", 1)[0] in self.config.fallback_ops:
            return "listed in Config.fallback_ops"
        if not free_symbols(node.meta.get("val")) <= inputs_bound:
            return "output size depends on values computed inside the graph"
        try:
            return self.backend.accepts(node, self.config)
        except Exception as e:  # a backend's capability check must not take the model down
            return f"{self.backend.name}.accepts raised {type(e).__name__}: {e}"

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        bound = bound_symbols(gm)
        gid = 0
        fallbacks = 0
        for node in gm.graph.nodes:
            for k in (GROUP, BACKEND, FALLBACK, ALLOCATES):
                node.meta.pop(k, None)
            if node_kind(node) != "compute":
                continue
            reason = self.refusal(node, bound)
            node.meta[GROUP] = gid
            gid += 1
            if reason is None:
                node.meta[BACKEND] = self.backend.name
                if self.backend.allocates is not None and self.backend.allocates(node, self.config):
                    node.meta[ALLOCATES] = True
            else:
                node.meta[BACKEND] = FALLBACK_BACKEND
                node.meta[FALLBACK] = reason
                fallbacks += 1
                log.info("fxforge: %s (%s) runs as eager fallback: %s", node.name, op_display(node.target), reason)
        return PassResult(gm, True, {"groups": gid, "fallback_nodes": fallbacks})
