"""Calibrating the collective cost model (``fxforge.core.costs``) on gloo: the figures of the
``gloo-loopback`` and ``loopback-1gbit`` presets, and how well α-β predicts each collective.

On each link (this machine's loopback, and loopback limited to 1 Gbit/s in a network namespace:
``bench/ranks.py``) and each world size, every rank runs ``costs.calibrate`` (α and β fitted to
all-reduces and all-gathers of 1 KiB to 4 MiB), then times all-gathers, reduce-scatters and
all-reduces of the same sizes (median of ``--repeats``) against what the fitted model predicts.

    python bench/comm.py [--worlds 2 4] [--links loopback 1gbit] [--repeats 7] [--tag comm]

writes ``bench/results/<tag>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

from ranks import limited_link, link_name, on_ranks  # noqa: E402

SIZES = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22)


def measure(rank: int, world: int) -> dict:
    """On every rank: the fitted model, and each collective's median time per size."""
    import torch.distributed as dist

    from fxforge.core.costs import calibrate

    repeats = int(os.environ.get("FXFORGE_BENCH_REPEATS", "7"))
    model = calibrate(sizes=SIZES, repeats=repeats, name=link_name())
    rows = []
    for nbytes in SIZES:
        x = torch.ones(nbytes // 4)
        out = torch.empty(world * x.numel())
        part = torch.empty(x.numel() // world)
        # (bytes a rank sends, as core.collectives counts them)
        runs = {"all_gather": (lambda: dist.all_gather_into_tensor(out, x), (world - 1) * x.nbytes),
                "reduce_scatter": (lambda: dist.reduce_scatter_tensor(part, x), (world - 1) * x.nbytes // world),
                "all_reduce": (lambda: dist.all_reduce(x), 2 * (world - 1) * x.nbytes // world)}
        for kind, (run, sent) in runs.items():
            run()
            dist.barrier()
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                run()
                ts.append(time.perf_counter() - t0)
            rows.append({"collective": kind, "bytes": nbytes, "sent": sent, "measured_s": sorted(ts)[len(ts) // 2],
                         "predicted_s": model.time(kind, sent, world)})
    return {"alpha_s": model.alpha_s, "beta_s_per_byte": model.beta_s_per_byte, "rows": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--links", nargs="+", default=["loopback", "1gbit"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tag", default="comm")
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    args = ap.parse_args()
    os.environ["FXFORGE_BENCH_REPEATS"] = str(args.repeats)
    path = os.path.join(args.out, f"{args.tag}.json")
    inside = os.environ.get("FXFORGE_BENCH_LINK")
    if inside is None and any(link != "loopback" for link in args.links):
        if "loopback" in args.links:
            _run_links(args, path, ["loopback"])
        for link in args.links:
            if link != "loopback":
                rc = limited_link(link)
                if rc:
                    return rc
        _write_md(path)
        return 0
    _run_links(args, path, [link_name().removeprefix("loopback-") if inside else "loopback"])
    if inside is None:
        _write_md(path)
    return 0


def _run_links(args, path: str, links: list[str]) -> None:
    data = json.load(open(path)) if os.path.exists(path) else {"cases": []}
    for world in args.worlds:
        results = on_ranks(measure, world)
        case = {"link": link_name(), "world": world,
                "alpha_s": max(r["alpha_s"] for r in results),
                "beta_s_per_byte": max(r["beta_s_per_byte"] for r in results),
                "rows": [dict(r0, measured_s=max(r["rows"][i]["measured_s"] for r in results))
                         for i, r0 in enumerate(results[0]["rows"])]}
        data["cases"] = [c for c in data["cases"] if (c["link"], c["world"]) != (case["link"], world)] + [case]
        os.makedirs(args.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
        print(f"{case['link']} x{world}: alpha {case['alpha_s'] * 1e6:.1f} us, "
              f"{1e-9 / case['beta_s_per_byte']:.3f} GB/s", flush=True)


def _write_md(path: str) -> None:
    data = json.load(open(path))
    lines = ["# Collective cost model on gloo (bench/comm.py)", "",
             "`python bench/comm.py --worlds 2 4 --links loopback 1gbit` on this machine (2 cores, one thread a rank). "
             "Per link and world size: α (latency a ring step) and bandwidth (bytes a rank sends a second) as "
             "`fxforge.core.costs.calibrate` fits them (all-reduces and all-gathers of 1 KiB to 4 MiB, median of "
             "the repeats, the slowest rank), then each collective measured against the fitted model.", "",
             "| link | ranks | α (µs) | bandwidth (GB/s) | median |error| of the model, ≥ 128 KiB | worst, ≥ 128 KiB |",
             "|---|---|---|---|---|---|"]
    for c in data["cases"]:
        errs = sorted(abs(r["predicted_s"] / r["measured_s"] - 1) for r in c["rows"] if r["bytes"] >= 1 << 17)
        lines.append(f"| {c['link']} | {c['world']} | {c['alpha_s'] * 1e6:.1f} | {1e-9 / c['beta_s_per_byte']:.3f} | "
                     f"{100 * errs[len(errs) // 2]:.0f}% | {100 * errs[-1]:.0f}% |")
    lines += ["", "Per collective (measured / predicted, ms):", "",
              "| link | ranks | collective | " + " | ".join(_size(s) for s in SIZES) + " |",
              "|---|---|---|" + "---|" * len(SIZES)]
    for c in data["cases"]:
        for kind in ("all_gather", "reduce_scatter", "all_reduce"):
            rs = {r["bytes"]: r for r in c["rows"] if r["collective"] == kind}
            lines.append(f"| {c['link']} | {c['world']} | {kind} | " + " | ".join(
                f"{rs[s]['measured_s'] * 1e3:.2f} / {rs[s]['predicted_s'] * 1e3:.2f}" for s in SIZES) + " |")
    with open(path[:-5] + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


if __name__ == "__main__":
    sys.exit(main())
