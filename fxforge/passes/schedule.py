"""The order nodes run in.  Program order, with each kernel group contiguous."""

from __future__ import annotations

import torch.fx as fx


def schedule(gm: fx.GraphModule) -> list[fx.Node]:
    """Every node but the output node, in program order (a valid topological order)."""
    return [n for n in gm.graph.nodes if n.op != "output"]
