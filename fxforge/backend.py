"""The torch.compile backend: AOTAutograd graphs (forward, backward, inference) through fxforge.

``torch.compile(m, backend="fxforge")`` finds ``fxforge_backend`` through the
``torch_dynamo_backends`` entry point.  ``fxforge.backend(Config(...))`` returns a ``Backend``
whose ``compiled`` list keeps the ``Compiled`` object of every graph it compiled.
"""

from __future__ import annotations

import logging
from typing import Any, Sequence

import torch
import torch.fx as fx

from .codegen.registry import DEFAULT_REGISTRY, Registry
from .compiled import Compiled
from .compiler import compile_graph
from .config import Config
from .lowering.decompose import aot_table

log = logging.getLogger("fxforge")


class Backend:
    """A torch.compile backend bound to one Config.  Keeps every ``Compiled`` in ``compiled``."""

    def __init__(self, config: Config | None = None, *, registry: Registry | None = None):
        self.config = config or Config()
        self.registry = registry or DEFAULT_REGISTRY
        self.compiled: list[Compiled] = []
        # Graphs whose compile failed and that run as AOTAutograd's eager graph: (kind, reason).
        self.failures: list[tuple[str, str]] = []
        self.__name__ = "fxforge"

    def _compiler(self, kind: str):
        def compile_one(gm: fx.GraphModule, example_inputs: Sequence[Any]):
            try:
                c = compile_graph(gm, self.config, kind=kind, registry=self.registry)
            except Exception as e:
                if self.config.debug:
                    raise
                reason = f"{type(e).__name__}: {e}"
                log.warning("fxforge: could not compile the %s graph (%s); it runs eagerly", kind, reason)
                self.failures.append((kind, reason))
                from torch._functorch.aot_autograd import make_boxed_func

                return make_boxed_func(gm)
            if kind == "backward":
                c.stats["saved_activation_bytes"] = saved_activation_bytes(gm)
            self.compiled.append(c)
            return c.call_boxed

        compile_one.__name__ = f"fxforge_{kind}_compiler"
        return compile_one

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
        from torch._dynamo.backends.common import aot_autograd

        devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)} or {"cpu"}
        try:
            selected = self.registry.select(self.config, devices)
        except ValueError as e:
            if self.config.debug:
                raise
            log.warning("fxforge: %s; this graph runs eagerly", e)
            self.failures.append(("graph", str(e)))
            return gm.forward
        aot = aot_autograd(
            fw_compiler=self._compiler("forward"),
            bw_compiler=self._compiler("backward"),
            inference_compiler=self._compiler("inference"),
            decompositions=aot_table(self.config, selected),
            partition_fn=_partitioner(self.config.partitioner),
        )
        return aot(gm, example_inputs)


def _partitioner(name: str):
    from torch._functorch import partitioners

    return {
        "min_cut": partitioners.min_cut_rematerialization_partition,
        "default": partitioners.default_partition,
    }[name]


def saved_activation_bytes(backward: fx.GraphModule) -> int:
    """Bytes the forward saved for this backward graph: its inputs that are not incoming grads."""
    from .graph import VAL, hint, shape_env_of, storage_nbytes

    env = shape_env_of(backward)
    total = 0
    for n in backward.graph.nodes:
        v = n.meta.get(VAL)
        if n.op == "placeholder" and isinstance(v, torch.Tensor) and not n.name.startswith("tangents"):
            total += hint(storage_nbytes(v), env)
    return total


def backend(config: Config | None = None, *, registry: Registry | None = None) -> Backend:
    """A torch.compile backend using ``config``: ``torch.compile(m, backend=fxforge.backend(cfg))``."""
    return Backend(config, registry=registry)


def fxforge_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
    """Entry point behind ``backend="fxforge"``: default Config, a fresh Backend per graph."""
    return Backend()(gm, example_inputs, **kwargs)
