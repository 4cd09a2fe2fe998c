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


Modules: ``format`` (version, limits, CPU levels), ``state`` (what the manifest stores as JSON),
``write`` (``package``), ``read`` (``read_package``: checked, nothing run), ``load``
(``load_package``).
"""

from .format import (BASELINES, DEFAULT_CPU_ISAS, FORMAT, MANIFEST, MAX_MANIFEST_BYTES, MAX_MEMBER_BYTES, PART_BYTES,
                     X86_LEVELS, PackageError, cpu_levels, host_cpu_levels)
from .load import LoadedPackage, load_package
from .read import PackageContents, read_package
from .write import package

__all__ = ["BASELINES", "DEFAULT_CPU_ISAS", "FORMAT", "MANIFEST", "MAX_MANIFEST_BYTES", "MAX_MEMBER_BYTES", "PART_BYTES",
           "X86_LEVELS", "LoadedPackage", "PackageContents", "PackageError", "cpu_levels", "host_cpu_levels", "load_package",
           "package", "read_package"]
