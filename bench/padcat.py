"""Zero-copy cat and pad: bytes moved and bytes accessed per call, fxforge vs the ideal vs Inductor.

    python bench/padcat.py [--no-models] [--out bench/results/padcat.md]

Cases (graphs built here, random float32 inputs, codegen torch, inference):

* four micro cases (64x48 operands, every cat/pad input computed in the graph);
* LLaMA's rotary embedding at llama-2l's sizes (batch 2, seq 128, 4 heads of 64), with
  transformers' own code: ``LlamaRotaryEmbedding`` (``cat((freqs, freqs))``) and
  ``apply_rotary_pos_emb`` on projected q and k (``rotate_half``: ``cat((-x2, x1))``);
* a KV-cache update as LLaMA decodes one token with a 128-token ``DynamicCache``: k and v
  projected, k rotated, then ``DynamicLayer.update``'s ``cat([past, new], -2)`` for each.

Two kinds of figure, in separate column groups:

* **moved**: bytes written by data movement (copies, fills) in one call.  ``fxforge`` is measured
  by ``fxforge.testing.CopyCounter`` around the compiled call (and checked equal to
  ``stats["copy_bytes"]``); ``zero-copy off`` the same with ``Config(zero_copy=False)``;
  ``ideal`` is analytic, for cats and pads that are built: an input that is a graph input, a
  view of another buffer, or the same value a second time is copied once, an input computed in
  the graph costs nothing (its producer writes it in place), a pad's border is filled once.
* **accessed**: bytes read plus bytes written by every kernel of the call, the figure Inductor
  reports (``torch._inductor.metrics.num_bytes_accessed``, CPU, counters reset and caches off
  before a cold compile).  ``fxforge`` is measured by ``Traffic`` below, a dispatch counter around
  the compiled call: the torch backend runs one ATen kernel per op (pointwise ops are not fused
  there), so each op reads its inputs and writes its output.  ``ideal`` is analytic, the traffic
  of the ideal plan above with every other elementwise op fused: each cat and pad is built, its
  computed inputs written in place by their producers (which read what they compute from), its
  copied inputs read and written once, its border written; each graph input read once, each
  output written once; each matmul reads its operands and writes its result.  Where fxforge's
  accessed exceeds it while its moved equals the ideal, the difference is the torch backend's
  unfused elementwise intermediates, not copies; where Inductor's is below it, Inductor did not
  build the cat at all (it fused it into its consumer).

Unless ``--no-models``, the corpus models follow (demo GPT, 2-layer GPT-2 / LLaMA / BERT
inference, and a LLaMA decode step with a 128-token ``DynamicCache``): bytes moved per call
(whole graph, measured, zero-copy on and off), then every cat and pad of their graphs grouped by
the kind of its inputs, with fxforge's bytes, the ideal and the reasons for each copy.  Inductor
has no per-cat figure inside a model (its kernels fuse each cat with its neighbours); the
isolated LLaMA cases above are those cats, at the same sizes, with the code that produces them.
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import os
import re
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import measure  # noqa: E402

import fxforge  # noqa: E402
from fxforge.artifact.compiled import Compiled  # noqa: E402
from fxforge.core.copies import node_copy_bytes  # noqa: E402
from fxforge.core.graph import VAL, node_kind  # noqa: E402
from fxforge.core.regions import PAD, container_inputs, is_container, pad_border  # noqa: E402
from fxforge.testing import CopyCounter  # noqa: E402

F32 = 4
R, C = 64, 48
B, S, H, D = 2, 128, 4, 64  # llama-2l: batch, sequence, heads, head dim
E = H * D


def nb(*shape: int, itemsize: int = F32) -> int:
    return math.prod(shape) * itemsize


def mm_bytes(m: int, k: int, n: int) -> int:
    """What an (m, k) @ (k, n) reads and writes."""
    return nb(m, k) + nb(k, n) + nb(m, n)


# --------------------------------------------------------------------------- measuring


class Traffic(TorchDispatchMode):
    """Bytes read and written by every ATen call dispatched inside it: a call reads each tensor
    argument it does not write and writes its out=/in-place tensors (else its results); views and
    allocations move nothing.  A tensor counts each element its strides reach once (an expanded
    tensor is read at its real size)."""

    _ALLOC = {"empty", "empty_strided", "new_empty", "new_empty_strided", "empty_like"}
    _WRITE_ONLY = {"copy_", "fill_", "zero_"}  # in-place ops that do not read what they write

    def __init__(self):
        super().__init__()
        self.read = self.written = 0

    @property
    def bytes(self) -> int:
        return self.read + self.written

    @staticmethod
    def size(t: torch.Tensor) -> int:
        if t.numel() == 0:
            return 0
        return math.prod(s for s, st in zip(t.shape, t.stride()) if st != 0) * t.element_size()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        schema = func._schema
        name = schema.name.split("::", 1)[1]
        if name in self._ALLOC or any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
            return result  # a view or an allocation
        bound = dict(zip((a.name for a in schema.arguments), args)) | kwargs
        written, read = [], []
        for a in schema.arguments:
            v = bound.get(a.name)
            ts = [v] if isinstance(v, torch.Tensor) else [x for x in v if isinstance(x, torch.Tensor)] \
                if isinstance(v, (list, tuple)) else []
            is_write = a.alias_info is not None and a.alias_info.is_write
            (written if is_write else read).extend(ts)
            if is_write and not a.is_out and name not in self._WRITE_ONLY:
                read.extend(ts)  # add_(x): self is read too
        if not written:
            written = [result] if isinstance(result, torch.Tensor) else [t for t in result if isinstance(t, torch.Tensor)]
        self.read += sum(self.size(t) for t in read)
        self.written += sum(self.size(t) for t in written)
        return result


class captured_calls:
    """Records the argument list each ``Compiled`` receives from dynamo (its placeholders in
    order, parameters included) on its first call, so that call can be replayed under a dispatch
    mode: torch.compile does not run frames under one."""

    def __enter__(self):
        self.calls: dict[int, tuple[Compiled, list]] = {}
        self.original = original = Compiled.call_boxed

        def call_boxed(c, args):
            self.calls.setdefault(id(c), (c, list(args)))
            return original(c, args)

        call_boxed._boxed_call = True  # type: ignore[attr-defined]
        Compiled.call_boxed = call_boxed
        return self

    def __exit__(self, *exc):
        Compiled.call_boxed = self.original

    def replay(self, counter) -> list[Compiled]:
        """Runs every recorded call again inside ``counter``; the Compiled objects, in call order."""
        out = []
        for c, args in self.calls.values():
            with torch.no_grad(), counter:
                c.call_boxed(list(args))
            out.append(c)
        return out


class _Refusals(logging.Handler):
    """The zero-copy pass's DEBUG lines ("cat input 1 (slice_4) is copied, not written in place:
    view"), each with the index of the graph being compiled (``len(backend.compiled)`` then)."""

    LINE = re.compile(r"fxforge: (\S+) input (\d+) \((.*)\) is copied, not written in place: (\w+)")

    def __init__(self, backend):
        super().__init__(logging.DEBUG)
        self.backend, self.found = backend, {}

    def emit(self, record):
        m = self.LINE.fullmatch(record.getMessage())
        if m:
            self.found[(len(self.backend.compiled), m[1], int(m[2]))] = m[4]


def compiled_by(fn: Callable, args: tuple, kwargs: dict | None = None, **config) -> tuple[Any, captured_calls, dict, Any]:
    """The backend, the calls it received, the zero-copy refusals ((graph index, container name,
    input index) -> reason) and what the compiled call returned."""
    torch._dynamo.reset()
    b = fxforge.backend(fxforge.Config(codegen="torch", **config))
    log, handler = logging.getLogger("fxforge"), _Refusals(b)
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        with torch.no_grad(), captured_calls() as calls:
            result = torch.compile(fn, backend=b)(*args, **(kwargs or {}))
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    return b, calls, handler.found, result


def fxforge_figures(fn, args, kwargs=None, **config) -> dict:
    """moved (CopyCounter, checked against stats), accessed (Traffic), refusals, graphs, result."""
    b, calls, why, result = compiled_by(fn, args, kwargs, **config)
    moved = traffic = 0
    refused: Counter = Counter()
    for c, a in calls.calls.values():
        with torch.no_grad(), CopyCounter() as copies:
            c.call_boxed(list(a))
        assert copies.bytes == c.stats["copy_bytes"], (copies.calls, c.stats["copy_bytes"])
        with torch.no_grad(), Traffic() as t:
            c.call_boxed(list(a))
        moved, traffic = moved + copies.bytes, traffic + t.bytes
        refused.update(c.stats["refused_zero_copy"])
    return {"moved": moved, "accessed": traffic, "refused": dict(refused), "compiled": list(b.compiled), "why": why,
            "result": result}


def inductor_bytes(fn, args, kwargs=None) -> int | None:
    try:
        from torch._inductor import metrics
    except ImportError:
        return None
    torch._dynamo.reset()
    metrics.reset()
    torch._logging.set_logs(inductor_metrics=True)  # Inductor counts bytes only with this log on
    try:
        with torch.no_grad(), measure.fresh_inductor():  # a cached compile would count nothing
            torch.compile(fn, backend="inductor")(*args, **(kwargs or {}))
    finally:
        torch._logging.set_logs()
    return int(metrics.num_bytes_accessed)


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    fn: Callable
    args: tuple
    ideal_moved: int
    ideal_accessed: int  # module docstring


def cat_feeding_mm(a, b, w):
    x = a * 2  # in the cat and read by an mm
    return torch.cat([x, b + 1], 1) @ w, x @ w[:C]


def micro_cases() -> dict[str, Case]:
    a, b, w = torch.randn(R, C), torch.randn(R, C), torch.randn(2 * C, 32)
    ab = 2 * nb(R, C)  # reading a and b
    return {
        "cat input also feeds an mm": Case(
            cat_feeding_mm, (a, b, w),
            0, ab + nb(R, 2 * C) + mm_bytes(R, 2 * C, 32) + mm_bytes(R, C, 32)),
        "pad of a cat": Case(
            lambda a, b: F.pad(torch.cat([a * 2, b + 1], 1), (1, 2, 3, 0)), (a, b),
            nb(R + 3, 2 * C + 3) - nb(R, 2 * C), ab + nb(R + 3, 2 * C + 3)),
        "cat of two 2-D pads": Case(
            lambda a, b: torch.cat([F.pad(a * 2, (1, 1)), F.pad(b + 1, (0, 2, 1, 0))], 0), (a, b),
            nb(R, 2) + nb(R + 1, C + 2) - nb(R, C), ab + nb(R, C + 2) + nb(R + 1, C + 2)),
        "left pad with an mm consumer": Case(
            lambda a, w: F.pad(torch.sin(a), (4, 0)) @ w[:C + 4], (a, w),
            nb(R, 4), nb(R, C) + nb(R, C + 4) + mm_bytes(R, C + 4, 32)),
    }


def _llama():
    try:
        import transformers
        from transformers.models.llama import modeling_llama
    except ImportError:
        return None
    return transformers, modeling_llama


def llama_cases() -> dict[str, Case]:
    """LLaMA's rotary embedding and KV-cache update with transformers' own functions, llama-2l sizes."""
    found = _llama()
    if found is None:
        return {}
    transformers, L = found
    config = transformers.LlamaConfig(hidden_size=E, num_attention_heads=H, num_key_value_heads=H,
                                      max_position_embeddings=S)
    rotary = L.LlamaRotaryEmbedding(config)
    x, pos = torch.randn(B, S, E), torch.arange(S)[None]
    wq, wk, wv = (torch.randn(E, E) / 16 for _ in range(3))
    cos, sin = (t.contiguous() for t in rotary(x, pos))

    def heads(t):
        return t.view(t.shape[0], t.shape[1], H, D).transpose(1, 2)

    def rope(x, wq, wk, cos, sin):  # LlamaAttention.forward up to the cache
        return L.apply_rotary_pos_emb(heads(F.linear(x, wq)), heads(F.linear(x, wk)), cos, sin)

    def kv_update(x, past_k, past_v, wk, wv, cos, sin):  # decoding one token: k rotated, then cached
        k, v = heads(F.linear(x, wk)), heads(F.linear(x, wv))
        k = k * cos.unsqueeze(1) + L.rotate_half(k) * sin.unsqueeze(1)  # apply_rotary_pos_emb's k
        return torch.cat([past_k, k], -2), torch.cat([past_v, v], -2)  # DynamicLayer.update

    x1, cos1, sin1 = torch.randn(B, 1, E), cos[:, -1:].contiguous(), sin[:, -1:].contiguous()
    past_k, past_v = torch.randn(B, H, S, D), torch.randn(B, H, S, D)
    def rotated(s: int) -> int:
        """Traffic of k * cos + rotate_half(k) * sin for one (B, H, s, D) tensor, its cat built:
        -x2 read and written into its half, x1 copied (read and written), then one kernel reading
        k and the cat and writing the result (cos and sin are counted once by the caller)."""
        half, full = nb(B, H, s, D // 2), nb(B, H, s, D)
        return 2 * half + 2 * half + 3 * full

    return {
        "LLaMA rotary cos/sin: cat((freqs, freqs))": Case(
            lambda x, pos: rotary(x, pos), (x, pos),
            nb(1, S, D // 2),  # the second freqs: the same value again
            # freqs reads the positions and inv_freq and writes half of emb; the second half is a
            # copy (read, written); one kernel reads emb and writes cos and sin
            nb(1, S, itemsize=8) + nb(D // 2) + nb(1, S, D // 2) + 2 * nb(1, S, D // 2) + nb(1, S, D) + 2 * nb(1, S, D)),
        "LLaMA rotate_half on q and k: cat((-x2, x1))": Case(
            rope, (x, wq, wk, cos, sin),
            2 * nb(B, H, S, D // 2),  # x1 of q and of k: views of the projections
            2 * mm_bytes(B * S, E, E) + 2 * rotated(S) + 2 * nb(1, S, D)),
        "KV-cache update, LLaMA decode (128 cached)": Case(
            kv_update, (x1, past_k, past_v, wk, wv, cos1, sin1),
            # past k and v (graph inputs), the new v (a view of its projection), rotate_half's x1
            2 * nb(B, H, S, D) + nb(B, H, 1, D) + nb(B, H, 1, D // 2),
            # projections; k rotated (written into the cache); past k, past v and the new v copied
            2 * mm_bytes(B, E, E) + rotated(1) + 2 * nb(1, 1, D) + 2 * 2 * nb(B, H, S, D) + 2 * nb(B, H, 1, D)),
    }


def case_rows() -> list[str]:
    rows = []
    for name, case in {**micro_cases(), **llama_cases()}.items():
        on = fxforge_figures(case.fn, case.args)
        off = fxforge_figures(case.fn, case.args, zero_copy=False)
        ind = inductor_bytes(case.fn, case.args)
        refused = ", ".join(f"{k}: {v}" for k, v in sorted(on["refused"].items())) or "—"
        rows.append(f"| {name} | {on['moved']:,} | {case.ideal_moved:,} | {off['moved']:,} | "
                    f"{on['accessed']:,} | {'—' if ind is None else f'{ind:,}'} | {case.ideal_accessed:,} | {refused} |")
    return rows


# --------------------------------------------------------------------------- models


def input_kinds(n: fx.Node) -> list[str]:
    """What each input of container ``n`` is: a graph input, a view, the same value again, or
    computed in the graph."""
    out, seen = [], []
    for a in container_inputs(n):
        if not isinstance(a, fx.Node) or a.op in ("placeholder", "get_attr"):
            out.append("input")
        elif any(a is s for s in seen):
            out.append("again")
        elif node_kind(a) == "view":
            out.append("view")
        else:
            out.append("computed")
        seen.append(a)
    return out


def ideal_bytes(n: fx.Node, hint) -> int:
    """The ideal for container ``n``: its graph inputs, views and repeats copied, its border filled."""
    val = n.meta[VAL]
    size = lambda shape: hint(math.prod(shape) * val.dtype.itemsize)  # noqa: E731
    total = sum(size(a.meta[VAL].shape) for a, k in zip(container_inputs(n), input_kinds(n)) if k != "computed")
    if n.target is PAD:
        total += sum(size(shape) for _, shape in pad_border(n))
    return total


def container_table(graphs: dict[str, tuple[list[Compiled], dict]]) -> list[str]:
    """Every cat and pad of the graphs, grouped by model, op, input kinds and result type."""
    groups: dict[tuple, list] = {}
    for model, (compiled, why) in graphs.items():
        for i, c in enumerate(compiled):
            hint = c.plan.memory.hint
            for n in c.graph.graph.nodes:
                if not is_container(n):
                    continue
                val = n.meta[VAL]
                key = (model, "cat" if n.target is not PAD else "pad", ", ".join(input_kinds(n)),
                       f"{str(val.dtype).replace('torch.', '')}{list(val.shape)}")
                g = groups.setdefault(key, [0, 0, 0, 0, Counter()])
                g[0] += 1
                g[1] += node_copy_bytes(n, hint)
                g[2] += ideal_bytes(n, hint)
                g[3] += hint(math.prod(val.shape) * val.dtype.itemsize)  # zero-copy off: the whole result
                g[4].update(why[(i, n.name, j)] for j in range(len(container_inputs(n))) if (i, n.name, j) in why)
    rows = [
        "| model | op (inputs) | result | count | fxforge moved | ideal moved | zero-copy off | inputs copied (reason: count) |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    for (model, op, kinds, result), (count, got, ideal, off, why) in groups.items():
        said = ", ".join(f"{k}: {v}" for k, v in sorted(why.items())) or "—"
        rows.append(f"| {model} | {op}({kinds}) | {result} | {count} | {got:,} | {ideal:,} | {off:,} | {said} |")
    return rows


def llama_decode(m):
    """(step function, args, kwargs) for one decoded token after a 128-token prompt, DynamicCache."""
    model = m.build().eval()
    model.config.use_cache = True
    ids = m.inputs("cpu", False)["input_ids"]
    with torch.no_grad():
        past = model(input_ids=ids, use_cache=True).past_key_values

    def step(ids, past):
        return model(input_ids=ids, past_key_values=past, use_cache=True).logits

    return step, (ids[:, -1:], past)


def model_rows() -> tuple[list[str], list[str]]:
    import corpus

    models = corpus.all_models()
    totals = ["| model (inference) | fxforge moved | zero-copy off | inputs copied (reason: count) |",
              "|---|---:|---:|---|"]
    graphs: dict[str, tuple[list[Compiled], dict]] = {}
    cases = {}
    for name in ("demo", "gpt2-2l", "llama-2l", "bert-2l"):
        m = models[name]
        model = m.build().eval()
        cases[name] = (model, (), m.inputs("cpu", False))
    step, args = llama_decode(models["llama-2l"])
    cases["llama-2l decode (128 cached)"] = (step, args, {})
    for name, (fn, args, kwargs) in cases.items():
        on = fxforge_figures(fn, copy.deepcopy(args), kwargs)
        off = fxforge_figures(fn, copy.deepcopy(args), kwargs, zero_copy=False)
        graphs[name] = (on["compiled"], on["why"])
        refused = ", ".join(f"{k}: {v}" for k, v in sorted(on["refused"].items())) or "—"
        totals.append(f"| {name} | {on['moved']:,} | {off['moved']:,} | {refused} |")
    return totals, container_table(graphs)


HEAD = [
    "| case | fxforge moved | ideal moved | zero-copy off | fxforge accessed | Inductor accessed | ideal accessed | refused |",
    "|---|---:|---:|---:|---:|---:|---:|---|",
]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--no-models", action="store_true", help="only the cases built here (no corpus models)")
    p.add_argument("--out", help="write the Markdown there")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    lines = HEAD + case_rows()
    if not args.no_models:
        totals, containers = model_rows()
        lines += ["", *totals, "", *containers]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(f"<!-- python bench/padcat.py {'--no-models ' if args.no_models else ''}--out {args.out}; "
                    f"2 shared cores, no GPU, torch {torch.__version__} CPU; columns: bench/README.md -->\n"
                    + text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
