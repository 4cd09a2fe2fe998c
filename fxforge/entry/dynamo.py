"""The torch.compile backend: AOTAutograd graphs (forward, backward, inference) through fxforge.

``torch.compile(m, backend="fxforge")`` finds ``fxforge_backend`` through the
``torch_dynamo_backends`` entry point.  ``fxforge.backend(Config(...))`` returns a ``Backend``
whose ``compiled`` list keeps the ``Compiled`` object of every graph it compiled.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import torch
import torch.fx as fx

from ..codegen.registry import DEFAULT_REGISTRY, Registry
from ..artifact.compiled import Compiled
from ..spine import compile_graph
from ..core.config import Config
from ..custom_ops import inline_winners
from ..core.graph import CUSTOM_OP_DISPATCH, FREE_OUTPUTS, INPUT_STRIDES, SAVE_PLAN, VAL, given_strides
from ..lowering.decompose import aot_table

log = logging.getLogger("fxforge")


class Backend:
    """A torch.compile backend bound to one Config.  Keeps every ``Compiled`` in ``compiled``."""

    def __init__(self, config: Config | None = None, *, registry: Registry | None = None):
        self.config = config or Config()
        self.registry = registry or DEFAULT_REGISTRY
        self.registry.check(self.config)  # (a wrong backend name fails here, not at the first compile)
        self.compiled: list[Compiled] = []
        # Graphs whose compile failed and that run as AOTAutograd's eager graph: (kind, reason).
        self.failures: list[tuple[str, str]] = []
        self.__name__ = "fxforge"

    def wait_for_kernels(self, timeout: float | None = None) -> bool:
        """``Compiled.wait_for_kernels`` of every graph compiled so far, within ``timeout`` seconds in all."""
        end = None if timeout is None else time.monotonic() + timeout
        return all(c.wait_for_kernels(None if end is None else max(0.0, end - time.monotonic())) for c in self.compiled)

    def _compiler(self, kind: str, custom_ops: list[dict], dispatches: dict):
        def compile_one(gm: fx.GraphModule, example_inputs: Sequence[Any]):
            if dispatches:
                CUSTOM_OP_DISPATCH.set(gm, dispatches)
            caller_layouts(gm, example_inputs, kind)
            plan = SAVE_PLAN.get(gm)
            traced = _traced_strides(gm)  # before the passes adopt the given ones
            try:
                c = compile_graph(gm, self.config, kind=kind, registry=self.registry)
            except Exception as e:
                if self.config.debug:
                    raise
                reason = f"{type(e).__name__}: {e}"
                log.warning("fxforge: could not compile the %s graph (%s); it runs eagerly", kind, reason)
                self.failures.append((kind, reason))
                from torch._functorch.aot_autograd import make_boxed_func

                return make_boxed_func(_in_strides(gm, traced) if traced else gm)
            if plan is not None:
                c.stats["memory_budget"] = plan.as_dict()
            if kind == "backward":
                c.stats["saved_activation_bytes"] = saved_activation_bytes(gm)
            else:
                c.stats["custom_ops"] = custom_ops
            if kind == "forward" and FREE_OUTPUTS.on(gm):
                report_output_strides(c)
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
        try:  # custom ops' candidates checked, timed, the winners inlined (fxforge/custom_ops)
            custom_ops, dispatches = inline_winners(gm, self.config, self.registry)
        except Exception as e:
            if self.config.debug:
                raise
            log.warning("fxforge: tuning the graph's custom ops failed (%s: %s); they run as they are", type(e).__name__, e)
            custom_ops, dispatches = [], {}
        aot = aot_autograd(
            fw_compiler=self._compiler("forward", custom_ops, dispatches),
            bw_compiler=self._compiler("backward", custom_ops, dispatches),
            inference_compiler=self._compiler("inference", custom_ops, dispatches),
            decompositions=aot_table(self.config, selected),
            partition_fn=_partitioner(self.config, selected.splits, self.registry, self.compiled),
        )
        from torch._functorch import config as functorch_config

        # Effect tokens (``with_effects``: linalg's error checks, prints) made inside the graphs,
        # not passed in and out of them: what AOTAutograd expects of a backend that reports its
        # forward's output strides (``report_output_strides``), and what it does for Inductor.
        with functorch_config.patch(unlift_effect_tokens=True):
            return aot(gm, example_inputs)


def caller_layouts(gm: fx.GraphModule, example_inputs: Sequence[Any], kind: str) -> None:
    """What AOTAutograd says about layouts, in the graph's meta for the passes (graph.py).

    A training forward's outputs past the user's (``num_forward``: mutated inputs, outputs,
    intermediate bases) are saved for the backward: they may keep any layout (``FREE_OUTPUTS``),
    which ``report_output_strides`` tells AOTAutograd.  It then gives the backward compiler
    example inputs in those strides: the placeholders whose strides differ are recorded
    (``INPUT_STRIDES``) for lowering/conv_layout.py to adopt."""
    from torch._guards import TracingContext

    if kind == "forward":
        tc = TracingContext.try_get()
        meta = getattr(tc, "fw_metadata", None)
        # (no tensor subclass among the outputs: their saved tensors are the subclasses' inner ones)
        plain = all(isinstance(m, int) or type(m).__name__ == "PlainTensorMeta"
                    for m in getattr(meta, "subclass_fw_graph_out_meta", None) or [])
        # (AOTAutograd finds the saved values' strides at ``num_forward``, which counts no effect
        # token: with tokens still among the outputs, each stride would land on the wrong value)
        if isinstance(getattr(meta, "num_forward", None), int) and plain and tc.output_strides is not None \
                and not getattr(meta, "tokens", None):
            FREE_OUTPUTS.set(gm, meta.num_forward)
    elif kind == "backward":
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        given = {}
        for n, x in zip(phs, example_inputs):
            strides = given_strides(n.meta.get(VAL), x)
            if strides is not None:
                given[n.name] = strides
        if given:
            INPUT_STRIDES.set(gm, given)


def report_output_strides(c: Compiled) -> None:
    """A compiled training forward's output strides, to AOTAutograd (which lays the backward's
    example inputs out in them): its outputs are what the compiled graph's values say
    (``Compiled.output_strides``, kept by the graph cache too)."""
    from torch._guards import TracingContext

    tc = TracingContext.try_get()
    if tc is None or tc.output_strides is None:
        return
    tc.output_strides.extend(c.output_strides)


def _traced_strides(gm: fx.GraphModule) -> dict[int, tuple]:
    """Input position -> traced strides, of the inputs given in other strides (``INPUT_STRIDES``)."""
    given = INPUT_STRIDES.get(gm) or {}
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return {i: tuple(n.meta[VAL].stride()) for i, n in enumerate(phs) if n.name in given}


def _in_strides(gm: fx.GraphModule, strides: dict[int, tuple]):
    """``gm`` as a callable that first copies the inputs at these positions into these strides:
    run eagerly, a graph may hold ops (a ``view``) that need the layout it was traced with."""

    def run(*args):
        args = list(args)
        for i, stride in strides.items():
            x = args[i]
            args[i] = torch.empty_strided(x.shape, stride, dtype=x.dtype, device=x.device).copy_(x)
        return gm(*args)

    return run


def _partitioner(config: Config, splits: tuple[str, ...], registry: Registry, compiled: list[Compiled]):
    """AOTAutograd's partitioner ``config.partitioner``, run on the joint graph after activation
    gradients are rewritten to read results (``lowering/result_grads.py``) and the backend's splits
    that belong before partitioning (``lowering/splits.split_joint``); under
    ``config.memory_budget``, then made to fit it (``passes/memory_budget.py``; ``compiled``: the
    graphs compiled so far, whose default peaks a fraction is also of)."""
    from torch._functorch import partitioners

    from ..lowering.result_grads import GradsFromResults
    from ..lowering.splits import split_joint

    partition = {
        "min_cut": partitioners.min_cut_rematerialization_partition,
        "default": partitioners.default_partition,
    }[config.partitioner]
    debug = config.debug

    def split_then_partition(joint: fx.GraphModule, joint_inputs, **kwargs):
        try:
            stats = {"grads_from_results": GradsFromResults()(joint).stats, **split_joint(joint, splits)}
            log.debug("fxforge: the joint graph's rewrites before partitioning: %s", stats)
        except Exception as e:  # (each rewrite leaves a valid graph; the splits run again on the compiled graphs)
            if debug:
                raise
            log.warning("fxforge: rewriting the joint graph failed (%s: %s); it is partitioned as traced",
                        type(e).__name__, e)
        if config.memory_budget is None:
            return partition(joint, joint_inputs, **kwargs)
        from ..passes.memory_budget import partition_under_budget
        from ..spine import collector_paused, plan_ahead

        # (the forward is planned with its saved values free to keep their layouts, as compile_one
        # has it: the chosen graphs' compiles then go on from their plans)
        with collector_paused():  # (the plans make many objects, as a compile does)
            fw, bw, plan = partition_under_budget(
                joint, joint_inputs, base=partition, budget=config.memory_budget, free_outputs=True,
                planner=lambda gm, kind: plan_ahead(gm, config, kind, registry),
                step_peak_so_far=max((c.stats["memory_budget"]["default_peak_bytes"] for c in compiled
                                      if "memory_budget" in c.stats), default=0), **kwargs)
        SAVE_PLAN.set(fw, plan)
        SAVE_PLAN.set(bw, plan)
        return fw, bw

    return split_then_partition


def saved_activation_bytes(backward: fx.GraphModule) -> int:
    """Bytes the forward saved for this backward graph: its inputs that are not incoming grads."""
    from ..core.graph import VAL, is_tangent, shape_env_of, storage_nbytes_hint

    env = shape_env_of(backward)
    total = 0
    for n in backward.graph.nodes:
        v = n.meta.get(VAL)
        if n.op == "placeholder" and isinstance(v, torch.Tensor) and not is_tangent(n):
            total += storage_nbytes_hint(v, env)
    return total


def backend(config: Config | None = None, *, registry: Registry | None = None) -> Backend:
    """A torch.compile backend using ``config``: ``torch.compile(m, backend=fxforge.backend(cfg))``."""
    return Backend(config, registry=registry)


def fxforge_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any):
    """Entry point behind ``backend="fxforge"``: default Config, a fresh Backend per graph."""
    return Backend()(gm, example_inputs, **kwargs)
