"""Kernels: backend, size, launch arguments and the generated source of each kernel.

The wrapper function of a kernel is its ``Kernel.source`` (what ``Compiled.source`` holds); a
backend that loads device code from elsewhere (Triton: the ``@triton.jit`` function, kept in the
kernel's globals) has that source shown too, when the loaded object carries it."""

from __future__ import annotations

import inspect
from typing import Any


def device_source(kernel: Any) -> str:
    """Source of the device functions a kernel's wrapper calls (Triton's ``.src``), if any."""
    out = []
    for name, v in getattr(kernel, "globals", {}).items():
        src = getattr(v, "src", None)
        if not isinstance(src, str):
            fn = getattr(v, "fn", None)
            try:
                src = inspect.getsource(fn) if callable(fn) else None
            except (OSError, TypeError):
                src = None
        if isinstance(src, str) and src.strip():
            out.append(f"# {name}\n{src.rstrip()}")
    return "\n\n".join(out)


def kernel_view(compiled) -> list[list]:
    data = getattr(compiled, "report_data", None)
    full = {k.name: k for k in (data.kernels if data is not None else [])}
    rows = []
    for info in compiled.kernels:
        k = full.get(info.name)
        rows.append([info.name, info.backend, info.node_count, info.num_args, info.unique_io_buffers,
                     list(getattr(k, "args", [])), getattr(k, "source", ""), device_source(k) if k is not None else ""])
    return rows
