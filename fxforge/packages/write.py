"""Writing a package: ``package(ep, path)`` compiles the program once and writes the zip: the
wrapper, the plan, the report, the tensors, the C units per CPU level and the cubins per GPU
architecture, each named in the manifest with its hash."""

from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import sysconfig
import zipfile
from typing import Any, Mapping

import torch

from ..infra.host import arch as host_arch
from .format import FORMAT, MANIFEST, PART_BYTES, PackageError, _check_isas, _fxforge_version
from .state import _describe, _dtype_name, _signature_json


# --------------------------------------------------------------------------- writing


def _tensor_members(tensors: Mapping[str, torch.Tensor], members: dict) -> dict:
    """Each tensor's bytes as members ``tensors/<i>-<part>.bin`` (parts of at most ``PART_BYTES``:
    a loader checks them on all its cores), laid out with the tensor's own strides (kernels read
    parameters at the strides they were traced with), the same members for tensors that are
    the same view of the same storage; returns name -> its entry in the manifest (members,
    dtype, shape, stride)."""

    out, seen = {}, {}
    for name, t in tensors.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key not in seen:
            dense = torch.empty_strided(tuple(t.shape), t.stride(), dtype=t.dtype, device="cpu").copy_(t)
            storage = dense.untyped_storage()
            data = ctypes.string_at(storage.data_ptr(), storage.nbytes()) if storage.nbytes() else b""
            parts = [f"tensors/{len(seen)}-{j}.bin" for j in range(max(1, -(-len(data) // PART_BYTES)))]
            for j, part in enumerate(parts):
                members[part] = (data[j * PART_BYTES:(j + 1) * PART_BYTES], "any")
            seen[key] = parts
        out[name] = {"members": seen[key], "dtype": _dtype_name(t.dtype), "shape": list(t.shape),
                     "stride": list(t.stride()), "device": str(t.device)}
    return out


def package(ep, path: str, config=None, *, cpu_isas=None, cuda_archs=(80, 90), weights: bool = True) -> str:
    """Compile ``ep`` (a ``torch.export.ExportedProgram``) and write it to ``path`` as one package
    file (module docstring); returns ``path``.

    ``cpu_isas``: the CPU levels its C kernels are built for (default ``DEFAULT_CPU_ISAS`` on
    x86-64; the baseline elsewhere); ``load_package`` picks the highest one its host runs.
    ``cuda_archs``: the GPU architectures a CUDA program's Triton kernels are compiled for (a
    cubin each, no GPU needed; ``load_package`` launches the one for its GPU).  ``weights=False`` leaves the
    parameters and buffers out: the caller passes them to ``load_package(state_dict=...)``.
    """
    from torch.export import ExportedProgram

    from ..entry.export import compile_exported
    from ..report.html import render

    if not isinstance(ep, ExportedProgram):
        raise TypeError(f"fxforge.package expects a torch.export.ExportedProgram, got {type(ep).__name__}; "
                        "for an nn.Module use torch.export.export(module, args) first")
    isas = _check_isas(cpu_isas)
    device = _program_device(ep, cuda_archs)
    on_gpu = device != "cpu"
    c = compile_exported(ep, config)
    w = c.artifact
    sig = c.signature
    weight_names, constants = _program_state(c, ep)
    foreign = sorted({k.backend for k in c.kernels} - {"c", "torch", *(["triton"] if on_gpu else [])})
    if foreign:
        raise PackageError(f"fxforge.package: the program has {', '.join(foreign)} kernels; packages hold C kernels, "
                           "Triton kernels of CUDA programs and ATen calls: package it with Config(codegen='c') or "
                           "Config(codegen='torch')")
    members: dict[str, tuple[bytes, str]] = {}  # path -> (bytes, what it was built for)
    unit = w.units.get("c")
    c_info, c_names = _c_members(unit, isas, members) if unit is not None and unit.kernels else (None, set())
    cuda_info, triton_names = _cuda_members(w, tuple(cuda_archs), members) if on_gpu else (None, set())
    descriptors, wrapper_tensors = _wrapper_globals(w, c_names | triton_names | {ns for ns, _, _ in w.ops})

    members["wrapper.py"] = (w.source.encode(), "any")
    members["profiled.py"] = (w.profiled_source.encode(), "any")
    members["plan.txt"] = (c.plan.memory.dump().encode(), "any")
    tensors = _tensor_members({**{f"state.{k}": v for k, v in constants.items()},
                               **{f"global.{k}": v for k, v in wrapper_tensors.items()},
                               **({f"weight.{t}": ep.state_dict[t] for t in weight_names} if weights else {})}, members)
    members["report.html"] = (render(c).encode(), "any")

    manifest = {
        "format": FORMAT,
        "fxforge": _fxforge_version(),
        "torch": torch.__version__,
        "python": list(sys.version_info[:2]),
        "arch": host_arch(),
        "device": device,
        "signature": _signature_json(sig),
        "state": {t: {"shape": list(v.shape), "dtype": _dtype_name(v.dtype), "device": str(v.device)}
                  for t in weight_names for v in [ep.state_dict[t]]},
        "tensors": tensors,
        "weights": weights,
        "globals": descriptors,
        "ops": [list(key) for key in w.ops],  # (namespace, name, overload): runtime.bind_ops's keys
        "c": c_info,
        "cuda": cuda_info,
        "n_inputs": len(sig.inputs),
        "kernels": [[k.name, k.backend, k.node_count, k.num_args, k.unique_io_buffers] for k in c.kernels],
        "stats": json.loads(json.dumps(c.stats, default=str)),
        "members": {p: {"sha256": hashlib.sha256(b).hexdigest(), "size": len(b), "built_for": what}
                    for p, (b, what) in members.items()},
    }
    _write_zip(path, manifest, members)
    return path


def _program_device(ep, cuda_archs) -> str:
    """The one device the program runs on ("cpu" or a CUDA device), checked with the GPU
    architectures asked for; a PackageError otherwise."""
    devices = {t.device for t in [*ep.state_dict.values(), *ep.constants.values()] if isinstance(t, torch.Tensor)}
    devices |= {v.device for n in ep.graph.nodes if n.op == "placeholder"
                for v in [n.meta.get("val")] if isinstance(v, torch.Tensor)}
    other = sorted({d.type for d in devices} - {"cpu", "cuda"})
    gpus = sorted({str(d) for d in devices if d.type == "cuda"})
    if other or len(gpus) > 1:
        raise PackageError(f"fxforge.package: the program runs on {', '.join(other or gpus)}; a package holds a "
                           "program of the CPU or of one CUDA device")
    if gpus and (not cuda_archs or any(isinstance(a, bool) or not isinstance(a, int) or a < 50 for a in cuda_archs)):
        raise PackageError(f"fxforge.package: cuda_archs={tuple(cuda_archs)!r}: expected GPU architectures such as "
                           "(80, 90) (sm_80, sm_90)")
    return gpus[0] if gpus else "cpu"


def _program_state(c, ep) -> tuple[list[str], dict]:
    """The state the compiled program reads: the names of its weights (parameters and buffers),
    and its constants; a PackageError for state that is not a tensor."""
    from torch.export.graph_signature import InputKind

    sig = c.signature
    targets = [t for k, t in sig.inputs if k in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)]
    state = {t: c.state[t] for t in targets}
    for t, v in state.items():
        if not isinstance(v, torch.Tensor):
            raise PackageError(f"fxforge.package: the program's constant {t} is a {type(v).__name__}, not a tensor; "
                               "a package holds tensor state only")
    weight_names = [t for t in targets if t in ep.state_dict]
    constants = {t: v for t, v in state.items() if t not in ep.state_dict}
    return weight_names, constants


def _wrapper_globals(w, bound_at_load: set[str]) -> tuple[dict, dict]:
    """The generated wrapper's globals a package stores (those the loader does not bind itself:
    kernels, op namespaces): each one's descriptor, and the tensors among them."""
    descriptors, wrapper_tensors = {}, {}
    for name, v in w.globals.items():
        if name in bound_at_load:
            continue
        d = _describe(name, v)
        if "tensor" in d:
            wrapper_tensors[name] = v
        descriptors[name] = d
    return descriptors, wrapper_tensors


def _c_members(unit, isas: tuple[str, ...], members: dict) -> tuple[dict, set[str]]:
    """Build the unit's translation units for each CPU level (and the launcher for this
    interpreter, at the lowest level) into ``members``; what the manifest says of them (each
    kernel's name, symbol, argument kinds and unit), and the wrapper globals they stand for."""
    from ..codegen.c.build import CompileError, compiler, openmp, shared_object, shared_objects
    from ..codegen.c.launcher import launcher_include, launcher_source

    if compiler() is None:
        raise PackageError("fxforge.package: the program has C kernels and no C compiler is found (install gcc or "
                           "clang, or set CC); the package's loaders need none")
    units = unit.units()
    parallel = openmp()
    for isa in isas:
        try:
            paths = shared_objects([(src, quick) for src, _, quick in units], unit.libs(), parallel, march=isa)
        except CompileError as e:
            raise PackageError(f"fxforge.package: building the C kernels for {isa} failed (does this compiler know "
                               f"-march={isa}?): {str(e)[:600]}") from e
        for i, p in enumerate(paths):
            with open(p, "rb") as f:
                members[f"c/{isa}/unit{i}.so"] = (f.read(), isa)
    unit_of = {s: i for i, (_, symbols, _) in enumerate(units) for s in symbols}
    info: dict[str, Any] = {"isas": list(isas), "openmp": parallel, "launcher": None, "units": len(units),
                            "kernels": [[k.name, k.symbol, k.kinds, unit_of[k.symbol]] for k in unit.kernels]}
    include = launcher_include()
    if include is not None:
        try:
            path = shared_object(launcher_source(), include, march=isas[0])
        except CompileError:
            path = None  # loaders call the kernels through ctypes
        if path is not None:
            suffix = sysconfig.get_config_var("EXT_SUFFIX") or ""
            with open(path, "rb") as f:
                members[f"c/launcher/launcher{suffix}"] = (f.read(), f"{isas[0]}, Python ABI {suffix}")
            info["launcher"] = {"member": f"c/launcher/launcher{suffix}", "ext_suffix": suffix}
    return info, {f"{k.name}_c" for k in unit.kernels}


def _cuda_members(w, archs: tuple[int, ...], members: dict) -> tuple[dict, set[str]]:
    """Each Triton kernel of the wrapper compiled for each ``sm_<arch>`` (no GPU needed) into
    ``members``; what the manifest says of them, and the wrapper globals they stand for."""
    try:
        from ..codegen.triton import aot
    except ImportError as e:
        raise PackageError(f"fxforge.package: the program has Triton kernels and Triton cannot be imported ({e})") from e
    kernels = []
    for k in w.kernels:
        if k.backend != "triton":
            continue
        if any(name.endswith("_tuner") for name in k.globals):
            raise PackageError("fxforge.package: autotuned Triton kernels choose their launch configuration at run "
                               "time; package the program with Config(autotune=False)")
        try:
            built = aot.cubins(k.detail, archs)
        except NotImplementedError as e:
            raise PackageError(f"fxforge.package: {e}") from e
        entry = {}
        for cub in built:
            member = f"cuda/sm_{cub.arch}/{k.name}.cubin"
            members[member] = (cub.data, f"sm_{cub.arch}")
            entry[str(cub.arch)] = {"member": member, "entry": cub.entry, "num_warps": cub.num_warps,
                                    "shared": cub.shared, "param_types": cub.param_types}
        kernels.append([k.name, entry])
    return {"archs": list(archs), "kernels": kernels}, {f"{name}_triton" for name, _ in kernels}


def _write_zip(path: str, manifest: dict, members: dict[str, tuple[bytes, str]]) -> None:
    from ..codegen.diskcache import atomic_file

    with atomic_file(path, "wb") as f, zipfile.ZipFile(f, "w") as z:
        z.writestr(MANIFEST, json.dumps(manifest, indent=1), zipfile.ZIP_DEFLATED)
        for name, (data, _) in members.items():
            # tensors barely compress: stored, so loading reads them at disk speed
            z.writestr(name, data, zipfile.ZIP_STORED if name.startswith("tensors/") else zipfile.ZIP_DEFLATED)
