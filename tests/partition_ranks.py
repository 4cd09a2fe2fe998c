"""Running a function on N real ranks (gloo, CPU) for the partition tests.

``run_ranks(fn, world)`` spawns ``world`` processes (``torch.multiprocessing``'s spawn context),
each joining one gloo process group through a ``FileStore`` in a fresh temporary directory (no
port to pick, so no port race), calls ``fn(rank, world)`` and returns every rank's result.  Every
run is bounded: processes are joined against one deadline; when a rank fails, the others get a
few seconds to fail too (they are usually stuck in a collective) and are then killed; collectives
time out after ``collective_timeout`` seconds.  A failure raises ``AssertionError`` carrying each
rank's traceback.  ``fn`` must be importable by name (a module-level function).
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import os
import pickle
import shutil
import tempfile
import time
import traceback

import torch.multiprocessing as mp


def _entry(rank: int, world: int, store: str, module: str, name: str, outdir: str, collective_timeout: float) -> None:
    # a rank killed by a signal (a crash in native code) leaves its Python stack here
    faulthandler.enable(open(os.path.join(outdir, f"rank{rank}.fault"), "w"))
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # ranks share the machine's cores
        dist.init_process_group(
            "gloo", store=dist.FileStore(store, world), rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=collective_timeout),
        )
        try:
            fn = getattr(importlib.import_module(module), name)
            result = fn(rank, world)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        with open(os.path.join(outdir, f"rank{rank}.pkl"), "wb") as f:
            pickle.dump(result, f)
    except BaseException:
        with open(os.path.join(outdir, f"rank{rank}.err"), "w") as f:
            f.write(traceback.format_exc())
        raise SystemExit(1)


def run_ranks(fn, world: int, *, timeout: float = 300.0, collective_timeout: float = 120.0, grace: float = 10.0) -> list:
    """``fn(rank, world)`` on ``world`` gloo ranks; the list of their results, by rank."""
    tmp = tempfile.mkdtemp(prefix="fxforge-ranks-")
    store = os.path.join(tmp, "store")
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_entry, args=(r, world, store, fn.__module__, fn.__name__, tmp, collective_timeout),
                    daemon=True)
        for r in range(world)
    ]
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        failed_at = None
        while any(p.is_alive() for p in procs):
            now = time.monotonic()
            failed = any(p.exitcode not in (None, 0) for p in procs) or any(
                os.path.exists(os.path.join(tmp, f"rank{r}.err")) for r in range(world))
            if failed and failed_at is None:
                failed_at = now
            if now > deadline or (failed_at is not None and now > failed_at + grace):
                break
            time.sleep(0.1)
        stragglers = [r for r, p in enumerate(procs) if p.is_alive()]
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(5)
        errors = []
        for r, p in enumerate(procs):
            path = os.path.join(tmp, f"rank{r}.err")
            if os.path.exists(path):
                errors.append(f"--- rank {r} ---\n{open(path).read()}")
            elif r in stragglers:
                errors.append(f"--- rank {r} --- killed after {timeout:.0f} s (or while another rank had failed)")
            elif p.exitcode != 0:
                fault = os.path.join(tmp, f"rank{r}.fault")
                stack = open(fault).read() if os.path.exists(fault) else ""
                errors.append(f"--- rank {r} --- exit code {p.exitcode}" + (f"\n{stack}" if stack else ""))
        if errors:
            raise AssertionError(f"{len(errors)} of {world} ranks failed:\n" + "\n".join(errors))
        results = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.pkl"), "rb") as f:
                results.append(pickle.load(f))
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def run_documented_torchrun(doc: str, marker: str, tmp_path, nproc: int = 2, timeout: float = 120.0) -> str:
    """The ``python`` code block after ``marker`` in the file ``doc``, run as written with
    ``torchrun --standalone --nproc-per-node nproc`` (torchrun and its ranks in a session of
    their own, killed together past ``timeout``); its stdout.  Fails the test with the output
    when it fails or runs too long; skips when torchrun is not installed."""
    import re
    import signal
    import subprocess
    import sys

    import pytest

    torchrun = shutil.which("torchrun", path=os.path.dirname(sys.executable)) or shutil.which("torchrun")
    if torchrun is None:
        pytest.skip("torchrun not found")
    text = open(doc, encoding="utf-8").read()
    (code,) = re.findall(re.escape(marker) + r"\n```python\n(.*?)```", text, flags=re.S)
    script = tmp_path / "documented_example.py"
    script.write_text(code)
    env = dict(os.environ, FXFORGE_DEBUG="1", PYTHONPATH=os.pathsep.join(sys.path), OMP_NUM_THREADS="1")
    p = subprocess.Popen([torchrun, "--standalone", "--nproc-per-node", str(nproc), str(script)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
                         start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        stdout, stderr = p.communicate()
        pytest.fail(f"the example of {os.path.basename(doc)} did not finish in {timeout:.0f} s:\n"
                    + stdout[-3000:] + stderr[-5000:])
    assert p.returncode == 0, stdout[-3000:] + stderr[-5000:]
    return stdout
