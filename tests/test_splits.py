"""SplitForFusion (lowering/splits.py): layer norm split on the compiled graph for the C backend."""

import shutil

import pytest
import torch

import fxforge
from fxforge.lowering.splits import SplitForFusion

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="the C backend needs a C compiler (cc)")


class Block(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x, r):
        return self.fc(self.norm(x + r)).transpose(1, 2).contiguous()


def test_forward_splits_the_norm_and_backward_keeps_atens_kernel():
    torch.manual_seed(0)
    m = Block()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    cm = torch.compile(m, backend=b)
    x, r = torch.randn(4, 8, 32, requires_grad=True), torch.randn(4, 8, 32)
    out = cm(x, r)
    ref = m(x.detach().requires_grad_(), r)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(out)
    out.backward(g)
    x2 = x.detach().requires_grad_()
    gx_fx = x.grad.clone()
    grads_fx = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    m(x2, r).backward(g)
    torch.testing.assert_close(gx_fx, x2.grad)
    for a, e in zip(grads_fx, [p.grad for p in m.parameters()]):
        torch.testing.assert_close(a, e)
    fw, bw = (next(c for c in b.compiled if c.stats["graph"] == k) for k in ("forward", "backward"))
    (rec,) = [p for p in fw.stats["passes"] if p["name"] == "split_for_fusion"]
    assert rec["stats"] == {"split": 1}
    assert "native_layer_norm.default" not in fw.source
    # the residual add and the norm run as one C kernel (var_mean, its pointwise ops and the add)
    assert max(k.node_count for k in fw.kernels if k.backend == "c") >= 6
    # the backward graph was traced with the norm whole: one backward node, not its pieces'
    # gradients, run as the C backend's template kernel (codegen/c/templates.py)
    assert sum(n.target is torch.ops.aten.native_layer_norm_backward.default for n in bw.graph.graph.nodes) == 1
    assert "template: layer norm backward" in bw.source


def test_inference_with_dynamic_shapes_and_no_affine():
    def f(x):
        return torch.nn.functional.layer_norm(x * 2, x.shape[-1:]) + 1

    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    g = torch.compile(f, backend=b, dynamic=True)
    for n in (3, 7, 12):
        x = torch.randn(n, 5, 16)
        torch.testing.assert_close(g(x), f(x))
    assert len(b.compiled) == 1


def test_unknown_split_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="aten.native_layer_norm.default"):
        SplitForFusion(("aten.softmax.int",))


def test_the_torch_backend_keeps_the_norm_whole():
    b = fxforge.backend(fxforge.Config(codegen="torch", debug=True))
    g = torch.compile(lambda x: torch.nn.functional.layer_norm(x, (8,)), backend=b)
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(g(x), torch.nn.functional.layer_norm(x, (8,)))
    assert not any(p["name"] == "split_for_fusion" for p in b.compiled[0].stats["passes"])


class ConvBlock(torch.nn.Module):
    def __init__(self, affine=True):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 6, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(6, affine=affine)

    def forward(self, x, r):
        return torch.relu(self.bn(self.conv(x)) + r)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("layout", ["auto", "as_traced"])
def test_inference_batch_norm_fuses_with_the_activation_and_the_residual_add(affine, layout):
    torch.manual_seed(0)
    m = ConvBlock(affine).eval()
    with torch.no_grad():  # statistics and affine terms away from the identity
        m.bn.running_mean.normal_()
        m.bn.running_var.uniform_(0.5, 2.0)
        if affine:
            m.bn.weight.normal_()
            m.bn.bias.normal_()
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True, conv_layout=layout))
    cm = torch.compile(m, backend=b)
    x, r = torch.randn(2, 4, 7, 9), torch.randn(2, 6, 7, 9)
    with torch.no_grad():
        out = cm(x, r)
        torch.testing.assert_close(out, m(x, r))
    (c,) = b.compiled
    assert "batch_norm" not in c.source
    # normalize, affine, residual add and relu: one C kernel over the convolution's output
    assert max(k.node_count for k in c.kernels if k.backend == "c") >= (6 if affine else 4)


def test_a_batch_norm_whose_statistics_are_read_stays_atens():
    """An inference batch norm's second and third outputs are not computed by the split."""
    x = torch.randn(2, 3, 4, 4)
    w, b_, rm, rv = torch.randn(3), torch.randn(3), torch.randn(3), torch.rand(3) + 0.5

    def f(x):
        out, mean, rstd = torch.ops.aten._native_batch_norm_legit_no_training(x, w, b_, rm, rv, 0.1, 1e-5)
        return out.relu(), mean.sum() + rstd.sum()

    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    with torch.no_grad():
        got = torch.compile(f, backend=b)(x)
    torch.testing.assert_close(got, f(x))
    (rec,) = [p for p in b.compiled[0].stats["passes"] if p["name"] == "split_for_fusion"]
    assert rec["stats"]["split"] == 0


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("layout", ["auto", "as_traced"])
def test_training_batch_norm_is_split_and_fuses_with_the_activation(affine, layout):
    """A training batch norm: its statistics two column sums over the channels, its output a
    pointwise kernel with the residual add and the relu; its gradient two column sums and a
    pointwise kernel.  Gradients, outputs and the running statistics as eager's."""
    torch.manual_seed(0)
    m = ConvBlock(affine)
    if affine:
        with torch.no_grad():
            m.bn.weight.normal_()
            m.bn.bias.normal_()
    ref = ConvBlock(affine)
    ref.load_state_dict(m.state_dict())
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True, conv_layout=layout))
    cm = torch.compile(m, backend=b)
    for _ in range(2):  # the running statistics move twice
        x, r = torch.randn(2, 4, 7, 9) * 3 + 1, torch.randn(2, 6, 7, 9)
        out = cm(x, r)
        want = ref(x, r)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        out.square().sum().backward()
        want.square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):  # (a channels-last convolution's sums)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    torch.testing.assert_close(m.bn.running_mean, ref.bn.running_mean)
    torch.testing.assert_close(m.bn.running_var, ref.bn.running_var)
    assert m.bn.num_batches_tracked.item() == 2
    for c in b.compiled:
        assert "batch_norm" not in c.source, c.stats["graph"]
    fw = next(c for c in b.compiled if c.stats["graph"] == "forward")
    # normalize, affine, residual add, relu: one kernel over the convolution's output
    assert max(k.node_count for k in fw.kernels if k.backend == "c") >= (5 if affine else 3)


def test_a_batch_norm_over_one_value_per_channel_or_dynamic_shapes_stays_atens():
    """Statistics over one element per channel (eager raises on it in training) and sizes only
    known at run time keep ATen's kernel."""
    from fxforge.lowering.splits import _per_channel_count

    class V:
        def __init__(self, t):
            self.meta = {"val": t}

    assert _per_channel_count(V(torch.empty(1, 3))) is None
    assert _per_channel_count(V(torch.empty(2, 3, 4))) == 8
    torch.manual_seed(0)
    m = torch.nn.BatchNorm1d(5)
    ref = torch.nn.BatchNorm1d(5)
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    cm = torch.compile(m, backend=b, dynamic=True)
    for n in (6, 9):
        x = torch.randn(n, 5, requires_grad=True)
        x2 = x.detach().clone().requires_grad_()
        cm(x).sum().backward()
        ref(x2).sum().backward()
        torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(m.running_var, ref.running_var)


def test_log_softmax_over_empty_rows_is_left_to_aten():
    """The split's ``amax`` has no identity: rows of length 0 (a training graph, where the split
    runs before partitioning) must not be split; eager gives an empty result and gradient."""
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    f = torch.compile(lambda x: torch.log_softmax(x, -1) * 2, backend=b, fullgraph=True)
    x = torch.randn(3, 0, requires_grad=True)
    out = f(x)
    (g,) = torch.autograd.grad(out, x, torch.randn(out.shape))
    assert out.shape == (3, 0) and g.shape == (3, 0)
    x = torch.randn(3, 5, requires_grad=True)  # the split itself still matches eager
    ref = torch.log_softmax(x, -1) * 2
    torch.testing.assert_close(f(x), ref)
