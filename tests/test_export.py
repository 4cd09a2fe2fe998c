"""compile_exported / apply_passes on torch.export programs."""

import pytest
import torch
import torch.fx as fx

import fxforge
from fxforge.infra.pass_manager import PassResult


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)
        self.l2 = torch.nn.Linear(32, 8)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x, *, scale=None):
        self.calls.add_(1)
        h = torch.nn.functional.gelu(self.ln(self.l1(x)))
        a, b = h.split(16, dim=-1)
        y = self.l2(torch.cat([b, a], -1)).softmax(-1)
        if scale is not None:
            y = y * scale
        return {"y": y, "mean": y.mean(0)}


def test_compile_exported_matches_module_and_mutates_buffers():
    torch.manual_seed(0)
    m = Block().eval()
    ep = torch.export.export(m, (torch.randn(4, 16),), {"scale": torch.randn(8)})
    c = fxforge.compile_exported(ep, fxforge.Config(debug=True))
    ref_mod = ep.module()
    calls = c.program.state_dict["calls"]
    for _ in range(2):  # fresh inputs each call
        x, s = torch.randn(4, 16), torch.randn(8)
        before = calls.item()
        out = c(x, scale=s)
        # the buffer mutation is written back to the program's state, as ep.module() does
        assert calls.item() == before + 1
        ref = ref_mod(x, scale=s)
        assert set(out) == {"y", "mean"}
        torch.testing.assert_close(out["y"], ref["y"])
        torch.testing.assert_close(out["mean"], ref["mean"])
    assert c.stats["kernels"] > 0 and c.stats["nodes_in"] > 0
    assert c.stats["arena_bytes"] >= c.stats["lower_bound_bytes"] > 0


def test_compile_exported_rejects_wrong_inputs():
    ep = torch.export.export(Block().eval(), (torch.randn(4, 16),))
    c = fxforge.compile_exported(ep)
    with pytest.raises(TypeError, match="signature"):
        c(torch.randn(4, 16), torch.randn(4, 16))
    with pytest.raises(TypeError, match="ExportedProgram"):
        fxforge.compile_exported(Block())


def test_compile_exported_gpt2_matches_module():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
        bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ep = torch.export.export(model, (torch.randint(0, 256, (2, 32)),))
    c = fxforge.compile_exported(ep, fxforge.Config(debug=True))
    ids = torch.randint(0, 256, (2, 32))
    out, ref = c(ids), ep.module()(ids)
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-4)
    assert c.stats["kernels"] >= 50
    assert c.stats["fallback_nodes"] == 0, c.stats["fallbacks"]


def test_side_effect_nodes_survive_dead_code_elimination():
    class M(torch.nn.Module):
        def forward(self, x):
            return (x.to(torch.float64) * 2).sum()  # export records _assert_tensor_metadata for .to

    ep = torch.export.export(M(), (torch.randn(3, 3),))
    ops = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten._assert_tensor_metadata.default in ops
    c = fxforge.compile_exported(ep, fxforge.Config(debug=True, decompose="none"))
    kept = [n.target for n in c.graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten._assert_tensor_metadata.default in kept
    x = torch.randn(3, 3)
    torch.testing.assert_close(c(x), ep.module()(x))


def test_custom_op_in_exported_program_runs_as_fallback():
    @torch.library.custom_op("fxforge_test::scaled_tanh", mutates_args=())
    def scaled_tanh(x: torch.Tensor, k: float) -> torch.Tensor:
        return torch.tanh(x) * k

    @scaled_tanh.register_fake
    def _(x, k):
        return torch.empty_like(x)

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.ops.fxforge_test.scaled_tanh(x + 1, 3.0).relu()

    ep = torch.export.export(M(), (torch.randn(5, 4),))
    c = fxforge.compile_exported(ep, fxforge.Config(debug=True))
    x = torch.randn(5, 4)
    torch.testing.assert_close(c(x), ep.module()(x))
    assert c.stats["fallback_nodes"] == 1
    assert any("custom operator" in r for r in c.stats["fallbacks"].values())
    assert "fxforge_test.scaled_tanh" in c.source


def test_apply_passes_on_exported_program_and_graph_module():
    seen = []

    def count_nodes(gm: fx.GraphModule):
        seen.append(sum(1 for n in gm.graph.nodes if n.op == "call_function"))
        return PassResult(gm, False)

    def relu_to_clamp(gm: fx.GraphModule):
        changed = False
        for n in gm.graph.nodes:
            if n.target is torch.ops.aten.relu.default:
                n.target = torch.ops.aten.clamp_min.default
                n.args = (n.args[0], 0.0)
                changed = True
        return changed

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l = torch.nn.Linear(6, 6)

        def forward(self, x):
            return self.l(x).relu() * 2

    m = M()
    ep = torch.export.export(m, (torch.randn(2, 6),))
    gm = fxforge.apply_passes(ep, [count_nodes, relu_to_clamp, count_nodes], debug=True)
    x = torch.randn(2, 6)
    torch.testing.assert_close(gm(x), m(x))
    assert seen and seen[0] == seen[1]
    assert torch.ops.aten.clamp_min.default in [n.target for n in gm.graph.nodes]
    # a plain GraphModule works too, and runs
    gm2 = fxforge.apply_passes(torch.fx.symbolic_trace(m), [relu_to_clamp], debug=False)
    torch.testing.assert_close(gm2(x), m(x))
