"""Ahead-of-time compiles of generated kernels for a named GPU, with no GPU present.

``check_kernel(emitted)`` runs Triton's real compiler (``triton.compile`` on an ``ASTSource``
for ``GPUTarget("cuda", cc, 32)``) for sm_80 and sm_90 and returns the PTX per target: kernels
the permissive interpreter accepts but the compiler rejects fail here, on CPU.  Pointer
arguments are declared 16-byte aligned (what Triton infers at launch for PyTorch's allocations),
so the PTX shows the vectorised loads a real launch would get.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import cache
from .launch import KERNEL_NAME, Emitted
from .prelude import helper_names, module_text

@dataclass
class AotResult:
    arch: int
    ptx: str
    has_cubin: bool

    def vector_loads(self) -> list[str]:
        """``ld.global.v2/.v4`` instructions: vectorised loads."""
        return re.findall(r"ld\.global(?:\.\w+)*\.v[24](?:\.\w+)*", self.ptx)


def signature(emitted: Emitted) -> tuple[dict, dict, dict]:
    sig = {p.name: p.sig for p in emitted.params}
    sig.update({k: "constexpr" for k in emitted.constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(emitted.params) if p.sig.startswith("*")}
    return sig, dict(emitted.constexprs), attrs


@dataclass
class Cubin:
    """A kernel compiled for one GPU architecture, with what launching it needs (``cubin.py``)."""

    arch: int
    data: bytes  # the cubin (ELF)
    entry: str  # the kernel's symbol in it
    num_warps: int
    shared: int  # dynamic shared memory bytes
    param_types: list[str]  # PTX type of each kernel parameter, in order (``u64``, ``f32``...): the
    # emitted parameters first, then any Triton adds (scratch pointers, passed as null)


def _compile(emitted: Emitted, arch: int, mode: str):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    mod = cache.load(module_text(emitted.kernel_source, mode), helper_names(mode) + [KERNEL_NAME], wrap=JITFunction, tag="_aot")
    sig, constexprs, attrs = signature(emitted)
    src = ASTSource(getattr(mod, KERNEL_NAME), sig, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": emitted.num_warps, "enable_fp_fusion": False})


def ptx_param_types(ptx: str) -> list[str]:
    """The parameter types of the (one) kernel entry in ``ptx``: ``.param .u64 .ptr...`` -> ``u64``."""
    head = ptx[ptx.index(".entry"):]
    head = head[head.index("(") + 1:head.index(")")]
    return re.findall(r"\.param\s+\.(\w+)", head)


def cubins(emitted: Emitted, archs=(80, 90)) -> list[Cubin]:
    """``emitted`` compiled for each ``sm_<arch>`` with the GPU helpers: what a package holds to
    launch it with no compiler (``codegen/triton/cubin.py``).  Raises where a kernel needs what a
    plain launch does not give it (scratch memory)."""
    out = []
    for arch in archs:
        compiled = _compile(emitted, arch, "gpu")
        md = compiled.metadata
        if getattr(md, "global_scratch_size", 0) or getattr(md, "profile_scratch_size", 0):
            raise NotImplementedError(f"Triton kernel {emitted.name} needs scratch memory for sm_{arch}: not packaged")
        out.append(Cubin(arch, compiled.asm["cubin"], md.name, md.num_warps, md.shared,
                         ptx_param_types(compiled.asm["ptx"])))
    return out


def check_kernel(emitted: Emitted, archs=(80, 90), mode: str = "gpu") -> dict[int, AotResult]:
    """Compile ``emitted`` for each ``sm_<arch>``; raises on a compile error.  Returns PTX per arch.

    ``mode``: which helper prelude to compile with ("gpu": libdevice, what runs on a GPU;
    "interp": the core-``tl`` formulas the interpreter runs)."""
    out = {}
    for arch in archs:
        compiled = _compile(emitted, arch, mode)
        out[arch] = AotResult(arch, compiled.asm["ptx"], "cubin" in compiled.asm)
    return out
