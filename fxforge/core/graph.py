"""The node-metadata vocabulary and small graph helpers shared by every pass.

Every node of a graph fxforge works on carries ``meta["val"]``: a FakeTensor, a tuple of them for
multi-output ops, or a SymInt/int/float/bool for scalar-valued nodes.  The only other keys fxforge
writes are listed in ``META_KEYS`` (a graph module's own meta: ``GRAPH_META_KEYS``); nothing else
invents keys.

Vocabulary used across fxforge:

* a *storage* is identified by the node that first produced it (its *root*); views share their
  base's storage, and every ``getitem`` of a multi-output op that is not a view has its own;
* *liveness* of a storage over a schedule runs from its producer to the last user of any view
  of it; graph outputs live to the end;
* byte sizes are sympy expressions (constant for static shapes); ``hint`` evaluates them at the
  sizes the graph was traced with.
"""

from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass
from typing import Any, Generic, Iterable, Sequence, TypeVar

import numpy as np
import sympy
import torch
import torch.fx as fx

T = TypeVar("T")

VAL = "val"


class MetaKey(str, Generic[T]):
    """A metadata key fxforge writes, with what it holds: the key itself (``n.meta[GROUP]`` still
    reads it), and typed access, ``GROUP.get(n)``, ``GROUP.of(n)``, ``GROUP.set(n, 3)``,
    ``GROUP.on(n)``, ``GROUP.clear(n)``, on a node's meta or a graph module's (``graph``)."""

    doc: str
    graph: bool

    def __new__(cls, name: str, doc: str, graph: bool = False) -> "MetaKey":
        key = super().__new__(cls, name)
        key.doc, key.graph = doc, graph
        return key

    def get(self, owner: fx.Node | fx.GraphModule, default: T | None = None) -> T | None:
        return owner.meta.get(self, default)

    def of(self, owner: fx.Node | fx.GraphModule) -> T:
        return owner.meta[self]

    def set(self, owner: fx.Node | fx.GraphModule, value: T) -> None:
        owner.meta[self] = value

    def on(self, owner: fx.Node | fx.GraphModule) -> bool:
        return self in owner.meta

    def clear(self, owner: fx.Node | fx.GraphModule) -> None:
        owner.meta.pop(self, None)

    def __reduce__(self):  # pickled (a graph's meta, a package's stats) as the plain key it equals
        return (str, (str(self),))

    def __copy__(self) -> "MetaKey":
        return self

    def __deepcopy__(self, memo) -> "MetaKey":
        return self


GROUP: MetaKey[int] = MetaKey(
    "fxforge_group", "int: id of the kernel group the node runs in (passes/assign.py, passes/fusion.py)")
BACKEND: MetaKey[str] = MetaKey("fxforge_backend", "str: name of the codegen backend that runs the node's group, or 'fallback'")
FALLBACK: MetaKey[str] = MetaKey(
    "fxforge_fallback", "str: why no codegen backend accepted the node (present only on fallback nodes)")
BUFFER: MetaKey[str] = MetaKey(
    "fxforge_buffer", "str: name of the planned buffer holding the node's output storage (passes/memory.py)")
ALLOCATES: MetaKey[bool] = MetaKey(
    "fxforge_allocates", "bool: the node's kernel allocates its own outputs, which get no planned buffer")
SLICE_OF: MetaKey[tuple] = MetaKey(
    "fxforge_slice_of", "(str, tuple): the node writes its output in place into the region starting at these "
    "per-dim offsets of the named cat/pad node's result (passes/padcat.py); with fewer or more offsets than the "
    "node's rank, its value, laid out as traced (contiguous), fills the run of the 1-D result starting there")
ZERO_COPY: MetaKey[tuple] = MetaKey(
    "fxforge_zero_copy", "tuple[bool, ...]: on a cat / constant_pad_nd node, which inputs are written in place "
    "into its result; the wrapper moves only the others (copies) and a pad's border (fills)")
SYMMETRIC: MetaKey[str] = MetaKey(
    "fxforge_symmetric", "str: the process group whose symmetric-memory arena holds the node's output, which a "
    "collective reads from every rank (passes/symmetric.py)")
# the keys of a GraphModule's own meta
PROBES: MetaKey[dict] = MetaKey(
    "fxforge_probes", "dict: backends' emitter probe summaries by group structure and nodes' fusion facts, kept "
    "while a PassManager runs, or shared by graphs compiled together where one is handed in with the graph "
    "(passes/memory_budget.py's trials) (codegen/probes.py, codegen/ir/facts.py)", graph=True)


class KeptWhole:
    """Graph metadata that a copy of its graph shares rather than copies, and that a pickled one
    drops (it pickles as ``dropped()``)."""

    dropped: Any = type(None)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def __reduce__(self):
        return (type(self).dropped, ())


class SharedProbes(KeptWhole, dict):
    """A ``PROBES`` memo handed in with graphs compiled together (a partitioner's trials and the
    forward and backward it chooses): a copy of such a graph shares it (its entries are facts of
    group structures, true in every copy), and a pickled one drops it (an empty dict)."""

    dropped = dict


INPUT_STRIDES: MetaKey[dict] = MetaKey(
    "fxforge_input_strides", "dict[str, tuple[int, ...]]: placeholder name -> the strides its caller passes where "
    "they differ from the traced value's (a training forward's saved activations, laid out by its passes; "
    "entry/dynamo.py), adopted by lowering/conv_layout.py", graph=True)


def given_strides(traced: Any, given: Any) -> tuple[int, ...] | None:
    """The strides of tensor ``given`` where they differ from those of ``traced`` (a placeholder's
    value) at the same static sizes: what ``INPUT_STRIDES`` records for that placeholder; else None."""
    if (isinstance(traced, torch.Tensor) and isinstance(given, torch.Tensor) and traced.shape == given.shape
            and all(type(s) is int for s in (*traced.shape, *given.stride())) and traced.stride() != given.stride()):
        return tuple(given.stride())
    return None


FREE_OUTPUTS: MetaKey[int] = MetaKey(
    "fxforge_free_outputs", "int: the graph's outputs from this index on may keep the layout the passes give them "
    "(a training forward's saved activations, whose strides are reported to AOTAutograd; entry/dynamo.py)",
    graph=True)
CUSTOM_OP_DISPATCH: MetaKey[Any] = MetaKey(
    "fxforge_custom_op_dispatch", "custom_ops.Dispatches, (op, shape key) -> Dispatch: calls of a tuned custom op "
    "chosen per range of a size, which the wrapper emits as an if chain (fxforge/custom_ops)", graph=True)

REGION: MetaKey[Any] = MetaKey(
    "fxforge_region", "plan.Region: on an invoke_subgraph node, its body compiled once (spine.compile_regions), "
    "which the node's kernel calls instead of running the body eagerly")
BODY_RETURNS: MetaKey[dict] = MetaKey(
    "fxforge_body_returns", "dict[int | None, int | None]: a higher-order op's body's output index -> the input "
    "whose storage it shares, or None (graph.body_returns: read once per body)", graph=True)
OUTPUT_ALIASES: MetaKey[tuple] = MetaKey(
    "fxforge_output_aliases", "(args, val, dict): a higher-order op's outputs' aliases as graph._body_output_aliases "
    "read them for these arguments and value")
GUARD_INPUTS: MetaKey[bool] = MetaKey(
    "fxforge_guard_inputs", "bool: callers may pass the graph's inputs laid out otherwise than traced (a compiled "
    "region's call sites): the wrapper copies an input its kernels index at traced strides to them where it "
    "differs", graph=True)
SAVE_PLAN: MetaKey[Any] = MetaKey(
    "fxforge_save_plan", "passes.memory_budget.SavePlan: on a training forward and backward partitioned under "
    "Config.memory_budget, what the step saves and recomputes and its planned peak (entry/dynamo.py)", graph=True)

HEAD_START: MetaKey[Any] = MetaKey(
    "fxforge_head_start", "spine.HeadStart: the graph's passes, schedule and memory plan, run before it was handed "
    "to the compiler (the memory-budget partitioner planned the forward and backward it chose); the compile goes "
    "on from them where they ran under the graph's metadata and Config (spine.plan_ahead)", graph=True)

MEMO: MetaKey[Any] = MetaKey(
    "fxforge_memo", "graph.NodeMemo: answers of per-node queries about an ATen op node (node_kind, aliased_input, "
    "iteration.schema_bind and reduction_of, ir.aten.read_nodes), each kept with the target, arguments and value "
    "it was read from (graph.per_node)")

_KEYS = (GROUP, BACKEND, FALLBACK, BUFFER, ALLOCATES, SLICE_OF, ZERO_COPY, SYMMETRIC, REGION, OUTPUT_ALIASES, PROBES,
         INPUT_STRIDES, FREE_OUTPUTS, CUSTOM_OP_DISPATCH, BODY_RETURNS, GUARD_INPUTS,
         SAVE_PLAN, HEAD_START, MEMO)
META_KEYS = {VAL: "FakeTensor / tuple of FakeTensors / SymInt: the value the node computes (set by tracing)",
             **{k: k.doc for k in _KEYS if not k.graph}}
GRAPH_META_KEYS = {k: k.doc for k in _KEYS if k.graph}  # the keys fxforge writes in a GraphModule's own meta

FALLBACK_BACKEND = "fallback"


def writes_planned(node: fx.Node) -> bool:
    """``node``'s kernel writes its output into a buffer the memory plan gives it (laid out as
    traced): a backend runs it, not an eager fallback, and it does not allocate its own."""
    return BACKEND.get(node) not in (None, FALLBACK_BACKEND) and not ALLOCATES.get(node)


# --------------------------------------------------------------------------- values


def device_types(gm: fx.GraphModule) -> set[str]:
    """The device types of a graph's values ({"cpu"} where it has none)."""
    out = set()
    for n in gm.graph.nodes:
        v = n.meta.get(VAL)
        for t in v if isinstance(v, (list, tuple)) else [v]:
            if isinstance(t, torch.Tensor):
                out.add(t.device.type)
    return out or {"cpu"}


def tensors(v: Any) -> list[torch.Tensor]:
    """The tensors of a value (a tensor, or a tuple/list with tensors among other things)."""
    return [t for t in (v if isinstance(v, (tuple, list)) else [v]) if isinstance(t, torch.Tensor)]


def fake_call(gm: fx.GraphModule, mode, op, args: tuple, kwargs: dict | None = None) -> fx.Node:
    """A new ``call_function`` node of ``op`` (at the graph's insertion point) with its fake value,
    computed in the graph's fake mode from its arguments' (symbolic sizes kept)."""
    node = gm.graph.call_function(op, args, kwargs or {})
    with mode:  # (arguments may hold lists of nodes: a cat's)
        node.meta[VAL] = op(*fx.node.map_arg(args, lambda a: a.meta[VAL]),
                            **fx.node.map_arg(kwargs or {}, lambda a: a.meta[VAL]))
    return node


# Keys a node made in place of another (a split's pieces, a moved gather) takes from it: where it
# came from (the user's source line, its module) and, on AOTAutograd's joint graph, the
# partitioner's tag saying whether it belongs to the forward or the backward.
INHERITED_META = ("stack_trace", "nn_module_stack", "partitioner_tag")


def nodes_between(before: fx.Node, end: fx.Node) -> list[fx.Node]:
    """The nodes after ``before`` and before ``end`` (those a pass inserted there)."""
    out, n = [], before.next
    while n is not end:
        out.append(n)
        n = n.next
    return out


def inherit_meta(nodes: Iterable[fx.Node], source: fx.Node) -> None:
    """``nodes``, made in place of ``source``, take its ``INHERITED_META``."""
    for n in nodes:
        for k in INHERITED_META:
            if k in source.meta and k not in n.meta:
                n.meta[k] = source.meta[k]


def tensor_val(node: fx.Node) -> torch.Tensor | None:
    v = node.meta.get(VAL)
    return v if isinstance(v, torch.Tensor) else None


def has_val(node: fx.Node) -> bool:
    """A node carries the metadata fxforge needs (output nodes, ops returning nothing and the
    bodies of higher-order ops are exempt)."""
    if node.op == "output" or VAL in node.meta:
        return True
    if node.op == "get_attr":
        return isinstance(fetch_attr(node.graph.owning_module, node.target), fx.GraphModule)
    schema = op_schema(node)
    return schema is not None and not schema.returns  # ops returning nothing (asserts) have no value


@functools.lru_cache(maxsize=4096)
def _integer(x: int) -> sympy.Integer:
    """``sympy.Integer(x)``, a fifth of the time where sizes repeat (sympy's own cache costs more)."""
    return sympy.Integer(x)


def expr(x: Any) -> sympy.Expr:
    """A size, stride or scalar as a sympy expression (SymInts give their symbolic expression)."""
    if type(x) is int:  # the common case first: static sizes (asked for by every kernel probe)
        return _integer(x)
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        env = getattr(x.node, "shape_env", None)
        # replacements: symbols the ShapeEnv proved equal to others (s77 == s33) are rewritten
        return env.replace(x.node.expr) if env is not None else x.node.expr
    if isinstance(x, sympy.Basic):
        return x
    if isinstance(x, bool):
        return sympy.true if x else sympy.false
    if isinstance(x, int):
        return sympy.Integer(x)
    if isinstance(x, float):
        return sympy.Float(x)
    raise TypeError(f"not a size: {x!r} ({type(x).__name__})")


def shape_env_of(gm: fx.GraphModule):
    """The ShapeEnv of the graph's fake values, or None for fully static graphs."""
    mode = fake_mode_of(gm)
    return getattr(mode, "shape_env", None) if mode is not None else None


def fake_mode_of(gm: fx.GraphModule):
    """The FakeTensorMode of the graph's values (placeholders first), or None."""
    from torch._subclasses.fake_tensor import FakeTensor

    for n in itertools.chain(gm.graph.find_nodes(op="placeholder"), gm.graph.nodes):
        for v in _flatten([n.meta.get(VAL)]):
            if isinstance(v, FakeTensor):
                return v.fake_mode
    return None


def size_hints(shape_env) -> dict:
    """The traced value of each backed size symbol of ``shape_env``."""
    hints = getattr(shape_env, "backed_var_to_val", None)
    if hints is None:  # torch < 2.13
        hints = getattr(shape_env, "var_to_val", None)
    return hints or {}


def hint(e: sympy.Expr | int, shape_env=None) -> int:
    """An expression evaluated at the sizes the graph was traced with."""
    if isinstance(e, int):
        return e
    if isinstance(e, sympy.Integer):
        return int(e)
    e = sympy.sympify(e)
    if not e.free_symbols:
        return int(e)
    if shape_env is None:
        raise ValueError(f"symbolic size {e} needs a ShapeEnv to evaluate")
    hints = size_hints(shape_env)
    if hints:
        v = e.xreplace(hints)
        if not v.free_symbols:
            return int(v)
    try:
        return int(shape_env.size_hint(e))
    except Exception:
        # data-dependent (unbacked) sizes have no traced value; figures use 1 for them
        return int(e.xreplace({s: 1 for s in e.free_symbols}))


def free_symbols(v: Any) -> set[sympy.Symbol]:
    """The free symbols of a value's sizes, strides and storage offset."""
    out: set[sympy.Symbol] = set()
    for t in (v,) if isinstance(v, torch.Tensor) else _flatten([v]):  # (most values: one tensor)
        if isinstance(t, torch.Tensor):
            if _static(t):
                continue
            sizes = (*t.shape, *t.stride(), t.storage_offset())
            for x in sizes:
                if isinstance(x, torch.SymInt):
                    out |= expr(x).free_symbols
        elif isinstance(t, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            out |= expr(t).free_symbols
    return out


def _static(t: torch.Tensor) -> bool:
    """``t``'s sizes, strides and offset are all ints."""
    return type(t.storage_offset()) is int and all(type(x) is int for x in t.shape) \
        and all(type(x) is int for x in t.stride())


def _flatten(xs: Iterable[Any]) -> list[Any]:
    out = []
    for x in xs:
        if isinstance(x, (list, tuple)):
            out.extend(_flatten(x))
        else:
            out.append(x)
    return out


def _static_storage_nbytes(t: torch.Tensor) -> int | None:
    """``storage_nbytes`` as an int where ``t``'s sizes, strides and offset are all ints, else None."""
    if not _static(t):
        return None
    shape = t.shape
    if 0 in shape:
        return 0
    return (t.storage_offset() + 1 + sum((s - 1) * st for s, st in zip(shape, t.stride()))) * t.element_size()


def storage_nbytes_hint(t: torch.Tensor, shape_env=None) -> int:
    """``storage_nbytes`` at the sizes the graph was traced with (``hint``)."""
    static = _static_storage_nbytes(t)
    return static if static is not None else hint(storage_nbytes(t), shape_env)


def storage_nbytes(t: torch.Tensor) -> sympy.Expr:
    """Bytes of the smallest storage that holds ``t`` (from its offset, sizes and strides)."""
    static = _static_storage_nbytes(t)
    if static is not None:  # (most tensors): integer arithmetic, one sympy number at the end
        return sympy.Integer(static)
    sizes = [expr(s) for s in t.shape]
    if any(s == 0 for s in sizes):
        return sympy.Integer(0)
    span = expr(t.storage_offset()) + 1
    for s, st in zip(sizes, (expr(x) for x in t.stride())):
        span += (s - 1) * st
    return sympy.expand(span * t.element_size())


# --------------------------------------------------------------------------- ops and aliasing


def op_path(op: torch._ops.OpOverload) -> str:
    """``torch.ops.<ns>.<name>.<overload>`` for an OpOverload."""
    ns, rest = op.name().split("::", 1)
    name, _, overload = rest.partition(".")
    return f"torch.ops.{ns}.{name}.{overload or 'default'}"


def op_display(op: Any) -> str:
    """A readable name for a call target: ``aten.add.Tensor`` for OpOverloads."""
    if isinstance(op, torch._ops.OpOverload):
        return op_path(op)[len("torch.ops."):]
    return getattr(op, "__qualname__", None) or getattr(op, "__name__", None) or repr(op)


class NodeMemo(dict):
    """A node's ``MEMO``: query name -> (target, args, kwargs, value, answer).  A copy of the node
    (its meta copied) starts with none, and a pickled one drops it."""

    def __copy__(self) -> "NodeMemo":
        return NodeMemo()

    def __deepcopy__(self, memo) -> "NodeMemo":
        return NodeMemo()

    def __reduce__(self):
        return (NodeMemo, ())


def forget_answers(gm: fx.GraphModule) -> None:
    """Drop the answers ``per_node`` kept in ``gm``'s nodes (a compile's, once it is done): a
    compiled graph keeps its graph, and these were half the objects it kept alive (a 10k-node
    graph: 122k of 231k), each one the garbage collector walks."""
    for n in gm.graph.nodes:
        n.meta.pop(MEMO, None)


def per_node(fn):
    """``fn(node)`` for an ATen op node (an ``OpOverload`` target), kept in the node's meta
    (``MEMO``) while the node's target, arguments and value are the ones it was read from: the
    passes ask the same nodes the same questions many times (fusion's candidate merges), and a
    pass that rewrites a node gives it a new argument tuple (or target, or value), which asks
    again.  Other nodes (getitems, higher-order ops, placeholders) are answered every time: their
    answers read other nodes."""
    name = fn.__name__

    @functools.wraps(fn)
    def memoized(node: fx.Node):
        meta = node.meta
        memo = meta.get(MEMO)
        if memo is not None:  # (only ATen op nodes have answers kept: the hit first, it is most calls)
            hit = memo.get(name)
            if hit is not None and hit[0] is node.target and hit[1] is node._args and hit[2] is node._kwargs \
                    and hit[3] is meta.get(VAL):
                return hit[4]
        if node.op != "call_function" or type(node.target) is not torch._ops.OpOverload:
            return fn(node)
        if memo is None:
            memo = meta[MEMO] = NodeMemo()
        val = meta.get(VAL)
        answer = fn(node)
        memo[name] = (node.target, node._args, node._kwargs, val, answer)
        return answer

    return memoized


def op_schema(node: fx.Node):
    return getattr(node.target, "_schema", None) if node.op == "call_function" else None


@per_node
def aliased_input(node: fx.Node) -> fx.Node | None:
    """The input whose storage ``node``'s output shares, else None.

    Decided from the op schema: a return annotated ``Tensor(a)`` (a view) or ``Tensor(a!)`` (an
    in-place or out= op returning what it wrote) shares the storage of the argument carrying the
    same alias set.  ``_unsafe_view`` returns a view without saying so.
    """
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        base = node.args[0]
        if isinstance(base, fx.Node) and is_higher_order(base):
            return body_alias(base, node.args[1])
        return aliased_input(base) if isinstance(base, fx.Node) else None
    if is_higher_order(node):
        return body_alias(node, None)
    try:
        arg = _aliased_argument(node.target)
    except TypeError:  # an unhashable callable: not an op with a schema
        arg = None
    if arg is None:
        return None
    i, name = arg
    v = node.args[i] if i < len(node.args) else node.kwargs.get(name)
    return v if isinstance(v, fx.Node) else None


@functools.cache
def _aliased_argument(op) -> tuple[int, str] | None:
    """(position, name) of the argument an op's output aliases, read off its schema once per op
    (schemas never change, and passes ask this of every node many times)."""
    if op in _UNANNOTATED_VIEWS:
        return 0, "self"
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    rets = [r.alias_info for r in schema.returns if r.alias_info is not None]
    if not rets:
        return None
    sets = set().union(*(a.before_set for a in rets))
    for i, arg in enumerate(schema.arguments):
        # a list of views (``Tensor(a)[]``) carries its alias set on the elements, not the list
        if arg.alias_info is not None and (arg.alias_info.before_set & sets or not sets):
            return i, arg.name
    return None


_UNANNOTATED_VIEWS = {torch.ops.aten._unsafe_view.default}


# --------------------------------------------------------------------------- higher-order ops
#
# A higher-order op (``invoke_subgraph``, ``cond``, ``while_loop``...) runs body graphs; no schema
# says whether what it returns shares storage with what it is given, and a partitioned
# ``invoke_subgraph`` forward does return its own operands (saved for its backward).  Where the
# bodies and the operands they take are known, the body's output is followed back to the operand
# it views; other higher-order ops, and calls of Python callables that are no operator, are
# *opaque*: any output may share storage with any tensor input (``opaque_aliasing``).

# name -> where the bodies and the operands they take in order are in the node's args
_BODIES = {
    "invoke_subgraph": lambda a: ((a[0],), a[2:]),
    "tag_activation_checkpoint": lambda a: ((a[0],), a[1:]),
    "wrap_with_set_grad_enabled": lambda a: ((a[1],), a[2:]),
    "wrap_with_autocast": lambda a: ((a[4],), a[5:]),
    "cond": lambda a: ((a[1], a[2]), tuple(a[3])),
    "while_loop": lambda a: ((a[1],), (*a[2], *a[3])),  # (zero iterations return clones)
}
# higher-order ops whose outputs are new storage: computed (attention), or copies and the results
# of ops that may not return their inputs (functionalized custom ops, effectful ops)
_FRESH_OUTPUTS = {"flex_attention", "flex_attention_backward", "auto_functionalized", "auto_functionalized_v2",
                  "with_effects", "triton_kernel_wrapper_functional"}
_OPAQUE = object()


def is_higher_order(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator)


def _body_output_aliases(hop: fx.Node) -> dict[int | None, Any]:
    """Output index of ``hop`` (None: its only output) -> the operand whose storage that output
    shares, None (new storage), or ``_OPAQUE`` (unknown: the bodies disagree, or one cannot be
    read or does not return what the node's value holds).  Each body is read once
    (``body_returns``), each node's answer kept for the arguments it was read with
    (``OUTPUT_ALIASES``: every getitem of a many-output node asks)."""
    val = hop.meta.get(VAL)
    kept = OUTPUT_ALIASES.get(hop)
    if kept is not None and kept[0] is hop.args and kept[1] is val:
        return kept[2]
    found = _read_output_aliases(hop, val)
    OUTPUT_ALIASES.set(hop, (hop.args, val, found))
    return found


def _read_output_aliases(hop: fx.Node, val: Any) -> dict[int | None, Any]:
    keys: list[int | None] = list(range(len(val))) if isinstance(val, (tuple, list)) else [None]
    name = hop.target.name()
    where = _BODIES.get(name)
    if name in _FRESH_OUTPUTS or where is None:
        return dict.fromkeys(keys, None if name in _FRESH_OUTPUTS else _OPAQUE)
    found: dict[int | None, set] = {k: set() for k in keys}
    try:
        bodies, operands = where(hop.args)
        for b in bodies:
            body = fetch_attr(hop.graph.owning_module, b.target) if isinstance(b, fx.Node) and b.op == "get_attr" else None
            if not isinstance(body, fx.GraphModule):
                return dict.fromkeys(keys, _OPAQUE)
            returns = body_returns(body)
            if VAL not in hop.meta and not any(found.values()):  # no value to say what it returns: the body says
                keys = list(returns)
                found = {k: set() for k in keys}
            for i in keys:
                k = returns[i]
                found[i].add(None if k is None or not isinstance(operands[k], fx.Node) else operands[k])
    except (IndexError, TypeError, AttributeError, StopIteration, KeyError):
        return dict.fromkeys(keys, _OPAQUE)
    return {i: f.pop() if len(f) == 1 else _OPAQUE for i, f in found.items()}


def body_returns(body: fx.GraphModule) -> dict[int | None, int | None]:
    """Output index of a higher-order op's body (None: its only output) -> the index of the input
    whose storage that output shares, or None.  Read once per body (``BODY_RETURNS``): a body is
    called from many nodes (a compiled region's call sites), and compiling it keeps what it returns."""
    returns = BODY_RETURNS.get(body)
    if returns is None:
        slot = {p: k for k, p in enumerate(n for n in body.graph.nodes if n.op == "placeholder")}
        out = next(n for n in reversed(body.graph.nodes) if n.op == "output").args[0]
        keys = list(range(len(out))) if isinstance(out, (tuple, list)) else [None]
        returns = {i: slot.get(storage_root(v)) if isinstance(v, fx.Node) else None
                   for i, v in ((i, out if i is None else out[i]) for i in keys)}
        BODY_RETURNS.set(body, returns)
    return returns


def region_body(node: fx.Node) -> fx.GraphModule | None:
    """The body graph an ``invoke_subgraph`` node calls (None for any other node, or a body that
    is not a graph module of the node's own)."""
    if not is_higher_order(node) or node.target.name() != "invoke_subgraph" or not node.args:
        return None
    b = node.args[0]
    body = fetch_attr(node.graph.owning_module, b.target) if isinstance(b, fx.Node) and b.op == "get_attr" else None
    return body if isinstance(body, fx.GraphModule) else None


def fetch_attr(gm: Any, target: str) -> Any:
    """The attribute a ``get_attr`` node's dotted ``target`` names on ``gm`` (None where absent)."""
    for part in target.split("."):
        gm = getattr(gm, part, None)
    return gm


def body_alias(hop: fx.Node, index: int | None) -> fx.Node | None:
    """The operand whose storage output ``index`` of higher-order op ``hop`` shares, if any is
    known (module comment above)."""
    a = _body_output_aliases(hop).get(index, _OPAQUE)
    return None if a is _OPAQUE else a


def opaque_aliasing(node: fx.Node) -> bool:
    """``node``'s tensor outputs may share storage with any of its tensor inputs, in ways
    ``aliased_input`` cannot name: the planner keeps those inputs out of the arenas and alive as
    long as the outputs (an opaque higher-order op, or a Python callable that is no operator)."""
    # operators and getitems first: nearly every node is one (liveness asks of each)
    if (node.op != "call_function" or node.target is operator.getitem
            or isinstance(node.target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket))
            or not any(isinstance(a.meta.get(VAL), torch.Tensor) for a in node.all_input_nodes)):
        return False
    if is_higher_order(node):
        return any(a is _OPAQUE for a in _body_output_aliases(node).values())
    return bool(tensors(node.meta.get(VAL))) and getattr(operator, getattr(node.target, "__name__", ""), None) is not node.target


def is_mutating(node: fx.Node) -> bool:
    """The op writes into one of its inputs (in-place or out= overloads)."""
    schema = op_schema(node)
    return bool(schema is not None and schema.is_mutable)


def with_views(node: fx.Node) -> list[fx.Node]:
    """``node`` (first) and every view of it, views of views too: the values sharing its storage
    that are made from it."""
    out, stack = {node: None}, [node]
    while stack:
        for u in stack.pop().users:
            if u not in out and node_kind(u) == "view":
                out[u] = None
                stack.append(u)
    return list(out)


def written_in_place(node: fx.Node) -> bool:
    """Some node writes in place into ``node``'s value: a mutating op reading it or a view of it
    (``with_views``)."""
    return any(is_mutating(u) for x in with_views(node) for u in x.users)


def storage_root(node: fx.Node) -> fx.Node:
    """The node that produced the storage ``node``'s value lives in."""
    while True:
        base = aliased_input(node)
        if base is None:
            return node
        node = base


# --------------------------------------------------------------------------- liveness


@dataclass(frozen=True)
class Live:
    """A storage's live range over schedule positions ``start..end`` (inclusive)."""

    root: fx.Node
    start: int
    end: int


def liveness(
    schedule: Sequence[fx.Node], outputs: Iterable[fx.Node] = (), position: dict[fx.Node, int] | None = None
) -> dict[fx.Node, Live]:
    """Live range of every storage produced by the scheduled nodes.

    Positions are indices into ``schedule`` unless ``position`` gives them (nodes of one fused
    kernel share a position: its reads and writes happen together); a storage lives until the
    last scheduled user of any view of it; storages reachable from ``outputs`` live to the end.
    """
    pos = position if position is not None else {n: i for i, n in enumerate(schedule)}
    start: dict[fx.Node, int] = {}
    end: dict[fx.Node, int] = {}
    for n in schedule:
        i = pos[n]
        r = storage_root(n)
        if r is n:
            # a multi-output op writes every output when it runs, before its getitems
            base = n.args[0] if n.target is operator.getitem else None
            start[n] = pos.get(base, i) if isinstance(base, fx.Node) else i
            end[n] = i
        for user in n.users:
            for reader in _read_until(user):
                if reader in pos:
                    end[r] = max(end.get(r, i), pos[reader])
    last = max(pos.values(), default=-1) if position is not None else len(schedule) - 1
    for o in outputs:
        end[storage_root(o)] = last
    # an opaque node may return any of its inputs: they live as long as its outputs (latest first,
    # so a chain of them passes the end back to the first)
    for n in reversed(schedule):
        if n in pos and opaque_aliasing(n):
            outs = [n, *(u for u in n.users if u.target is operator.getitem)]
            until = max(end.get(storage_root(o), pos[n]) for o in outs)
            for a in n.all_input_nodes:
                r = storage_root(a)
                if r in end:
                    end[r] = max(end[r], until)
    return {r: Live(r, start[r], end[r]) for r in start}


def _read_until(user: fx.Node) -> list[fx.Node]:
    """Where ``user`` has finished reading its inputs: itself, or for a collective that reads its
    input asynchronously (all-gather, reduce-scatter, all-to-all...) also its ``wait_tensor``s."""
    if user.op != "call_function" or user.target not in _async_collectives():
        return [user]
    wait = torch.ops._c10d_functional.wait_tensor.default
    waits, stack = [], list(user.users)
    while stack:
        u = stack.pop()
        if u.target is wait:
            waits.append(u)
        elif u.target is operator.getitem:  # the coalesced forms return a list
            stack.extend(u.users)
    return [user, *waits]


@functools.cache
def _async_collectives() -> frozenset:
    from .collectives import async_input_ops

    return frozenset(async_input_ops())


def live_profile(ranges: Iterable[tuple[int, int, int]], length: int) -> np.ndarray:
    """Bytes live at each of ``length`` positions, for (start, end, nbytes) ranges (``end``
    inclusive, below ``length``): each range's two ends as steps, summed once."""
    starts, ends, sizes = [], [], []
    for start, end, b in ranges:
        starts.append(start)
        ends.append(end + 1)
        sizes.append(b)
    steps = np.zeros(length + 1, dtype=np.int64)
    np.add.at(steps, np.array(starts, dtype=np.int64), np.array(sizes, dtype=np.int64))
    np.add.at(steps, np.array(ends, dtype=np.int64), -np.array(sizes, dtype=np.int64))
    return np.cumsum(steps[:length])


def peak_live_bytes(ranges: Iterable[tuple[int, int, int]]) -> int:
    """Max over positions of the bytes live there, for (start, end, nbytes) ranges (sweep)."""
    events: list[tuple[int, int]] = []
    for start, end, b in ranges:
        if b:
            events.append((start, b))
            events.append((end + 1, -b))
    # Frees (negative) sort first within a position, so a range ending at t never counts with
    # one starting at t + 1.
    events.sort()
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def is_tangent(n: fx.Node) -> bool:
    """An incoming gradient of an AOTAutograd backward or joint graph (a ``tangents_*`` input)."""
    return n.op == "placeholder" and n.name.startswith("tangents")


def inputs_freed_at_last_use(gm: fx.GraphModule) -> list[fx.Node]:
    """The placeholders whose storage the call frees at its last use (the wrapper drops its
    references then), a guess from AOTAutograd's names: in a backward graph (it has
    ``tangents_*`` inputs) the saved activations and incoming grads; ``primals_*`` (weights and
    user inputs) are held by the caller, as is every input of any other graph."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if not any(is_tangent(n) for n in placeholders):
        return []
    return [n for n in placeholders if not n.name.startswith("primals_")]


def output_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return [a for a in _flatten([out.args[0]]) if isinstance(a, fx.Node)]


def count_compute_nodes(gm: fx.GraphModule) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")


@per_node
def node_kind(node: fx.Node) -> str:
    """How the wrapper treats a node.

    ``placeholder`` / ``get_attr`` / ``output``: as in FX.  ``view``: output shares an input's
    storage without writing it (views; a getitem of a list of views).  ``getitem``: picks one
    output of a multi-output op.  ``scalar``: computes a Python/SymInt value or nothing (asserts,
    size queries).  ``compute``: runs a kernel: produces new tensor storage, or writes into an
    input (in-place and out= ops, which return what they wrote): what backends and fallbacks run.
    """
    if node.op in ("placeholder", "get_attr", "output"):
        return node.op
    if node.op != "call_function":
        return "compute"  # call_module / call_method: only eager can run them
    if node.target is operator.getitem:
        return "view" if aliased_input(node) is not None else "getitem"
    if aliased_input(node) is not None and not is_mutating(node):
        return "view"
    v = node.meta.get(VAL)
    if isinstance(v, torch.Tensor) or (
        isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v)
    ):
        return "compute"
    return "scalar"
