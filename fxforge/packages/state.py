"""What a package stores as JSON: the generated wrapper's globals described by name (and
resolved again at load), tensor specs and the exported calling convention."""

from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from ..artifact import named
from .format import PackageError


# --------------------------------------------------------------------------- globals


def _describe(name: str, v: Any) -> dict:
    """How ``load_package`` finds a wrapper global again (``artifact.named``); a PackageError for
    one a package cannot hold."""
    try:
        return named.describe(name, v)
    except named.Unnamed as e:
        raise PackageError(f"fxforge.package: the generated wrapper uses {e}, which a package cannot hold; compile "
                           "the program with fxforge.compile_exported instead, or report the op that introduced it") from e


def _op(ns: str, name: str, overload: str) -> Any:
    """The OpOverload ``torch.ops.<ns>.<name>.<overload>`` of this process (its library loaded)."""
    try:
        return named.op(ns, name, overload)
    except named.Unnamed as e:
        raise PackageError(f"the package calls the op {ns}::{name}.{overload}, which this process does not have: "
                           "import the library that registers it before load_package") from e


def _resolve(name: str, d: dict, tensors: Mapping[str, torch.Tensor]) -> Any:
    if "op" in d:
        return _op(*d["op"])
    try:
        return named.resolve(name, d, tensors)
    except named.Unnamed as e:
        raise PackageError(f"the package's wrapper uses {e}") from e


# --------------------------------------------------------------------------- specs as JSON


_dtype_name = named.dtype_name


def _dim_json(d: Any) -> Any:
    return d if isinstance(d, int) else str(d)


def _dim(d: Any) -> Any:
    if isinstance(d, int):
        return d
    import sympy
    from torch.utils._sympy import functions

    e = sympy.sympify(d, locals={k: v for k, v in vars(functions).items() if isinstance(v, type)})
    return int(e) if e.is_Integer else e


def _spec_json(v: Any) -> dict:
    from ..artifact.inputs import TensorSpec

    if isinstance(v, TensorSpec):
        return {"tensor": {"shape": [_dim_json(d) for d in v.shape], "stride": [_dim_json(d) for d in v.stride],
                           "dtype": _dtype_name(v.dtype), "device": str(v.device)}}
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"const": v}
    import sympy

    if isinstance(v, sympy.Expr):
        return {"int": str(v)}
    raise PackageError(f"fxforge.package: an input of the program is a {type(v).__name__} constant ({v!r}), "
                       "which a package cannot describe")


def _spec(d: dict) -> Any:
    from ..artifact.inputs import TensorSpec

    if "tensor" in d:
        t = d["tensor"]
        return TensorSpec(tuple(map(_dim, t["shape"])), tuple(map(_dim, t["stride"])), getattr(torch, t["dtype"]),
                          torch.device(t["device"]))
    if "int" in d:
        return _dim(d["int"])
    return d["const"]


def _signature_json(sig) -> dict:
    import torch.utils._pytree as pytree

    return {
        "inputs": [[k.name, t] for k, t in sig.inputs],
        "outputs": [[k.name, t] for k, t in sig.outputs],
        "in_spec": None if sig.in_spec is None else pytree.treespec_dumps(sig.in_spec),
        "out_spec": None if sig.out_spec is None else pytree.treespec_dumps(sig.out_spec),
        "expected": [[e.name, _spec_json(e.val)] for e in sig.expected],
        "ranges": [[str(s), lo, hi] for s, (lo, hi) in sig.ranges.items()],
    }


def _treespec(text: str):
    """A pytree structure written by ``treespec_dumps``.  A container type its module registers
    with pytree (``transformers``' model outputs) is found by importing that module first."""
    import importlib

    import torch.utils._pytree as pytree

    try:
        return pytree.treespec_loads(text)
    except NotImplementedError:
        pass
    types = set(re.findall(r'"type": "([\w.]+)"', text))
    for t in sorted(types):
        module = t.rpartition(".")[0]
        if module:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise PackageError(f"the program's inputs or outputs hold a {t}, and its module {module} cannot be "
                                   f"imported here ({e}): install it where the package runs") from e
    try:
        return pytree.treespec_loads(text)
    except NotImplementedError as e:
        raise PackageError(f"the program's inputs or outputs hold a container pytree does not know how to read "
                           f"here ({e}); import the module registering it before load_package") from e


def _signature(d: dict):
    from torch.export.graph_signature import InputKind, OutputKind

    from ..entry.export import Signature
    from ..artifact.inputs import Expected

    return Signature(
        [(InputKind[k], t) for k, t in d["inputs"]],
        [(OutputKind[k], t) for k, t in d["outputs"]],
        None if d["in_spec"] is None else _treespec(d["in_spec"]),
        None if d["out_spec"] is None else _treespec(d["out_spec"]),
        [Expected(name, _spec(s)) for name, s in d["expected"]],
        {_dim(s): (lo, hi) for s, lo, hi in d["ranges"]},
    )
