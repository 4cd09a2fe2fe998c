"""Packages against compiling in the process: load time, first call, size, per-call time.

For each model (inference, ``torch.export`` of the corpus model with its inputs):

* ``compile_exported`` in a fresh process, once with an empty kernel cache (cold: what a new
  machine pays) and once more with the cache it left (warm);
* ``fxforge.package`` of the same program (all three x86-64 levels by default);
* ``load_package`` + first call in fresh processes with an empty cache, ``import torch`` and
  ``import fxforge`` done before the clock starts (both are reported on their own): the median
  of ``--loads`` processes;
* the package's size, its C kernels per CPU level after compression against one native build
  of the same kernels, uncompressed;
* per-call time of the loaded package against ``compile_exported``'s, calls interleaved in one
  process (median).

    python bench/package.py [--models gpt2-2l mixer-small] [--loads 5] [--tag package]

writes ``bench/results/<tag>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

# transformers registers its models' output types with pytree: imported before the clock starts,
# as a process running such a model has it
_COMPILE = """
import sys, time, warnings
warnings.simplefilter("ignore")
import torch
try:
    import transformers.modeling_outputs
except ImportError:
    pass
t0 = time.perf_counter()
import fxforge
ep = torch.export.load(sys.argv[1])
t1 = time.perf_counter()
c = fxforge.compile_exported(ep)
t2 = time.perf_counter()
c(*ep.example_inputs[0], **ep.example_inputs[1])
t3 = time.perf_counter()
print(t2 - t1, t3 - t2)
"""

_LOAD = """
import sys, time
import torch
try:
    import transformers.modeling_outputs
except ImportError:
    pass
t0 = time.perf_counter()
import fxforge
t1 = time.perf_counter()
args, kwargs = torch.load(sys.argv[2])
t2 = time.perf_counter()
f = fxforge.load_package(sys.argv[1])
t3 = time.perf_counter()
f(*args, **kwargs)
t4 = time.perf_counter()
print(t1 - t0, t3 - t2, t4 - t3)
"""


def _python(code: str, *argv: str, cache: str) -> list[float]:
    env = {**os.environ, "FXFORGE_CACHE_DIR": cache, "FXFORGE_PROGRESS": "0"}
    r = subprocess.run([sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-3000:])
    return [float(x) for x in r.stdout.strip().splitlines()[-1].split()]


def measure(name: str, loads: int, calls: int, budget: float) -> dict:
    import torch

    import corpus
    import fxforge
    from measure import interleaved_medians

    model = corpus.all_models()[name]
    m = model.build().eval()
    kwargs = model.inputs("cpu", False)
    with torch.no_grad():
        ep = torch.export.export(m, (), kwargs)
    work = tempfile.mkdtemp(prefix="fxforge-bench-package-")
    pt2, inputs, pkg = (os.path.join(work, f) for f in ("model.pt2", "inputs.pt", "model.fxpkg"))
    torch.export.save(ep, pt2)
    torch.save(((), kwargs), inputs)

    cache = os.path.join(work, "cache")
    cold = _python(_COMPILE, pt2, cache=cache)
    warm = _python(_COMPILE, pt2, cache=cache)
    t = time.perf_counter()
    fxforge.package(ep, pkg)
    package_s = time.perf_counter() - t
    runs = [_python(_LOAD, pkg, inputs, cache=os.path.join(work, f"load{i}")) for i in range(loads)]
    import_s, load_s, first_s = (statistics.median(r[i] for r in runs) for i in range(3))

    with zipfile.ZipFile(pkg) as z:
        infos = z.infolist()
    manifest = json.loads(zipfile.ZipFile(pkg).read("manifest.json"))
    isas = manifest["c"]["isas"] if manifest["c"] else []
    per_level = {isa: sum(i.compress_size for i in infos if i.filename.startswith(f"c/{isa}/")) for isa in isas}
    c = fxforge.compile_exported(ep)
    unit = c.artifact.units.get("c")
    native = sum(os.path.getsize(p) for p, _ in unit.built()) if unit is not None and unit.kernels else 0
    f = fxforge.load_package(pkg)
    with torch.no_grad():
        times = interleaved_medians({"compile_exported": lambda: c(**kwargs), "package": lambda: f(**kwargs)},
                                    calls=calls, budget_s=budget)
    size = os.path.getsize(pkg)
    shutil.rmtree(work, ignore_errors=True)
    return {
        "model": name,
        "compile_cold_s": cold[0], "compile_cold_first_call_s": cold[1],
        "compile_warm_s": warm[0], "compile_warm_first_call_s": warm[1],
        "package_s": package_s,
        "import_fxforge_s": import_s, "load_s": load_s, "load_first_call_s": first_s, "loads": loads,
        "package_bytes": size,
        "weights_bytes": sum(i.compress_size for i in infos if i.filename.startswith("tensors/")),
        "kernel_bytes_per_level": per_level,
        "native_kernel_bytes": native,
        "launcher_bytes": sum(i.compress_size for i in infos if i.filename.startswith("c/launcher/")),
        "per_call_s": {k: v["median_s"] for k, v in times.items()},
        "cpu_isa": f.cpu_isa,
        "threads": torch.get_num_threads(),
    }


def markdown(rows: list[dict], argv: list[str]) -> str:
    out = ["# Packages: load time, size, per-call time", "",
           f"Command: `python bench/package.py {' '.join(argv)}` ({rows[0]['threads'] if rows else '?'} threads; "
           "fresh processes; times in seconds unless marked).", "",
           "| model | compile_exported cold | warm | load + first call | ratio to cold | ratio to warm | "
           "import fxforge | package |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lf = r["load_s"] + r["load_first_call_s"]
        cold = r["compile_cold_s"] + r["compile_cold_first_call_s"]
        warm = r["compile_warm_s"] + r["compile_warm_first_call_s"]
        out.append(f"| {r['model']} | {cold:.2f} | {warm:.2f} | {lf:.3f} ({1e3 * r['load_s']:.0f} ms load) | "
                   f"{lf / cold:.3f}x | {lf / warm:.3f}x | {r['import_fxforge_s']:.2f} | {r['package_s']:.2f} |")
    out += ["", "Compile times include the first call (what a process pays before its first result); "
            "load + first call excludes `import torch` and `import fxforge` (that column).", "",
            "| model | package | weights | C kernels per level (compressed) | one native build | level / native | "
            "launcher | per call: package / compile_exported |",
            "|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        levels = ", ".join(f"{k.removeprefix('x86-64-')} {v / 1024:.0f} KiB" for k, v in r["kernel_bytes_per_level"].items())
        worst = max(r["kernel_bytes_per_level"].values(), default=0)
        pc = r["per_call_s"]
        out.append(f"| {r['model']} | {r['package_bytes'] / 2**20:.1f} MiB | {r['weights_bytes'] / 2**20:.1f} MiB | "
                   f"{levels} | {r['native_kernel_bytes'] / 1024:.0f} KiB | "
                   f"{worst / r['native_kernel_bytes'] if r['native_kernel_bytes'] else 0:.2f} | "
                   f"{r['launcher_bytes'] / 1024:.0f} KiB | {pc['package'] / pc['compile_exported']:.3f} "
                   f"({1e3 * pc['package']:.2f} / {1e3 * pc['compile_exported']:.2f} ms) |")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["gpt2-2l", "mixer-small"])
    p.add_argument("--loads", type=int, default=5)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--budget", type=float, default=15.0)
    p.add_argument("--tag", default="package")
    args = p.parse_args()
    rows = [measure(m, args.loads, args.calls, args.budget) for m in args.models]
    results = os.path.join(HERE, "results")
    with open(os.path.join(results, f"{args.tag}.json"), "w") as f:
        json.dump({"argv": sys.argv[1:], "rows": rows}, f, indent=1)
    text = markdown(rows, sys.argv[1:])
    with open(os.path.join(results, f"{args.tag}.md"), "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
