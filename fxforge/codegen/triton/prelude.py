"""What every generated Triton module starts with: helper functions the kernels call.

``PRELUDE`` holds the helpers of core ``tl`` (Python's floor semantics, NaN-propagating min/max,
the combine functions of reductions).  Math functions outside core ``tl`` (``_ld_tanh``,
``_ld_pow``...) come from libdevice on a GPU (``LIBDEVICE_GPU``); the interpreter has no
libdevice, so under ``TRITON_INTERPRET=1`` the same names are defined from core ``tl``
functions (``LIBDEVICE_INTERP``, accurate to a few ulp).  An op whose lowering calls a helper
the interpreter module lacks is refused there (``available_helpers``, ``printer.values``).
"""

from __future__ import annotations

import os

PRELUDE = '''import triton
import triton.language as tl
from triton.language.extra import libdevice


def _remainder(a, b):
    # Python / torch.remainder: the result takes the divisor's sign (Triton's % is C fmod)
    r = a % b
    return tl.where(r == 0, r, tl.where((r < 0) != (b < 0), r + b, r))


def _div_floor_f(a, b):
    # torch's div_floor_floating: floor of the exact quotient, computed from fmod
    mod = a % b
    div = (a - mod) / b
    div = tl.where(mod == 0, div, tl.where((b < 0) != (mod < 0), div - 1.0, div))
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    fl = tl.where(div == 0, 0.0 * (a / b), fl)
    return tl.where(b == 0, a / b, fl)


def _max_nan(a, b):
    # NaN wins (eager propagates it); no `|` of scalars (the interpreter rejects it)
    return tl.where(a != a, a, tl.where(a > b, a, b))


def _min_nan(a, b):
    return tl.where(a != a, a, tl.where(a < b, a, b))


def _sum_combine(a, b):
    return a + b


def _prod_combine(a, b):
    return a * b


def _argmax_combine(v1, i1, v2, i2):
    # NaN is the largest value; ties go to the first index (eager's argmax)
    n1 = v1 != v1
    n2 = v2 != v2
    pick = tl.where(n1, tl.where(n2, i1 < i2, True),
                    tl.where(n2, False, tl.where(v1 > v2, True, tl.where(v1 == v2, i1 < i2, False))))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)


def _argmin_combine(v1, i1, v2, i2):
    n1 = v1 != v1
    n2 = v2 != v2
    pick = tl.where(n1, tl.where(n2, i1 < i2, True),
                    tl.where(n2, False, tl.where(v1 < v2, True, tl.where(v1 == v2, i1 < i2, False))))
    return tl.where(pick, v1, v2), tl.where(pick, i1, i2)
'''

# Math functions outside core `tl`: libdevice on GPU; the interpreter has no libdevice, so
# under TRITON_INTERPRET=1 the same names are defined from core `tl` functions (accurate to a
# few ulp; ops with no formula here are refused under the interpreter: available_helpers).
LIBDEVICE_GPU = "\n\n".join(
    f"def _ld_{n}({', '.join(a)}):\n    return libdevice.{n}({', '.join(a)})"
    for n, a in [("tanh", "x"), ("pow", "ab"), ("trunc", "x"), ("expm1", "x"), ("log1p", "x"), ("log10", "x"),
                 ("nearbyint", "x"), ("sinh", "x"), ("cosh", "x"), ("tan", "x"), ("erfc", "x"), ("asin", "x"),
                 ("acos", "x"), ("atan", "x"), ("asinh", "x"), ("acosh", "x"), ("atanh", "x"), ("erfinv", "x"),
                 ("lgamma", "x"), ("atan2", "ab"), ("sqrt", "x")]
) + '''

def _to_bf16(x):
    return x.to(tl.bfloat16)
'''

LIBDEVICE_INTERP = '''def _ld_tanh(x):
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    big = (1.0 - e) / (1.0 + e)
    x2 = x * x
    small = ax * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * -0.05396825396825397)))
    r = tl.where(ax < 0.1, small, big)
    return tl.where(x < 0, -r, r)


def _ld_pow(a, b):
    r = tl.exp2(b * tl.log2(tl.abs(a)))
    bint = tl.floor(b) == b
    odd = tl.where(bint, tl.floor(b * 0.5) != b * 0.5, False)
    r = tl.where(a < 0, tl.where(bint, tl.where(odd, -r, r), float("nan")), r)
    return tl.where((b == 0) | (a == 1), 1.0, r)


def _ld_trunc(x):
    return tl.where(x < 0, tl.ceil(x), tl.floor(x))


def _ld_expm1(x):
    u = tl.exp(x)
    um1 = u - 1.0
    r = tl.where(u == 1.0, x, tl.where(um1 == -1.0, -1.0, um1 * x / tl.log(u)))
    return tl.where(u == float("inf"), u, r)


def _ld_log1p(x):
    u = 1.0 + x
    r = tl.where(u == 1.0, x, tl.log(u) * (x / (u - 1.0)))
    return tl.where(u == float("inf"), u, r)


def _ld_log10(x):
    return tl.log(x) * 0.4342944819032518


def _ld_nearbyint(x):
    f = tl.floor(x)
    d = x - f
    even = tl.floor(f * 0.5) == f * 0.5
    return tl.where(d > 0.5, f + 1.0, tl.where(d < 0.5, f, tl.where(even, f, f + 1.0)))


def _ld_sinh(x):
    m = _ld_expm1(x)
    small = 0.5 * (m + m / (m + 1.0))  # no cancellation near 0
    return tl.where(tl.abs(x) < 1.0, small, 0.5 * (tl.exp(x) - tl.exp(-x)))


def _ld_cosh(x):
    e = tl.exp(tl.abs(x))
    return 0.5 * (e + 1.0 / e)


def _ld_tan(x):
    return tl.sin(x) / tl.cos(x)


def _ld_erfc(x):
    return 1.0 - tl.math.erf(x)


def _ld_sqrt(x):
    return tl.sqrt_rn(x)


def _to_bf16(x):
    # the interpreter truncates fp32 -> bf16; round to nearest even on the bits, like eager
    u = x.to(tl.uint32, bitcast=True)
    r = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    r = tl.where(x != x, u, r)
    return r.to(tl.float32, bitcast=True).to(tl.bfloat16)
'''

def _defined(text: str) -> list[str]:
    return [l[4:l.index("(")] for l in text.splitlines() if l.startswith("def ")]


def helper_names(mode: str) -> list[str]:
    """Every helper a module of ``mode`` defines (what a kernel may call)."""
    return _defined(PRELUDE) + _defined(LIBDEVICE_GPU if mode == "gpu" else LIBDEVICE_INTERP)


def module_text(kernel_source: str, mode: str) -> str:
    """The cache module for ``mode`` ("gpu": libdevice helpers, "interp": core-tl helpers)."""
    return PRELUDE + "\n\n" + (LIBDEVICE_GPU if mode == "gpu" else LIBDEVICE_INTERP) + "\n\n" + kernel_source


def interpreting() -> bool:
    """Triton runs under its interpreter (``TRITON_INTERPRET=1``): kernel modules get the
    interpreter's helpers."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "yes", "on")


def available_helpers() -> frozenset[str] | None:
    """The helpers a kernel may call in this process (None: all, on a GPU)."""
    return frozenset(helper_names("interp")) if interpreting() else None
