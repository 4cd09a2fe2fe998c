"""Deployable packages: ``package(ep, path)`` compiles an exported program once and writes one
file; ``load_package(path)`` runs it in another process with no C compiler, no Triton compile
and no tracing.

A package is a zip archive.  Its ``manifest.json`` names every other member with its SHA-256,
its size and what it was built for; ``load_package`` reads and checks all of them before it
uses any, and refuses a member the manifest does not name, a path that leaves the archive
(absolute, ``..``), a symbolic link, or a member whose size or hash differs from the manifest's.

Members::

    manifest.json            versions (format, fxforge, torch, Python), the calling convention
                             (``export.Signature``), the wrapper's globals described by name,
                             the C kernels (name, symbol, argument kinds, unit), stats, kernels
    wrapper.py, profiled.py  the generated wrapper (``Compiled.source``) and its profiled twin
    plan.txt                 the memory plan (``MemoryPlan.dump``)
    report.html              the HTML report of the compile
    tensors/<i>.bin          the bytes of each tensor: the parameters and buffers the program
                             reads (unless weights=False), its constants and the wrapper's
                             constant tensors; the manifest gives each one's dtype, shape and
                             strides (no pickle: loading them runs no code)
    c/<isa>/unit<i>.so       each C translation unit, built for each CPU level
    c/launcher/<suffix>.so   the C kernel launcher, for the packaging interpreter's ABI
    cuda/sm_<a>/<k>.cubin    a CUDA program's Triton kernels, built for each GPU architecture

The package holds code that runs when it is loaded, as ``torch.load(weights_only=False)`` does:
load only packages from people you trust.  The hashes catch a damaged or altered member, not
a malicious author.  See docs/packages.md.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import stat
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from .codegen.wrapper import Wrapper
from .compiled import Compiled, KernelInfo
from .export import ExportedCompiled
from .host import arch as host_arch, cpu_field

FORMAT = 1
MANIFEST = "manifest.json"
# A member larger than this is refused before it is read (weights of larger models: split them,
# or package with weights=False and pass a state_dict at load).
MAX_MEMBER_BYTES = 64 << 30
MAX_MANIFEST_BYTES = 64 << 20
# A tensor's bytes are split into members of at most this size: their hashes are checked side by side.
PART_BYTES = 8 << 20

# x86-64 micro-architecture levels and the /proc/cpuinfo flags each one adds to the one before.
X86_LEVELS = {
    "x86-64": (),
    "x86-64-v2": ("cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"),
    "x86-64-v3": ("avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}
DEFAULT_CPU_ISAS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
# Other host architectures: the one level a package builds for by default.
BASELINES = {"aarch64": "armv8-a"}


class PackageError(RuntimeError):
    """A package that cannot be written, or cannot be loaded here: the message says why and what to do."""


# --------------------------------------------------------------------------- CPU levels


def cpu_levels(arch: str) -> tuple[str, ...]:
    """The CPU levels a package can build for on ``arch``, lowest first."""
    if arch == "x86_64":
        return tuple(X86_LEVELS)
    if arch in BASELINES:
        return (BASELINES[arch],)
    return ()


def host_cpu_levels() -> tuple[str, ...]:
    """The levels this CPU runs, lowest first (x86-64: by the flags in /proc/cpuinfo, each level
    needing the ones below it)."""
    arch = host_arch()
    if arch != "x86_64":
        return cpu_levels(arch)
    have = set(cpu_field("flags").split())
    out = []
    for level, needs in X86_LEVELS.items():
        if not set(needs) <= have:
            break
        out.append(level)
    return tuple(out)


def _check_isas(cpu_isas) -> tuple[str, ...]:
    arch = host_arch()
    known = cpu_levels(arch)
    if cpu_isas is None:
        cpu_isas = DEFAULT_CPU_ISAS if arch == "x86_64" else known
    if isinstance(cpu_isas, str):
        cpu_isas = (cpu_isas,)
    if not known:
        raise PackageError(f"fxforge.package: no portable CPU level is known for this host's architecture ({arch}); "
                           "package the program on x86-64 or aarch64")
    bad = [i for i in cpu_isas if i not in known]
    if bad or not cpu_isas:
        raise PackageError(f"fxforge.package: cpu_isas={tuple(cpu_isas)!r}: {', '.join(bad) or 'none given'}; "
                           f"on {arch} the levels are {', '.join(known)}")
    return tuple(sorted(set(cpu_isas), key=known.index))


# --------------------------------------------------------------------------- globals


def _describe(name: str, v: Any) -> dict:
    """How ``load_package`` finds a wrapper global again: by import path, op name or value; a
    tensor goes to ``tensors/``.  Anything else cannot be packaged."""
    import types

    if isinstance(v, types.ModuleType):
        return {"module": v.__name__}
    if isinstance(v, torch.Tensor):
        return {"tensor": name}
    if isinstance(v, torch._ops.OpOverload):
        ns, rest = v.name().split("::", 1)
        name, _, overload = rest.partition(".")
        return {"op": [ns, name, overload or "default"]}
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"value": v}
    if isinstance(v, torch.dtype):
        return {"dtype": _dtype_name(v)}
    if isinstance(v, torch.device):
        return {"device": str(v)}
    module, qualname = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str):
        try:
            if _import_attr(module, qualname) is v:
                return {"attr": [module, qualname]}
        except (ImportError, AttributeError):
            pass
    raise PackageError(f"fxforge.package: the generated wrapper uses {name} = {type(v).__name__} {str(v)[:80]!r}, "
                       "which a package cannot hold (it is neither importable by name nor a tensor); compile the "
                       "program with fxforge.compile_exported instead, or report the op that introduced it")


def _import_attr(module: str, qualname: str) -> Any:
    import importlib

    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _op(ns: str, name: str, overload: str) -> Any:
    """The OpOverload ``torch.ops.<ns>.<name>.<overload>`` of this process (its library loaded)."""
    try:
        return getattr(getattr(getattr(torch.ops, ns), name), overload)
    except (AttributeError, RuntimeError) as e:
        raise PackageError(f"the package calls the op {ns}::{name}.{overload}, which this process does not have: "
                           "import the library that registers it before load_package") from e


def _resolve(name: str, d: dict, tensors: Mapping[str, torch.Tensor]) -> Any:
    import importlib

    if "module" in d:
        return importlib.import_module(d["module"])
    if "tensor" in d:
        return tensors[d["tensor"]]
    if "op" in d:
        return _op(*d["op"])
    if "value" in d:
        return d["value"]
    if "dtype" in d:
        return getattr(torch, d["dtype"])
    if "device" in d:
        return torch.device(d["device"])
    if "attr" in d:
        try:
            return _import_attr(*d["attr"])
        except (ImportError, AttributeError) as e:
            raise PackageError(f"the package's wrapper uses {'.'.join(d['attr'])} (as {name}), which this process "
                               f"cannot import: {e}") from e
    raise PackageError(f"the package's manifest describes the global {name} as {d!r}, which this fxforge does not know")


# --------------------------------------------------------------------------- specs as JSON


def _dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``float32`` (``getattr(torch, name)`` gives it back)."""
    return str(dtype).removeprefix("torch.")


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
    from .inputs import TensorSpec

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
    from .inputs import TensorSpec

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

    from .export import Signature
    from .inputs import Expected

    return Signature(
        [(InputKind[k], t) for k, t in d["inputs"]],
        [(OutputKind[k], t) for k, t in d["outputs"]],
        None if d["in_spec"] is None else _treespec(d["in_spec"]),
        None if d["out_spec"] is None else _treespec(d["out_spec"]),
        [Expected(name, _spec(s)) for name, s in d["expected"]],
        {_dim(s): (lo, hi) for s, lo, hi in d["ranges"]},
    )


# --------------------------------------------------------------------------- writing


def _tensor_members(tensors: Mapping[str, torch.Tensor], members: dict) -> dict:
    """Each tensor's bytes as members ``tensors/<i>-<part>.bin`` (parts of at most ``PART_BYTES``:
    a loader checks them on all its cores), laid out with the tensor's own strides (kernels read
    parameters at the strides they were traced with), the same members for tensors that are
    the same view of the same storage; returns name -> its entry in the manifest (members,
    dtype, shape, stride)."""
    import ctypes

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


def _tensor(pkg: "PackageContents", entry: dict) -> torch.Tensor:
    """The tensor a ``_tensor_members`` entry describes, over the bytes ``read_package`` read
    (not copied)."""
    dtype = getattr(torch, entry["dtype"])
    held = pkg.buffers.get(entry["members"][0])
    if held is None or held[1] != 0:
        raise PackageError(f"{pkg.path}: the tensor members {entry['members']} are not laid out as fxforge writes "
                           "them; the package is refused")
    data = held[0][:sum(pkg.manifest["members"][p]["size"] for p in entry["members"])]
    shape, stride = entry["shape"], entry["stride"]
    span = 0 if 0 in shape else 1 + sum((n - 1) * st for n, st in zip(shape, stride))
    size = torch.empty((), dtype=dtype).element_size()
    if span * size > data.numel() or data.numel() % size or min(stride, default=0) < 0:
        raise PackageError(f"{pkg.path}: the tensor in {entry['members'][0]} does not fit its bytes; the package "
                           "is refused")
    t = data.view(dtype).as_strided(shape, stride)
    return t if entry.get("device", "cpu") == "cpu" else t.to(entry["device"])


def _fxforge_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fxforge")
    except PackageNotFoundError:  # (run from a source tree)
        return "unknown"


def _release(version: str) -> str:
    """``2.13.0+cpu`` -> ``2.13.0``: the release a package's ops and ABI depend on."""
    return version.split("+", 1)[0]


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
    from torch.export.graph_signature import InputKind

    from .export import compile_exported
    from .report.html import render

    if not isinstance(ep, ExportedProgram):
        raise TypeError(f"fxforge.package expects a torch.export.ExportedProgram, got {type(ep).__name__}; "
                        "for an nn.Module use torch.export.export(module, args) first")
    isas = _check_isas(cpu_isas)
    devices = {t.device for t in [*ep.state_dict.values(), *ep.constants.values()] if isinstance(t, torch.Tensor)}
    devices |= {v.device for n in ep.graph.nodes if n.op == "placeholder"
                for v in [n.meta.get("val")] if isinstance(v, torch.Tensor)}
    other = sorted({d.type for d in devices} - {"cpu", "cuda"})
    gpus = sorted({str(d) for d in devices if d.type == "cuda"})
    if other or len(gpus) > 1:
        raise PackageError(f"fxforge.package: the program runs on {', '.join(other or gpus)}; a package holds a "
                           "program of the CPU or of one CUDA device")
    device = gpus[0] if gpus else "cpu"
    if gpus and (not cuda_archs or any(isinstance(a, bool) or not isinstance(a, int) or a < 50 for a in cuda_archs)):
        raise PackageError(f"fxforge.package: cuda_archs={tuple(cuda_archs)!r}: expected GPU architectures such as "
                           "(80, 90) (sm_80, sm_90)")
    c = compile_exported(ep, config)
    w = c.artifact
    sig = c.signature

    # the state the program reads: parameters and buffers (the weights), constants
    targets = [t for k, t in sig.inputs if k in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)]
    state = {t: c.state[t] for t in targets}
    for t, v in state.items():
        if not isinstance(v, torch.Tensor):
            raise PackageError(f"fxforge.package: the program's constant {t} is a {type(v).__name__}, not a tensor; "
                               "a package holds tensor state only")
    weight_names = [t for t in targets if t in ep.state_dict]
    constants = {t: v for t, v in state.items() if t not in ep.state_dict}

    foreign = sorted({k.backend for k in c.kernels} - {"c", "torch", *(["triton"] if gpus else [])})
    if foreign:
        raise PackageError(f"fxforge.package: the program has {', '.join(foreign)} kernels; packages hold C kernels, "
                           "Triton kernels of CUDA programs and ATen calls: package it with Config(codegen='c') or "
                           "Config(codegen='torch')")
    members: dict[str, tuple[bytes, str]] = {}  # path -> (bytes, what it was built for)
    unit = w.units.get("c")
    c_info, c_names = _c_members(unit, isas, members) if unit is not None and unit.kernels else (None, set())
    cuda_info, triton_names = _cuda_members(w, tuple(cuda_archs), members) if gpus else (None, set())

    bound_at_load = c_names | triton_names | {ns for ns, _, _ in w.ops}  # (kernels, op namespaces)
    descriptors, wrapper_tensors = {}, {}
    for name, v in w.globals.items():
        if name in bound_at_load:
            continue
        d = _describe(name, v)
        if "tensor" in d:
            wrapper_tensors[name] = v
        descriptors[name] = d

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


def _c_members(unit, isas: tuple[str, ...], members: dict) -> tuple[dict, set[str]]:
    """Build the unit's translation units for each CPU level (and the launcher for this
    interpreter, at the lowest level) into ``members``; what the manifest says of them (each
    kernel's name, symbol, argument kinds and unit), and the wrapper globals they stand for."""
    from .codegen.c.build import CompileError, compiler, openmp, shared_object, shared_objects
    from .codegen.c.launcher import launcher_include, launcher_source

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
        from .codegen.triton import aot
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
    from .codegen.diskcache import atomic_file

    with atomic_file(path, "wb") as f, zipfile.ZipFile(f, "w") as z:
        z.writestr(MANIFEST, json.dumps(manifest, indent=1), zipfile.ZIP_DEFLATED)
        for name, (data, _) in members.items():
            # tensors barely compress: stored, so loading reads them at disk speed
            z.writestr(name, data, zipfile.ZIP_STORED if name.startswith("tensors/") else zipfile.ZIP_DEFLATED)


# --------------------------------------------------------------------------- reading


@dataclass
class PackageContents:
    """A package's manifest and its members, every one checked against the manifest."""

    path: str
    manifest: dict
    members: dict[str, bytes | memoryview]
    # an uncompressed member (tensor bytes) -> the uint8 tensor holding it and its offset there:
    # the parts of one tensor lie one after another in one buffer
    buffers: dict[str, tuple[torch.Tensor, int]]


def read_package(path: str) -> PackageContents:
    """Read ``path`` and check it (module docstring): every member named by the manifest, inside
    the archive, no link, of the manifest's size and SHA-256.  Raises ``PackageError``."""
    try:
        return _read_package(path)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise PackageError(f"{path}: its manifest is malformed ({type(e).__name__}: {e}); the package is "
                           "refused") from e


def _read_package(path: str) -> PackageContents:
    if not os.path.isfile(path):
        raise PackageError(f"no such package file: {path}")
    try:
        z = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as e:
        raise PackageError(f"{path} is not an fxforge package ({type(e).__name__}: {e})") from e
    with z:
        infos = {}
        for info in z.infolist():
            why = _unsafe(info)
            if why is not None:
                raise PackageError(f"{path}: the member {info.filename!r} {why}; the package is refused")
            if info.filename in infos:
                raise PackageError(f"{path}: the member {info.filename!r} appears twice; the package is refused")
            infos[info.filename] = info
        if MANIFEST not in infos:
            raise PackageError(f"{path} has no {MANIFEST}: it is not an fxforge package")
        manifest = json.loads(_read(z, infos[MANIFEST], MAX_MANIFEST_BYTES, path))
        _check_versions(manifest, path)
        listed = manifest.get("members", {})
        extra = sorted(set(infos) - set(listed) - {MANIFEST})
        missing = sorted(set(listed) - set(infos))
        if extra or missing:
            raise PackageError(f"{path}: members {'not in its manifest: ' + ', '.join(extra) if extra else ''}"
                               f"{'; ' if extra and missing else ''}{'missing: ' + ', '.join(missing) if missing else ''}"
                               "; the package is refused")
        for name, meta in listed.items():
            if infos[name].file_size != meta["size"]:
                raise PackageError(f"{path}: the member {name} is {infos[name].file_size} bytes, its manifest says "
                                   f"{meta['size']}; the package is refused")
        members: dict[str, bytes | memoryview] = {
            name: _read(z, infos[name], int(meta["size"]), path)
            for name, meta in listed.items() if infos[name].compress_type != zipfile.ZIP_STORED}
    # stored members (tensor bytes) are read straight from the file into the buffers the tensors
    # will live in, each part checked by its SHA-256 (not the archive's CRC), side by side
    buffers = _buffers(manifest, listed, infos)
    stored = {name for name in listed if name not in members}
    for name in stored:
        buf, off = buffers[name]
        size = listed[name]["size"]
        members[name] = memoryview((ctypes.c_char * size).from_address(buf.data_ptr() + off)).cast("B") if size \
            else memoryview(bytearray())

    def check(name: str) -> bool:
        if name in stored:
            with open(path, "rb") as raw:
                _read_stored(raw, infos[name], members[name], path)
        return hashlib.sha256(members[name]).hexdigest() == listed[name]["sha256"]

    big = sum(listed[n]["size"] for n in stored) > 1 << 22
    if big:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:  # hashlib and reads release the GIL
            ok = list(pool.map(check, listed))
    else:
        ok = [check(n) for n in listed]
    bad = [name for name, good in zip(listed, ok) if not good]
    if bad:
        raise PackageError(f"{path}: the member {bad[0]} does not match its SHA-256 in the manifest (damaged or "
                           "altered); the package is refused")
    return PackageContents(path, manifest, members, buffers)


def _unsafe(info: zipfile.ZipInfo) -> str | None:
    name = info.filename
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name) or ".." in parts or "\\" in name:
        return "has a path leaving the package"
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if info.is_dir():
        return "is a directory"
    if info.file_size > MAX_MEMBER_BYTES:
        return f"is {info.file_size} bytes, over the {MAX_MEMBER_BYTES}-byte limit"
    return None


def _read(z: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, path: str) -> bytes:
    """A member's bytes, refusing one that holds more than ``limit`` bytes (read no further)."""
    if info.file_size > limit:
        raise PackageError(f"{path}: the member {info.filename} is {info.file_size} bytes, more than its manifest "
                           f"says ({limit}); the package is refused")
    with z.open(info) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise PackageError(f"{path}: the member {info.filename} holds more than {limit} bytes; the package is refused")
    return data


def _buffers(manifest: dict, listed: dict, infos: dict) -> dict[str, tuple[torch.Tensor, int]]:
    """Where each uncompressed member is read to: one uint8 buffer per tensor, its parts one
    after another; any other uncompressed member a buffer of its own."""
    out: dict[str, tuple[torch.Tensor, int]] = {}
    groups = [e["members"] for e in manifest.get("tensors", {}).values()]
    stored = {n for n in listed if infos[n].compress_type == zipfile.ZIP_STORED}
    for parts in groups + [[n] for n in sorted(stored)]:
        parts = [p for p in parts if p in stored and p not in out]
        if parts:
            buf = torch.empty(sum(listed[p]["size"] for p in parts), dtype=torch.uint8)
            off = 0
            for p in parts:
                out[p] = (buf, off)
                off += listed[p]["size"]
    return out


def _read_stored(raw, info: zipfile.ZipInfo, into: memoryview, path: str) -> None:
    """An uncompressed member's bytes, read from the archive file at its offset into ``into``."""
    import struct

    raw.seek(info.header_offset)
    head = raw.read(30)
    if len(head) != 30 or head[:4] != b"PK\x03\x04":
        raise PackageError(f"{path}: the member {info.filename} has no valid header; the package is refused")
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    raw.seek(info.header_offset + 30 + name_len + extra_len)
    if raw.readinto(into) != info.file_size:
        raise PackageError(f"{path}: the member {info.filename} is truncated; the package is refused")


def _check_versions(manifest: dict, path: str) -> None:
    if manifest.get("format") != FORMAT:
        raise PackageError(f"{path} has package format {manifest.get('format')!r}; this fxforge reads format {FORMAT}: "
                           "package the program again with this fxforge")
    built, here = _release(str(manifest.get("torch"))), _release(torch.__version__)
    if built != here:
        raise PackageError(f"{path} was built with torch {manifest.get('torch')}; this process has torch "
                           f"{torch.__version__}: load it with torch {built}, or package the program again with "
                           f"torch {here}")


# --------------------------------------------------------------------------- loading


def load_package(path: str, *, device=None, state_dict: Mapping[str, torch.Tensor] | None = None,
                 cpu_isa: str | None = None):
    """Load a package written by ``package``: returns a callable taking the same inputs as
    ``ep.module()`` (``compile_exported``'s calling convention and ``InputError`` checks).

    Nothing is compiled, traced or JIT-built: the C kernels are the package's, built for the
    highest CPU level this host runs (``cpu_isa``: that level instead; ``host_cpu_levels()``
    lists this host's).  ``state_dict``: the parameters and buffers, for a package written with
    ``weights=False`` (or to replace the packaged ones); ``device``: None, or the device the
    program was compiled for (a CUDA program's Triton kernels are the cubins built for this
    GPU's architecture, launched through the CUDA driver).  Every member is checked
    against the manifest first (``read_package``); a package this host or this torch cannot
    run raises ``PackageError`` saying why.
    """
    pkg = read_package(path)
    m = pkg.manifest
    want, have = (torch.device(device) if device is not None else None), torch.device(m["device"])
    if want is not None and (want.type != have.type or None not in (want.index, have.index) and want.index != have.index):
        raise PackageError(f"{path} holds a program compiled for {m['device']}; it cannot run on {device}")
    arch = _choose_arch(m, path) if m.get("cuda") else None
    tensors = {name: _tensor(pkg, e) for name, e in m["tensors"].items()}
    state = {k.removeprefix("state."): v for k, v in tensors.items() if k.startswith("state.")}
    state.update(_weights(pkg, state_dict, {k.removeprefix("weight."): v for k, v in tensors.items()
                                            if k.startswith("weight.")}))
    globals_ = {"__builtins__": __builtins__}
    wrapper_tensors = {k.removeprefix("global."): v for k, v in tensors.items() if k.startswith("global.")}
    for name, d in m["globals"].items():
        globals_[name] = _resolve(name, d, wrapper_tensors)
    if m["ops"]:
        from .codegen.runtime import bind_ops

        globals_.update(bind_ops({tuple(key): _op(*key) for key in m["ops"]}))
    chosen = None
    if m["c"] is not None:
        chosen = _choose_isa(m, cpu_isa, path)
        globals_.update(_bind_c(pkg, chosen))
    if arch is not None:
        globals_.update(_bind_cuda(pkg, arch))
    source = pkg.members["wrapper.py"].decode()
    w = Wrapper(source, globals_, [], profiled_source=pkg.members["profiled.py"].decode())
    fn, profiled = w.load(f"<fxforge-package {os.path.basename(path)}>")
    kernels = [KernelInfo(*k) for k in m["kernels"]]
    inner = Compiled(fn, profiled=profiled, source=source, stats=dict(m["stats"]), kernels=kernels, graph=None,
                     n_inputs=m["n_inputs"])
    out = LoadedPackage(inner, _signature(m["signature"]), state, None)
    out.path, out.manifest, out.cpu_isa, out.cuda_arch, out.report_html = path, m, chosen, arch, pkg.members["report.html"]
    return out


class LoadedPackage(ExportedCompiled):
    """A loaded package (``load_package``): called like ``ep.module()``; ``path``, its
    ``manifest``, ``cpu_isa`` (the CPU level whose C kernels it runs; None: it has none),
    ``cuda_arch`` (the GPU architecture whose Triton kernels it runs, 90 for sm_90; None: none),
    ``stats``, ``kernels`` and ``source`` as the compile had them."""

    path: str
    manifest: dict
    cpu_isa: str | None
    cuda_arch: int | None
    report_html: bytes

    def write_report(self, path: str) -> str:
        """Write the package's HTML report (made when it was packaged) to ``path``."""
        with open(path, "wb") as f:
            f.write(self.report_html)
        return path


def _weights(pkg: PackageContents, state_dict: Mapping[str, torch.Tensor] | None,
             packaged: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    m = pkg.manifest
    wanted = m["state"]
    if state_dict is None:
        if not m["weights"]:
            raise PackageError(f"{pkg.path} was written with weights=False: pass the parameters and buffers as "
                               f"load_package(..., state_dict=model.state_dict()) (it reads {', '.join(wanted)})")
        return packaged
    missing = [k for k in wanted if k not in state_dict]
    if missing:
        raise PackageError(f"load_package: state_dict lacks {', '.join(missing)}, which the program reads")
    out = {}
    for k, spec in wanted.items():
        t = state_dict[k]
        if not isinstance(t, torch.Tensor) or list(t.shape) != spec["shape"] or _dtype_name(t.dtype) != spec["dtype"]:
            got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise PackageError(f"load_package: state_dict[{k!r}] is {got}; the program was compiled for "
                               f"{tuple(spec['shape'])} torch.{spec['dtype']}")
        if str(t.device) != spec["device"]:
            raise PackageError(f"load_package: state_dict[{k!r}] is on {t.device}; the program reads it on "
                               f"{spec['device']}")
        out[k] = t
    return out


def _choose_isa(m: dict, forced: str | None, path: str) -> str:
    built = m["c"]["isas"]
    arch = host_arch()
    if m["arch"] != arch:
        raise PackageError(f"{path}: its C kernels are built for {m['arch']} ({', '.join(built)}); this host is {arch}: "
                           f"package the program on {arch}")
    runs = host_cpu_levels()
    if forced is not None:
        if forced not in built:
            raise PackageError(f"{path} has no build for {forced}; it has {', '.join(built)}")
        if forced not in runs:
            raise PackageError(f"this CPU cannot run {forced} code (it runs {', '.join(runs) or 'none of the levels'})")
        return forced
    usable = [i for i in built if i in runs]
    if not usable:
        raise PackageError(f"{path} has C kernels built for {', '.join(built)}; this CPU runs "
                           f"{', '.join(runs) or 'none of them'}: package the program again with "
                           f"cpu_isas including {runs[-1] if runs else 'x86-64'}")
    return usable[-1]


def _choose_arch(m: dict, path: str) -> int:
    """The build for this GPU: its compute capability, or the nearest one below it of the same
    major version (a cubin runs on those only)."""
    built = [int(a) for a in m["cuda"]["archs"]]
    if not torch.cuda.is_available():
        raise PackageError(f"{path} holds a CUDA program (kernels for {', '.join(f'sm_{a}' for a in built)}); this "
                           "process has no GPU")
    major, minor = torch.cuda.get_device_capability(torch.device(m["device"]))
    usable = [a for a in built if a // 10 == major and a % 10 <= minor]
    if not usable:
        raise PackageError(f"{path} has kernels for {', '.join(f'sm_{a}' for a in built)}; this GPU is "
                           f"sm_{major}{minor}: package the program again with cuda_archs including {major}{minor}")
    return max(usable)


def _bind_cuda(pkg: PackageContents, arch: int) -> dict[str, Any]:
    """The package's Triton kernels for ``sm_<arch>``, each bound to ``<kernel>_triton``
    (``codegen/triton/cubin.py``: launched through the CUDA driver, nothing compiled)."""
    from .codegen.triton.cubin import CubinKernel

    out = {}
    for name, builds in pkg.manifest["cuda"]["kernels"]:
        b = builds[str(arch)]
        out[f"{name}_triton"] = CubinKernel(bytes(pkg.members[b["member"]]), b["entry"], b["num_warps"], b["shared"],
                                            b["param_types"])
    return out


def _bind_c(pkg: PackageContents, isa: str) -> dict[str, Any]:
    """The package's C kernels for ``isa``, each bound to ``<kernel>_c`` (``launcher.bind``)."""
    import ctypes

    from .codegen.c.launcher import bind, load_launcher

    c = pkg.manifest["c"]
    libs = [ctypes.CDLL(_extracted(pkg, f"c/{isa}/unit{i}.so")) for i in range(c["units"])]
    module = None
    launcher = c.get("launcher")
    if launcher is not None and launcher["ext_suffix"] == (sysconfig.get_config_var("EXT_SUFFIX") or ""):
        module = load_launcher(_extracted(pkg, launcher["member"]))
    lib_of = {symbol: libs[unit] for _, symbol, _, unit in c["kernels"]}
    return bind([(name, symbol, kinds, None) for name, symbol, kinds, _ in c["kernels"]], lib_of, module)


def _extracted(pkg: PackageContents, member: str) -> str:
    """A file holding ``member``'s (checked) bytes, named by their hash in the private cache
    directory (``codegen/diskcache.py``): shared objects load from files."""
    from .codegen.diskcache import atomic_write, cache_dir

    data = pkg.members[member]
    digest = pkg.manifest["members"][member]["sha256"]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") if "launcher" in member else ".so"
    target = os.path.join(cache_dir("packages"), f"{digest[:40]}{suffix or '.so'}")
    try:
        with open(target, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() == digest:
                return target
    except OSError:
        pass
    atomic_write(target, bytes(data))
    return target
