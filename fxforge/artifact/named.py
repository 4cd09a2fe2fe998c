"""A generated wrapper's globals described by name, as JSON, and found again in another process:
what a package (``fxforge/packages``) and the compiled-graph cache (``graph_cache.py``) store
instead of the objects.  Nothing is unpickled: a global is a module, an op, a value, a dtype, a
device, an importable attribute, or a tensor (whose bytes the caller stores)."""

from __future__ import annotations

import importlib
import types
from typing import Any, Mapping

import torch


class Unnamed(ValueError):
    """A global that cannot be described by name, or a description this process cannot resolve."""


def describe(name: str, v: Any) -> dict:
    """How ``resolve`` finds global ``name`` again: by import path, op name or value; a tensor as
    ``{"tensor": name}`` (its bytes are the caller's to store).  ``Unnamed`` for anything else."""
    if isinstance(v, types.ModuleType):
        return {"module": v.__name__}
    if isinstance(v, torch.Tensor):
        return {"tensor": name}
    if isinstance(v, torch._ops.OpOverload):
        ns, rest = v.name().split("::", 1)
        op, _, overload = rest.partition(".")
        return {"op": [ns, op, overload or "default"]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"value": v}
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    module, qualname = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        try:
            if import_attr(module, qualname) is v:
                return {"attr": [module, qualname]}
        except (ImportError, AttributeError):
            pass
    raise Unnamed(f"{name} = {type(v).__name__} {str(v)[:80]!r} is neither importable by name nor a tensor")


def resolve(name: str, d: dict, tensors: Mapping[str, torch.Tensor]) -> Any:
    """The object ``describe`` described as ``d`` (``tensors``: the stored tensors by name)."""
    if "module" in d:
        return importlib.import_module(d["module"])
    if "tensor" in d:
        return tensors[d["tensor"]]
    if "op" in d:
        return op(*d["op"])
    if "value" in d:
        return d["value"]
    if "dtype" in d:
        return getattr(torch, d["dtype"])
    if "device" in d:
        return torch.device(d["device"])
    if "attr" in d:
        try:
            return import_attr(*d["attr"])
        except (ImportError, AttributeError) as e:
            raise Unnamed(f"{'.'.join(d['attr'])} (as {name}) cannot be imported here: {e}") from e
    raise Unnamed(f"the global {name} is described as {d!r}, which this fxforge does not know")


def import_attr(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def op(ns: str, name: str, overload: str) -> Any:
    """The OpOverload ``torch.ops.<ns>.<name>.<overload>`` of this process (its library loaded)."""
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError) as e:
        raise Unnamed(f"the op {ns}::{name}.{overload} is not registered in this process: import the library that "
                      "registers it first") from e


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32`` (``getattr(torch, name)`` gives it back)."""
    return str(dtype).removeprefix("torch.")
