"""Entry points for ``torch.export`` programs: ``compile_exported`` and ``apply_passes``."""

from __future__ import annotations

from collections import ChainMap
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from ..codegen.registry import DEFAULT_REGISTRY, Registry
from ..artifact.compiled import Compiled
from ..spine import compile_graph
from ..core.config import Config
from ..custom_ops import decomposition_table
from ..core.graph import CUSTOM_OP_DISPATCH, VAL
from ..artifact.inputs import Expected, check_inputs, ranges_of
from ..core.signature import flatten_call, user_input_paths
from ..lowering.decompose import export_table
from ..infra.pass_manager import PassManager


@dataclass
class Signature:
    """How an exported program is called: its graph's inputs (user inputs, parameters, buffers,
    constants, tokens) and outputs (user outputs, mutations) in order, the caller's pytree
    structures, and what each user input must be (``inputs.check_inputs``)."""

    inputs: list[tuple[InputKind, str | None]]  # (kind, target: the state's name for a parameter...)
    outputs: list[tuple[OutputKind, str | None]]  # (kind, target: the mutated buffer or user input)
    in_spec: Any  # pytree TreeSpec of (args, kwargs), or None
    out_spec: Any  # pytree TreeSpec of the user outputs, or None
    expected: list[Expected]  # one per user input
    ranges: dict  # size symbol -> (lower, upper): ``inputs.ranges_of``

    @staticmethod
    def of(ep: ExportedProgram) -> "Signature":
        vals = {n.name: n.meta.get(VAL) for n in ep.graph.nodes if n.op == "placeholder"}
        specs = ep.graph_signature.input_specs
        names = [s.arg.name for s in specs if s.kind == InputKind.USER_INPUT]
        paths = user_input_paths(ep.call_spec.in_spec, names)
        names_of = [s.arg.name for s in specs]
        outputs = [(s.kind, names_of.index(s.target) if s.kind == OutputKind.USER_INPUT_MUTATION else s.target)
                   for s in ep.graph_signature.output_specs]
        return Signature([(s.kind, s.target) for s in specs], outputs, ep.call_spec.in_spec, ep.call_spec.out_spec,
                         [Expected.of(f"{n!r} ({p})", vals.get(n)) for n, p in zip(names, paths)],
                         ranges_of(ep.range_constraints))

    def call(self, compiled: Compiled, state: Mapping[str, Any], args: tuple, kwargs: dict) -> tuple[Any, int]:
        """``compiled`` called with the caller's ``(args, kwargs)`` and ``state`` (parameters,
        buffers and constants by name): the user outputs in the caller's structure, and the
        bytes copied to restride inputs.  Mutations are written back to ``state`` and to the
        caller's inputs."""
        flat = flatten_call(self.in_spec, args, kwargs, "compiled program")
        checked = check_inputs(self.expected, flat, self.ranges)
        user = iter(checked.args)
        originals = iter(flat)
        graph_args, given = [], {}  # given: position -> the caller's own tensor (mutations go there)
        for kind, target in self.inputs:
            if kind == InputKind.USER_INPUT:
                given[len(graph_args)] = next(originals)
                graph_args.append(next(user))
            elif kind == InputKind.TOKEN:
                graph_args.append(torch.empty(0))
            else:
                graph_args.append(state[target])
        results = compiled.call_boxed(graph_args)  # the call empties the list it gets
        user_out = []
        for (kind, target), r in zip(self.outputs, results):
            if kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
                user_out.append(r)
            elif kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
                with torch.no_grad():
                    state[target].copy_(r)
            elif kind == OutputKind.USER_INPUT_MUTATION:
                with torch.no_grad():
                    given[target].copy_(r)
        out = pytree.tree_unflatten(user_out, self.out_spec) if self.out_spec is not None else tuple(user_out)
        return out, checked.copied_bytes


class ExportedCompiled(Compiled):
    """A compiled ExportedProgram: called with the same inputs as ``ep.module()``.

    Inputs are checked first (``fxforge.artifact.inputs``): a wrong count, rank, size (against the
    program's static sizes, symbols and range constraints), dtype or device raises
    ``fxforge.InputError`` naming the input, and the compiled code stays valid.  An input laid out
    differently from the example (transposed, step-sliced) is copied into the compiled layout
    (``input_copy_bytes``: bytes the last call copied).  Parameters, buffers and constants are
    read from ``state`` on every call (the program's own: ``ep.state_dict`` and ``ep.constants``),
    and buffer mutations are written back to it, as ``ep.module()`` does.
    """

    def __init__(self, inner: Compiled, signature: Signature, state: Mapping[str, Any], program: ExportedProgram | None):
        self.__dict__.update(vars(inner))  # same artifact, different calling convention
        self.signature = signature
        self.state = state
        self.program = program
        self.input_copy_bytes = 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out, self.input_copy_bytes = self.signature.call(self, self.state, args, kwargs)
        return out


def compile_exported(
    ep: ExportedProgram, config: Config | None = None, *, registry: Registry | None = None
) -> ExportedCompiled:
    """Compile an ExportedProgram; the result takes the same inputs as ``ep.module()``.

    Operators fxforge has no lowering for (custom ops) run as eager fallbacks; nodes with side
    effects (``_assert_tensor_metadata`` and friends) are kept.
    """
    if not isinstance(ep, ExportedProgram):
        raise TypeError(
            f"compile_exported expects a torch.export.ExportedProgram, got {type(ep).__name__}; "
            "for an nn.Module use torch.export.export(module, args) first, or torch.compile(module, backend='fxforge')"
        )
    config = config or Config()
    registry = registry or DEFAULT_REGISTRY
    devices = {t.device.type for t in ep.state_dict.values() if isinstance(t, torch.Tensor)}
    table = export_table(config, registry.select(config, devices or {"cpu"}))
    # custom ops' candidates checked, timed, the winners inlined (fxforge/custom_ops)
    chosen, custom_ops, dispatches = decomposition_table(ep.graph_module, config, registry)
    table.update(chosen)
    ep = ep.run_decompositions(table)
    if dispatches:
        CUSTOM_OP_DISPATCH.set(ep.graph_module, dispatches)
    c = compile_graph(ep.graph_module, config, kind="export", registry=registry)
    c.stats["custom_ops"] = custom_ops
    return ExportedCompiled(c, Signature.of(ep), ChainMap(ep.state_dict, ep.constants), ep)


def apply_passes(
    ep_or_gm: ExportedProgram | fx.GraphModule, passes: Sequence[Callable], *, debug: bool | None = None
) -> fx.GraphModule:
    """Run ``passes`` in order and return a runnable GraphModule.

    For an ExportedProgram the passes see ``ep.module()`` (parameters as attributes), so the
    result takes the same inputs as ``ep.module()``.  With ``debug`` (default: ``FXFORGE_DEBUG``)
    the graph is verified after every pass, and a broken graph names the pass that broke it.
    """
    if isinstance(ep_or_gm, ExportedProgram):
        gm = ep_or_gm.module()
        _fill_attr_vals(gm)
    elif isinstance(ep_or_gm, fx.GraphModule):
        gm = ep_or_gm
    else:
        raise TypeError(f"apply_passes expects an ExportedProgram or a GraphModule, got {type(ep_or_gm).__name__}")
    debug = Config().debug if debug is None else debug
    gm, _ = PassManager(passes, debug=debug)(gm)
    return gm


def _fill_attr_vals(gm: fx.GraphModule) -> None:
    """get_attr nodes of an unlifted program carry no fake value; give them one.

    Submodule calls ``ep.module()`` adds (its input guards) return nothing: their value is None.
    """
    from ..core.graph import fake_mode_of, fetch_attr

    mode = fake_mode_of(gm)
    for n in gm.graph.nodes:
        if n.op == "call_module" and VAL not in n.meta and not n.users:
            n.meta[VAL] = None
        if n.op == "get_attr" and VAL not in n.meta:
            obj = fetch_attr(gm, n.target)
            if isinstance(obj, torch.Tensor) and mode is not None:
                n.meta[VAL] = mode.from_tensor(obj, static_shapes=True)
            elif not isinstance(obj, torch.Tensor):
                n.meta[VAL] = None
