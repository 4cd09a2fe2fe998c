"""Layer norm's gradient on the C backend: the hand-written template kernel (``codegen/c/templates.py``)
and the layout guard for tensors an ATen kernel allocates (``Wrapper.guard_layout``).

The guard's bug, found on an MLP-mixer's training step: on CPU, ATen's
``native_layer_norm_backward`` returns a contiguous grad_input, while its meta function (what the
graph is traced with) follows grad_out's strides.  A token-mixing block transposes the norm's
output, so grad_out is transposed; a C kernel reading the grad_input at the traced (transposed)
strides read the wrong elements, and every gradient before that norm was wrong (no error raised).

Every case compares a training step's gradients with eager on fresh random inputs.
"""

from __future__ import annotations

import re

import copy

import pytest
import torch
import torch.nn as nn

import fxforge
from fxforge.codegen.c import backend as c_backend, build, templates
from fxforge.core.graph import BACKEND

pytestmark = [pytest.mark.skipif(build.compiler() is None, reason="no C compiler (cc, or $CC) on this machine"),
              pytest.mark.usefixtures("kernel_cache")]


class TokenMix(nn.Module):
    """A mixer block's token half: the norm's output is transposed, so its gradient arrives transposed."""

    def __init__(self, d: int, tokens: int, affine: bool = True, shape: tuple | None = None):
        super().__init__()
        self.norm = nn.LayerNorm(shape or d, elementwise_affine=affine)
        self.mix = nn.Linear(tokens, tokens)

    def forward(self, x):
        return x + self.mix(self.norm(x).transpose(1, 2)).transpose(1, 2)


def _grads_match(model: nn.Module, x: torch.Tensor, *, dynamic: bool = False, requires_grad: bool = False):
    """Compile a training step (C backend), compare the loss and every gradient with eager."""
    torch._dynamo.reset()
    ref = copy.deepcopy(model)
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    compiled = torch.compile(model, backend=b, fullgraph=True, dynamic=dynamic)
    xc, xr = x.clone().requires_grad_(requires_grad), x.clone().requires_grad_(requires_grad)
    w = torch.randn_like(x)  # a loss whose gradient is not uniform
    loss = (compiled(xc) * w).sum()
    loss.backward()
    ref_loss = (ref(xr) * w).sum()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-4)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    if requires_grad:
        torch.testing.assert_close(xc.grad, xr.grad, rtol=1e-4, atol=1e-4)
    (bw,) = [c for c in b.compiled if c.stats["graph"] == "backward"]
    assert not bw.stats["fallbacks"], bw.stats["fallbacks"]
    return bw


def _mix(dtype, affine=True):
    return nn.Sequential(TokenMix(24, 16, affine), TokenMix(24, 16, affine)).to(dtype)


def _two_normalized_dims(dtype):  # contiguous grads: the two dims are one run
    return nn.Sequential(nn.LayerNorm((16, 24)), nn.Linear(24, 24), nn.LayerNorm((16, 24))).to(dtype)


CASES = {"affine": _mix, "no_affine": lambda dt: _mix(dt, affine=False), "two_normalized_dims": _two_normalized_dims}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("input_grad", [False, True])
@pytest.mark.parametrize("batch", [4, 128])
def test_template_matches_eager(case, dtype, input_grad, batch):
    """4 x 16 rows in one pass; 128 x 16 (49,152 elements a norm) in chunks of rows
    (``templates._row_chunks``), the weight's and bias's gradients summed per chunk."""
    torch.manual_seed(0)
    # the first norm's grad_input is not asked for unless the input requires grad (mask [False, ...])
    bw = _grads_match(CASES[case](dtype), torch.randn(batch, 16, 24, dtype=dtype) * 3 + 1, requires_grad=input_grad)
    # without weights or an input gradient the first norm's backward computes nothing
    expected = 2 if input_grad or case != "no_affine" else 1
    assert bw.source.count("template: layer norm backward") == expected, bw.source
    assert "native_layer_norm_backward.default(" not in bw.source
    assert ("const int64_t ue = " in bw.source) == (batch > 4), bw.source


def test_normalized_dims_that_are_not_one_run_run_as_aten_with_the_reason():
    torch.manual_seed(6)
    model = nn.Sequential(TokenMix(24, 16, shape=(16, 24)), TokenMix(24, 16, shape=(16, 24)))
    bw = _grads_match(model, torch.randn(4, 16, 24), requires_grad=True)
    lnb = [n for n in bw.graph.graph.nodes if n.target is torch.ops.aten.native_layer_norm_backward.default]
    assert lnb and all(n.meta.get(BACKEND) != "c" for n in lnb)
    assert "not one strided run" in c_backend.accepts(lnb[-1], fxforge.Config(codegen="c"))


def test_blocks_of_transposed_rows_with_a_remainder():
    """20 transposed rows: two blocks of 8 and one of 4, staged and written back through tiles."""
    torch.manual_seed(3)
    model = nn.Sequential(TokenMix(24, 20), TokenMix(24, 20))
    bw = _grads_match(model, torch.randn(3, 20, 24), requires_grad=True)
    blocked = [k for k in bw.source.split("# C kernel ")[1:] if "fx_tile_in8(&blk_dy[0][0], 24, in_ptr0 + (" in k]
    assert blocked and all("nb = (FX_MIN_NAN(8, -ib + 20));" in k and "fx_tile_out8(out_ptr0 + (" in k for k in blocked)


@pytest.mark.parametrize("blocks", [True, False])
def test_template_reads_contiguous_and_transposed_grads_in_one_model(blocks, monkeypatch):
    if not blocks:  # no room for a block of rows: each strided row is staged alone
        monkeypatch.setattr(templates, "STAGE_BLOCK_MAX_BYTES", 0)
    torch.manual_seed(1)
    model = nn.Sequential(TokenMix(32, 8), nn.LayerNorm(32), nn.Linear(32, 32), TokenMix(32, 8))
    bw = _grads_match(model, torch.randn(2, 8, 32))
    assert bw.source.count("template: layer norm backward") == 3
    # where grad_input is computed (two loops over a row) a transposed grad is copied into a
    # contiguous local row once (a tile of 8 rows at a time: the transposed rows start one
    # element apart); a contiguous one is read in place
    staging = "fx_tile_in8(&blk_dy[0][0], 32, in_ptr0 + (" if blocks else "row_dy[j] = in_ptr0["
    kernels = [k for k in bw.source.split("# C kernel ")[1:]
               if "template: layer norm backward" in k.split("\n", 1)[0] and "double ds" in k]
    for k in kernels:
        reads = re.findall(r"in_ptr0\[[^\]]*\]", k)  # dy read in place, or staged one row at a time
        in_place = bool(reads) and all(re.search(r"(?<![*\w])j\b(?!\*)", r) for r in reads)  # at a unit stride
        assert (staging in k) == (not in_place), k
    assert any(staging in k for k in kernels) and not all(staging in k for k in kernels)


def test_symbolic_sizes_run_atens_kernel_and_the_guard_restrides_its_result():
    torch.manual_seed(2)
    model = nn.Sequential(TokenMix(24, 16), TokenMix(24, 16))
    bw = _grads_match(model, torch.randn(4, 16, 24), dynamic=True, requires_grad=True)
    assert "native_layer_norm_backward.default(" in bw.source  # the template refuses symbolic sizes
    assert "as_traced(" in bw.source.split("\ndef call(", 1)[1]  # a C kernel reads its grad_input at the traced strides


def test_the_guard_alone_fixes_atens_layer_norm_backward(monkeypatch):
    """Without the template (its table emptied), ATen's kernel runs and the guard restrides."""
    monkeypatch.setattr(templates, "TEMPLATES", {})
    torch.manual_seed(3)
    model = nn.Sequential(TokenMix(24, 16), TokenMix(24, 16))
    bw = _grads_match(model, torch.randn(4, 16, 24), requires_grad=True)
    assert "as_traced(" in bw.source.split("\ndef call(", 1)[1]


def test_no_guard_where_only_aten_reads_the_value():
    """The torch backend's ATen calls read every tensor's own strides: no check, no copy."""
    torch.manual_seed(4)
    model = nn.Sequential(TokenMix(24, 16), TokenMix(24, 16))
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="torch", debug=True))
    torch.compile(model, backend=b, fullgraph=True)(torch.randn(4, 16, 24)).sum().backward()
    assert all("as_traced(" not in c.source for c in b.compiled)


def test_template_refusals_name_the_reason():
    torch.manual_seed(5)
    big = templates.LAYER_NORM_MAX_COLUMNS + 64
    model = nn.Sequential(nn.Linear(big, big), nn.LayerNorm(big))
    bw = _grads_match(model, torch.randn(2, big))
    assert "template: layer norm backward" not in bw.source
    (n,) = [n for n in bw.graph.graph.nodes if n.target is torch.ops.aten.native_layer_norm_backward.default]
    assert n.meta.get(BACKEND) != "c"
    assert "normalized elements" in c_backend.accepts(n, fxforge.Config(codegen="c"))


@pytest.mark.parametrize("case", ["affine", "two_normalized_dims"])
def test_arrays_past_the_stack_budget_live_in_heap_scratch(case, monkeypatch):
    """With a stack budget smaller than one array, every template and emitted kernel's arrays
    (staged rows, tiles, accumulators, row caches) go to the kernel's heap block: same results."""
    from fxforge.codegen.c import abi

    monkeypatch.setattr(abi, "STACK_MAX_BYTES", 64)
    torch.manual_seed(1)
    bw = _grads_match(CASES[case](torch.float32), torch.randn(4, 16, 24) * 3 + 1, requires_grad=True)
    assert "template: layer norm backward" in bw.source
    assert "fx_heap + " in bw.source and "malloc(" in bw.source and "free(fx_heap);" in bw.source


def test_scratch_keeps_a_kernels_stack_arrays_within_the_budget():
    from fxforge.codegen.c.abi import STACK_MAX_BYTES, Scratch
    from fxforge.codegen.c.printer import array_decl

    s = Scratch()
    decls = [array_decl(s.alloc("float", f"a{i}", (8, 1024), 4)) for i in range(6)]  # 32 KiB each
    on_stack = [d for d in decls if "fx_heap" not in d]
    assert len(on_stack) * 32 * 1024 <= STACK_MAX_BYTES < (len(on_stack) + 1) * 32 * 1024
    assert decls[-1] == "float (*a5)[1024] = (float (*)[1024])(fx_heap + 32768);" and s.heap == 2 * 32768
    assert array_decl(s.alloc("double", "d", (3,), 8)) == "double* d = (double*)(fx_heap + 65536);"
