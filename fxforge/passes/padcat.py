"""Zero-copy cat and pad: each input's producer writes straight into the region of the result it
occupies, so ``aten.cat`` moves nothing and ``aten.constant_pad_nd`` only fills its border.

Runs after fusion (it asks who runs each producer and each reader; crops, pads by negative
amounts, are already slice views: ``lowering/crops.py``).  Every cat and pad node (a
*container*), in program order, takes each of its inputs in place when that is safe and the
kernels involved can do it, and copies the others.  An input ``a`` is refused, with the
reason counted in ``stats["refused_zero_copy"]`` and logged at DEBUG, when

==================  ===============================================================================
``graph_input``     it is an input, parameter or constant of the graph (the caller's memory)
``repeated``        the container read it already (``cat([a, a])``: the first place holds it, the
                    others are copies of it)
``view``            it is a view (its producer's output is already laid out elsewhere), other than a
                    flattening: see below
``graph_output``    it, or a view of it, is returned (outputs must not alias each other)
``dtype``           its dtype is not the container's
``shared``          it is already in place in another container
``symmetric``       a collective reads it from symmetric memory (its arena is not the container's)
``mutated``         something writes into it, or into the container
``producer``        its producer cannot write into a strided region of a larger buffer (a fallback,
                    a kernel that allocates its result, an op the backend does not write that way,
                    an output of a multi-output op such as ``native_layer_norm``)
``reader``          a reader needs it laid out as traced (a ``view`` that cannot view the region, an
                    ``as_strided``, a kernel that indexes with the traced strides)
``layout``          the container is not laid out row-major, or the input's rank is not its rank
``pad_sign``        a pad amount whose sign the shape environment cannot prove (symbolic: a negative
                    amount crops, so its region would start outside the input; eager runs either)
==================  ===============================================================================

A flattened input of a 1-D cat (a view of a value, both laid out row-major from their first
element, with as many elements: how ``passes/bucketing.py`` builds a bucket's flat buffer) is
taken in place by the value it views: its producer writes the run of the cat's elements it
occupies, laid out as traced, so every reader of the value reads it as before (``reader`` does not
apply), and the other refusals are the value's.

An input taken in place gets ``meta[SLICE_OF] = (container, region start per dim)``; the container
gets ``meta[ZERO_COPY]`` (which inputs are in place).  Containers nest: a cat of cats, a pad of a
cat, each inner one a region of the outer, all in one buffer.  The memory plan makes each such
input's buffer a region of its container's (``Buffer.kind == "slice"``) living as long as any of
them, and the wrapper moves only what is left: the refused inputs (``copy_``) and a pad's border
(``fill_``), all counted in ``stats["copy_bytes"]``.
"""

from __future__ import annotations

import logging
from collections import Counter

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..codegen.api import CodegenBackend
from ..core.config import Config
from ..core.graph import (
    ALLOCATES,
    BACKEND,
    FALLBACK_BACKEND,
    SLICE_OF,
    SYMMETRIC,
    VAL,
    ZERO_COPY,
    aliased_input,
    expr,
    node_kind,
    output_nodes,
    writes_planned,
    with_views,
    written_in_place,
)
from ..infra.pass_manager import PassResult
from ..core.regions import CAT, PAD, container_inputs, is_container, regions, size_expr

log = logging.getLogger("fxforge")
aten = torch.ops.aten
# Readers whose result depends on the strides of what they read, not only on its values.
_LAYOUT_READERS = {aten.as_strided.default, aten.as_strided_copy.default, aten.as_strided_scatter.default,
                   aten.view.dtype}
_VIEW_OPS = {aten.view.default, aten._unsafe_view.default}


class ZeroCopyCatPad:
    """The pass: crops to views, then in-place decisions for every cat/pad (module docstring)."""

    name = "zero_copy_cat_pad"

    def __init__(self, backends, config: Config):
        self.backends = backends  # a Registry: ``get(name)`` gives the backend a node's metadata names
        self.config = config

    def backend_of(self, n: fx.Node) -> CodegenBackend | None:
        """The backend running ``n`` (None: an eager fallback, or not a kernel's node)."""
        name = BACKEND.get(n)
        return None if name in (None, FALLBACK_BACKEND) else self.backends.get(name)

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        refused: Counter = Counter()
        placed = 0
        outputs = set(output_nodes(gm))
        for n in list(gm.graph.nodes):
            if not is_container(n):
                continue
            ZERO_COPY.clear(n)
            why_not = self.container_refusal(n)
            inputs = container_inputs(n)
            taken = []
            for i, (a, region) in enumerate(zip(inputs, regions(n) if why_not is None else [None] * len(inputs))):
                flat = _flattened(n, a) if isinstance(a, fx.Node) else None
                why = why_not or self.refusal(n, a, flat, inputs, i, outputs)
                if why is None:
                    SLICE_OF.set(flat or a, (n.name, region))
                    if is_container(a) and not ZERO_COPY.on(a):
                        # an inner cat/pad none of whose inputs is in place: the wrapper still
                        # builds it, by copies, in its region of this one
                        ZERO_COPY.set(a, (False,) * len(container_inputs(a)))
                        ALLOCATES.clear(a)
                    placed += 1
                else:
                    refused[why] += 1
                    log.debug("fxforge: %s input %d (%s) is copied, not written in place: %s", n.name, i,
                              getattr(a, "name", a), why)
                taken.append(why is None)
            if any(taken):
                ZERO_COPY.set(n, tuple(taken))
                ALLOCATES.clear(n)  # its result is a planned buffer its inputs write into
        return PassResult(gm, placed > 0, {"zero_copy_inputs": placed, "refused_zero_copy": dict(refused)})

    # ------------------------------------------------------------------ refusals

    def container_refusal(self, n: fx.Node) -> str | None:
        val = n.meta[VAL]
        if not _row_major(val):
            return "layout"
        if written_in_place(n):
            return "mutated"
        if n.target is PAD and not all(_nonnegative(p) for p in n.args[1]):
            return "pad_sign"
        return None

    def refusal(self, n: fx.Node, a, flat: fx.Node | None, inputs: list, index: int, outputs: set) -> str | None:
        """Why input ``a`` of container ``n`` is copied rather than written in place (``flat``:
        the value ``a`` flattens, ``_flattened``), or None."""
        if not isinstance(a, fx.Node):
            return "graph_input"
        if a.op in ("placeholder", "get_attr"):
            return "graph_input"
        if any(x is a for x in inputs[:index]):
            return "repeated"  # its first place holds it; this one is a copy of that
        kind = node_kind(a)
        if kind == "getitem":
            return "producer"  # one output of a multi-output op: only single outputs are placed
        if flat is None and kind != "compute":
            return "view"
        why = self.value_refusal(n, flat or a, outputs, flat is not None)
        if why is not None or flat is not None:
            return why  # (a flattened value keeps its own layout: its readers read it as traced)
        if not all(self.reads_in_place(r, n, a) for r in _readers(a)):
            return "reader"
        return None

    def value_refusal(self, n: fx.Node, v: fx.Node, outputs: set, flat: bool) -> str | None:
        """Why the value ``v`` cannot be written into its place in container ``n``: a region laid
        out as ``n``, or, ``flat``, a run of the 1-D cat laid out as ``v`` was traced."""
        if SLICE_OF.on(v):
            return "shared"
        if SYMMETRIC.on(v):
            return "symmetric"
        va, vn = v.meta.get(VAL), n.meta[VAL]
        if not isinstance(va, torch.Tensor) or va.dtype != vn.dtype:
            return "dtype"
        if not flat and va.dim() != vn.dim():
            return "layout"
        if any(x in outputs for x in with_views(v)):
            return "graph_output"
        if written_in_place(v):
            return "mutated"
        writes = writes_planned(v) and not is_container(v) if flat else self.writes_in_place(v)
        if not writes:
            return "producer"
        return None

    def writes_in_place(self, a: fx.Node) -> bool:
        """``a``'s kernel can write its output into a strided region of a larger buffer."""
        if is_container(a):
            return True  # a container's result is a region it fills (or copies into)
        backend = self.backend_of(a)
        if backend is None or ALLOCATES.get(a):
            return False
        return backend.writes_views is not None and bool(backend.writes_views(a, self.config))

    def reads_in_place(self, r: fx.Node, container: fx.Node, a: fx.Node) -> bool:
        """Reader ``r`` (of the value ``a``, or of a view of it) computes the same from a strided region."""
        if r is container or r.op == "output":
            return True
        if r.target in _LAYOUT_READERS or (r.target in _VIEW_OPS and not _views_region(r, container)):
            return False
        backend = self.backend_of(r)
        if node_kind(r) == "view":
            # a view run by the wrapper reads through strides (what reads the view is a reader
            # too); one inside a kernel is indexed as its kernel's backend says
            return backend is None or not backend.fuses or backend.reads_views
        if BACKEND.get(r) == FALLBACK_BACKEND:
            return True
        if backend is None:
            return False
        # reads_planned: the kernel is told the layout of ``a`` itself, not that of a view of it
        direct = not any(x in r.all_input_nodes for x in with_views(a)[1:])
        return backend.reads_views or (backend.reads_planned and direct)


def _flattened(n: fx.Node, a: fx.Node) -> fx.Node | None:
    """The value input ``a`` of container ``n`` flattens, if ``n`` is a 1-D cat and ``a`` a view
    (through views) of a computed value, each laid out row-major from its first element with the
    value's number of elements: the value's bytes, as traced, are ``a``'s."""
    if n.target is not CAT or n.meta[VAL].dim() != 1:
        return None
    want = expr(a.meta[VAL].numel()) if isinstance(a.meta.get(VAL), torch.Tensor) else None
    x = a
    while want is not None and node_kind(x) == "view":
        v = x.meta.get(VAL)
        if not isinstance(v, torch.Tensor) or not _row_major(v) or expr(v.numel()) != want:
            return None
        x = aliased_input(x)
        if x is None:
            return None
    if x is a or x is None or node_kind(x) != "compute" or x.op != "call_function":
        return None
    v = x.meta.get(VAL)
    return x if isinstance(v, torch.Tensor) and _row_major(v) and expr(v.numel()) == want else None


def _nonnegative(p) -> bool:
    """Pad amount ``p`` (an int, a SymInt, or a node computing one) is >= 0 for every size this
    graph runs with: by its expression (sizes are positive), or as a consequence of the guards
    tracing recorded (``torch._check(y.size(1) >= x.size(1))``, a branch on it), which the
    caller checks before the graph runs.  ``statically_known_true`` adds no guard of its own."""
    if size_expr(p).is_nonnegative:
        return True
    v = p.meta.get(VAL) if isinstance(p, fx.Node) else p
    return isinstance(v, torch.SymInt) and statically_known_true(v >= 0)


def _row_major(v: torch.Tensor) -> bool:
    inner = sympy.Integer(1)
    for s, st in zip(reversed([expr(x) for x in v.shape]), reversed([expr(x) for x in v.stride()])):
        if s != 1 and sympy.expand(st - inner) != 0:
            return False
        inner = inner * s
    return expr(v.storage_offset()) == 0


def _readers(a: fx.Node) -> list[fx.Node]:
    """Every node reading ``a``'s storage: the users of ``a`` and of its views (views included)."""
    return list(dict.fromkeys(u for x in with_views(a) for u in x.users))


def _views_region(r: fx.Node, container: fx.Node) -> bool:
    """A ``view`` of an input placed in ``container`` works on the region: whether a view is
    legal depends on strides (the region has the container's), decided here on a meta tensor;
    only for static sizes and for a view of the input itself."""
    src, region = r.args[0], container.meta[VAL]
    if not (isinstance(src, fx.Node) and isinstance(src.meta.get(VAL), torch.Tensor)):
        return False
    sizes = list(src.meta[VAL].shape) + list(region.stride()) + list(r.meta[VAL].shape)
    if not all(isinstance(s, int) for s in sizes) or src.meta[VAL].dim() != region.dim():
        return False
    probe = torch.empty_strided(tuple(src.meta[VAL].shape), tuple(region.stride()), device="meta")
    try:
        probe.view(tuple(r.meta[VAL].shape))
    except (RuntimeError, ValueError):  # "cannot view a tensor with shape ... and strides ..."
        return False
    return True
