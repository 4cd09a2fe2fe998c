"""Cost models: how long a collective takes on a link (α-β), and a kernel on a device (roofline).

Both are estimates, used to order a graph and to say how much of its communication compute
hides (``stats["comm"]``, ``passes/overlap.py``); neither decides anything a wrong value could
make incorrect.

**Collectives** (``CommModel``): a ring algorithm over ``n`` ranks takes ``steps(n)`` latencies
``alpha_s`` and moves the bytes one rank sends (``core.collectives.collective_bytes``: all-gather
``(n-1)/n`` of the output, reduce-scatter ``(n-1)/n`` of the input, all-reduce ``2(n-1)/n``,
all-to-all ``(n-1)/n``) at ``1 / beta_s_per_byte`` bytes a second::

    all-gather, reduce-scatter, all-to-all, broadcast   (n-1) alpha + bytes_sent beta
    all-reduce                                          2(n-1) alpha + bytes_sent beta

``COMM_PRESETS`` are the links users meet, as data: their figures are published bandwidths and
latencies of the hardware rounded to what collectives reach, not measurements of this project,
except ``gloo-loopback`` and ``loopback-1gbit`` (fitted by ``calibrate`` on two gloo ranks of one
machine, ``bench/comm.py``).
``calibrate(group)`` fits ``alpha_s`` and ``beta_s_per_byte`` on any process group.

**Kernels** (``ComputeModel``): a node takes the longer of its floating-point work at
``flops_per_s`` and the bytes it reads and writes at ``bytes_per_s`` (views and size queries
nothing); a matmul's work is ``2 M N K``, a convolution's ``2 x outputs x inputs per output``.
``COMPUTE_PRESETS`` hold a CPU core and two GPUs; a CPU's figure is per thread, times the threads
the graph runs on.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.fx as fx

from .graph import VAL, device_types, node_kind, tensors

# latencies a ring collective over n ranks pays
STEPS = {"all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1, "all_to_all": lambda n: n - 1,
         "broadcast": lambda n: n - 1, "all_reduce": lambda n: 2 * (n - 1)}


@dataclass(frozen=True)
class CommModel:
    """One link's α-β figures: ``alpha_s`` per step, ``beta_s_per_byte`` per byte a rank sends."""

    name: str
    alpha_s: float
    beta_s_per_byte: float
    # gloo has no reduce-scatter of its own: it all-reduces the whole input and keeps a block, so
    # a reduce-scatter costs what an all-reduce of its input costs (bench/results/comm.md)
    reduce_scatter_as_all_reduce: bool = False

    @property
    def bandwidth(self) -> float:
        """Bytes a second one rank sends."""
        return 1.0 / self.beta_s_per_byte

    def time(self, collective: str, bytes_sent: int, ranks: int) -> float:
        """Seconds one ``collective`` takes over ``ranks`` ranks, sending ``bytes_sent`` from
        each (a collective of one rank, or an unknown one, costs its bytes alone)."""
        if collective == "reduce_scatter" and self.reduce_scatter_as_all_reduce:
            collective, bytes_sent = "all_reduce", 2 * bytes_sent
        steps = STEPS.get(collective, lambda n: n - 1)(ranks) if ranks > 1 else 0
        return steps * self.alpha_s + bytes_sent * self.beta_s_per_byte


def _link(name: str, alpha_us: float, gbytes_per_s: float, gloo: bool = False) -> CommModel:
    return CommModel(name, alpha_us * 1e-6, 1.0 / (gbytes_per_s * 1e9), reduce_scatter_as_all_reduce=gloo)


# Estimates (module docstring): per-rank bandwidth collectives reach, latency per ring step.
COMM_PRESETS: dict[str, CommModel] = {m.name: m for m in (
    _link("nvlink", 3.0, 300.0),          # NVLink 4 (H100 SXM): 450 GB/s a direction, ~300 reached
    _link("infiniband", 8.0, 45.0),       # NDR 400 Gb/s a GPU
    _link("pcie", 10.0, 20.0),            # PCIe 4.0 x16 between GPUs of one host, no NVLink
    _link("ethernet-100g", 20.0, 11.0),   # 100 GbE with RoCE
    # measured: two gloo ranks (one thread each, 2 cores), bench/results/comm.md; one loopback
    # carries every rank's traffic, so a rank's share of it shrinks with the ranks (at 4: ~half)
    _link("gloo-loopback", 239.0, 0.86, gloo=True),
    _link("loopback-1gbit", 306.0, 0.054, gloo=True),   # the same under a 1 Gbit/s tc rate limit
)}


def comm_model(spec: Any, backend: str | None = None) -> CommModel:
    """The CommModel ``Config.comm_model`` names: a preset's name, a ``CommModel``, a mapping
    ``{"alpha_s": ..., "bandwidth": bytes/s}``, or "auto" (``nvlink`` for NCCL, ``gloo-loopback``
    otherwise)."""
    if isinstance(spec, CommModel):
        return spec
    if isinstance(spec, Mapping):
        return CommModel(str(spec.get("name", "custom")), float(spec["alpha_s"]), 1.0 / float(spec["bandwidth"]))
    if spec == "auto":
        return COMM_PRESETS["nvlink" if backend == "nccl" else "gloo-loopback"]
    if spec in COMM_PRESETS:
        return COMM_PRESETS[spec]
    raise ValueError(f"Config.comm_model={spec!r}: expected 'auto', one of {sorted(COMM_PRESETS)}, a CommModel or "
                     "{'alpha_s': seconds, 'bandwidth': bytes per second}")


def calibrate(group=None, sizes: tuple[int, ...] = (1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22), repeats: int = 5,
              name: str = "calibrated") -> CommModel:
    """α and β fitted to all-reduces and all-gathers of ``sizes`` bytes on ``group`` (every rank
    of it must call this with the same arguments): least squares on the relative error of the
    median times, so small collectives weigh as much as large ones.  Each time is the slowest
    rank's (a collective ends for all when it ends for the last), and the fit is the group's
    first rank's, broadcast: every rank gets the same model, so the choices made from it (the
    buckets, ``passes/bucketing.py``) and with them the collectives are the same on every rank."""
    import torch.distributed as dist

    n = dist.get_world_size(group)
    rows, times = [], []
    for nbytes in sizes:
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        out = torch.empty(n * x.numel(), dtype=torch.float32)
        for collective, run, sent in (("all_reduce", lambda: dist.all_reduce(x, group=group), 2 * (n - 1) * x.nbytes // n),
                                      ("all_gather", lambda: dist.all_gather_into_tensor(out, x, group=group),
                                       (n - 1) * x.nbytes)):
            run()  # warm
            dist.barrier(group=group)
            ts = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                run()
                ts.append(time.perf_counter() - t0)
            rows.append((STEPS[collective](n), sent))
            times.append(sorted(ts)[len(ts) // 2])
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    a = torch.tensor(rows, dtype=torch.float64) / t.unsqueeze(1)
    fit = torch.linalg.lstsq(a, torch.ones_like(t).unsqueeze(1)).solution.squeeze(1)
    dist.broadcast(fit, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    alpha, beta = fit.tolist()
    return CommModel(name, max(alpha, 0.0), max(beta, 1e-15),
                     reduce_scatter_as_all_reduce=dist.get_backend(group) == "gloo")


@dataclass(frozen=True)
class ComputeModel:
    """One device's roofline: ``flops_per_s`` and ``bytes_per_s`` (per thread on a CPU)."""

    name: str
    flops_per_s: float
    bytes_per_s: float
    per_thread: bool = False

    def scaled(self, threads: int) -> "ComputeModel":
        if not self.per_thread:
            return self
        return ComputeModel(f"{self.name} x{threads}", self.flops_per_s * threads, self.bytes_per_s * min(threads, 8))

    def time(self, flops: float, nbytes: float) -> float:
        return max(flops / self.flops_per_s, nbytes / self.bytes_per_s)


COMPUTE_PRESETS: dict[str, ComputeModel] = {m.name: m for m in (
    ComputeModel("cpu", 40e9, 10e9, per_thread=True),   # an x86 core: AVX2 FMA float32, one core's memory stream
    ComputeModel("h100", 400e12, 3.0e12),                # dense TF32/BF16 tensor cores, HBM3
    ComputeModel("a100", 250e12, 1.8e12),
)}


def compute_model(device_type: str, threads: int | None = None) -> ComputeModel:
    """The preset for a graph's device (CUDA: ``h100``), a CPU's scaled to ``threads``."""
    if device_type == "cuda":
        return COMPUTE_PRESETS["h100"]
    return COMPUTE_PRESETS["cpu"].scaled(threads or torch.get_num_threads())


def graph_models(gm: fx.GraphModule, comm_spec: Any = "auto", threads: int | None = None) -> tuple[CommModel, ComputeModel]:
    """The models a graph's collectives and kernels are estimated under: ``comm_spec``
    (``Config.comm_model``) for the default process group's backend where one is initialized,
    and the compute preset of the graph's device on ``threads`` (``Config.threads``)."""
    backend = None
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        backend = torch.distributed.get_backend()
    return comm_model(comm_spec, backend), graph_compute_model(gm, threads)


def graph_compute_model(gm: fx.GraphModule, threads: int | None = None) -> ComputeModel:
    """The compute preset of a graph's device (``compute_model``) on ``threads``."""
    return compute_model("cuda" if "cuda" in device_types(gm) else "cpu", threads)


def node_time(n: fx.Node, compute: ComputeModel) -> float:
    """A node's estimated time alone (not fused with others) under ``compute``."""
    flops, nbytes = node_flops(n), node_bytes(n)
    return compute.time(flops, nbytes) if (flops or nbytes) else 0.0


_MATMULS = {"mm": (0, 1), "addmm": (1, 2), "bmm": (0, 1), "baddbmm": (1, 2)}


def node_flops(n: fx.Node) -> float:
    """Floating-point work of a node: matmuls ``2 M N K`` (batched too), convolutions ``2 x
    outputs x inputs per output``; 0 for other ops (priced by their bytes)."""
    op = n.target
    if not isinstance(op, torch._ops.OpOverload):
        return 0.0
    name = op.__name__.split(".")[0]
    out = n.meta.get(VAL)
    if name in _MATMULS and isinstance(out, torch.Tensor):
        a = n.args[_MATMULS[name][0]]
        k = a.meta[VAL].shape[-1] if isinstance(a, fx.Node) and isinstance(a.meta.get(VAL), torch.Tensor) else 1
        return 2.0 * _numel(out) * _int(k)
    if name == "convolution" and isinstance(out, torch.Tensor):
        w = n.args[1].meta.get(VAL) if isinstance(n.args[1], fx.Node) else None
        if isinstance(w, torch.Tensor):
            per_output = _numel(w) / max(1, _int(w.shape[0]))
            return 2.0 * _numel(out) * per_output
    return 0.0


def node_bytes(n: fx.Node) -> float:
    """Bytes a compute node reads and writes (its tensor inputs and outputs)."""
    if node_kind(n) != "compute":
        return 0.0
    return value_bytes(n) + sum(value_bytes(a) for a in n.all_input_nodes)


def value_bytes(n: fx.Node) -> float:
    """Bytes of a node's tensor values (symbolic sizes at their example values)."""
    return float(sum(_nbytes(t) for t in tensors(n.meta.get(VAL))))


def _int(s: Any) -> int:
    """A size, or a symbolic size's example value."""
    if isinstance(s, int):
        return s
    h = getattr(getattr(s, "node", None), "hint", None)
    return int(h) if h is not None else 1


def _numel(t: torch.Tensor) -> float:
    return float(math.prod(_int(s) for s in t.shape))


def _nbytes(t: torch.Tensor) -> float:
    return _numel(t) * t.element_size()
