"""GPU benchmark of the Triton codegen backend: fxforge (codegen="triton") vs Inductor vs eager.

    python bench/bench_gpu_kernels.py [--sizes 4096x4096] [--reps 50] [--json out.json] [--autotune]

Workloads: a pointwise chain, softmax, layer norm (as graphs of pointwise + reduction nodes),
and fxforge's demo GPT model.  Times are medians of CUDA-event timings after warm-up; achieved
bandwidth (bytes read + written by eager's kernels, counted from the inputs and outputs) is
compared with a measured device-to-device copy of the same size.  ``--autotune`` adds a column
timing fxforge with ``Config(autotune=True)`` (launch configurations timed on the first call).  Needs a CUDA device; on a
machine without one it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch


def timed(fn, reps: int) -> float:
    """Median milliseconds of ``fn()`` over ``reps`` runs (CUDA events), after 5 warm-ups."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def copy_bandwidth(nbytes: int, reps: int) -> float:
    """GB/s of a device-to-device copy moving ``nbytes`` (read + write counted)."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = timed(lambda: dst.copy_(src), reps)
    return 2 * src.numel() / ms / 1e6


def workloads(rows: int, cols: int):
    def pointwise_chain(x, y):
        return torch.sigmoid(x * 1.5 + y).relu() - y * 0.5

    def softmax(x):
        m = x.amax(-1, keepdim=True)
        e = (x - m).exp()
        return e / e.sum(-1, keepdim=True)

    def layer_norm(x, w, b):
        var, mean = torch.var_mean(x, -1, correction=0, keepdim=True)
        return (x - mean) * torch.rsqrt(var + 1e-5) * w + b

    dev = "cuda"
    x = torch.randn(rows, cols, device=dev)
    y = torch.randn(rows, cols, device=dev)
    w, b = torch.randn(cols, device=dev), torch.randn(cols, device=dev)
    return [
        ("pointwise_chain", pointwise_chain, (x, y)),
        ("softmax", softmax, (x,)),
        ("layer_norm", layer_norm, (x, w, b)),
    ]


def io_bytes(args, out) -> int:
    outs = out if isinstance(out, (tuple, list)) else [out]
    return sum(t.numel() * t.element_size() for t in list(args) + list(outs) if isinstance(t, torch.Tensor))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4096x4096,16384x1024", help="comma-separated ROWSxCOLS")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-demo", action="store_true", help="skip the demo GPT model")
    ap.add_argument("--autotune", action="store_true", help="also time fxforge with Config(autotune=True)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_gpu_kernels: no CUDA device here; nothing to measure")
        return 0

    import fxforge

    torch._dynamo.config.recompile_limit = 1000
    results = []
    print(
        f"{'workload':18s} {'size':>12s} {'eager ms':>9s} {'inductor':>9s} {'fxforge':>9s} {'fx GB/s':>8s} {'copy GB/s':>9s} {'fx/copy':>7s}"  # noqa: E501
    )
    for size in args.sizes.split(","):
        rows, cols = (int(s) for s in size.split("x"))
        for name, fn, inputs in workloads(rows, cols):
            out = fn(*inputs)
            nbytes = io_bytes(inputs, out)
            torch._dynamo.reset()
            ind = torch.compile(fn)
            torch._dynamo.reset()
            b = fxforge.backend(fxforge.Config(codegen="triton"))
            fx = torch.compile(fn, backend=b)
            torch.testing.assert_close(fx(*inputs), out, atol=1e-4, rtol=1e-4)
            t_tuned = None
            if args.autotune:
                torch._dynamo.reset()
                tuned = torch.compile(fn, backend=fxforge.backend(fxforge.Config(codegen="triton", autotune=True)))
                torch.testing.assert_close(tuned(*inputs), out, atol=1e-4, rtol=1e-4)
                t_tuned = timed(lambda: tuned(*inputs), args.reps)
            t_eager = timed(lambda: fn(*inputs), args.reps)
            t_ind = timed(lambda: ind(*inputs), args.reps)
            t_fx = timed(lambda: fx(*inputs), args.reps)
            bw = nbytes / t_fx / 1e6
            cbw = copy_bandwidth(nbytes, args.reps)
            row = dict(
                workload=name,
                size=size,
                eager_ms=t_eager,
                inductor_ms=t_ind,
                fxforge_ms=t_fx,
                fxforge_gbps=bw,
                copy_gbps=cbw,
                fxforge_autotuned_ms=t_tuned,
                kernels=sum(c.stats["kernels"] for c in b.compiled),
                fallbacks=sum(c.stats["fallback_nodes"] for c in b.compiled),
            )
            results.append(row)
            tuned_col = f" tuned {t_tuned:.3f}" if t_tuned is not None else ""
            print(
                f"{name:18s} {size:>12s} {t_eager:9.3f} {t_ind:9.3f} {t_fx:9.3f} {bw:8.0f} {cbw:9.0f} {bw / cbw:7.2f}{tuned_col}"
            )
    if not args.no_demo:
        from fxforge.entry.demo import GPT, GPTConfig

        torch.manual_seed(0)
        cfg = GPTConfig()
        model = GPT(cfg).cuda().eval()
        idx = torch.randint(0, cfg.vocab, (8, cfg.seq), device="cuda")
        with torch.no_grad():
            torch._dynamo.reset()
            ind = torch.compile(model)
            torch._dynamo.reset()
            fx = torch.compile(model, backend=fxforge.backend(fxforge.Config(codegen="triton")))
            row = dict(workload="demo_gpt", eager_ms=timed(lambda: model(idx), args.reps),
                       inductor_ms=timed(lambda: ind(idx), args.reps), fxforge_ms=timed(lambda: fx(idx), args.reps))
        results.append(row)
        print(f"{'demo_gpt':18s} {'':>12s} {row['eager_ms']:9.3f} {row['inductor_ms']:9.3f} {row['fxforge_ms']:9.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
