"""Entry points for ``torch.export`` programs: ``compile_exported`` and ``apply_passes``."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from .codegen.registry import DEFAULT_REGISTRY, Registry
from .compiled import Compiled
from .compiler import compile_graph
from .config import Config
from .graph import VAL
from .inputs import Expected, check_inputs, flatten_call, user_input_paths
from .lowering.decompose import export_table
from .pipeline import PassManager


class ExportedCompiled(Compiled):
    """A compiled ExportedProgram: called with the same inputs as ``ep.module()``.

    Inputs are checked first (``fxforge.inputs``): a wrong count, rank, size (against the
    program's static sizes, symbols and range constraints), dtype or device raises
    ``fxforge.InputError`` naming the input, and the compiled code stays valid.  An input laid out
    differently from the example (transposed, step-sliced) is copied into the compiled layout
    (``input_copy_bytes``: bytes the last call copied).  Parameters, buffers and constants are
    read from the program's state on every call, and buffer mutations are written back to it,
    as ``ep.module()`` does.
    """

    def __init__(self, inner: Compiled, ep: ExportedProgram):
        self.__dict__.update(vars(inner))  # same artifact, different calling convention
        self.program = ep
        self.expected = _expected_inputs(ep)
        self.input_copy_bytes = 0

    def _state(self, kind: InputKind, target: str) -> Any:
        ep = self.program
        if kind == InputKind.PARAMETER or (kind == InputKind.BUFFER and target in ep.state_dict):
            return ep.state_dict[target]
        return ep.constants[target]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ep = self.program
        flat = flatten_call(ep, args, kwargs, "compiled program")
        checked = check_inputs(self.expected, flat, ep.range_constraints)
        self.input_copy_bytes = checked.copied_bytes
        user = iter(checked.args)
        originals = iter(flat)
        graph_args, given = [], {}  # given: position -> the caller's own tensor (mutations go there)
        for s in ep.graph_signature.input_specs:
            if s.kind == InputKind.USER_INPUT:
                given[len(graph_args)] = next(originals)
                graph_args.append(next(user))
            elif s.kind == InputKind.TOKEN:
                graph_args.append(torch.empty(0))
            else:
                graph_args.append(self._state(s.kind, s.target))
        results = self.call_boxed(list(graph_args))  # the call empties the list it gets
        user_out = []
        for s, r in zip(ep.graph_signature.output_specs, results):
            if s.kind in (OutputKind.USER_OUTPUT, OutputKind.LOSS_OUTPUT):
                user_out.append(r)
            elif s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
                with torch.no_grad():
                    self._state(InputKind.BUFFER, s.target).copy_(r)
            elif s.kind == OutputKind.USER_INPUT_MUTATION:
                pos = [i.arg.name for i in ep.graph_signature.input_specs].index(s.target)
                with torch.no_grad():
                    given[pos].copy_(r)
        out_spec = ep.call_spec.out_spec
        return pytree.tree_unflatten(user_out, out_spec) if out_spec is not None else tuple(user_out)


def _expected_inputs(ep: ExportedProgram) -> list[Expected]:
    """The user inputs of ``ep``'s graph, named by placeholder and by where the caller passes them."""
    vals = {n.name: n.meta.get(VAL) for n in ep.graph.nodes if n.op == "placeholder"}
    names = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    paths = user_input_paths(ep, names)
    return [Expected(f"{n!r} ({p})", vals.get(n)) for n, p in zip(names, paths)]


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
    ep = ep.run_decompositions(export_table(config, registry.select(config, devices or {"cpu"})))
    c = compile_graph(ep.graph_module, config, kind="export", registry=registry)
    return ExportedCompiled(c, ep)


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
    from .graph import fake_mode_of

    mode = fake_mode_of(gm)
    for n in gm.graph.nodes:
        if n.op == "call_module" and VAL not in n.meta and not n.users:
            n.meta[VAL] = None
        if n.op == "get_attr" and VAL not in n.meta:
            obj: Any = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            if isinstance(obj, torch.Tensor) and mode is not None:
                n.meta[VAL] = mode.from_tensor(obj, static_shapes=True)
            elif not isinstance(obj, torch.Tensor):
                n.meta[VAL] = None
