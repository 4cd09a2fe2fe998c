"""Tuning one call site (``tune_site``): candidates checked, timed (``fxforge.infra.timing``),
the winner chosen, per range of a dynamic size where asked, and the record cached on disk."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from ..infra.timing import Budget, Timing, quiet, time_candidates
from .check import _Like, _Reference, _check, _describe_inputs, _hint, _site_inputs
from .context import Setting, _compiled, _neighbourhood, context_of
from .register import Tuning

log = logging.getLogger("fxforge")

# Rounds of timed calls per site (each round calls every implementation once), at most, and the
# seconds a site's timing may take once a few rounds ran.
TIMING = Budget(rounds=30, min_rounds=5, seconds=1.0)


def _timed(calls: dict[str, Callable[[], Any]], inputs: tuple) -> Timing:
    """``calls`` timed (``timing.time_candidates``: interleaved, least time over rounds, retried
    while the machine is busy); ``inputs``: the site's (args, kwargs), whose device decides
    whether the calls' CPU time tells the load."""
    on_cuda = any(isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in pytree.tree_leaves(inputs))
    return time_candidates(calls, TIMING, threads=torch.get_num_threads(), host=not on_cuda)


def _cache_key(t: Tuning, args: tuple, kwargs: dict, config: Any, neighbourhood: str = "") -> str:
    def spec(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return [str(v.dtype), [_hint(s) for s in v.shape], [_hint(s) for s in v.stride()], str(v.device)]
        return repr(_hint(v) if isinstance(v, torch.SymInt) else v)

    from ..infra.host import cpu_field

    cpu = cpu_field("model name") or platform.processor() or platform.machine()
    parts = [t.op.name(), torch.__version__, cpu, str(torch.get_num_threads()), config.codegen, repr(t.min_speedup),
             repr(t.dispatch_on), repr(t.split_points),
             *[c.source() for c in t.configs], json.dumps(pytree.tree_map(spec, (list(args), kwargs))), neighbourhood]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _dispatch_symbol(t: Tuning, args: tuple, kwargs: dict) -> Any:
    """The size ``dispatch_on`` names at this site, where it is symbolic (a sympy symbol): the
    site is then tuned per range of ``split_points``; None otherwise."""
    if not t.dispatch_on or not t.split_points:
        return None
    names = [a.name for a in t.op._schema.arguments]
    i = names.index(t.dispatch_on["tensor_name"])
    v = args[i] if i < len(args) else kwargs.get(names[i])
    if not isinstance(v, torch.Tensor) or not -v.dim() <= t.dispatch_on["dim"] < v.dim():
        return None
    size = v.shape[t.dispatch_on["dim"]]
    if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
        return size.node.expr
    return None


def _ranges(points: tuple[int, ...], unbounded: int | None = None) -> list[tuple[int, int | None, int]]:
    """(lowest, highest or None, the size it is timed at) per range of ``split_points``: a
    bounded range at its highest size, the last one at ``unbounded`` (``dispatch_on``'s
    ``unbounded_size``; default twice the last split point)."""
    bounds = [0, *points]
    out = [(lo + 1, hi, hi) for lo, hi in zip(bounds, bounds[1:])]
    return out + [(points[-1] + 1, None, max(points[-1] + 1, unbounded or 2 * points[-1]))]




def _at_size(args: tuple, kwargs: dict, symbol: Any, size: int) -> tuple[tuple, dict]:
    """The site's fake values with every dim of size ``symbol`` at ``size``."""
    def one(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        shape = [size if isinstance(d, torch.SymInt) and d.node.expr == symbol else _hint(d) for d in v.shape]
        return _Like(tuple(shape), v.dtype, v.device)

    return pytree.tree_map(one, args), pytree.tree_map(one, kwargs)


def _choose(t: Tuning, times: dict[str, float]) -> str:
    base = times["fallback"]
    faster = [n for n, s in times.items() if n != "fallback" and base / s >= t.min_speedup]
    return min(faster, key=times.__getitem__) if faster else "fallback"


def tune_site(t: Tuning, args: tuple, kwargs: dict, setting: Setting, node: fx.Node | None = None) -> dict:
    """Check and time every candidate at one call site (``args``/``kwargs``: its fake or example
    values); returns the site's record for ``stats["custom_ops"]``: ``op``, ``node``, ``inputs``,
    ``candidates`` (name -> least seconds per call over the rounds), ``rejected`` (name -> reason), ``winner``
    (a candidate's name, "fallback" for the op itself) and ``cached``.  A site whose
    ``dispatch_on`` size is symbolic is tuned per range of ``split_points`` instead: ``ranges``
    lists each range's sizes, the size timed, the times and the winner (adjacent ranges with the
    same winner merged), and ``winner`` is the common one, or None where they differ.  Given the
    site's ``node``, a static site is timed with its neighbours, fused as they would be
    (``context_of``; ``context`` in the record names them); without one, or where the
    candidates' inputs come from ``input_gen_fns``, on its own."""
    from ..codegen.diskcache import atomic_write, cache_dir

    where = "" if node is None else node.name
    if t.input_gen_fns:
        node = None  # the inputs it names are the op's own, which neighbours would compute
    key = _cache_key(t, args, kwargs, setting.config, "" if node is None else _neighbourhood(node))
    path = os.path.join(cache_dir("custom_ops"), f"{key}.json")
    stored = _stored(path, {c.name for c in t.configs})
    if stored is not None:
        return dict(stored, node=where, cached=True)
    symbol = _dispatch_symbol(t, args, kwargs)
    sites = [(None, None, args, kwargs)] if symbol is None else \
        [(lo, hi, *_at_size(args, kwargs, symbol, at))
         for lo, hi, at in _ranges(t.split_points, t.dispatch_on.get("unbounded_size"))]
    rejected, inputs = _checked(t, sites)
    accepted = [c for c in t.configs if c.name not in rejected]
    record: dict[str, Any] = {"op": t.op.name(), "inputs": _describe_inputs(*inputs[0]), "rejected": rejected}
    if symbol is None:
        timings = [_time_in_context(t, accepted, inputs[0], node, setting, record)]
    else:
        timings = _time_ranges(t, accepted, sites, inputs, record)
    contended = [x for x in timings if x.contended]
    if contended:
        # stored marked: a later compile on a quiet machine times the site again
        record["contended"] = contended[0].describe()
        log.info("fxforge: custom op %s: timed while the machine was busy (%s); choice %s kept until a quiet "
                 "compile times it again", t.op.name(), record["contended"], record["winner"])
    try:
        atomic_write(path, json.dumps(record))
    except OSError:
        pass
    return dict(record, node=where, cached=False)


def _stored(path: str, names: set[str]) -> dict | None:
    """The site's cached record, where it names only these candidates and was not timed on a busy
    machine that is quiet now (``timing.quiet``: then it is timed again)."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        if {r["winner"] for r in record.get("ranges", [record])} <= names and \
                not (record.get("contended") and quiet(torch.get_num_threads())):
            return record
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def _checked(t: Tuning, sites: list) -> tuple[dict[str, str], list]:
    """Every candidate checked against the op on each site's generated inputs: the rejected ones
    (name -> why, each logged), and the inputs (args, kwargs) of each site."""
    rejected: dict[str, str] = {}
    inputs = []
    for seed, (_, _, a, k) in enumerate(sites):
        real = _site_inputs(t, a, k, seed)
        inputs.append(real)
        ref = _Reference.of(t, *real)
        for cfg in t.configs[1:]:
            why = None if cfg.name in rejected else _check(t, cfg, ref)
            if why is not None:
                rejected[cfg.name] = why
                log.warning("fxforge: custom op %s: candidate %s rejected on inputs (%s): %s", t.op.name(), cfg.name,
                            _describe_inputs(*real), why)
    return rejected, inputs


def _time_in_context(t: Tuning, accepted: list, inputs: tuple, node: fx.Node | None, setting: Setting,
                     record: dict) -> Timing:
    """A static site: each accepted candidate compiled (among the neighbours it fuses with, where
    ``node`` is given) and timed; the times, the winner and the context go into ``record``; a
    candidate that does not compile is rejected there."""
    calls = {}
    context = None if node is None else context_of(node, setting)
    if context is not None:
        record["context"] = context.describe()
    for cfg in accepted:
        try:
            calls[cfg.name] = context.call(cfg, t, setting) if context is not None else \
                _compiled(t, cfg, *inputs, setting)
        except Exception as e:
            if cfg.impl is None:
                raise
            record["rejected"][cfg.name] = f"did not compile: {type(e).__name__}: {e}"
            log.warning("fxforge: custom op %s: candidate %s did not compile (%s); not chosen", t.op.name(),
                        cfg.name, e)
    timing = _timed(calls, inputs)
    record["candidates"] = timing.seconds
    record["winner"] = _choose(t, record["candidates"])
    return timing


def _time_ranges(t: Tuning, accepted: list, sites: list, inputs: list, record: dict) -> list[Timing]:
    """A site tuned per range of its ``dispatch_on`` size: each range timed at its size, adjacent
    ranges with one winner merged, into ``record``'s ``ranges``."""
    # one graph serves every range: each range's winner runs as its own ATen calls, timed so
    dim = t.dispatch_on["dim"]
    record["dispatch_on"] = f"{t.dispatch_on['tensor_name']}.size({dim})"
    ranges, timings = [], []
    for (lo, hi, _, _), (ra, rk) in zip(sites, inputs):
        timings.append(_timed({c.name: (lambda f=c.bind(t.op), ra=ra, rk=rk: f(*ra, **rk)) for c in accepted},
                              (ra, rk)))
        times = timings[-1].seconds
        winner = _choose(t, times)
        if ranges and ranges[-1]["winner"] == winner:
            ranges[-1]["sizes"][1] = hi
            ranges[-1]["times"].append(times)
        else:
            ranges.append({"sizes": [lo, hi], "at": _describe_inputs(ra, rk), "times": [times], "winner": winner})
    record["ranges"] = ranges
    record["winner"] = ranges[0]["winner"] if len(ranges) == 1 else None
    return timings
