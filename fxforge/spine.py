"""One graph through the spine: passes -> plan -> wrapper source -> ``Compiled``."""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch.fx as fx

from .infra import logs
from .codegen import wrapper
from .codegen.registry import DEFAULT_REGISTRY, Registry
from .artifact import graph_cache
from .artifact.compiled import Compiled, KernelInfo
from .core.config import Config
from .core.costs import graph_models
from .core.graph import (BACKEND, FALLBACK, FALLBACK_BACKEND, GRAPH_META_KEYS, GROUP, GUARD_INPUTS, HEAD_START, PROBES,
                         REGION, SAVE_PLAN, KeptWhole, count_compute_nodes, device_types, forget_answers,
                         output_nodes, region_body)
from .lowering.cleanup import DedupeGetitems, EliminateDeadCode, EliminateIdentityViews
from .lowering.conv_layout import ConvLayout
from .lowering.crops import LowerCrops
from .lowering.embedding_grads import AccumulateEmbeddingGrads
from .lowering.gathers import SinkGathers
from .lowering.matmul_accumulate import MatmulAccumulate
from .lowering.permuted_copies import PermutedCopies
from .lowering.reshaped_cats import CatThroughReshapes
from .lowering.splits import SplitForFusion
from .passes.assign import AssignBackends
from .passes.bucketing import BucketCollectives
from .passes.fusion import FuseGroups, verify_groups
from .passes.memory import plan_memory, verify_memory_plan
from .passes.padcat import ZeroCopyCatPad
from .passes.overlap import bound_in_flight, comm_figures, overlap, wait_at_once
from .passes.schedule import peak_bytes, program_order, schedule as make_schedule
from .passes.symmetric import LowerAllReduceToSymmetric, PlaceSymmetric
from .infra.pass_manager import PassError, PassManager, pass_name
from .artifact.stats import CompileStats
from .infra.progress import Progress
from .core.plan import Group, MemoryPlan, Plan, Region, group_outputs
from .report.hooks import on_compiled
from .report.record import PassRecorder

log = logging.getLogger("fxforge")

_graph_ids = itertools.count()  # one per compile: names its traceback file and its report; no other state


def default_passes(config: Config, registry: Registry, gm: fx.GraphModule, kind: str = "graph") -> list:
    """fxforge's pipeline, with the user passes of ``config.passes`` at their named points
    (``kind``: the graph's role, ``compile_graph``'s)."""
    backend = registry.select(config, device_types(gm))
    extern = registry.get(backend.extern) if backend.extern and backend.extern != backend.name else None
    assign = AssignBackends(backend, config, extern)
    return [
        DedupeGetitems(), EliminateIdentityViews(returned=kind == "backward"),
        ConvLayout(config.conv_layout),
        *([SplitForFusion(backend.splits)] if backend.splits else []), SinkGathers(),
        *([CatThroughReshapes()] if config.zero_copy else []),
        *([PermutedCopies()] if backend.fusion_cost is not None else []), EliminateDeadCode(),
        AccumulateEmbeddingGrads(), MatmulAccumulate(), LowerCrops(),
        *([BucketCollectives(config)] if config.bucket_bytes else []),
        *([LowerAllReduceToSymmetric(config)] if config.symmetric_all_reduce_bytes else []),
        *config.passes_at("after_lowering"),
        assign, *config.passes_at("after_assignment"),
        FuseGroups(backend, config), *config.passes_at("after_fusion"),
        PlaceSymmetric(assign, config),
        *([ZeroCopyCatPad(registry, config)] if config.zero_copy else []),
    ]


def _check_groups(gm: fx.GraphModule, config: Config, registry: Registry) -> None:
    """Debug mode: user passes after fusion left kernel groups a backend can still emit."""
    backend = registry.select(config, device_types(gm))
    problems = verify_groups(gm, config, backend)
    if problems:
        names = ", ".join(getattr(p, "__name__", type(p).__name__) for p in config.passes_at("after_fusion"))
        raise PassError(names, "; ".join(problems[:10]))


def _fuses(backend: str, registry: Registry) -> bool:
    """Groups of this backend run as one kernel each (values inside never reach memory)."""
    return backend != FALLBACK_BACKEND and registry.get(backend).fuses


def kernels_ahead(gm: fx.GraphModule, config: Config, registry: Registry) -> dict:
    """Each backend's kernels begun before the schedule and memory plan are made
    (``CodegenBackend.ahead``, given the fused groups in program order: the C backend's units
    build while they are made); what the wrapper's kernels then go to (``KernelContext.units``)."""
    units: dict = {}
    ahead: dict[str, list[Group]] = {}
    for g in build_groups(gm, list(gm.graph.nodes), registry):
        if g.fused and not g.reason and registry.get(g.backend).ahead is not None:
            ahead.setdefault(g.backend, []).append(g)
    for name, groups in ahead.items():
        registry.get(name).ahead(groups, config, units)
    return units


def build_groups(gm: fx.GraphModule, sched: list[fx.Node], registry: Registry) -> list[Group]:
    """Groups from the ``GROUP``/``BACKEND`` metadata the passes wrote, in schedule order."""
    by_id: dict[int, Group] = {}
    for n in sched:
        gid = GROUP.get(n)
        if gid is None:
            continue
        if gid not in by_id:
            backend = BACKEND.of(n)
            fused = _fuses(backend, registry)
            by_id[gid] = Group(gid, backend, [], fused=fused,
                               overwrites_inputs=fused and registry.get(backend).overwrites_inputs)
        g = by_id[gid]
        g.nodes.append(n)
        if FALLBACK.on(n):
            g.reason = FALLBACK.of(n)
    outputs = set(output_nodes(gm))
    for g in by_id.values():
        members = set(g.nodes)
        for n in g.nodes:
            for a in n.all_input_nodes:
                if a not in members and a not in g.inputs:
                    g.inputs.append(a)
        g.outputs = group_outputs(g.nodes, outputs)
    return list(by_id.values())


def compile_graph(
    gm: fx.GraphModule,
    config: Config,
    *,
    kind: str = "graph",
    registry: Registry | None = None,
    passes: Sequence | None = None,
    region: str = "",
    cache: bool = True,
) -> Compiled:
    """Compile an ATen-level GraphModule whose nodes carry ``meta["val"]`` (``region``: the name
    of the ``invoke_subgraph`` body it is, called from a graph of this ``kind``), or load it from
    the compiled-graph cache (``artifact/graph_cache.py``; ``cache=False``: compile it here)."""
    with collector_paused():  # (the key, the load and the compile each make many objects)
        compiled = _start(gm, config, kind, registry or DEFAULT_REGISTRY, passes, region, cache)()
        forget_answers(gm)  # (the graph as given; the one compiled forgets its own in _finish)
        return compiled


def _start(gm: fx.GraphModule, config: Config, kind: str, registry: Registry, passes: Sequence | None, region: str,
           cache: bool) -> Callable[[], Compiled]:
    """A graph's compile in two steps: this call loads it from the cache, or runs its passes and
    emits its kernels (their builds start); the function it returns links and loads it, and
    stores it in the cache (a graph calling regions finishes them once its own kernels are
    emitted: their builds run side by side)."""
    key, why = None, graph_cache.off() if cache else "off for this compile"
    if why is None and passes is not None:
        why = "not cached: explicit passes"
    if why is None:
        try:
            key = graph_cache.key(gm, config, kind, region, registry)
        except graph_cache.Uncacheable as e:
            why = f"not cached: {e}"
    if key is not None:
        # what only a compile makes, for a graph loaded from the cache: compiled again, silently
        found = graph_cache.load(key, registry, eager=_boxed(gm), debug=config.debug,
                                 materialize=lambda: _compile(gm, config, kind, registry, None, region, announce=False))
        if found is not None:
            _announce_loaded(found, kind, key)
            return lambda: found
    finish = _compile_steps(gm, config, kind, registry, passes, region)

    def finish_and_store() -> Compiled:
        compiled = finish()
        if key is not None:
            graph_cache.store(key, compiled, registry)
        else:
            compiled.stats["graph_cache"] = why
        return compiled

    return finish_and_store


def _compile(gm: fx.GraphModule, config: Config, kind: str, registry: Registry, passes: Sequence | None, region: str,
             announce: bool = True) -> Compiled:
    with collector_paused():  # (also where a loaded graph's plan is made on demand)
        return _compile_steps(gm, config, kind, registry, passes, region, announce)()


def _compile_steps(gm: fx.GraphModule, config: Config, kind: str, registry: Registry, passes: Sequence | None,
                   region: str, announce: bool = True) -> Callable[[], Compiled]:
    """``_emit`` now, and the function finishing the compile (``_finish``)."""
    progress = Progress(f"{kind} region {region}" if region else kind, count_compute_nodes(gm),
                        enabled=config.progress and announce)
    try:
        emitted = _emit(gm, config, kind, registry, passes, progress, region)
    except BaseException:
        progress.close()
        raise

    def finish() -> Compiled:
        try:
            return _finish(emitted, announce)
        finally:
            progress.close()

    return finish


def compile_regions(gm: fx.GraphModule, config: Config, kind: str, registry: Registry) -> list[Region]:
    """Each distinct ``invoke_subgraph`` body of ``gm`` (``torch.compiler.nested_compile_region``,
    and the forward and backward bodies AOTAutograd partitions it into) compiled once, by this
    same pipeline; every node invoking it gets the compiled body (``REGION``), which its kernel
    calls.  Bodies that are the same program (the same code over inputs of the same sizes,
    strides and dtypes) share one compile.  A body whose compile fails is left to its nodes,
    which run it eagerly (logged; raised in debug mode).  Each body is emitted here and finished
    (``Region.finish``: linked and loaded) when the caller's own kernels are (``_finish``)."""
    found: dict[Any, Region | None] = {}
    keys: dict[int, Any] = {}  # body -> its key, read before its compile transforms it
    for n in gm.graph.nodes:
        body = region_body(n)
        if body is None:
            continue
        key = keys.get(id(body))
        if key is None:  # (once per body: its call sites share it)
            key = keys[id(body)] = _body_key(body)
        if key not in found:
            name = n.args[1] if len(n.args) > 1 and isinstance(n.args[1], str) else n.args[0].target
            GUARD_INPUTS.set(body, True)  # (the caller passes its values as it has laid them out)
            try:
                found[key] = Region(name, finish=_start(body, config, kind, registry, None, name, True), body=body)
            except Exception as e:
                if config.debug:
                    raise
                log.warning("fxforge: could not compile the region %s (%s: %s); its calls run it eagerly",
                            name, type(e).__name__, e)
                found[key] = None
        region = found[key]
        if region is not None:
            region.sites.append(n.name)
            REGION.set(n, region)
    return [r for r in found.values() if r is not None]


def _body_key(body: fx.GraphModule) -> Any:
    """What makes two region bodies the same program: their nodes, the values they compute and
    the constants they hold (``graph_cache.graph_digest``); a body holding what cannot be named
    is only itself."""
    try:
        return graph_cache.graph_digest(body)
    except graph_cache.Uncacheable:
        return id(body)


# The stage that follows each of ``_compile_graph``'s stages (the progress line names it).
_NEXT_STAGE = {"regions": "passes", "passes": "kernels ahead of the plan", "kernels_ahead": "schedule",
               "schedule": "memory plan", "memory_plan": "kernels and wrapper", "codegen": "linking the kernels",
               "link": "loading"}


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector does not run while a compile does (``gc.disable``), and
    runs again after it.  A compile makes many objects that live until it ends and next to no
    cyclic garbage: the collector's passes over them would find almost nothing, at a cost that
    grows with the graph.  A collector the caller turned off stays off, and a compile inside a
    compile (a region's body) leaves it to the outer one.

    When it runs again, what the compile made and kept (the compiled graph, its plan and wrapper)
    joins the oldest generation unexamined (``gc.freeze`` then ``gc.unfreeze``), where the next
    full collection looks at it as at every other long-lived object: otherwise the first young
    collection after the compile walks all of it (a quarter of a second for a graph of 10k nodes)
    to find it alive.  Not where the process froze objects of its own (``gc.get_freeze_count``):
    unfreezing would hand those back to the collector."""
    if not gc.isenabled():  # (the caller's choice, or an outer compile's pause)
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if not gc.get_freeze_count():
            gc.freeze()
            gc.unfreeze()
        gc.enable()


class _Stages:
    """The seconds each stage of one compile took, each stage's end announced on the progress line."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.seconds: dict[str, float] = {}
        self.clock = time.perf_counter()

    def done(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = now - self.clock
        self.clock = now
        self.progress.stage(_NEXT_STAGE.get(name, name))


def _run_passes(gm: fx.GraphModule, config: Config, kind: str, registry: Registry, passes: Sequence | None,
                progress: Progress, recorder: PassRecorder) -> tuple[fx.GraphModule, list]:
    """The pass pipeline (``default_passes`` unless ``passes`` are given), each pass observed by
    the report's recorder and the progress line."""
    pass_list = list(passes if passes is not None else default_passes(config, registry, gm, kind))
    following = iter([f"pass {pass_name(p)}" for p in pass_list] + ["schedule"])

    def observe(name: str, g: fx.GraphModule, modified: bool) -> None:  # (after each pass: the report's, the progress line's)
        recorder(name, g, modified)
        progress.stage(next(following, "schedule"))

    gm, records = PassManager(pass_list, debug=config.debug, observer=observe)(gm)
    if config.debug and passes is None and config.passes_at("after_fusion"):
        _check_groups(gm, config, registry)
    return gm, records


def _plan(gm: fx.GraphModule, config: Config, kind: str, registry: Registry, stages: _Stages) -> tuple[Plan, dict]:
    """The schedule, the groups in its order and the memory plan; the scheduler's figures."""
    fused = {GROUP.of(n) for n in gm.graph.nodes
             if GROUP.get(n) is not None and _fuses(BACKEND.get(n, FALLBACK_BACKEND), registry)}
    sched, sched_stats = make_schedule(gm, fused)
    plans: dict[tuple, tuple] = {}  # a schedule -> it bounded in flight, the waits that moved, groups, memory plan

    def planned(order: list[fx.Node]) -> tuple[list[fx.Node], int, list[Group], MemoryPlan]:
        key = tuple(order)
        if key not in plans:
            bounded, early = bound_in_flight(order, config.max_collectives_in_flight)
            groups = build_groups(gm, bounded, registry)
            plans[key] = (bounded, early, groups, plan_memory(gm, bounded, groups, config, kind=kind))
        return plans[key]

    if config.comm_overlap:
        sched, moved = overlap(gm, sched, fused, config, lambda order: planned(order)[3].peak_bytes)
        if moved:
            sched_stats["overlap"] = moved
    else:
        sched = wait_at_once(sched)
    stages.done("schedule")  # (with the plans the overlap weighed)
    sched, early, groups, memory = planned(sched)  # (the overlap's choice: planned already)
    if early:
        sched_stats.setdefault("overlap", {})["waits_for_in_flight_bound"] = early
    if config.debug:
        verify_memory_plan(memory)
    stages.done("memory_plan")
    return Plan(sched, groups, memory), sched_stats


@dataclass(eq=False)
class HeadStart(KeptWhole):
    """A graph's passes, schedule and memory plan run before the graph reached the compiler (the
    memory-budget partitioner plans each choice it weighs, ``plan_ahead``); ``_emit`` goes on from
    them where the graph meets the compile as it met them (``fits``).  A copy of the graph
    (AOTAutograd copies a backward before compiling it) shares its head start; a pickled one
    drops it."""

    config: Config
    kind: str
    meta: dict  # the graph's fxforge metadata the passes ran under (``_pass_meta``)
    gm: fx.GraphModule  # after the passes
    records: list
    recorder: PassRecorder
    plan: Plan
    sched_stats: dict
    seconds: dict  # each stage's

    @property
    def memory(self) -> MemoryPlan:
        return self.plan.memory

    def fits(self, gm: fx.GraphModule, config: Config, kind: str) -> bool:
        """The compile of ``gm`` would run the same passes on the same graph: same Config, kind and
        metadata (a backward's input strides are the forward's compiled outputs' only then)."""
        return config == self.config and kind == self.kind and _pass_meta(gm) == self.meta


def _pass_meta(gm: fx.GraphModule) -> dict:
    """The graph metadata fxforge's passes and wrapper read (all of it but what a head start or
    the memory budget keep beside it)."""
    return {k: v for k, v in gm.meta.items() if k in GRAPH_META_KEYS and k not in (PROBES, SAVE_PLAN, HEAD_START)}


def plan_ahead(gm: fx.GraphModule, config: Config, kind: str, registry: Registry) -> HeadStart:
    """``gm`` through the default passes, schedule and memory plan, no code emitted: its memory
    plan (``HeadStart.memory``), and where ``gm`` is later compiled with this head start
    (``HEAD_START``), what the compile goes on from. The passes rewrite ``gm``: hand in a graph
    made for this."""
    progress = Progress(kind, count_compute_nodes(gm), enabled=False)
    meta = _pass_meta(gm)
    try:  # (the caller pauses the garbage collector around its plans: collector_paused)
        stages = _Stages(progress)
        recorder = PassRecorder()
        gm, records = _run_passes(gm, config, kind, registry, None, progress, recorder)
        stages.done("passes")
        plan, sched_stats = _plan(gm, config, kind, registry, stages)
    finally:
        progress.close()
    return HeadStart(config, kind, meta, gm, records, recorder, plan, sched_stats, dict(stages.seconds))


@dataclass
class _Emitted:
    """A graph compiled up to its emitted kernels (``_emit``), what ``_finish`` needs."""

    gm: fx.GraphModule
    config: Config
    kind: str
    registry: Registry
    region: str
    t0: float
    nodes_in: int
    eager_peak: int
    stages: _Stages
    regions: list[Region]
    graph_id: int
    label: str
    recorder: PassRecorder
    records: list
    plan: Plan
    sched_stats: dict
    wrapper: Any


def _emit(gm: fx.GraphModule, config: Config, kind: str, registry: Registry, passes: Sequence | None,
          progress: Progress, region: str = "") -> _Emitted:
    t0 = time.perf_counter()
    nodes_in = progress.nodes
    eager_peak = peak_bytes(gm, program_order(gm))
    stages = _Stages(progress)
    regions = compile_regions(gm, config, kind, registry)
    if regions:
        stages.done("regions")
    graph_id = next(_graph_ids)
    label = f"{kind}-region-{graph_id}" if region else f"{kind}-{graph_id}"
    head = HEAD_START.get(gm)
    HEAD_START.clear(gm)
    units: dict = {}
    if head is not None and passes is None and not regions and head.fits(gm, config, kind):
        # (the passes, schedule and plan ran ahead, on a copy of this graph: the stages' seconds are those)
        log.debug("fxforge: the %s graph's passes and plan ran ahead (memory budget); its compile goes on from them",
                  kind)
        gm, records, recorder, plan, sched_stats = head.gm, head.records, head.recorder, head.plan, head.sched_stats
        stages.seconds.update(head.seconds)
        stages.clock = time.perf_counter()
    else:
        recorder = PassRecorder()  # what the HTML report needs: code per pass, input graph sketch
        gm, records = _run_passes(gm, config, kind, registry, passes, progress, recorder)
        stages.done("passes")
        units = kernels_ahead(gm, config, registry)
        stages.done("kernels_ahead")
        plan, sched_stats = _plan(gm, config, kind, registry, stages)
    w = wrapper.generate(gm, plan, registry, config, graph=label, units=units)
    stages.done("codegen")
    return _Emitted(gm, config, kind, registry, region, t0, nodes_in, eager_peak, stages, regions, graph_id, label,
                    recorder, records, plan, sched_stats, w)


def _finish(e: _Emitted, announce: bool = True) -> Compiled:
    """The graph's regions finished, then its own kernels linked and its wrapper loaded."""
    w, gm, plan, kind = e.wrapper, e.gm, e.plan, e.kind
    filename = f"<fxforge-{e.label}>"
    code = w.compile(filename)  # (Python's compile of the source needs no kernel: it runs beside their builds)
    for r in e.regions:
        _finish_region(r, e.config)
    regions = e.regions
    wrapper.link(w, e.registry)
    e.stages.done("link")
    fn, profiled = w.load(filename, code)
    e.stages.done("load")

    record = CompileStats.collect(kind, gm, plan.groups, plan.memory, w, e.records, e.sched_stats, nodes_in=e.nodes_in,
                                  eager_peak=e.eager_peak, stages=e.stages.seconds, seconds=time.perf_counter() - e.t0,
                                  region=e.region, regions=regions,
                                  comm={**_comm(gm, plan, e.config), **e.sched_stats.get("overlap", {})})
    forget_answers(gm)
    compiled = Compiled(
        fn,
        profiled=profiled,
        source=w.source,
        stats=record.as_dict(),
        kernels=[KernelInfo(k.name, k.backend, k.node_count, k.num_args, k.unique_io_buffers) for k in w.kernels],
        graph=gm,
        plan=plan,
        eager=_boxed(gm),
        debug=e.config.debug,
        holds_inputs=kind != "backward",  # a backward's inputs (saved activations) are freed as it runs
        communicates=bool(record.collectives),
    )
    compiled.report_data = e.recorder.finish(w.kernels)
    compiled.artifact = w
    compiled.regions = regions
    if announce:
        title = f"{kind} region {e.region} graph {e.graph_id}" if e.region else f"{kind} graph {e.graph_id}"
        _announce(compiled, e.config, e.label, title, record)
    return compiled


def _comm(gm: fx.GraphModule, plan: Plan, config: Config) -> dict:
    """``stats["comm"]``: the schedule's collectives replayed under the cost models (passes/overlap.py)."""
    fused = {g.id for g in plan.groups if g.fused}
    return comm_figures(gm, plan.schedule, fused, *graph_models(gm, config.comm_model, config.threads))


def _finish_region(r: Region, config: Config) -> None:
    """Link and load a region's body (``Region.finish``); one that fails runs as its graph module,
    eagerly, at every call site (logged, and said in its caller's fallbacks; raised in debug
    mode)."""
    try:
        c = r.finish()
    except Exception as e:
        if config.debug:
            raise
        log.warning("fxforge: could not compile the region %s (%s: %s); its calls run it eagerly", r.name,
                    type(e).__name__, e)
        body = r.body
        r.call, r.failed = (lambda args: _as_tuple(body(*args))), f"its region failed to compile: {type(e).__name__}: {e}"
        return
    r.compiled, r.call = c, c.generated
    r.finish = None


def _as_tuple(v: Any) -> tuple:
    return tuple(v) if isinstance(v, (tuple, list)) else (v,)


def _announce(compiled: Compiled, config: Config, label: str, title: str, record: CompileStats) -> None:
    """The compiled graph's logs (TORCH_LOGS plan and code, the debug line, naming it ``title``),
    its watchers, and its report where ``config.report_dir`` asks for one (``label``.html)."""
    if logs.PLAN.isEnabledFor(logging.INFO):
        logs.PLAN.info("fxforge: memory plan of the %s\n%s", title, compiled.plan.memory.dump())
    if logs.CODE.isEnabledFor(logging.INFO):
        logs.CODE.info("fxforge: generated code of the %s\n%s", title, compiled.source)
    log.debug("fxforge: compiled %s: %d nodes, %d kernels, %d fallbacks, %.3f s", title,
              record.nodes_in, record.kernels, record.fallback_nodes, record.compile_seconds)
    on_compiled(compiled)  # compile watchers; tlparse artifacts when TORCH_TRACE is set
    if config.report_dir:
        path = os.path.join(config.report_dir, f"{label}.html")
        try:
            os.makedirs(config.report_dir, exist_ok=True)
            compiled.write_report(path)
        except Exception as e:  # the compiled graph is good; only its report is lost
            if config.debug and not isinstance(e, OSError):
                raise
            log.warning("fxforge: could not write the report %s (%s: %s); the compiled graph is kept",
                        path, type(e).__name__, e)


def _announce_loaded(c: Compiled, kind: str, key: str) -> None:
    """A graph loaded from the graph cache says what its compile said: each node it runs eagerly
    (INFO) and its line (DEBUG), and goes to the compile watchers."""
    for name, why in c.stats["fallbacks"].items():
        log.info("fxforge: %s runs as eager fallback: %s", name, why)
    log.debug("fxforge: compiled %s graph from the graph cache (%s): %d kernels, %d fallbacks, %.3f s", kind, key[:12],
              len(c.kernels), c.stats["fallback_nodes"], c.stats["compile_seconds"])
    on_compiled(c)


def _boxed(gm: fx.GraphModule):
    """Runs the (semantics-preserving) transformed graph eagerly: the fallback of a failed call."""

    def run(args: list):
        return gm(*args)

    return run
