"""ConvLayout (lowering/conv_layout.py): channels-last operands for convolutions, the layout
carried through what follows, and the traced layout back where something needs it."""

import pytest
import torch
import torch.nn.functional as F

import fxforge
from fxforge.core.graph import INPUT_STRIDES, VAL
from fxforge.lowering.conv_layout import ConvLayout

aten = torch.ops.aten
prims = torch.ops.prims
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not available")


class Net(torch.nn.Module):
    """Conv, batch norm, relu, a residual block, max pool, a strided conv, global pooling, head."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
                                        torch.nn.ReLU())
        self.body = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
                                        torch.nn.Conv2d(8, 8, 1, groups=2))
        self.down = torch.nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        h = self.stem(x)
        h = F.max_pool2d(h + self.body(h), 2)
        return self.head(self.down(h).mean((2, 3)))


def compiled(fn, codegen="auto", layout="auto", **kw):
    b = fxforge.backend(fxforge.Config(codegen=codegen, conv_layout=layout, debug=True))
    return torch.compile(fn, backend=b, **kw), b


def layout_stats(c):
    (rec,) = [p for p in c.stats["passes"] if p["name"] == "conv_layout"] or [None]
    return rec and rec["stats"]


def conv_inputs_channels_last(c) -> list[bool]:
    convs = [n for n in c.graph.graph.nodes if n.target is aten.convolution.default]
    return [n.args[0].meta[VAL].is_contiguous(memory_format=torch.channels_last) for n in convs]


@needs_onednn
@pytest.mark.parametrize("codegen", ["auto", "torch"])
def test_a_cnn_runs_channels_last_and_matches_eager(codegen):
    torch.manual_seed(0)
    m = Net().eval()
    with torch.no_grad():
        m.stem[1].running_mean.normal_()
        m.stem[1].running_var.uniform_(0.5, 2)
    cm, b = compiled(m, codegen)
    for _ in range(2):  # fresh inputs each call
        x = torch.randn(2, 3, 12, 12)
        with torch.no_grad():
            out = cm(x)
            torch.testing.assert_close(out, m(x), rtol=1e-4, atol=1e-4)
    (c,) = b.compiled
    assert conv_inputs_channels_last(c) == [True] * 4
    st = layout_stats(c)
    assert st["convolutions"] == 4 and st["channels_last_nodes"] > 4
    # only the image and three weights are copied (a 1x1 kernel's weight is channels-last as it
    # is): everything after the first convolution stays channels-last, and the head reads a
    # pooled (N, C) value
    assert st["layout_copies"] == 4


@needs_onednn
def test_outputs_keep_their_traced_strides():
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def f(x):
        y = conv(x).relu()
        return y, y.flatten(2).transpose(1, 2)  # a view of the value, as a ViT's patch embedding

    cm, b = compiled(f)
    x = torch.randn(2, 3, 5, 6)
    with torch.no_grad():
        got, want = cm(x), f(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()
    assert layout_stats(b.compiled[0])["convolutions"] == 1


@needs_onednn
def test_a_view_that_needs_the_traced_layout_gets_it():
    conv = torch.nn.Conv2d(3, 4, 3)
    lin = torch.nn.Linear(4 * 3 * 3, 2)

    def f(x):
        return lin(conv(x).view(x.shape[0], -1))  # (N, C*H*W): not a view of a channels-last value

    cm, b = compiled(f)
    x = torch.randn(2, 3, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), f(x))
    g = b.compiled[0].graph.graph
    (view,) = [n for n in g.nodes if n.target is aten.view.default and n.meta[VAL].dim() == 2]
    # the view reads a copy in the traced strides
    assert view.args[0].target is prims.copy_strided.default
    assert view.args[0].meta[VAL].is_contiguous()


@needs_onednn
def test_ops_that_read_memory_get_the_traced_layout():
    """A custom op (it may read its input's memory as it was traced) and ``as_strided`` (its result
    depends on strides) get the traced layout, not channels-last."""

    @torch.library.custom_op("fxforge_test::flat_first_row", mutates_args=())
    def flat_first_row(x: torch.Tensor) -> torch.Tensor:
        assert x.is_contiguous(), "the custom op was given another layout than traced"
        return x.reshape(x.shape[0], -1)[:, :5].clone()

    @flat_first_row.register_fake
    def _(x):
        return x.new_empty(x.shape[0], 5)

    conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def f(x):
        y = conv(x)
        return flat_first_row(y) + y.as_strided((2, 5), (1, 2)).sum()

    cm, b = compiled(f)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), f(x))


def train_step_matches_eager(cm, m, ref, x):
    cm(x).square().sum().backward()
    ref(x).square().sum().backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
        assert p.grad.stride() == q.grad.stride(), name
    for (name, p), q in zip(m.named_buffers(), ref.buffers()):
        torch.testing.assert_close(p, q, msg=name)


@needs_onednn
def test_a_training_step_runs_channels_last_and_its_gradients_match():
    """The forward keeps the activations it saves channels-last and tells AOTAutograd their
    strides; the backward adopts them, and its convolution gradients run channels-last too."""
    torch.manual_seed(0)
    m, ref = Net(), Net()
    ref.load_state_dict(m.state_dict())
    cm, b = compiled(m)
    train_step_matches_eager(cm, m, ref, torch.randn(2, 3, 12, 12))
    fw, bw = (next(c for c in b.compiled if c.stats["graph"] == k) for k in ("forward", "backward"))
    assert layout_stats(fw)["convolutions"] == 4
    st = layout_stats(bw)
    assert st["convolutions"] == 4 and st["given_inputs"] > 0  # convolution_backward nodes
    given = bw.graph.meta[INPUT_STRIDES]
    assert len(given) == st["given_inputs"]
    for n in bw.graph.graph.nodes:
        if n.name in given:  # saved activations, channels-last as the forward left them
            assert n.meta[VAL].dim() == 4 and n.meta[VAL].is_contiguous(memory_format=torch.channels_last)


@needs_onednn
def test_a_backward_run_eagerly_gets_its_inputs_in_the_traced_layout():
    """A backward graph fxforge could not compile runs as traced: the saved activations the
    forward laid out channels-last are copied back to the traced strides first."""

    def refuse_backward(gm):
        if any(n.op == "placeholder" and n.name.startswith("tangents") for n in gm.graph.nodes):
            raise RuntimeError("refused for the test")
        return gm

    torch.manual_seed(0)
    m, ref = Net(), Net()
    ref.load_state_dict(m.state_dict())
    b = fxforge.backend(fxforge.Config(passes={"after_fusion": [refuse_backward]}, debug=False))
    cm = torch.compile(m, backend=b)
    train_step_matches_eager(cm, m, ref, torch.randn(2, 3, 12, 12))
    assert [k for k, _ in b.failures] == ["backward"]
    (fw,) = b.compiled
    assert layout_stats(fw)["convolutions"] == 4


@needs_onednn
def test_symbolic_sizes_keep_the_traced_layout():
    conv = torch.nn.Conv2d(3, 4, 3)
    cd, bd = compiled(lambda x: conv(x).relu(), dynamic=True)
    with torch.no_grad():
        for n in (2, 3, 5):
            x = torch.randn(n, 3, 6, 6)
            torch.testing.assert_close(cd(x), conv(x).relu())
    assert all(layout_stats(c) == {"convolutions": 0} for c in bd.compiled)


def test_as_traced_leaves_the_graph_alone_and_bad_values_are_refused():
    conv = torch.nn.Conv2d(3, 4, 3)
    cm, b = compiled(lambda x: conv(x).relu(), layout="as_traced")
    x = torch.randn(1, 3, 5, 5)
    with torch.no_grad():
        torch.testing.assert_close(cm(x), conv(x).relu())
    assert layout_stats(b.compiled[0]) == {"convolutions": 0}
    assert conv_inputs_channels_last(b.compiled[0]) == [False]
    with pytest.raises(ValueError, match="conv_layout"):
        fxforge.Config(conv_layout="nhwc")
    with pytest.raises(ValueError, match="conv_layout"):
        ConvLayout("nhwc")


class UNetish(torch.nn.Module):
    """Group norm, SiLU, a transposed convolution, a channel cat of two layouts' worth of values,
    pooling, bilinear upsampling, adaptive pooling and a flatten into a linear head."""

    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.d1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU())
        self.d2 = nn.Sequential(nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU())
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.fuse = nn.Conv2d(32, 8, 3, padding=1)
        self.head = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):
        a = self.d1(x)
        u = self.up(self.d2(a))
        c = self.fuse(torch.cat([a, u], 1))
        c = c + F.interpolate(F.avg_pool2d(c, 2), scale_factor=2, mode="bilinear", align_corners=False)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(c, 4), 1))


class Mixed(torch.nn.Module):
    """A cat with the input, max pooling, a permute-reshape, a slice's softmax and a 3-D
    convolution of a repeated channel."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(11, 8, 3, padding=1)
        self.c3 = torch.nn.Conv3d(1, 4, 3, padding=1)

    def forward(self, x):
        z = F.max_pool2d(F.gelu(self.c2(torch.cat([x, F.relu(self.c1(x))], 1))), 2)
        v = self.c3(z[:, :1].unsqueeze(1).repeat(1, 1, 2, 1, 1))
        return (z.permute(0, 2, 3, 1).reshape(z.shape[0], -1).sum(1) + v.mean((1, 2, 3, 4))
                + z[..., 1:, :-1].softmax(-1).sum((1, 2, 3)))


@needs_onednn
@pytest.mark.parametrize("model", [UNetish, Mixed])
@pytest.mark.parametrize("train", [False, True])
def test_other_convolution_programs_match_eager(model, train):
    torch.manual_seed(0)
    m = model().train(train)
    ref = model().train(train)
    ref.load_state_dict(m.state_dict())
    cm, b = compiled(m)
    x = torch.randn(2, 3, 16, 16)
    if train:
        cm(x).square().sum().backward()
        ref(x).square().sum().backward()
        for (name, p), q in zip(m.named_parameters(), ref.parameters()):
            # (a bias before a batch norm has a gradient of rounding noise: atol at least 1e-5)
            scale = max(q.grad.abs().max().item(), 1.0)
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5 * scale, msg=name)
            assert p.grad.stride() == q.grad.stride(), name
    else:
        with torch.no_grad():
            got, want = cm(x), ref(x)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert got.stride() == want.stride()
    assert not b.failures
    assert layout_stats(b.compiled[0])["convolutions"] >= 3
