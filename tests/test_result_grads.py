"""GradsFromResults (lowering/result_grads.py): activation gradients read the activation's result."""

import shutil

import pytest
import torch
import torch.nn.functional as F
from torch._functorch import partitioners
from torch._functorch.aot_autograd import aot_function

import fxforge
from fxforge.lowering.result_grads import GradsFromResults

aten = torch.ops.aten
needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="the C backend needs a C compiler (cc)")


def rewritten_joint(f, *args):
    """``f``'s joint graph after ``GradsFromResults``, with its stats, through AOTAutograd."""
    seen = {}

    def partition(joint, joint_inputs, **kw):
        seen["stats"] = GradsFromResults()(joint).stats
        seen["joint"] = joint
        return partitioners.default_partition(joint, joint_inputs, **kw)

    g = aot_function(f, fw_compiler=lambda gm, _: gm, bw_compiler=lambda gm, _: gm, partition_fn=partition)
    g(*args).sum().backward()
    return seen["joint"], seen["stats"]["rewritten"]


def grad_reads(joint, target):
    (n,) = joint.graph.find_nodes(op="call_function", target=target)
    return n


ACTIVATIONS = {
    # name: (activation, rewritten): a slope or alpha below 0 keeps reading the input
    "relu6": (F.relu6, True),
    "hardtanh": (lambda x: F.hardtanh(x, -2.0, 3.0), True),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), True),
    "leaky_relu_negative_slope": (lambda x: F.leaky_relu(x, -0.5), False),
    "elu": (lambda x: F.elu(x, 1.5), True),
    "selu": (F.selu, True),
    "elu_negative_alpha": (lambda x: F.elu(x, -0.5), False),
}


def _inputs():
    """Values at the bounds exactly (0, 3 and 6 after doubling) and either side of them.  (Not
    NaN: eager's own hardtanh gradient at a NaN input differs between its vectorized loop and
    its scalar one.)"""
    x = torch.tensor([-4.0, -1.0, -0.0, 0.0, 1e-6, 1.0, 1.5, 3.0, 4.0, -1.5, 2.5, -2.0])
    return torch.cat([x, torch.randn(20) * 4]).requires_grad_()


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_gradient_from_the_result_is_eagers(name):
    act, rewritten = ACTIVATIONS[name]

    def f(x):
        return act(x * 2.0) * torch.linspace(-1, 1, x.numel())

    x = _inputs()
    joint, count = rewritten_joint(f, x)
    assert count == (1 if rewritten else 0)
    x_eager = x.detach().clone().requires_grad_()
    x_comp = x.detach().clone().requires_grad_()
    f(x_eager).sum().backward()
    torch.compile(f, backend=fxforge.backend(fxforge.Config(debug=True)))(x_comp).sum().backward()
    torch.testing.assert_close(x_comp.grad, x_eager.grad)


def test_the_gradient_reads_the_result_not_the_input():
    def f(x):
        return F.relu6(x * 2.0).sum(1)

    joint, count = rewritten_joint(f, torch.randn(4, 5, requires_grad=True))
    assert count == 1
    grad = grad_reads(joint, aten.hardtanh_backward.default)
    assert grad.args[1].target is aten.hardtanh.default


def test_an_input_read_elsewhere_in_the_backward_keeps_its_gradient():
    """``x * x`` reads ``x`` in the backward anyway, and nothing reads the result there: read
    from the result, the backward would need both saved."""
    def f(x):
        h = x * 2.0
        return F.relu6(h) + h * h

    joint, count = rewritten_joint(f, torch.randn(4, 5, requires_grad=True))
    assert count == 0
    assert grad_reads(joint, aten.hardtanh_backward.default).args[1].target is aten.mul.Tensor


@needs_cc
def test_a_conv_batch_norm_relu6_chain_saves_two_tensors_per_layer():
    """The batch norm's output is read by the ReLU6 only: the backward reads the ReLU6's result
    (which the next convolution's gradient reads anyway) and the convolution's output."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
                            torch.nn.Conv2d(8, 4, 1))
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU6(),
                              torch.nn.Conv2d(8, 4, 1))
    ref.load_state_dict(m.state_dict())
    b = fxforge.backend(fxforge.Config(codegen="c", debug=True))
    x = torch.randn(2, 3, 6, 6) * 4
    torch.compile(m, backend=b)(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    bw = next(c for c in b.compiled if c.stats["graph"] == "backward")
    saved = [n for n in bw.graph.graph.nodes if n.op == "placeholder" and not n.name.startswith("tangents")
             and tuple(n.meta["val"].shape) == (2, 8, 6, 6)]
    assert len(saved) == 2, [n.name for n in saved]
