"""The generated wrapper: readable Python source that runs one planned graph, made in two stages:
the wrapper plan (``plan.py``: the steps of ``call`` as data, ``steps.py``), computed from the
schedule and the memory plan, and its printer (``source.py``), which prints ``call`` and its
profiled variant from the same plan.

Shape of the source::

    def kernel3(mm, arg2_1, add):            # one function per kernel group (any backend)
        aten.add.out(mm, arg2_1, out=add)     # torch.ops.aten.add.out, bound once at load

    def call(args):
        arg0_1, arg1_1, arg2_1 = args
        args.clear()                          # inputs are freed after their last use
        s0 = arg0_1.size(0)                   # size symbols read off the inputs
        ...
        arena0 = empty_strided_cpu((...,), (1,), torch.uint8)     # arena0: live 4..9
        arena0_f32 = arena0.view(torch.float32)
        add = arena0_f32.as_strided((s0, 16), (16, 1), 0)           # planned buffer = arena view
        kernel3(mm, arg2_1, add)
        ...
        del add, arena0, arena0_f32           # the arena's last buffer is dead: arena freed
        ...
        return (out,)

Graph outputs (and everything they view) are allocated fresh per call, never in the arena, so
values an earlier call returned are never overwritten by a later one.  A large one on the CPU
(``Buffer.recycled``) is allocated over the bytes it had on one of the last two calls where the
caller holds nothing of that result any more (``_recycled.empty(...)``: ``runtime.Recycled``),
which spares the allocator's fresh pages and their faults.  Intermediates are released (``del``)
after their last use, so eager fallbacks do not hold memory longer than eager.
An arena (there may be several per device, each over a window of the schedule) is allocated just
before the first kernel writing one of its buffers, and its name and typed views are deleted
together with the last of its buffers, so its storage is freed as soon as no buffer in it is
live (a later view of a buffer keeps it alive as long as needed).
A kernel whose backend fails to compile it falls back to eager calls for its nodes.

A second function, ``call_profiled``, is ``call`` with each kernel call inside a profiler range
named after the kernel (``kernel_range``); it is compiled and used only for calls made while a
profiler records (``Compiled.call_boxed``).

Kept arenas (``plan.memory.kept_bytes``: static sizes, ``Config.keep_arenas``): the arenas sit
at their own offsets in one block, and every view of a buffer in them is made once, by
``_arenas()``; ``call`` takes them (``runtime.KeptArenas``) and unpacks them at its start, and
lends them back when it returns: no allocation, no view and no ``del`` for them per call.  Ops
are called as ``aten.cumsum.out(...)``: namespaces of the graph's ops bound once to their dispatcher
entries (``runtime.bind_ops``), matmuls through torch's bindings (``runtime.PUBLIC_OUT``); views of
wrapper values through the Tensor methods.  A tensor an ATen call allocated that a generated
kernel reads at its traced strides has its layout checked first (``steps.Guard``).
"""

from __future__ import annotations

import torch.fx as fx

from ...core.config import Config
from ...core.plan import Plan
from ..registry import Registry
from .plan import LAYOUT_VIEWS, RANGE_OPS, VIEW_METHODS, Positions, kernel_range, plan_wrapper, positions
from .source import KERNEL_RANGE, Wrapper, module
from .steps import WrapperPlan

__all__ = ["KERNEL_RANGE", "LAYOUT_VIEWS", "RANGE_OPS", "VIEW_METHODS", "Positions", "Wrapper", "WrapperPlan", "generate",
           "kernel_range", "link", "plan_wrapper", "positions"]


def generate(gm: fx.GraphModule, plan: Plan, registry: Registry, config: Config, graph: str = "graph",
             units: dict | None = None) -> Wrapper:
    """The wrapper of ``gm`` (``graph``: its name in profiler ranges, ``forward-0``...): its plan,
    printed.  Its kernels are emitted (their builds may be running): ``link`` it before loading.
    ``units``: what the backends' ``ahead`` began (``kernels_ahead``)."""
    wp = plan_wrapper(gm, plan, registry, config, graph, units)
    for name, unit in wp.units.items():  # (every kernel is emitted: the builds left may start)
        seal = registry.get(name).seal
        if seal is not None:
            seal(unit)
    source, profiled = module(wp)
    return Wrapper(source, wp.globals, wp.kernels, wp.demoted, profiled, wp.ops, wp.units)


def link(w: Wrapper, registry: Registry) -> None:
    """Each backend's kernels of ``w`` linked into its globals (``CodegenBackend.link``: the C
    kernels' builds waited for and bound), once: a wrapper is linked as late as its caller can,
    so the builds run while the caller does other work (the spine links a graph's regions after
    emitting the graph's own kernels)."""
    for name, unit in w.units.items():
        link_unit = registry.get(name).link
        if link_unit is not None:
            w.globals.update(link_unit(unit))
