"""Training under a memory budget: which forward values a training step saves for its backward,
and which the backward recomputes, chosen so that the step's peak fits ``Config.memory_budget``.

AOTAutograd hands the backend one joint graph (forward and backward) and a partitioner splits it.
Without a budget fxforge uses ``Config.partitioner`` (AOTAutograd's min-cut by default). With one,
``partition_under_budget`` starts from that partitioner's choice and, while the step's planned
peak is over the budget, stops saving values, which the backward then recomputes:

* **The peak** that decides is the memory plans': the forward and backward graphs a choice gives
  are run through fxforge's passes, schedule and memory plan (no code emitted), and their
  ``MemoryPlan.peak_bytes`` make the step's (each graph's kept arenas held while the other runs,
  the caller holding the outputs through the backward). The choice itself runs on a quick
  estimate (``step_peak``: the joint graph's values in order, each recomputed one made just before
  its first read in the backward), aimed lower by what the plans add, and is made again while the
  plans are over. Parameters and inputs are not counted: they exist before the step. The graphs
  are planned as they will be compiled (the forward's saved values free to keep the layouts its
  passes give them, the backward taking them in those), and the two chosen are compiled from
  their plans (``HEAD_START``): a choice costs its planning, the chosen one nothing more.
* **The cost** of recomputing is fxforge's compute model's time (``core.costs``): a matmul or a
  convolution costs its FLOPs, a reduction its bytes, a pointwise op or a view about nothing (it
  fuses into the backward kernel that reads it).
* **The moves** stop saving one storage (a value and its views) at a time: recomputing it alone,
  with the cheap chain behind it back to values saved anyway, or with that chain's matmuls too;
  greedy on bytes freed per second, a batch of storages per round (as many as the bytes over
  need), then the costliest recomputations are saved again where the budget still holds.
* **Results split** (``split_results``), where the default is over: a dropout's and a training
  batch norm's result become pointwise functions of what the op returns besides (mask, batch
  statistics), so they can be recomputed without the op.

Never recomputed: random ops (a dropout mask is the one the forward drew), ops that mutate or
have side effects, collectives, higher-order ops; and the backward never reads an input the
forward may mutate. A budget no choice meets raises ``MemoryBudgetError`` naming the least peak
found and what dominates it.
"""

from __future__ import annotations

import copy
import logging
import operator
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx as fx

from ..core.collectives import is_collective, is_wait
from ..core.costs import ComputeModel, graph_compute_model, node_flops, value_bytes
from ..core.graph import (FREE_OUTPUTS, HEAD_START, INPUT_STRIDES, PROBES, VAL, SharedProbes, aliased_input,
                          given_strides, is_mutating, is_tangent, output_nodes, peak_live_bytes, storage_root,
                          tensors)
from ..core.plan import MemoryPlan
from .memory import eager_scratch_bytes

log = logging.getLogger("fxforge")

# Rounds of choosing on the quick estimate and checking with the memory plans.
ATTEMPTS = 4
# Recomputations (the costliest) a choice within budget tries to save again.
SAVE_AGAIN = 16
# Values that are symbols (sizes), saved apart from tensors.
_SYMBOLS = (torch.SymInt, torch.SymFloat, torch.SymBool)
# A pointwise op or a reduction recomputed in the backward fuses into the kernel that reads it:
# it costs this fraction of the time its bytes would take as a kernel of its own.
FUSED_RECOMPUTE = 0.1


class MemoryBudgetError(ValueError):
    """``Config.memory_budget`` is below the least step peak fxforge found (a ``ValueError``)."""


@dataclass
class SavePlan:
    """What a training graph saves and recomputes under a budget, and the peaks (bytes)."""

    budget_bytes: int
    default_peak_bytes: int  # the step's planned peak with the default partitioner's choice
    planned_peak_bytes: int  # the same with this choice
    saved: dict[str, int] = field(default_factory=dict)  # forward value -> bytes saved for the backward
    recomputed: dict[str, dict] = field(default_factory=dict)  # forward value -> {"bytes", "flops", "seconds"}
    # seconds the budget took in the partitioner (its plans and choices; the chosen graphs' plans
    # are their compiles' head start)
    plan_seconds: float = 0.0

    @property
    def saved_bytes(self) -> int:
        return sum(self.saved.values())

    @property
    def recomputed_flops(self) -> float:
        return sum(r["flops"] for r in self.recomputed.values())

    def as_dict(self) -> dict[str, Any]:
        return {"budget_bytes": self.budget_bytes, "default_peak_bytes": self.default_peak_bytes,
                "planned_peak_bytes": self.planned_peak_bytes, "saved_bytes": self.saved_bytes,
                "recomputed_flops": self.recomputed_flops, "saved": dict(self.saved),
                "recomputed": {k: dict(v) for k, v in self.recomputed.items()}, "plan_seconds": self.plan_seconds}


def budget_bytes(budget: int | float, default_peak: int) -> int:
    """``Config.memory_budget`` in bytes: an int is bytes, a float a fraction of ``default_peak``
    (the step's: the largest default peak of its graphs)."""
    return int(budget) if isinstance(budget, int) else int(budget * default_peak)


# --------------------------------------------------------------------------- the joint graph


class Joint:
    """The joint graph read once: its forward and backward nodes, what can be recomputed, sizes."""

    def __init__(self, joint: fx.GraphModule, num_fwd_outputs: int, compute: ComputeModel,
                 base_backward: fx.GraphModule):
        self.nodes = list(joint.graph.nodes)
        self.order = {n: i for i, n in enumerate(self.nodes)}
        self.by_name = {n.name: n for n in self.nodes}
        self.root = {n: storage_root(n) for n in self.nodes}  # (the storage each value lives in)
        # what eager ops (convolutions) allocate inside themselves while they run
        self.scratch = {n: b for n in self.nodes if (b := eager_scratch_bytes(n))}
        tangents = [n for n in self.nodes if is_tangent(n)]
        # the backward: every node that reads an incoming gradient, directly or not
        back: set[fx.Node] = set(tangents)
        for n in self.nodes:
            if n.op == "call_function" and any(a in back for a in n.all_input_nodes):
                back.add(n)
        outs = output_nodes(joint)
        self.num_fwd_outputs = num_fwd_outputs
        self.fwd_outputs = [o for o in outs[:num_fwd_outputs]]
        self.grads = outs[num_fwd_outputs:]
        self.inputs = {n for n in self.nodes if n.op == "placeholder"}
        self.backward = [n for n in self.nodes if n in back and n.op == "call_function"]
        self.forward = [n for n in self.nodes if n.op in ("placeholder", "call_function", "get_attr") and n not in back]
        self.is_forward = set(self.forward)
        self.compute = compute
        # the step's inputs the backward may read: those the base partitioner's backward reads,
        # and those it computes gradients for (no forward mutates them); never one the forward
        # may mutate (a batch norm's running statistics: saved, it would be the mutated tensor)
        self.readable = {self.by_name[n.name] for n in base_backward.graph.nodes
                         if n.op == "placeholder" and n.name in self.by_name} | self.differentiable_inputs()
        self._cost: dict[fx.Node, float] = {}

    def differentiable_inputs(self) -> set[fx.Node]:
        """The step's inputs it computes a gradient for (the joint graph's outputs past the
        forward's are one per input, None where there is none)."""
        out = next(n for n in reversed(self.nodes) if n.op == "output").args[0]
        primals = [n for n in self.nodes if n.op == "placeholder" and not is_tangent(n)]
        grads = list(out[self.num_fwd_outputs:]) if isinstance(out, (tuple, list)) else []
        if len(grads) != len(primals):
            return set()
        return {p for p, g in zip(primals, grads) if g is not None}

    def output_bytes(self, recompute: set[fx.Node]) -> int:
        """Bytes of the graph's own outputs, which the caller holds through the backward (those
        also saved for it are the backward's inputs already)."""
        saved = {self.root[s] for s in self.saved(recompute)}
        return sum(self.nbytes(r) for r in {self.root[o] for o in self.fwd_outputs} - saved)

    def nbytes(self, n: fx.Node) -> int:
        """Bytes ``n``'s storage adds: 0 for a view (its base holds them) and for the step's inputs."""
        if n.op != "call_function" or aliased_input(n) is not None:
            return 0
        if n.target is operator.getitem and isinstance(n.args[0], fx.Node) and aliased_input(n.args[0]) is not None:
            return 0
        return int(value_bytes(n)) if isinstance(n.meta.get(VAL), torch.Tensor) else 0

    def recomputable(self, n: fx.Node) -> bool:
        """A forward node the backward may run again: a functional, deterministic ATen op."""
        if n.op != "call_function" or n not in self.is_forward or n.meta.get("has_backward_hook"):
            return False
        if n.target is operator.getitem:
            parent = n.args[0]
            return isinstance(parent, fx.Node) and self.recomputable(parent)
        op = n.target
        if not isinstance(op, torch._ops.OpOverload) or is_mutating(n) or is_collective(n) or is_wait(n):
            return False
        if torch.Tag.nondeterministic_seeded in op.tags or op._schema.is_mutable:
            return False
        if not tensors(n.meta.get(VAL)):
            return False
        try:
            return not n.is_impure(impure_random=True)
        except TypeError:  # (an older signature)
            return not n.is_impure()

    def cost(self, n: fx.Node) -> float:
        """Seconds the backward spends recomputing ``n`` under the compute model."""
        c = self._cost.get(n)
        if c is None:
            if n.target is operator.getitem or aliased_input(n) is not None:
                c = 0.0
            else:
                flops = node_flops(n)
                nbytes = value_bytes(n) + sum(value_bytes(a) for a in n.all_input_nodes)
                if flops:
                    c = self.compute.time(flops, nbytes)
                else:
                    c = FUSED_RECOMPUTE * self.compute.time(0.0, nbytes)
            self._cost[n] = c
        return c

    def unit(self, n: fx.Node) -> list[fx.Node]:
        """The nodes recomputing ``n`` runs: a multi-output op's getitem runs its op."""
        if n.target is operator.getitem and isinstance(n.args[0], fx.Node):
            return [n.args[0], n]
        return [n]

    def saved(self, recompute: set[fx.Node]) -> list[fx.Node]:
        """The forward values the backward reads, directly or through recomputed ones, in joint order."""
        need: set[fx.Node] = set()
        for n in (*self.backward, *recompute):
            for a in n.all_input_nodes:
                if a in self.is_forward and a not in recompute:
                    need.add(a)
        return sorted(need, key=self.order.__getitem__)


# --------------------------------------------------------------------------- the peak


def step_peak(j: Joint, recompute: set[fx.Node]) -> tuple[int, list[tuple[fx.Node, int, str]]]:
    """The step's peak of live bytes with this recompute set, every value its own buffer (quick:
    what the choice runs on), and what is live there: (node, bytes, "forward" | "saved" |
    "gradient" | "output" | "backward" | "recomputed" | "workspace")."""
    kept = j.saved(recompute)
    saved = [s for s in kept if isinstance(s.meta.get(VAL), torch.Tensor)]
    saved_roots = {j.root[s] for s in saved}
    user_outs = {j.root[o] for o in j.fwd_outputs}
    # forward: what its outputs and the saved values need (a node only the backward reads, which
    # it recomputes, does not run there), every storage from its op to its last forward read,
    # saved ones and outputs to the end
    runs = _needed(j, [*j.fwd_outputs, *kept])
    fpos = {n: i for i, n in enumerate(x for x in j.forward if x in runs)}
    last = len(fpos) - 1
    ranges: list[tuple[int, int, int, fx.Node, str]] = []
    ends: dict[fx.Node, int] = {}
    for n in fpos:
        r = j.root[n]
        for u in n.users:
            if u in fpos:
                ends[r] = max(ends.get(r, fpos[n]), fpos[u])
    for n in fpos:
        b = j.nbytes(n)
        if b:
            keep = n in saved_roots or n in user_outs
            kind = "output" if n in user_outs else "saved" if n in saved_roots else "forward"
            ranges.append((fpos[n], last if keep else ends.get(n, fpos[n]), b, n, kind))
        if n in j.scratch:  # (a convolution's own scratch, while it runs)
            ranges.append((fpos[n], fpos[n], j.scratch[n], n, "workspace"))
    fwd_peak, fwd_at = _peak(ranges)
    # backward: saved values and user outputs live from the start; recomputed values are made just
    # before their first reader, in the backward's order
    order: list[fx.Node] = []
    placed: set[fx.Node] = set()

    def place(n: fx.Node) -> None:
        stack = [n]
        while stack:
            m = stack[-1]
            pending = [a for a in m.all_input_nodes if a in recompute and a not in placed]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if m not in placed:
                placed.add(m)
                order.append(m)

    for n in j.backward:
        for a in n.all_input_nodes:
            if a in recompute and a not in placed:
                place(a)
        order.append(n)
    bpos = {n: i + 1 for i, n in enumerate(order)}
    blast = len(order)
    grads = {j.root[g] for g in j.grads}
    bends: dict[fx.Node, int] = {}
    for n in [*saved, *order]:
        r = j.root[n]
        start = bpos.get(n, 0)
        for u in n.users:
            if u in bpos:
                bends[r] = max(bends.get(r, start), bpos[u])
    branges = []
    for r in sorted(saved_roots | user_outs, key=j.order.__getitem__):
        b = j.nbytes(r)
        if b:
            branges.append((0, blast if r in user_outs else bends.get(r, 0), b, r, "output" if r in user_outs else "saved"))
    for n in order:
        b = j.nbytes(n)
        if b:
            kind = "gradient" if n in grads else "recomputed" if n in recompute else "backward"
            branges.append((bpos[n], blast if n in grads else bends.get(n, bpos[n]), b, n, kind))
        if n in j.scratch:
            branges.append((bpos[n], bpos[n], j.scratch[n], n, "workspace"))
    bwd_peak, bwd_at = _peak(branges)
    return (fwd_peak, fwd_at) if fwd_peak > bwd_peak else (bwd_peak, bwd_at)


def _needed(j: Joint, values) -> set[fx.Node]:
    """The forward nodes ``values`` need, directly or not, themselves included."""
    need: set[fx.Node] = set()
    stack = [v for v in values if v in j.is_forward]
    while stack:
        n = stack.pop()
        if n not in need:
            need.add(n)
            stack.extend(a for a in n.all_input_nodes if a in j.is_forward and a not in need)
    return need


def _peak(ranges) -> tuple[int, list[tuple[fx.Node, int, str]]]:
    """The peak of (start, end, bytes, node, kind) ranges and the ranges live at it."""
    if not ranges:
        return 0, []
    peak = peak_live_bytes((s, e, b) for s, e, b, _, _ in ranges)
    events = sorted([(s, b) for s, _, b, _, _ in ranges] + [(e + 1, -b) for _, e, b, _, _ in ranges])
    cur, at = 0, 0
    for t, d in events:
        cur += d
        if cur == peak:
            at = t
            break
    return peak, [(n, b, k) for s, e, b, n, k in ranges if s <= at <= e]


# --------------------------------------------------------------------------- the choice


def choose(j: Joint, recompute0: set[fx.Node], budget: int) -> tuple[set[fx.Node], int]:
    """A recompute set, grown from ``recompute0``, whose step peak is within ``budget`` (or the
    least peak found, for the error)."""
    recompute = set(recompute0)
    peak, live = step_peak(j, recompute)
    tried: set[fx.Node] = set()
    while peak > budget:
        over = peak - budget
        in_order = j.saved(recompute)
        saved, aliases = set(in_order), _by_storage(j, in_order)
        moves = []  # (bytes freed per second, bytes, storage, nodes to recompute)
        for r, _, kind in live:  # the saved storages live at the peak
            if kind == "saved" and r not in tried:
                moves += [(gain / (cost + 1e-9), gain, r, cone) for cone, gain, cost in _moves(j, aliases[r], recompute, saved)]
        if not moves:
            break
        moves.sort(key=lambda m: -m[0])
        freed, taken = 0, set()
        for _, gain, r, cone in moves:
            if freed >= over:
                break
            if r in tried or _reads(cone, taken):  # (it would now recompute what this round made recomputed)
                continue
            recompute.update(cone)
            taken.update(cone)
            tried.add(r)
            freed += gain
        peak, live = step_peak(j, recompute)
    if peak > budget:
        return recompute, peak
    # save again the costliest recomputations (not the default's own) while the budget holds
    extra = sorted((n for n in recompute - recompute0 if n.target is not operator.getitem),
                   key=lambda n: (-j.cost(n), j.order[n]))
    for n in extra[:SAVE_AGAIN]:
        if j.cost(n) <= 0:
            break
        trial = recompute - set(j.unit(n)) - {u for u in n.users if u.target is operator.getitem and u in recompute}
        p, _ = step_peak(j, trial)
        if p <= budget:
            recompute, peak = trial, p
    return recompute, peak


def _by_storage(j: Joint, values) -> dict[fx.Node, list[fx.Node]]:
    """Values by the storage they live in (its root node)."""
    out: dict[fx.Node, list[fx.Node]] = {}
    for x in values:
        out.setdefault(j.root[x], []).append(x)
    return out


def _reads(cone: set[fx.Node], nodes: set[fx.Node]) -> bool:
    """Some node of ``cone`` reads one of ``nodes`` (from outside the cone)."""
    return any(a in nodes and a not in cone for u in cone for a in u.all_input_nodes)


# Most nodes one move recomputes: a value and the chain behind it back to saved values.
MAX_CONE = 32


def _moves(j: Joint, seeds: list[fx.Node], recompute: set[fx.Node],
           saved: set[fx.Node]) -> list[tuple[set[fx.Node], int, float]]:
    """The ways to stop saving one storage, ``seeds`` being its saved values (it and its views),
    that free bytes: recomputing them alone (their inputs saved), with the cheap chain behind them
    back to values saved anyway, or with the matmuls on that chain too."""
    if not all(j.recomputable(x) for x in seeds) or any(u in recompute and j.root[u] is not j.root[x]
                                                        for x in seeds for u in x.users):
        # (a value another recomputed one reads would be made that early and live as long as saved)
        return []
    moves = [_move(j, seeds, recompute, saved, 0, False), _move(j, seeds, recompute, saved, MAX_CONE, False),
             _move(j, seeds, recompute, saved, MAX_CONE, True)]
    return [m for m in moves if m[1] > 0]


def _move(j: Joint, seeds: list[fx.Node], recompute: set[fx.Node], saved: set[fx.Node], max_cone: int,
          matmuls: bool) -> tuple[set[fx.Node], int, float]:
    """Recomputing ``seeds``: the nodes the backward then runs (the seeds and, up to
    ``max_cone`` more, the chain behind them back to values saved anyway: pointwise ops, views,
    reductions, and with ``matmuls`` matmuls and convolutions, which are otherwise saved), the
    bytes no longer saved, and the seconds it costs."""
    cone: set[fx.Node] = {u for x in seeds for u in j.unit(x)}
    limit = len(cone) + max_cone
    # storages saved anyway (through any of their views), but the seeds'
    held = {j.root[x] for x in saved if x not in cone}
    frontier: set[fx.Node] = set()
    stack = [a for u in sorted(cone, key=j.order.__getitem__) for a in u.all_input_nodes]
    while stack:
        a = stack.pop()
        if a.op == "placeholder" and a not in j.readable:
            return cone, 0, 0.0  # (an input the backward may not read)
        if a in cone or a in frontier or a in recompute or a not in j.is_forward or a.op != "call_function" \
                or j.root[a] in held:
            continue
        if len(cone) < limit and j.recomputable(a) and (matmuls or not node_flops(a)):
            unit = j.unit(a)
            cone.update(unit)
            stack.extend(x for u in unit for x in u.all_input_nodes)
        else:
            frontier.add(a)
    added = {j.root[a] for a in frontier} - held
    freed = {j.root[u] for u in cone if u in saved} - held - added
    gain = sum(j.nbytes(r) for r in freed) - sum(j.nbytes(r) for r in added)
    return cone, gain, sum(j.cost(u) for u in cone)


# --------------------------------------------------------------------------- random ops


def split_results(joint: fx.GraphModule) -> int:
    """Ops whose first result is a pointwise function of their other results and inputs give it
    that way (``RESULT_RULES``): the op still runs for the rest, and the result can be recomputed
    in the backward from what is saved anyway. Returns how many were split."""
    from ..core.graph import fake_call, fake_mode_of, inherit_meta

    mode = fake_mode_of(joint)
    if mode is None:
        return 0
    order = {n: i for i, n in enumerate(joint.graph.nodes)}
    count = 0
    for n in list(joint.graph.nodes):
        rule = RESULT_RULES.get(n.target) if n.op == "call_function" else None
        outs = {u.args[1]: u for u in n.users if u.target is operator.getitem} if rule else {}
        if 0 not in outs:
            continue
        made: list[fx.Node] = []
        cursor = [max(outs.values(), key=lambda u: order.get(u, len(order)))]

        def insert(make) -> fx.Node:
            with joint.graph.inserting_after(cursor[0]):
                x = make()
            cursor[0] = x
            made.append(x)
            return x

        def out(i: int, n=n, outs=outs) -> fx.Node:
            if i not in outs:
                outs[i] = insert(lambda: joint.graph.call_function(operator.getitem, (n, i)))
                outs[i].meta[VAL] = n.meta[VAL][i]
            return outs[i]

        def emit(op, *args, **kwargs) -> fx.Node:
            return insert(lambda: fake_call(joint, mode, op, args, kwargs))

        result = rule(n, out, emit)
        if result is None:
            continue
        want = n.meta[VAL][0]
        if result.meta[VAL].dtype != want.dtype:
            result = emit(torch.ops.aten._to_copy.default, result, dtype=want.dtype)
        inherit_meta(made, outs[0])
        outs[0].replace_all_uses_with(result)
        joint.graph.erase_node(outs[0])
        count += 1
    if count:
        joint.recompile()
    return count


def _dropout(n: fx.Node, out, emit) -> fx.Node | None:
    """``native_dropout``'s result is ``x * mask * scale`` (bit for bit: ATen computes it so)."""
    x, p = n.args[0], float(n.args[1])
    if not isinstance(x, fx.Node):
        return None
    return emit(torch.ops.aten.mul.Tensor, emit(torch.ops.aten.mul.Tensor, x, out(1)), 0.0 if p == 1 else 1.0 / (1.0 - p))


def _batch_norm(n: fx.Node, out, emit) -> fx.Node | None:
    """A training batch norm's result is ``(x - mean) * rstd * weight + bias`` of the batch
    statistics it returns (to rounding: ATen may fold the terms otherwise)."""
    aten = torch.ops.aten
    x, weight, bias, _, _, training = n.args[:6]
    v = x.meta.get(VAL) if isinstance(x, fx.Node) else None
    if not training or not isinstance(v, torch.Tensor) or v.dim() < 2 or not isinstance(v.shape[1], int):
        return None
    shape = [1, v.shape[1]] + [1] * (v.dim() - 2)
    y = emit(aten.mul.Tensor, emit(aten.sub.Tensor, x, emit(aten.view.default, out(1), shape)),
             emit(aten.view.default, out(2), shape))
    if isinstance(weight, fx.Node):
        y = emit(aten.mul.Tensor, y, emit(aten.view.default, weight, shape))
    if isinstance(bias, fx.Node):
        y = emit(aten.add.Tensor, y, emit(aten.view.default, bias, shape))
    return y


# Ops whose first result ``split_results`` gives as a pointwise function: op -> rule(node, out(i),
# emit(op, *args)) returning the node computing it, or None to leave the op as it is.
RESULT_RULES: dict[Any, Callable] = {
    torch.ops.aten.native_dropout.default: _dropout,
    torch.ops.aten._native_batch_norm_legit_functional.default: _batch_norm,
}


# --------------------------------------------------------------------------- the partition


# A graph's passes and memory plan: ``spine.plan_ahead`` with the entry point's Config and registry,
# given the graph and its kind ("forward" or "backward"); what it returns has the plan as ``memory``,
# and is handed to the compile of the graph planned (``HEAD_START``) where that graph is chosen.
Planner = Callable[[fx.GraphModule, str], Any]


@dataclass
class _Trial:
    """A choice as the memory plans lay it out: the step's peak, the graphs, what makes the peak,
    and the graphs' plans (each graph's head start to its compile)."""

    peak: int
    fw: fx.GraphModule
    bw: fx.GraphModule
    where: str
    ahead: tuple[Any, Any]

    def hand_over(self) -> tuple[fx.GraphModule, fx.GraphModule]:
        """The forward and backward, each with its planned passes as its compile's head start."""
        HEAD_START.set(self.fw, self.ahead[0])
        HEAD_START.set(self.bw, self.ahead[1])
        return self.fw, self.bw


class _Plans:
    """Each choice planned once (``peak``): its step peak, its forward and backward graphs, and
    what makes the peak (``tried``). The planner's passes rewrite copies; the backends' probes
    (codegen/probes.py) are shared by every graph planned and the two compiled. A forward's outputs
    past ``num_fwd_outputs`` are planned free to keep the layouts the passes give them
    (``FREE_OUTPUTS``, as the compile has them where ``free_outputs``), and its backward to take
    its saved values in them (``INPUT_STRIDES``)."""

    def __init__(self, joint: fx.GraphModule, j: Joint, fw0: fx.GraphModule, num_fwd_outputs: int, kwargs: dict,
                 planner: Planner, free_outputs: bool):
        self.joint, self.j, self.fw0, self.num_fwd_outputs, self.kwargs = joint, j, fw0, num_fwd_outputs, kwargs
        self.planner, self.free_outputs = planner, free_outputs
        self.tried: dict[frozenset[fx.Node], _Trial] = {}
        self.probes = SharedProbes()

    def peak(self, recompute: set[fx.Node], graphs: tuple[fx.GraphModule, fx.GraphModule] | None = None) -> int:
        """The step's peak as the forward's and backward's memory plans lay it out (of ``graphs``,
        or of the graphs extracted for ``recompute``)."""
        key = frozenset(recompute)
        if key not in self.tried:
            j = self.j
            f, b = graphs or _extract(self.joint, j, recompute, self.fw0, self.num_fwd_outputs, self.kwargs)
            fc, bc = _copy(f), _copy(b)
            self.hand_probes(fc, bc)
            if self.free_outputs:
                FREE_OUTPUTS.set(fc, self.num_fwd_outputs)
            fa = self.planner(fc, "forward")
            given = _given_strides(f, fa.gm, b, self.num_fwd_outputs)
            if given:
                INPUT_STRIDES.set(bc, given)
            ba = self.planner(bc, "backward")
            fp, bp = fa.memory, ba.memory
            # (each graph's kept arenas are held while the other runs; the caller holds the outputs)
            at = [("forward", fp, {"the backward's kept arenas": bp.kept_bytes}),
                  ("backward", bp, {"the forward's kept arenas": fp.kept_bytes,
                                    "the forward's outputs the caller holds": j.output_bytes(recompute)})]
            kind, plan, held = max(at, key=lambda x: x[1].peak_bytes + sum(x[2].values()))
            self.tried[key] = _Trial(plan.peak_bytes + sum(held.values()), f, b, _where(kind, plan, held), (fa, ba))
        return self.tried[key].peak

    def hand_probes(self, *graphs: fx.GraphModule) -> None:
        """The graphs (planned, or handed to the compiler) share the probes."""
        for g in graphs:
            PROBES.set(g, self.probes)


def _given_strides(fw: fx.GraphModule, planned_fw: fx.GraphModule, bw: fx.GraphModule,
                   num_fwd_outputs: int) -> dict[str, tuple]:
    """The backward's saved inputs whose strides the planned forward lays out otherwise than
    traced: name -> strides (what AOTAutograd gives the backward's compiler once the forward
    reports its outputs' strides; ``entry/dynamo.caller_layouts``)."""
    def outs(gm: fx.GraphModule) -> list:
        out = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
        return list(out) if isinstance(out, (tuple, list)) else [out]

    inputs = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    given = {}
    for o, p in zip(outs(fw)[num_fwd_outputs:], outs(planned_fw)[num_fwd_outputs:]):
        n = inputs.get(o.name) if isinstance(o, fx.Node) else None
        if n is not None and isinstance(p, fx.Node):
            strides = given_strides(n.meta.get(VAL), p.meta.get(VAL))
            if strides is not None:
                given[n.name] = strides
    return given


def partition_under_budget(joint: fx.GraphModule, joint_inputs, *, base: Callable, budget: int | float,
                           planner: Planner, num_fwd_outputs: int, step_peak_so_far: int = 0,
                           free_outputs: bool = False, **kwargs) -> tuple[fx.GraphModule, fx.GraphModule, SavePlan]:
    """Partition ``joint`` with ``base`` (an AOTAutograd partitioner); where the step's planned
    peak is over ``budget`` (``Config.memory_budget``), recompute more in the backward until the
    memory plans fit. A fraction is of the largest default peak among this graph's and
    ``step_peak_so_far`` (the step's other graphs', with graph breaks)."""
    compute = graph_compute_model(joint)

    fw, bw = base(joint, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
    t0 = time.perf_counter()
    j = Joint(joint, num_fwd_outputs, compute, bw)
    # what the base partitioner recomputes: the forward's nodes its backward graph runs again
    recompute0 = {j.by_name[n.name] for n in bw.graph.nodes
                  if n.op == "call_function" and j.by_name.get(n.name) in j.is_forward}
    plans = _Plans(joint, j, fw, num_fwd_outputs, kwargs, planner, free_outputs)
    default_peak = plans.peak(recompute0, (fw, bw))
    want = budget_bytes(budget, max(default_peak, step_peak_so_far))
    plans.hand_probes(fw, bw)
    if default_peak <= want:
        fw, bw = plans.tried[frozenset(recompute0)].hand_over()
        return fw, bw, _plan(j, recompute0, want, default_peak, default_peak, t0)
    if split_results(joint):  # (the default's choice again, by name, on the graph with results split)
        names, default = {n.name for n in recompute0}, plans.tried[frozenset(recompute0)]
        j = plans.j = Joint(joint, num_fwd_outputs, compute, bw)
        recompute0 = {n for n in j.nodes if n.name in names}
        plans.tried[frozenset(recompute0)] = default
    # choose on the quick estimate, aimed at the budget less what the plans add to it; check with
    # the plans, aiming lower by what they are still over
    quick0, _ = step_peak(j, recompute0)
    recompute, target = set(recompute0), want - (default_peak - quick0)
    best, peak = recompute0, default_peak  # (the least planned peak seen, for the error)
    for _ in range(ATTEMPTS):
        recompute, quick = choose(j, recompute, target)
        if quick > target:  # (the estimate cannot come down that far: neither would the plans)
            log.debug("fxforge: memory budget %d: aimed at %d on the estimate, reached %d", want, target, quick)
            break
        p = plans.peak(recompute)
        log.debug("fxforge: memory budget %d: aimed at %d on the estimate, reached %d; planned %d",
                  want, target, quick, p)
        if p < peak:
            best, peak = set(recompute), p
        if p <= want:
            break
        target = quick - (p - want)  # (below what this choice reached on the estimate)
    if peak > want:
        # last tries: the greedy run to its end from the default's choice (what a budget below
        # reach gets), then every storage whose recompute frees bytes on top of the best so far
        for make in (lambda: choose(j, recompute0, 0)[0], lambda: _most_recomputed(j, best)):
            candidate = make()
            p = plans.peak(candidate)
            if p < peak:
                best, peak = candidate, p
            if peak <= want:
                break
        if peak > want:
            raise MemoryBudgetError(_impossible(want, peak, default_peak, plans.tried[frozenset(best)].where,
                                                step_peak(j, best)[1]))
    fw, bw = plans.tried[frozenset(best)].hand_over()
    plans.hand_probes(fw, bw)
    plan = _plan(j, best, want, default_peak, peak, t0)
    log.info("fxforge: memory budget %d bytes: %d values recomputed in the backward, planned step peak %d "
             "(default %d)", want, len(plan.recomputed), peak, default_peak)
    return fw, bw, plan


def _most_recomputed(j: Joint, recompute: set[fx.Node]) -> set[fx.Node]:
    """``recompute`` grown by every saved value whose recompute frees bytes (the least peak)."""
    recompute = set(recompute)
    while True:
        in_order = j.saved(recompute)
        saved, aliases = set(in_order), _by_storage(j, in_order)
        grow = [m for seeds in aliases.values() for m in _moves(j, seeds, recompute, saved)[-1:]]
        if not grow:
            return recompute
        taken: set[fx.Node] = set()
        for cone, _, _ in grow:
            if not _reads(cone, taken):
                recompute.update(cone)
                taken.update(cone)


def _plan(j: Joint, recompute: set[fx.Node], want: int, default_peak: int, peak: int, t0: float) -> SavePlan:
    plan = SavePlan(budget_bytes=want, default_peak_bytes=default_peak, planned_peak_bytes=peak)
    for r in _by_storage(j, j.saved(recompute)):  # (a storage once, however many views of it are saved)
        if j.nbytes(r):
            plan.saved[r.name] = j.nbytes(r)
    for n in sorted(recompute, key=j.order.__getitem__):
        if n.target is not operator.getitem:
            plan.recomputed[n.name] = {"bytes": j.nbytes(n), "flops": node_flops(n), "seconds": j.cost(n)}
    plan.plan_seconds = time.perf_counter() - t0
    return plan


def _where(kind: str, plan: MemoryPlan, held: dict[str, int]) -> str:
    """What makes a step's planned peak: the graph whose plan peaks, its parts there, what else is held."""
    parts = plan.peak_parts
    said = [] if parts is None else [
        f"arenas {_mib(parts.arenas)}", f"storages outside them (saved values, gradients, outputs) {_mib(parts.storages)}",
        *([f"{parts.workspace_of}'s workspace (an eager op's own scratch) {_mib(parts.workspace)}"] if parts.workspace else [])]
    said += [f"{what} {_mib(b)}" for what, b in held.items() if b >= 2 ** 16]
    return f"the {kind}'s memory plan peaks there" + (f" with {', '.join(said)}" if said else "")


def _impossible(want: int, least: int, default_peak: int, where: str, live: list[tuple[fx.Node, int, str]]) -> str:
    by_kind: dict[str, int] = {}
    for _, b, kind in live:
        by_kind[kind] = by_kind.get(kind, 0) + b
    names = {"saved": "saved values that cannot be recomputed (random ops' results, mutated or "
                      "side-effecting ops' inputs) or whose recompute frees nothing",
             "gradient": "gradients", "output": "the graph's outputs", "forward": "forward intermediates",
             "backward": "backward intermediates", "recomputed": "recomputed values",
             "workspace": "an eager op's own scratch"}
    parts = ", ".join(f"{names[k]} {_mib(b)}" for k, b in sorted(by_kind.items(), key=lambda kv: -kv[1])
                      if b >= 2 ** 16)
    big = max(live, key=lambda x: x[1], default=None)
    one = f"; the largest single value there is {big[0].name} ({_mib(big[1])})" if big else ""
    return (f"Config.memory_budget asks for a training step peak of {_mib(want)}, but the least peak "
            f"fxforge found by recomputing in the backward is {_mib(least)} (the default choice "
            f"peaks at {_mib(default_peak)}): {where}. Live there by fxforge's estimate: {parts}{one}. "
            f"Raise memory_budget to at least "
            f"{least} bytes, make the batch smaller, or checkpoint across graph breaks by hand.")


def _mib(b: int) -> str:
    return f"{b / 2 ** 20:.1f} MiB"


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A copy of ``gm`` for the planner's passes to rewrite (nodes' meta copied shallowly)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule

    return _LazyGraphModule(gm, copy.deepcopy(gm.graph))  # (its Python code made if it runs: never)


def _extract(joint: fx.GraphModule, j: Joint, recompute: set[fx.Node], fw0: fx.GraphModule, num_fwd_outputs: int,
             kwargs: dict) -> tuple[fx.GraphModule, fx.GraphModule]:
    """The forward and backward graphs saving what ``recompute`` leaves saved."""
    from torch._functorch import partitioners as p
    from torch.fx._lazy_graph_module import _use_lazy_graph_module

    saved = j.saved(recompute)
    values = [s for s in saved if not isinstance(s.meta.get(VAL), (*_SYMBOLS, int))]
    syms = [s for s in saved if s not in values]
    # the default partitioner's saved symbols stay saved (the backward's shapes may read them)
    fw_out = output_nodes(fw0)[num_fwd_outputs:]
    for o in fw_out:
        n = j.by_name.get(o.name)
        if n is not None and n not in syms and isinstance(n.meta.get(VAL), _SYMBOLS):
            syms.append(n)
    extra: dict[str, Any] = {}
    static = kwargs.get("static_lifetime_input_nodes")
    if static is None and kwargs.get("static_lifetime_input_indices") is not None and hasattr(p, "classify_nodes"):
        static = p.classify_nodes(joint, kwargs["static_lifetime_input_indices"], num_fwd_outputs).static_lifetime_input_nodes
    if static is not None:
        extra["static_lifetime_input_nodes"] = static
    with _use_lazy_graph_module(True):  # (Python code made when first run, not per trial)
        fw, bw = p._extract_fwd_bwd_modules(joint, values, saved_sym_nodes=syms, num_fwd_outputs=num_fwd_outputs,
                                            **extra)
        fw.graph.eliminate_dead_code(is_impure_node=p.is_not_collective)
        bw.graph.eliminate_dead_code(is_impure_node=p.is_not_collective)
        backward_order(bw.graph)
        fw.recompile()
        bw.recompile()
    return fw, bw


def backward_order(graph: fx.Graph) -> None:
    """Order a backward graph as the autograd engine would run it, in place: from the first node
    that reads a tangent on, each node comes after what it reads, and a recomputed forward value
    is made just before the first node that needs it (a partitioner leaves recomputation at the
    top of the backward, where all of it would be live at once). Nodes before the first tangent
    read that nothing after it needs are dropped, but for ``copy_`` (a mutation kept)."""
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    reads = [u for n in nodes if is_tangent(n) for u in n.users]
    if not reads:
        return
    first = order[min(reads, key=order.__getitem__)]
    placed = {n for n in nodes if n.op == "placeholder"}
    new: list[fx.Node] = []

    def place(n: fx.Node) -> None:
        todo, stack = set(), [n]
        while stack:
            m = stack.pop()
            if m not in placed and m not in todo:
                todo.add(m)
                stack.extend(m.all_input_nodes)
        new.extend(sorted(todo, key=order.__getitem__))
        placed.update(todo)

    for n in nodes[:first]:
        if n.op == "call_function" and n.target is torch.ops.aten.copy_.default:
            place(n)
    for n in nodes[first:]:
        place(n)
    for n in reversed(nodes):  # (what nothing placed needs)
        if n not in placed:
            graph.erase_node(n)
    at = max(placed - set(new), key=order.__getitem__)  # (the last placeholder; a tangent is one)
    for n in new:
        at.append(n)
        at = n
