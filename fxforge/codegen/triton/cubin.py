"""Launching ahead-of-time compiled Triton kernels (``aot.cubins``) with no compiler: the CUDA
driver API through ``ctypes``, as a loaded package does (``fxforge/packages/load.py``).

``CubinKernel`` stands where the wrapper's ``<kernel>_triton`` JIT function stands, with the same
launch syntax, ``kernel_triton[grid](*args, XBLOCK=..., num_warps=..., ...)``: the keyword
arguments are the compiled-in constants and are not passed again.  Each positional argument is
packed as the kernel's PTX parameter of the same position says (``u64`` for a tensor's device
pointer, ``u32``/``s32``, ``u64``/``s64``, ``f32``, ``u8`` for a flag); parameters Triton appends
(its scratch pointers, which these kernels do not use) are passed as null.  The module is
loaded into the current device's context on the first launch, and launched on torch's current
stream.

Pointer arguments were declared 16-byte aligned when the kernel was compiled (``aot.signature``),
so a tensor whose data is not is refused with a ``ValueError``.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import torch

_PACK = {"u64": ctypes.c_uint64, "s64": ctypes.c_int64, "b64": ctypes.c_uint64, "u32": ctypes.c_uint32,
         "s32": ctypes.c_int32, "b32": ctypes.c_uint32, "u16": ctypes.c_uint16, "s16": ctypes.c_int16,
         "u8": ctypes.c_uint8, "s8": ctypes.c_int8, "b8": ctypes.c_uint8, "f32": ctypes.c_float,
         "f64": ctypes.c_double}
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_STATIC_SHARED_LIMIT = 48 * 1024


@functools.lru_cache(maxsize=None)
def driver() -> ctypes.CDLL:
    """The CUDA driver library (``libcuda``), loaded once, its entry points typed."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"the CUDA driver (libcuda.so.1) cannot be loaded: {e}") from e
    P, I, U = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint
    cu.cuInit.argtypes = [U]
    cu.cuCtxGetCurrent.argtypes = [ctypes.POINTER(P)]
    cu.cuDeviceGet.argtypes = [ctypes.POINTER(I), I]
    cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(P), I]
    cu.cuCtxSetCurrent.argtypes = [P]
    cu.cuModuleLoadData.argtypes = [ctypes.POINTER(P), ctypes.c_char_p]
    cu.cuModuleGetFunction.argtypes = [ctypes.POINTER(P), P, ctypes.c_char_p]
    cu.cuFuncSetAttribute.argtypes = [P, I, I]
    cu.cuLaunchKernel.argtypes = [P, U, U, U, U, U, U, U, P, P, P]
    cu.cuGetErrorString.argtypes = [I, ctypes.POINTER(ctypes.c_char_p)]
    rc = cu.cuInit(0)
    if rc != 0:
        raise RuntimeError(f"the CUDA driver failed to initialise ({rc})")
    return cu


def _context(device: int) -> None:
    """Make ``device``'s primary context (torch's) current on this thread where none is."""
    cu = driver()
    ctx = ctypes.c_void_p()
    _check(cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        dev = ctypes.c_int()
        _check(cu.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        _check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def _check(rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        driver().cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"CUDA driver {what} failed ({rc}: {(msg.value or b'').decode()})")


def pack(param_types: list[str], args: tuple) -> list[Any]:
    """Each argument as a ctypes value of its parameter's PTX type (tensors by their data
    pointer, which must be 16-byte aligned), then null for the parameters past the arguments."""
    if len(args) > len(param_types):
        raise TypeError(f"the kernel takes {len(param_types)} parameters, got {len(args)} arguments")
    out = []
    for i, ty in enumerate(param_types):
        cls = _PACK.get(ty)
        if cls is None:
            raise TypeError(f"kernel parameter {i} has PTX type .{ty}, which this launcher does not pack")
        if i >= len(args):
            out.append(cls(0))
            continue
        a = args[i]
        if isinstance(a, torch.Tensor):
            ptr = a.data_ptr()
            if ptr % 16:
                raise ValueError(f"kernel argument {i}: its data is not 16-byte aligned (address {ptr:#x}); the "
                                 "packaged kernel was compiled for aligned tensors")
            a = ptr
        out.append(cls(a))
    return out


class CubinKernel:
    """One packaged kernel for one architecture, launched as ``kernel[grid](*args, **constants)``."""

    def __init__(self, data: bytes, entry: str, num_warps: int, shared: int, param_types: list[str]):
        self.data, self.entry, self.num_warps, self.shared = data, entry, num_warps, shared
        self.param_types = list(param_types)
        self._functions: dict[int, ctypes.c_void_p] = {}  # device -> CUfunction
        self._modules: list[ctypes.c_void_p] = []

    def _function(self, device: int) -> ctypes.c_void_p:
        fn = self._functions.get(device)
        if fn is None:
            torch.cuda.init()
            _context(device)
            cu = driver()
            module, fn = ctypes.c_void_p(), ctypes.c_void_p()
            _check(cu.cuModuleLoadData(ctypes.byref(module), self.data), "cuModuleLoadData")
            _check(cu.cuModuleGetFunction(ctypes.byref(fn), module, self.entry.encode()), "cuModuleGetFunction")
            if self.shared > _STATIC_SHARED_LIMIT:
                _check(cu.cuFuncSetAttribute(fn, _MAX_DYNAMIC_SHARED, self.shared), "cuFuncSetAttribute")
            self._modules.append(module)
            self._functions[device] = fn
        return fn

    def __getitem__(self, grid: tuple) -> Any:
        return functools.partial(self.launch, tuple(grid))

    def launch(self, grid: tuple, *args: Any, **constants: Any) -> None:
        device = torch.cuda.current_device()
        values = pack(self.param_types, args)
        params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        gx, gy, gz = (list(grid) + [1, 1])[:3]
        if gx * gy * gz == 0:
            return
        fn = self._function(device)
        _context(device)
        stream = torch.cuda.current_stream(device).cuda_stream
        _check(driver().cuLaunchKernel(fn, gx, gy, gz, 32 * self.num_warps, 1, 1, self.shared, stream,
                                       ctypes.cast(params, ctypes.c_void_p), None), "cuLaunchKernel")

    def __repr__(self) -> str:
        return f"<fxforge packaged Triton kernel {self.entry}: {len(self.data)} bytes of cubin, {self.num_warps} warps>"
