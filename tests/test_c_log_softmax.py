"""Log-softmax and its gradient on the C backend: the row templates (``codegen/c/templates.py``)
that run a small classification head's ``_log_softmax`` and ``_log_softmax_backward_data`` as C
kernels instead of ATen calls.  Every case compares with eager on fresh random inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fxforge
from fxforge.codegen.c import build
from fxforge.codegen.c.ops import TRANSCENDENTAL_MAX_NUMEL

pytestmark = [pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
              pytest.mark.usefixtures("kernel_cache")]

aten = torch.ops.aten
LIMIT = TRANSCENDENTAL_MAX_NUMEL["exp.default"]


def _compile(fn, **kw):
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    return b, torch.compile(fn, backend=b, fullgraph=True, **kw)


def _fallbacks(b) -> dict:
    out = {}
    for c in b.compiled:
        out.update(c.stats["fallbacks"])
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(8, 10), (3, 5, 7), (1, 1), (64, 128)])
def test_cross_entropy_step_runs_both_templates(shape, dtype):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=dtype, requires_grad=True)
    if len(shape) == 2:
        y = torch.randint(0, shape[1], (shape[0],))
        fn = lambda x, y: F.cross_entropy(x, y)  # noqa: E731
    else:
        y = torch.randn(shape[:-1], dtype=dtype)
        fn = lambda x, y: (F.log_softmax(x, -1).sum(-1) * y).sum()  # noqa: E731
    b, c = _compile(fn)
    loss = c(x, y)
    loss.backward()
    grad, x.grad = x.grad, None
    ref = fn(x, y)
    ref.backward()
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, x.grad)
    sources = "".join(cc.source for cc in b.compiled)
    assert "(template: log_softmax," in sources and "(template: log_softmax backward," in sources
    assert "_log_softmax" not in " ".join(_fallbacks(b))


def test_rows_with_infinities_and_nan_match_eager():
    inf, nan = float("inf"), float("nan")
    x = torch.tensor([[-inf] * 4, [0.0, inf, 1.0, 2.0], [nan, 1.0, 2.0, 3.0], [1.0, 2.0, -inf, 4.0],
                      [1e30, -1e30, 0.0, 3.0], [-1e30, -1e30, -1e30, -1e30]])
    x = torch.cat([x, torch.randn(4, 4)])[torch.randperm(10)]
    b, c = _compile(lambda x: F.log_softmax(x, -1))
    torch.testing.assert_close(c(x), F.log_softmax(x, -1), equal_nan=True)
    assert "(template: log_softmax," in b.compiled[0].source
    # a NaN anywhere in a long row, or all of it (the max, a vector reduction, may pass over a
    # NaN: the row's sum carries it to every output)
    x = torch.randn(4, 100)
    x[1, 57] = x[2, 0] = nan
    x[3] = nan
    torch.testing.assert_close(c(x), F.log_softmax(x, -1), equal_nan=True)
    assert c(x)[1:].isnan().all() and not c(x)[0].isnan().any()


def test_strided_rows_and_leading_dims():
    """Rows read at their traced strides: a transposed input, a sliced one, three leading dims."""
    def f(a, b):
        return F.log_softmax(a.transpose(0, 1), -1) + F.log_softmax(b[:, 1:, :, ::2], -1).sum(0)

    a, b = torch.randn(12, 6), torch.randn(2, 4, 6, 24)
    b_, c = _compile(f)
    torch.testing.assert_close(c(a, b), f(a, b))
    assert b_.compiled[0].source.count("(template: log_softmax,") == 2


def test_refusals_name_the_reason():
    def f(x, y):
        return F.log_softmax(x, 0) * 2, F.log_softmax(y, -1) * 2

    x, y = torch.randn(6, 5), torch.randn(LIMIT // 64 + 1, 64)
    b, c = _compile(f)
    out = c(x, y)
    torch.testing.assert_close(out[0], f(x, y)[0])
    torch.testing.assert_close(out[1], f(x, y)[1])
    src = b.compiled[0].source
    assert "template: log_softmax" not in src  # both run as ATen kernels (the torch backend's extern calls)
    assert src.count("aten._log_softmax.out(") == 2
    from fxforge.codegen.c import backend as c_backend
    gm = b.compiled[0].graph
    why = {n.args[1]: c_backend.accepts(n, fxforge.Config(codegen="c"))
           for n in gm.graph.nodes if n.target == aten._log_softmax.default}
    assert "over the last dim only" in why[0] and f"over {LIMIT} elements" in why[-1 if -1 in why else 1]


def test_dynamic_shapes_run_as_aten():
    x = torch.randn(8, 10)
    b, c = _compile(lambda x: F.log_softmax(x, -1) * 3, dynamic=True)
    torch.testing.assert_close(c(x), F.log_softmax(x, -1) * 3)
    x = torch.randn(5, 10)
    torch.testing.assert_close(c(x), F.log_softmax(x, -1) * 3)
    assert all("template: log_softmax" not in cc.source for cc in b.compiled)
