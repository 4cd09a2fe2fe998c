"""Channels-last layout through convolution chains: ``ConvLayout``.

ATen's CPU convolutions (oneDNN) run on channels-last tensors (``N, H, W, C`` in memory) without
reordering them; given the default contiguous layout they reorder input, weight and output on
every call.  This pass gives every 2-D (and 3-D) convolution channels-last operands and lets the
layout follow the values computed from its output: a batch norm, an activation, a residual add
and the next convolution all read and write channels-last, and the layout goes back to the traced
one only where something needs it.

How: the convolution's input and weight become ``prims.copy_strided`` copies in channels-last
strides (elementwise: a fusing backend stores them from the kernel computing the input), the
convolution's fake value is recomputed, and so is every value downstream whose input's layout
changed, in graph order.  A node keeps the traced layout of its inputs (a ``copy_strided`` back to
the traced strides is put before it) where recomputing is not sound or not possible:

* ops outside ``aten``/``prims`` (a custom op may read its input's memory directly), ops that
  write their arguments, and ops whose result depends on strides (``as_strided``);
* ops whose fake call refuses the new layout (a ``view`` that would need a copy);
* the graph's outputs: a caller receives the strides the graph was traced with; but a training
  forward's outputs saved for the backward (from ``FREE_OUTPUTS`` on) keep the new layout, which
  ``backend.report_output_strides`` tells AOTAutograd, and the backward graph, compiled with
  those strides (``INPUT_STRIDES``), carries them on from its inputs the same way.

Applies to graphs on CPU with oneDNN (``Config.conv_layout="auto"``), or on every device
(``"channels_last"``); static sizes only.  ``"as_traced"`` turns it off (given input strides are
still adopted: they are what the graph receives).
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..core.graph import FREE_OUTPUTS, INPUT_STRIDES, VAL, fake_call, fake_mode_of, tensors
from ..infra.pass_manager import PassResult

aten = torch.ops.aten
prims = torch.ops.prims

# Ops whose result depends on their input's strides, not only on its values.
_STRIDE_DEPENDENT = {
    aten.as_strided.default, aten.as_strided_.default, aten.as_strided_scatter.default,
    aten._reshape_alias.default, aten.set_.source_Storage_storage_offset,
}


def channels_last_strides(v: torch.Tensor) -> list[int] | None:
    """Channels-last strides for a 4-D or 5-D static tensor ``(N, C, *spatial)``, else None."""
    if v.dim() not in (4, 5) or not all(type(s) is int for s in v.shape):
        return None
    fmt = torch.channels_last if v.dim() == 4 else torch.channels_last_3d
    return list(torch.empty(v.shape, device="meta").contiguous(memory_format=fmt).stride())


# Convolution ops and the positions of their operands given channels-last strides.
_OPERANDS = {aten.convolution.default: (0, 1), aten.convolution_backward.default: (0, 1, 2)}


def _convolutions(gm: fx.GraphModule) -> list[fx.Node]:
    out = []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target not in _OPERANDS:
            continue
        vals = [n.args[i].meta.get(VAL) for i in _OPERANDS[n.target]]
        if all(isinstance(v, torch.Tensor) and v.is_floating_point() and channels_last_strides(v) is not None
               for v in vals):
            out.append(n)
    return out


def _layouts(v) -> list:
    """The strides of a value's tensors, those of size-1 dims left out (they address nothing)."""
    return [[st if sz != 1 else None for sz, st in zip(t.shape, t.stride())] for t in tensors(v)]


def _strides(v) -> list:
    return [list(t.stride()) for t in tensors(v)]


def _recomputable(n: fx.Node) -> bool:
    if n.target is operator.getitem:
        return True
    if not isinstance(n.target, torch._ops.OpOverload) or n.target in _STRIDE_DEPENDENT:
        return False
    if n.target.namespace not in ("aten", "prims"):
        return False
    return not any(a.alias_info is not None and a.alias_info.is_write for a in n.target._schema.arguments)


class ConvLayout:
    """Channels-last operands for convolutions, and the layout carried through what follows.

    Also adopts the strides a caller gives some inputs in (``INPUT_STRIDES``: a training
    backward's saved activations, laid out by the forward's run of this pass) whatever
    ``mode``, and lets the outputs from ``FREE_OUTPUTS`` on keep their new layout."""

    name = "conv_layout"

    def __init__(self, mode: str = "auto"):
        if mode not in ("auto", "channels_last", "as_traced"):
            raise ValueError(f"conv_layout={mode!r}: expected 'auto', 'channels_last' or 'as_traced'")
        self.mode = mode

    def applies(self, gm: fx.GraphModule) -> list[fx.Node]:
        if self.mode == "as_traced":
            return []
        convs = _convolutions(gm)
        if self.mode == "auto":
            cpu = torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled
            convs = [c for c in convs if cpu and c.args[0].meta[VAL].device.type == "cpu"]
        return convs

    def __call__(self, gm: fx.GraphModule) -> PassResult:
        convs = self.applies(gm)
        given = INPUT_STRIDES.get(gm) or {}
        fake = fake_mode_of(gm) if convs or given else None
        if fake is None:
            return PassResult(gm, False, {"convolutions": 0})
        graph = gm.graph
        traced = {n: n.meta.get(VAL) for n in graph.nodes}  # the values as traced
        changed: set[fx.Node] = set()  # nodes whose value now has other strides than traced
        restored: dict[fx.Node, fx.Node] = {}  # node -> its copy in the traced strides

        def copy(v: fx.Node, strides, before: fx.Node) -> fx.Node:
            with graph.inserting_before(before):
                return fake_call(gm, fake, prims.copy_strided.default, (v, strides))

        def as_traced(v: fx.Node) -> fx.Node:
            if v not in restored:
                restored[v] = copy(v, list(traced[v].stride()), v.next)
            return restored[v]

        def recompute(n: fx.Node) -> bool:
            args = fx.node.map_arg(n.args, lambda a: a.meta[VAL])
            kwargs = fx.node.map_arg(n.kwargs, lambda a: a.meta[VAL])
            try:
                with fake:
                    v = n.target(*args, **kwargs)
            except Exception:
                return False
            n.meta[VAL] = v
            if _layouts(v) != _layouts(traced[n]):
                changed.add(n)
            return True

        for n in graph.find_nodes(op="placeholder"):
            if n.name in given:  # an input the caller passes in other strides than traced
                with fake:
                    n.meta[VAL] = n.meta[VAL].as_strided(n.meta[VAL].shape, given[n.name])
                changed.add(n)
        to_channels_last = []
        for c in convs:
            for i in _OPERANDS[c.target]:
                a = c.args[i]
                want = channels_last_strides(a.meta[VAL])
                if list(a.meta[VAL].stride()) != want:
                    c.update_arg(i, copy(a, want, c))
                    to_channels_last.append(c.args[i])
        for c in convs:
            recompute(c)

        free = FREE_OUTPUTS.get(gm)
        kept = 0
        for n in list(graph.nodes):
            if n.op == "output":  # exactly the traced strides, size-1 dims' too
                outs = n.args[0] if isinstance(n.args[0], (tuple, list)) else [n.args[0]]
                bound = len(outs) if free is None else free
                ins = [a for a in n.all_input_nodes if a in traced and any(o is a for o in outs[:bound])
                       and _strides(a.meta[VAL]) != _strides(traced[a])]
            else:
                ins = [a for a in n.all_input_nodes if a in changed]
            if not ins or n in convs or n not in traced:  # (not in traced: the copies to channels-last)
                continue
            if n.op == "call_function" and _recomputable(n) and recompute(n):
                kept += 1
                continue
            # the traced layout for this node (an output, a refused or unsound recompute)
            for a in ins:
                n.replace_input_with(a, as_traced(a))
            if n.op == "call_function" and VAL in n.meta:
                recompute(n)
        copies = len(restored) + _drop_needless_copies(graph, to_channels_last)
        gm.recompile()
        return PassResult(gm, True, {"convolutions": len(convs), "given_inputs": len(given),
                                     "layout_copies": copies, "channels_last_nodes": kept + len(convs)},
                          recompile=False)


def _drop_needless_copies(graph: fx.Graph, to_channels_last: list[fx.Node]) -> int:
    """The copies to channels-last whose operand is channels-last already (made so upstream) are
    removed; returns how many are kept."""
    kept = 0
    for c in to_channels_last:
        x = c.args[0]
        if _layouts(x.meta[VAL]) == _layouts(c.meta[VAL]):
            c.replace_all_uses_with(x)
            graph.erase_node(c)
        else:
            kept += 1
    return kept
