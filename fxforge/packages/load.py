"""Loading a package: ``load_package`` binds the C kernels built for this CPU (or the cubins for
this GPU), the weights, and the wrapper's globals, and returns a callable program: no compiler,
no tracing."""

from __future__ import annotations

import ctypes
import hashlib
import os
import sysconfig
from typing import Any, Mapping

import torch

from ..codegen.wrapper import Wrapper
from ..artifact.compiled import Compiled, KernelInfo
from ..entry.export import ExportedCompiled
from ..infra.host import arch as host_arch
from .format import PackageError, host_cpu_levels
from .read import PackageContents, _tensor, read_package
from .state import _dtype_name, _op, _resolve, _signature


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
        from ..codegen.runtime import bind_ops

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
    from ..codegen.triton.cubin import CubinKernel

    out = {}
    for name, builds in pkg.manifest["cuda"]["kernels"]:
        b = builds[str(arch)]
        out[f"{name}_triton"] = CubinKernel(bytes(pkg.members[b["member"]]), b["entry"], b["num_warps"], b["shared"],
                                            b["param_types"])
    return out


def _bind_c(pkg: PackageContents, isa: str) -> dict[str, Any]:
    """The package's C kernels for ``isa``, each bound to ``<kernel>_c`` (``launcher.bind``)."""

    from ..codegen.c.launcher import bind, load_launcher

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
    from ..codegen.diskcache import atomic_write, cache_dir

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
