"""Tiles in C kernels (``kernel.TILE_ROWS``): a float32 tensor read or stored across the rows a
kernel walks (a transposed residual, a permuted copy) moves through a local tile of rows,
``fx_tile_in8``/``fx_tile_out8`` (``prelude.py``).

Every kernel case compiles with ``codegen="c"`` and compares with eager on fresh random inputs;
the helpers themselves are checked element by element, vector path and plain loops."""

from __future__ import annotations

import ctypes
import re
import subprocess

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import fxforge
from fxforge.codegen.c import build
from fxforge.codegen.c.schedule import TILE_ROWS
from fxforge.codegen.c.prelude import PRELUDE
from fxforge.testing import profile

pytestmark = [pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
              pytest.mark.usefixtures("kernel_cache")]


def run(fn, *args, **config):
    """``fn`` compiled with codegen="c" (fullgraph): results and strides checked against eager;
    the C kernels' sources."""
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True, **config))
    got, want = torch.compile(fn, backend=b, fullgraph=True)(*args), fn(*args)
    for x, y in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
        torch.testing.assert_close(x, y)
        assert [s for s, n in zip(x.stride(), x.shape) if n > 1] == [s for s, n in zip(y.stride(), y.shape) if n > 1]
    assert all(c.stats["fallback_nodes"] == 0 for c in b.compiled)
    return "\n".join(c.source for c in b.compiled)


def residual_norm(x, y, w, b):
    """A mixer's channel mixing: a layer norm over a residual added from a transposed value."""
    h = x + y.transpose(1, 2)
    return h, F.layer_norm(h, h.shape[-1:], w, b)


def norm_transposed(x, w, b):
    """A mixer's token mixing: a layer norm's result stored transposed (a permuted copy) for a
    matmul over its rows."""
    v = F.layer_norm(x * 2, x.shape[-1:], w, b)
    return v.transpose(1, 2).contiguous() @ torch.ones(x.shape[1], 3), v.sum(-1)


@pytest.mark.parametrize("rows,n", [(16, 64), (13, 37), (8, 8), (24, 9)])
def test_a_row_kernel_reads_a_transposed_residual_through_a_tile(rows, n):
    x, y = torch.randn(3, rows, n), torch.randn(3, n, rows)
    src = run(residual_norm, x, y, torch.randn(n), torch.randn(n))
    assert "fx_tile_in8(" in src
    # rows in blocks of TILE_ROWS; a last block of fewer rows where they do not divide evenly
    assert ("FX_MIN_NAN(" in re.search(r"const int64_t nb = .*;", src).group(0)) == (rows % TILE_ROWS != 0)


@pytest.mark.parametrize("rows,n", [(16, 64), (11, 20)])
def test_a_row_kernel_stores_a_permuted_copy_through_a_tile(rows, n):
    src = run(norm_transposed, torch.randn(2, rows, n), torch.randn(n), torch.randn(n))
    assert "fx_tile_out8(" in src


def test_a_pointwise_kernel_reads_and_stores_through_tiles():
    x, y = torch.randn(4, 24, 40), torch.randn(4, 40, 24)
    src = run(lambda a, b: (a * b.transpose(1, 2)).relu(), x, y)  # a transposed read
    assert "fx_tile_in8(" in src
    src = run(lambda a: (a + 1).transpose(1, 2).contiguous() * 3, x)  # a transposed store
    assert "fx_tile_out8(" in src


def test_what_is_not_tiled_still_matches_eager():
    # fewer rows than a tile, fewer elements than a tile, float64, a contiguous layout
    for x, y in [(torch.randn(2, 5, 32), torch.randn(2, 32, 5)), (torch.randn(2, 16, 6), torch.randn(2, 6, 16)),
                 (torch.randn(2, 16, 32, dtype=torch.float64), torch.randn(2, 32, 16, dtype=torch.float64))]:
        n = x.shape[-1]
        src = run(residual_norm, x, y, torch.randn(n, dtype=x.dtype), torch.randn(n, dtype=x.dtype))
        assert "fx_tile" not in src.split("def call", 1)[0].replace("fxforge/codegen/c/prelude.py", "")
    x = torch.randn(2, 16, 32)
    src = run(residual_norm, x, torch.randn(2, 16, 32).transpose(1, 2), torch.randn(32), torch.randn(32))
    assert "fx_tile_in8(" not in src  # its transpose is contiguous: no tile


def test_a_residual_norm_training_step_matches_eager():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = torch.nn.Linear(12, 12)
            self.norm = torch.nn.LayerNorm(20)

        def forward(self, x):
            return self.norm(x + self.tokens(x.transpose(1, 2)).transpose(1, 2))

    torch.manual_seed(0)
    m = Block()
    ref = Block()
    ref.load_state_dict(m.state_dict())
    torch._dynamo.reset()
    backend = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    cm = torch.compile(m, backend=backend, fullgraph=True)
    x, r = torch.randn(3, 12, 20), torch.randn(3, 12, 20)
    xc, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    (cm(xc) * r).sum().backward()
    (ref(xr) * r).sum().backward()
    torch.testing.assert_close(xc.grad, xr.grad, atol=1e-5, rtol=1e-4)
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    forward, backward = (c.source for c in backend.compiled)
    assert "fx_tile_in8(" in forward and "fx_tile" in backward.split("def call", 1)[0].replace("prelude.py", "")


@settings(profile(), max_examples=12, deadline=None)
@given(rows=st.integers(8, 27), n=st.integers(8, 40), batch=st.integers(1, 3), store=st.booleans())
def test_random_tiled_kernels(rows, n, batch, store):
    w, b = torch.randn(n), torch.randn(n)
    if store:
        src = run(norm_transposed, torch.randn(batch, rows, n), w, b)
    else:
        src = run(residual_norm, torch.randn(batch, rows, n), torch.randn(batch, n, rows), w, b)
    assert "fx_tile_out8(" in src if store else "fx_tile_in8(" in src


# ------------------------------------------------------------------ the helpers themselves

_HARNESS = r"""
void tile_in(float* tile, int64_t ld, const float* src, int64_t s, int64_t n, int64_t nb)
{ fx_tile_in8(tile, ld, src, s, n, nb); }
void tile_out(float* dst, int64_t s, const float* tile, int64_t ld, int64_t n, int64_t nb)
{ fx_tile_out8(dst, s, tile, ld, n, nb); }
"""


@pytest.fixture(scope="module", params=[1, 0], ids=["vectors", "loops"])
def helpers(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"tiles{request.param}")
    c, so = d / "tiles.c", d / "tiles.so"
    c.write_text(PRELUDE + _HARNESS)
    cmd = [build.compiler(), *build.flags(), f"-DFX_TILE_VECTORS={request.param}", str(c), "-o", str(so), "-lm"]
    subprocess.run(cmd, check=True, capture_output=True)
    lib = ctypes.CDLL(str(so))
    for f in (lib.tile_in, lib.tile_out):
        f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    return lib


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 37])
@pytest.mark.parametrize("nb", [1, 5, 8])
def test_tile_helpers_move_every_element_and_no_other(helpers, n, nb):
    s, ld = 11 + n % 3, n + 3  # a row stride that is no multiple of 8; tile rows with padding
    src = torch.randn(s * n + 8)
    tile = torch.full((8, ld), float("nan"))
    helpers.tile_in(tile.data_ptr(), ld, src.data_ptr(), s, n, nb)
    want = torch.stack([src[x + s * torch.arange(n)] for x in range(nb)])
    assert torch.equal(tile[:nb, :n], want)
    assert tile[nb:].isnan().all() and tile[:, n:].isnan().all()  # nothing past the tile's rows

    tile = torch.randn(8, ld)
    dst = torch.full((s * n + 8,), float("nan"))
    helpers.tile_out(dst.data_ptr(), s, tile.data_ptr(), ld, n, nb)
    expect = torch.full_like(dst, float("nan"))
    for x in range(nb):
        expect[x + s * torch.arange(n)] = tile[x, :n]
    assert torch.equal(dst.nan_to_num(123.0), expect.nan_to_num(123.0))  # and nothing else written

