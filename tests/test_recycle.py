"""Recycled outputs (``Config.recycle_outputs``, ``runtime.Recycled``): a large fresh output is
allocated over an earlier call's bytes only when nothing the caller can reach refers to them."""

import weakref

import pytest
import torch

import fxforge
from fxforge.codegen import runtime
from thread_helpers import run_in_threads

CODEGENS = ["torch", "c"]


def head(x, w):
    return (x @ w).relu() * 2  # 256 x 1024 float32: 1 MiB


def compiled(codegen="torch", **config):
    b = fxforge.backend(fxforge.Config(codegen=codegen, debug=True, **config))
    return torch.compile(head, backend=b), b


def call(f, w):
    x = torch.randn(256, 64)
    with torch.no_grad():
        return f(x, w), head(x, w)


@pytest.mark.parametrize("codegen", CODEGENS)
def test_a_dropped_result_is_written_again_and_a_kept_one_never(codegen):
    f, b = compiled(codegen)
    w = torch.randn(64, 1024)
    r, ref = call(f, w)
    c = b.compiled[0]
    assert c.stats["recycled_bytes"] == 256 * 1024 * 4
    assert "_recycled.empty(" in c.source
    first = r.data_ptr()
    del r
    r, ref = call(f, w)
    assert r.data_ptr() == first  # nothing held it: the same bytes
    torch.testing.assert_close(r, ref)
    # each way a caller can keep the result keeps its bytes from being written again: (keep it,
    # read it back)
    keeps = {
        "tensor": (lambda r: r, lambda k, ref: (k, ref)),
        "view": (lambda r: r[3:], lambda k, ref: (k, ref[3:])),
        "detached": (lambda r: r.detach(), lambda k, ref: (k, ref)),
        "storage": (lambda r: r.untyped_storage(),
                    lambda k, ref: (torch.empty(0).set_(k, 0, ref.shape, ref.stride()), ref)),
        "numpy": (lambda r: r.numpy(), lambda k, ref: (torch.from_numpy(k), ref)),
        "in a list": (lambda r: [r.view(-1)], lambda k, ref: (k[0].view(ref.shape), ref)),
    }
    for how, (keep, read) in keeps.items():
        r, ref = call(f, w)
        kept, ptr = keep(r), r.data_ptr()
        del r
        for _ in range(3):
            r2, ref2 = call(f, w)
            assert r2.data_ptr() != ptr, how
            torch.testing.assert_close(r2, ref2)
            del r2
        torch.testing.assert_close(*read(kept, ref), msg=how)
        del kept
    # a weak reference does not keep it
    r, ref = call(f, w)
    ptr, alive = r.data_ptr(), weakref.ref(r)
    del r
    r, ref = call(f, w)
    assert alive() is None and r.data_ptr() == ptr


def test_the_loop_that_holds_the_last_result_takes_turns_between_two_buffers():
    f, _ = compiled("c")
    w = torch.randn(64, 1024)
    out, ref = call(f, w)
    addresses = {out.data_ptr()}
    for _ in range(6):
        prev, prev_ref = out, ref
        out, ref = call(f, w)  # ``prev`` is alive while this call runs
        torch.testing.assert_close(prev, prev_ref)
        torch.testing.assert_close(out, ref)
        addresses.add(out.data_ptr())
    assert len(addresses) == 2


def test_results_kept_by_the_caller_are_all_distinct():
    f, _ = compiled("c")
    w = torch.randn(64, 1024)
    results = [call(f, w) for _ in range(5)]
    assert len({r.data_ptr() for r, _ in results}) == 5
    for r, ref in results:
        torch.testing.assert_close(r, ref)


def test_small_outputs_and_never_are_not_recycled():
    f, b = compiled("c", recycle_min_bytes=2 << 20)
    call(f, torch.randn(64, 1024))
    f2, b2 = compiled("c", recycle_outputs="never")
    call(f2, torch.randn(64, 1024))
    for c in (b.compiled[0], b2.compiled[0]):
        assert c.stats["recycled_bytes"] == 0 and "_recycled" not in c.source


def test_symbolic_sizes_are_not_recycled():
    b = fxforge.backend(fxforge.Config(debug=True))
    f = torch.compile(head, backend=b, dynamic=True)
    w = torch.randn(64, 1024)
    with torch.no_grad():
        for n in (256, 300):
            x = torch.randn(n, 64)
            torch.testing.assert_close(f(x, w), head(x, w))
    assert all(c.stats["recycled_bytes"] == 0 for c in b.compiled)


@pytest.mark.parametrize("policy", ["inference", "always"])
def test_training_steps(policy):
    """A training step's graphs recycle only under "always", and stay right step after step."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    ref = torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512))
    ref.load_state_dict(m.state_dict())
    b = fxforge.backend(fxforge.Config(codegen="c", recycle_outputs=policy))
    cm = torch.compile(m, backend=b)
    for _ in range(3):
        x = torch.randn(256, 64)
        for p, q in zip(m.parameters(), ref.parameters()):
            p.grad = q.grad = None
        out = cm(x)
        out.square().mean().backward()
        expected = ref(x)
        expected.square().mean().backward()
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    recycled = {c.stats["graph"]: c.stats["recycled_bytes"] for c in b.compiled}
    assert set(recycled) == {"forward", "backward"}
    assert (sum(recycled.values()) > 0) == (policy == "always"), recycled


def test_calls_from_two_threads_never_share_a_buffer():
    f, _ = compiled("c")
    w = torch.randn(64, 1024)
    call(f, w)  # compiled before the threads start

    def work():
        for _ in range(30):
            r, ref = call(f, w)
            torch.testing.assert_close(r, ref)

    run_in_threads(work, 2)


def test_recycled_hands_out_only_what_nothing_refers_to():
    """``runtime.Recycled`` itself, whatever graph calls it."""
    rec = runtime.Recycled()
    a = rec.empty("b", (4, 8), (8, 1), torch.float32)
    a.fill_(1.0)
    pa = a.data_ptr()
    b = rec.empty("b", (4, 8), (8, 1), torch.float32)  # ``a`` is alive
    assert b.data_ptr() != pa
    storage = a.untyped_storage()
    del a
    c = rec.empty("b", (4, 8), (8, 1), torch.float32)  # ``a``'s storage object is alive, ``b`` too
    pc = c.data_ptr()
    assert pc not in (pa, b.data_ptr())
    del storage, c
    d = rec.empty("b", (4, 8), (8, 1), torch.float32)  # the last two: ``b`` (alive) and ``c`` (dropped)
    assert d.data_ptr() == pc
    e = rec.empty("b", (4, 8), (8, 1), torch.float32)  # ``b`` and ``d`` alive
    assert e.data_ptr() not in (b.data_ptr(), d.data_ptr())


def test_bad_settings_name_the_knob():
    with pytest.raises(ValueError, match="recycle_outputs"):
        fxforge.Config(recycle_outputs="sometimes")
    with pytest.raises(ValueError, match="recycle_min_bytes"):
        fxforge.Config(recycle_min_bytes=-1)
