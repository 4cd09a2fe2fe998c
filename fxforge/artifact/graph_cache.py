"""The compiled-graph cache: a graph fxforge compiled once is loaded, not compiled, by every later
compile of the same graph, in this process or another (a warm start).

An entry (one JSON file, ``$FXFORGE_CACHE_DIR/graphs/<key>.json``) holds the generated wrapper's
source and its profiled twin, its globals described by name (``named.py``), the ops it binds,
each backend's kernel unit (``CodegenBackend.save_unit``: the C kernels, whose shared objects the
kernel cache holds, built again if it lost them), its constant tensors, the compiled regions it
calls (by their own keys), its stats, kernels and outputs' strides.

The key is a SHA-256 over what decides the generated code: the graph (each node's op, target,
arguments and value: sizes, strides, dtype, device; the bytes of its constants; the bodies of
higher-order ops), its symbols' ranges and hints, the graph metadata the entry points give the
passes, the ``Config``, the kind of graph, the out variants and codegen backends registered,
this machine's architecture and CPU flags, the C compiler named by ``$CC``, the ``FXFORGE_*``
environment (but the cache's own switches and ``FXFORGE_TIERED_BUILDS``: how the kernels are built
first decides nothing in them), and the versions of Python, torch and fxforge (with a hash of fxforge's sources).

Not cached (compiled each time; ``stats["graph_cache"]`` says why): a Config with user passes, an
``on_kernel`` hook or a ``report_dir`` (a report needs the compile's own records), a graph holding
a value that cannot be named or a constant over ``MAX_TENSOR_BYTES``, and a wrapper whose globals
cannot be named or that holds kernels of a backend without ``save_unit`` (Triton's).

Like the kernel caches (``codegen/diskcache.py``) the directory is private and every write is
atomic; nothing is unpickled.  An entry that does not parse, whose hash differs from its body's,
that another version wrote, or whose globals this process cannot find again is logged, compiled
again and overwritten: never run.  ``FXFORGE_GRAPH_CACHE=0`` (or torch's
``torch.compiler.config.force_disable_caches``) turns the cache off.  Entries stored by this
process are recorded with torch's cache artifacts: ``torch.compiler.save_cache_artifacts()``
carries them, and ``load_cache_artifacts`` puts them in this cache.
"""

from __future__ import annotations

import base64
import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import sys
import time
from typing import Any, Callable

import torch
import torch.fx as fx

from ..codegen.diskcache import atomic_write, cache_dir
from ..codegen.registry import Registry
from ..core.config import Config
from ..core.graph import CUSTOM_OP_DISPATCH, FREE_OUTPUTS, INPUT_STRIDES, VAL, fetch_attr, shape_env_of, size_hints
from ..core.plan import Region
from ..infra.host import arch, cpu_field
from . import named
from .compiled import Compiled, KernelInfo

log = logging.getLogger("fxforge")

ENV = "FXFORGE_GRAPH_CACHE"
FORMAT = 1
KIND = "graphs"  # the cache directory's name under $FXFORGE_CACHE_DIR
ARTIFACT = "fxforge_graph"  # the type of torch's cache artifacts holding fxforge's entries
# Constant tensors (of the graph, or made by its passes) an entry holds at most, in bytes.
MAX_TENSOR_BYTES = 16 << 20
# Config fields that decide nothing in the generated code.
_CONFIG_IGNORED = ("progress", "tiered_builds")


class Uncacheable(Exception):
    """Why a graph or its compile is not cached."""


def off() -> str | None:
    """Why the cache is off in this process (None: it is on)."""
    if os.environ.get(ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENV}=0"
    try:
        if torch.compiler.config.force_disable_caches:
            return "torch.compiler.config.force_disable_caches"
    except Exception:  # (a torch without that switch)
        pass
    return None


# --------------------------------------------------------------------------- the key


def _real():
    """Tensors made or read here are real ones: the compile may run under AOTAutograd's fake mode."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def key(gm: fx.GraphModule, config: Config, kind: str, region: str, registry: Registry) -> str:
    """The entry's key (module docstring); ``Uncacheable`` where the compile cannot be cached."""
    with _real():
        return _key(gm, config, kind, region, registry)


def _key(gm: fx.GraphModule, config: Config, kind: str, region: str, registry: Registry) -> str:
    if config.passes or config.on_kernel is not None:
        raise Uncacheable("the Config holds user passes or an on_kernel hook")
    if config.report_dir:
        raise Uncacheable("the Config asks for a report (report_dir)")
    if CUSTOM_OP_DISPATCH.on(gm):
        raise Uncacheable("the graph calls custom ops dispatched per size")
    h = hashlib.sha256()
    for part in _environment(registry):
        h.update(part.encode())
    fields = [(f.name, getattr(config, f.name)) for f in dataclasses.fields(config) if f.name not in _CONFIG_IGNORED]
    h.update(repr(sorted(fields, key=lambda kv: kv[0])).encode())
    h.update(f"|{kind}|{region}|{FREE_OUTPUTS.get(gm)}|{sorted((INPUT_STRIDES.get(gm) or {}).items())}".encode())
    _digest_graph(gm, h)
    env = shape_env_of(gm)
    if env is not None:
        h.update(repr(sorted((str(s), str(r)) for s, r in env.var_to_range.items())).encode())
        h.update(repr(sorted((str(s), str(v)) for s, v in size_hints(env).items())).encode())
    return h.hexdigest()


def _environment(registry: Registry) -> list[str]:
    from ..lowering.out_variant import OUT_VARIANTS

    backends = [(b.name, b.priority, b.devices) for b in map(registry.get, registry.names())]
    unkeyed = (ENV, "FXFORGE_CACHE_DIR", "FXFORGE_PROGRESS", "FXFORGE_TEST_CACHE", "FXFORGE_TIERED_BUILDS")
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("FXFORGE_") and k not in unkeyed)
    return [_sources_digest(), torch.__version__, sys.version, arch(), cpu_field("flags"), os.environ.get("CC", ""),
            repr(backends), repr(env), repr(OUT_VARIANTS.registered())]


@functools.lru_cache(maxsize=None)
def _sources_digest() -> str:
    """fxforge's version and a hash of its sources (a changed checkout compiles anew)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("fxforge")
    except PackageNotFoundError:  # (run from a source tree)
        installed = "unknown"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256(installed.encode())
    for d, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for f in sorted(files):
            if f.endswith(".py"):
                with open(os.path.join(d, f), "rb") as fh:
                    h.update(f.encode() + fh.read())
    return h.hexdigest()


def graph_digest(gm: fx.GraphModule) -> str:
    """A SHA-256 of the graph alone (nodes, values, constants, bodies: what the key holds of it);
    ``Uncacheable`` where it holds a value that cannot be named."""
    h = hashlib.sha256()
    with _real():
        _digest_graph(gm, h)
    return h.hexdigest()


def _digest_graph(gm: fx.GraphModule, h) -> None:
    index: dict[fx.Node, int] = {}

    def arg(a: Any) -> str:
        if isinstance(a, fx.Node):
            return f"%{index[a]}"
        if isinstance(a, (tuple, list)):
            inner = ",".join(arg(x) for x in a)
            return f"({inner})" if isinstance(a, tuple) else f"[{inner}]"
        if isinstance(a, dict):
            return "{" + ",".join(f"{k}:{arg(v)}" for k, v in a.items()) + "}"
        if a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device, torch.layout,
                                       torch.memory_format, slice, torch.SymInt, torch.SymFloat, torch.SymBool)):
            return repr(a)
        return _callable_name(a)

    for i, n in enumerate(gm.graph.nodes):
        index[n] = i
        target = n.target if isinstance(n.target, str) else _callable_name(n.target)
        h.update(f"{n.op}|{target}|{arg(n.args)}|{arg(n.kwargs)}|{_value(n.meta.get(VAL))}\n".encode())
        if n.op == "get_attr":
            _digest_attr(fetch_attr(gm, n.target), h)


def _callable_name(f: Any) -> str:
    if isinstance(f, (torch._ops.OpOverload, torch._ops.HigherOrderOperator, torch._ops.OpOverloadPacket)):
        return f.name() if callable(getattr(f, "name", None)) else str(f)
    module, qualname = getattr(f, "__module__", None), getattr(f, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<locals>" not in qualname:
        return f"{module}.{qualname}"
    raise Uncacheable(f"the graph holds {type(f).__name__} {str(f)[:60]!r}, which has no name")


def _value(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"T({v.dtype},{v.device},{tuple(v.shape)},{v.stride()},{v.storage_offset()})"
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_value(x) for x in v) + ")"
    return repr(v) if v is None or isinstance(v, (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)) \
        else type(v).__name__


def _digest_attr(v: Any, h) -> None:
    if isinstance(v, fx.GraphModule):
        _digest_graph(v, h)
    elif isinstance(v, torch.Tensor):
        if v.is_meta or v.device.type != "cpu" and v.untyped_storage().nbytes() > MAX_TENSOR_BYTES:
            raise Uncacheable("the graph holds a constant tensor whose bytes cannot be hashed here")
        h.update(_value(v).encode() + hashlib.sha256(_tensor_bytes(v)).digest())
    else:
        raise Uncacheable(f"the graph holds a {type(v).__name__} attribute")


def _tensor_bytes(t: torch.Tensor) -> bytes:
    dense = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cpu").copy_(t.detach())
    storage = dense.untyped_storage()
    return ctypes.string_at(storage.data_ptr(), storage.nbytes()) if storage.nbytes() else b""


# --------------------------------------------------------------------------- entries


def _path(k: str) -> str:
    return os.path.join(cache_dir(KIND), f"{k}.json")


def store(k: str, compiled: Compiled, registry: Registry) -> None:
    """Write ``compiled``'s entry under key ``k``; a compile whose wrapper cannot be stored is
    logged (debug) and left out."""
    try:
        with _real():
            body = json.dumps(_entry(compiled, registry), separators=(",", ":"))
    except (Uncacheable, named.Unnamed) as e:
        compiled.stats["graph_cache"] = f"not stored: {e}"
        log.debug("fxforge: graph cache: %s not stored: %s", k[:12], e)
        return
    text = json.dumps({"format": FORMAT, "key": k, "sha256": hashlib.sha256(body.encode()).hexdigest(), "body": body})
    atomic_write(_path(k), text)
    compiled.cache_key = k
    compiled.stats["graph_cache"] = "stored"
    _record_artifact(k, text)


def _entry(c: Compiled, registry: Registry) -> dict:
    w = c.artifact
    regions = {id(r): r for r in c.regions}
    for r in c.regions:
        if r.compiled is None or r.compiled.cache_key is None:
            raise Uncacheable(f"its region {r.name} is not cached")
    kernels = {f"{k.name}_c" for k in w.kernels} | {ns for ns, _, _ in w.ops}
    named_in_source = set(re.findall(r"[A-Za-z_]\w*", w.source + w.profiled_source))  # (globals no code reads: left out)
    globals_, tensors = {}, {}
    for name, v in w.globals.items():
        if name in kernels or name not in named_in_source:
            continue
        if id(v) in regions:
            globals_[name] = {"region": regions[id(v)].compiled.cache_key}
            continue
        d = named.describe(name, v)
        if "tensor" in d:
            if v.untyped_storage().nbytes() > MAX_TENSOR_BYTES or v.device.type != "cpu":
                raise Uncacheable(f"the wrapper holds the constant {name} ({v.device}, {v.untyped_storage().nbytes()} bytes)")
            tensors[name] = {"dtype": named.dtype_name(v.dtype), "shape": list(v.shape), "stride": list(v.stride()),
                             "bytes": base64.b64encode(_tensor_bytes(v)).decode()}
        globals_[name] = d
    units = {}
    for name, unit in w.units.items():
        save = registry.get(name).save_unit
        if save is None:
            raise Uncacheable(f"the {name} backend's kernels cannot be stored (no save_unit)")
        units[name] = save(unit)
    return {
        "source": w.source, "profiled": w.profiled_source, "globals": globals_, "tensors": tensors,
        "ops": [list(op) for op in w.ops], "units": units, "demoted": w.demoted,
        "stats": json.loads(json.dumps(c.stats, default=str)),
        "kernels": [[k.name, k.backend, k.node_count, k.num_args, k.unique_io_buffers] for k in c.kernels],
        "regions": [{"name": r.name, "sites": r.sites, "key": r.compiled.cache_key} for r in c.regions],
        "output_strides": c.output_strides, "n_inputs": c.n_inputs, "holds_inputs": c.holds_inputs,
        "communicates": c.communicates,
    }


def load(k: str, registry: Registry, *, eager: Callable | None, debug: bool,
         materialize: Callable[[], Compiled] | None) -> Compiled | None:
    """The compiled graph of entry ``k``, or None (no entry; an entry that cannot be used is
    logged and None)."""
    t0 = time.perf_counter()
    try:
        with open(_path(k), encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("fxforge: graph cache: cannot read the entry %s (%s); compiling", k[:12], e)
        return None
    try:
        entry = _checked(text, k)
        with _real():
            c = _compiled(entry, k, registry, eager, debug)
    except Exception as e:  # a damaged, stale or foreign entry is compiled again, never run
        log.warning("fxforge: graph cache: the entry %s cannot be used (%s: %s); compiling again", k[:12],
                    type(e).__name__, e)
        return None
    c._materialize = materialize
    c.stats["compile_seconds"] = time.perf_counter() - t0
    c.stats["graph_cache"] = "hit"
    return c


def _checked(text: str, k: str) -> dict:
    outer = json.loads(text)
    if not isinstance(outer, dict) or outer.get("format") != FORMAT or outer.get("key") != k:
        raise ValueError(f"written by another format ({outer.get('format') if isinstance(outer, dict) else '?'})")
    body = outer["body"]
    if hashlib.sha256(body.encode()).hexdigest() != outer["sha256"]:
        raise ValueError("its content does not match its hash")
    return json.loads(body)


def _compiled(e: dict, k: str, registry: Registry, eager: Callable | None, debug: bool) -> Compiled:
    from ..codegen import runtime
    from ..codegen.wrapper import Wrapper

    tensors = {name: _tensor(t) for name, t in e["tensors"].items()}
    regions, globals_ = [], {}
    for r in e["regions"]:
        body = load(r["key"], registry, eager=None, debug=debug, materialize=None)
        if body is None:
            raise ValueError(f"its region {r['name']} has no usable entry")
        regions.append(Region(r["name"], body.generated, body, list(r["sites"])))
    calls = {r.compiled.cache_key: r for r in regions}
    for name, d in e["globals"].items():
        globals_[name] = calls[d["region"]] if "region" in d else named.resolve(name, d, tensors)
    if e["ops"]:
        globals_.update(runtime.bind_ops({tuple(op): named.op(*op) for op in e["ops"]}))
    units = {}
    for name, data in e["units"].items():
        backend = registry.get(name)
        if backend.load_unit is None or backend.link is None:
            raise ValueError(f"the {name} backend cannot load its kernels")
        units[name] = backend.load_unit(data)
        globals_.update(backend.link(units[name]))
    w = Wrapper(e["source"], globals_, [], [tuple(d) for d in e["demoted"]], e["profiled"], {}, units)
    fn, profiled = w.load(f"<fxforge-cached {k[:12]}>")
    c = Compiled(fn, profiled=profiled, source=e["source"], stats=dict(e["stats"]),
                 kernels=[KernelInfo(*x) for x in e["kernels"]], graph=None, eager=eager, debug=debug,
                 holds_inputs=e["holds_inputs"], communicates=e["communicates"], n_inputs=e["n_inputs"])
    c.output_strides = [tuple(s) if s is not None else None for s in e["output_strides"]]
    c.regions = regions
    c.cache_key = k
    return c


def _tensor(d: dict) -> torch.Tensor:
    data = bytearray(base64.b64decode(d["bytes"]))
    dtype = getattr(torch, d["dtype"])
    flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
    return flat.as_strided(d["shape"], d["stride"])


# --------------------------------------------------------------------------- torch's cache artifacts


@functools.lru_cache(maxsize=None)
def _artifact_type() -> type | None:
    """fxforge's entries as a kind of torch's cache artifact (``torch.compiler.save_cache_artifacts``):
    registered once per process; None where this torch has no such registry."""
    try:
        from torch.compiler._cache import CacheArtifact, CacheArtifactFactory
    except ImportError:
        return None

    class FxforgeGraphArtifact(CacheArtifact):
        def populate_cache(self) -> None:
            atomic_write(_path(self.key), self.content.decode())

        @staticmethod
        def type() -> str:
            return ARTIFACT

    try:
        return CacheArtifactFactory.register(FxforgeGraphArtifact)
    except (AssertionError, AttributeError, TypeError):
        return None


def _record_artifact(k: str, text: str) -> None:
    if _artifact_type() is None:
        return
    try:
        from torch.compiler._cache import CacheArtifactManager

        CacheArtifactManager.record_artifact(ARTIFACT, k, text.encode())
    except Exception as e:  # torch's bookkeeping, not the compile: the entry is on disk anyway
        log.debug("fxforge: graph cache: not recorded with torch's cache artifacts (%s)", e)
