"""A picture of a profiled training step: each fxforge kernel a slice of the Chrome trace.

    python bench/trace_picture.py --out docs/profiler-trace.png   # needs chromium (headless)

Profiles one training step of ``fxforge demo``'s GPT compiled with fxforge, exports the Chrome
trace (``prof.export_chrome_trace``), and draws the main thread's slices as a timeline: one row
per nesting depth, fxforge's kernels coloured by backend, the rest grey.  ``--trace PATH`` keeps
the trace itself: open it in ``chrome://tracing`` or Perfetto.
"""

from __future__ import annotations

import argparse
import collections
import html
import json
import os
import shutil
import subprocess
import tempfile

import torch

import fxforge
from fxforge.entry.demo import GPT, GPTConfig

COLOURS = {"c": "#3b7dd8", "torch": "#e08a2c", "triton": "#3aa657"}
ROW_PX, WIDTH_PX = 22, 1400


def profiled_step(path: str) -> None:
    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    compiled = torch.compile(model, backend=fxforge.backend(fxforge.Config()))
    idx, targets = (torch.randint(0, cfg.vocab, (4, cfg.seq)) for _ in range(2))
    for _ in range(2):  # compiled and warm
        compiled(idx, targets).backward()
    with torch.profiler.profile() as prof:
        compiled(idx, targets).backward()
    prof.export_chrome_trace(path)


def slices(path: str) -> list[dict]:
    """The complete events of the thread with the most of them, each with its nesting depth."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    tid = collections.Counter(e["tid"] for e in events).most_common(1)[0][0]
    events = sorted((e for e in events if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"]))
    open_ends: list[float] = []
    for e in events:
        while open_ends and open_ends[-1] <= e["ts"]:
            open_ends.pop()
        e["depth"] = len(open_ends)
        open_ends.append(e["ts"] + e["dur"])
    return events


def page(events: list[dict]) -> str:
    t0 = min(e["ts"] for e in events)
    span = max(e["ts"] + e["dur"] for e in events) - t0
    scale = (WIDTH_PX - 20) / span
    rows = max(e["depth"] for e in events) + 1
    divs = []
    for e in events:
        name = e["name"]
        backend = name.split("[", 1)[1].split("]", 1)[0] if name.startswith("fxforge ") and "[" in name else None
        colour = COLOURS.get(backend, "#9aa0a6")
        x, w = 10 + (e["ts"] - t0) * scale, max(e["dur"] * scale, 1.0)
        label = html.escape(name) if w > 60 else ""
        divs.append(f'<div title="{html.escape(name)} ({e["dur"]:.0f} us)" style="left:{x:.1f}px;top:'
                    f'{40 + e["depth"] * ROW_PX}px;width:{w:.1f}px;background:{colour}">{label}</div>')
    legend = " ".join(f'<span style="background:{c}">fxforge [{b}] kernels</span>' for b, c in COLOURS.items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><style>
body {{ margin: 0; font: 11px sans-serif; background: #fff; }}
div {{ position: absolute; height: {ROW_PX - 3}px; overflow: hidden; white-space: nowrap; color: #fff;
       line-height: {ROW_PX - 3}px; padding-left: 2px; box-sizing: border-box; border-radius: 2px; }}
p {{ margin: 10px; }} span {{ color: #fff; padding: 2px 6px; margin-right: 6px; border-radius: 2px; }}
</style></head><body><p>One training step of <code>fxforge demo</code>'s GPT under torch.profiler
({span / 1e3:.1f} ms, main thread): {legend} <span style="background:#9aa0a6">other ranges and ATen
ops</span></p>{''.join(divs)}<div style="display:none;top:{40 + rows * ROW_PX}px"></div></body></html>"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/profiler-trace.png")
    ap.add_argument("--trace", default=None, help="where to keep the Chrome trace (default: not kept)")
    args = ap.parse_args()
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("no chromium found: install it (apt-get install -y chromium)")
        return 2
    with tempfile.TemporaryDirectory() as d:
        trace = args.trace or os.path.join(d, "trace.json")
        profiled_step(trace)
        events = slices(trace)
        rows = max(e["depth"] for e in events) + 1
        doc = os.path.join(d, "trace.html")
        with open(doc, "w") as f:
            f.write(page(events))
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--screenshot={os.path.abspath(args.out)}", f"--window-size={WIDTH_PX},{60 + rows * ROW_PX}",
                        "file://" + doc], check=True, capture_output=True, timeout=120)
    print(f"{args.out} ({len(events)} slices)" + (f", trace {args.trace}" if args.trace else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
