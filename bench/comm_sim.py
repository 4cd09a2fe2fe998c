"""The communication simulator: a profiled step replayed with its collectives under a cost model.

``simulate(trace, schedule, link)`` takes one step's top-level operations as the profiler saw
them on the rank's thread (``(name, start_us, duration_us)``), the compiled schedule's collectives
and waits in order (``("issue", kind, ranks, bytes)`` / ``("wait", k)``) and a
``fxforge.core.costs.CommModel`` (or its fields as a dict).  It keeps every measured duration
(kernels, fallbacks, the host time between them, the issue calls) and replaces each collective's
transfer by the model's time, on one stream per rank, in issue order; a wait stalls the thread
until its collective is done.  Returns ``wait_s`` (the stalls: the exposed communication),
``comm_s`` (the collectives' modelled time) and ``step_s``.  ``simulate_ranks(traces, schedules,
link)`` replays every rank's step together: a collective starts when the last rank has issued
it, so a rank that gets there first waits for the others too (what a measured wait holds).
``fit_link(steps, schedules, link)`` scales the link's α and β to profiled steps whose
collectives are each waited for at once: the link as it was during the run, not at its start.

``predict(...)`` does the same for a schedule compiled for more ranks than this machine runs
(``bench/distributed.py --simulate``): its compute is measured on this machine running the
per-rank program against torch's fake process group, whose collectives return at once.
"""

from __future__ import annotations

from typing import Any

from fxforge.core.costs import CommModel

WAIT = "_c10d_functional::wait_tensor"


def _model(link: Any) -> CommModel:
    return link if isinstance(link, CommModel) else CommModel(**link)


def simulate(trace: list, schedule: list, link: Any) -> dict:
    """One rank's step replayed alone (``simulate_ranks`` of one rank)."""
    return simulate_ranks([trace], [schedule], link)[0]


def simulate_ranks(traces: list, schedules: list, link: Any) -> list[dict]:
    """Every rank's profiled step replayed at once, each from the barrier before it: a
    collective starts when the last rank has issued it and the one before it is done (a ring
    moves when every rank has joined), so a rank that reaches a collective early waits for the
    others as well as for the link.  Per rank: ``wait_s``, ``comm_s``, ``step_s``, ``matched``."""
    model = _model(link)
    ranks = [_Replay(trace, schedule) for trace, schedule in zip(traces, schedules)]
    issues = [r for r in schedules[0] if r[0] == "issue"]
    done: dict[int, float] = {}
    stream = comm = 0.0
    for k, (_, kind, n, sent) in enumerate(issues):
        joined = [r.until_issue(k, done) for r in ranks]
        if any(t is None for t in joined):
            break
        t = model.time(kind, sent, n)
        comm += t
        stream = done[k] = max(max(joined), stream) + t
    for r in ranks:
        r.until_issue(None, done)
    return [{"wait_s": r.stalled, "comm_s": comm, "step_s": r.clock,
             "matched": r.issued == len(issues) == len(done) and r.waited == len(r.waits)} for r in ranks]


class _Replay:
    """One rank's trace, replayed up to a point: ``clock`` (its thread's time, stalls included),
    ``stalled`` (the time its waits stalled)."""

    def __init__(self, trace: list, schedule: list):
        self.trace, self.waits = trace, [r[1] for r in schedule if r[0] == "wait"]
        self.n_issues = sum(1 for r in schedule if r[0] == "issue")
        self.at = self.issued = self.waited = 0
        self.clock = self.stalled = 0.0
        self.prev_end = trace[0][1] if trace else 0.0

    def until_issue(self, k: int | None, done: dict[int, float]) -> float | None:
        """Replay up to and including the ``k``-th collective's issue (None: to the end); the
        clock when it is issued, or None if the trace ends first."""
        while self.at < len(self.trace):
            name, start, dur = self.trace[self.at]
            self.at += 1
            self.clock += max(0.0, start - self.prev_end) * 1e-6  # host time between operations
            self.prev_end = max(self.prev_end, start + dur)
            if name == WAIT and self.waited < len(self.waits):
                c = self.waits[self.waited]
                self.waited += 1
                if c in done and done[c] > self.clock:
                    self.stalled += done[c] - self.clock
                    self.clock = done[c]
                continue
            self.clock += dur * 1e-6
            if name.startswith("_c10d_functional::") and self.issued < self.n_issues:
                self.issued += 1
                if k is not None and self.issued == k + 1:
                    return self.clock
        return None


def fit_link(steps: list[list], schedules: list, base: Any) -> CommModel | None:
    """``base`` scaled to the link as the run found it: ``steps`` holds profiled steps (each a
    trace per rank) that wait for each collective as soon as it is issued (``fxforge-bucketed``),
    and the scale is the median over them of the measured wait (the slowest rank's) over the one
    ``simulate_ranks`` replays under ``base``.  α and β scale together: the link's speed moves,
    its shape is ``base``'s.  None: no step has a wait to scale by."""
    import statistics

    base = _model(base)
    ratios = []
    for traces in steps:
        measured = max(sum(dur for op, _, dur in trace if op == WAIT) for trace in traces) * 1e-6
        simulated = max(r["wait_s"] for r in simulate_ranks(traces, schedules, base))
        if measured > 0 and simulated > 0:
            ratios.append(measured / simulated)
    if not ratios:
        return None
    k = statistics.median(ratios)
    return CommModel(f"{base.name}, fitted in the run", base.alpha_s * k, base.beta_s_per_byte * k,
                     reduce_scatter_as_all_reduce=base.reduce_scatter_as_all_reduce)


# --------------------------------------------------------------------------- predictions


def predict(model: str, parallel: str, world: int, batch: int, links: dict, steps: int = 3) -> dict:
    """The exposed communication of one training step on ``world`` ranks, per link: this rank's
    part compiled by ``fxforge.partition`` (its buckets cut for the first of ``links``,
    ``Config.comm_model``) against torch's fake process group (its collectives return at once),
    run and profiled here (the median of ``steps`` profiled steps, by step time), and replayed
    under each link's model; also the memory plan's peak with the collectives overlapped
    (prefetching) and without."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.export.experimental import _export_forward_backward
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import fxforge
    from dist_models import batch as make_batch
    from dist_models import build, compute_placements, placements
    from distributed import _comm_schedule, _profile
    from fxforge.core.dtensor import local_shard

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        fsdp = parallel == "fsdp"
        mesh = init_device_mesh("cpu", (world,) if fsdp else (world // 2, 2), mesh_dim_names=("dp",) if fsdp else ("dp", "tp"))
        dp = world if fsdp else world // 2
        torch.manual_seed(0)
        m = build(model)
        idx, tgt = make_batch(batch * dp)
        joint = _export_forward_backward(torch.export.export(m, (idx, tgt)))
        pl = placements(m, parallel)
        gathered = compute_placements(m, parallel)
        cut_for = next(iter(links.values()))  # (the buckets are cut for the first link; the others replay them)
        plain = fxforge.partition(joint, mesh, pl, config=fxforge.Config(comm_overlap=False, comm_model=cut_for),
                                  compute_placements=gathered)
        p = fxforge.partition(joint, mesh, pl, config=fxforge.Config(comm_model=cut_for), compute_placements=gathered)
        shards = tuple(local_shard(t, mesh, pl[n]) for n, t in (("idx", idx), ("targets", tgt)))
        p(*shards)
        traces = sorted((_profile(lambda: p(*shards))[0] for _ in range(steps)),
                        key=lambda t: t[-1][1] + t[-1][2] - t[0][1])
        trace, schedule = traces[len(traces) // 2], _comm_schedule(p)
        out = {"world": world, "collectives": p.stats["comm"]["count"], "bytes": p.stats["comm"]["bytes"],
               "compute_s": (trace[-1][1] + trace[-1][2] - trace[0][1]) * 1e-6, "links": {},
               # the memory plan's peak (arenas as allocated, kept ones whole, what lives outside them), with
               # prefetching and without it
               "planned_peak": p.compiled.plan.memory.peak_bytes,
               "planned_peak_no_prefetch": plain.compiled.plan.memory.peak_bytes}
        for name, link in links.items():
            out["links"][name] = simulate(trace, schedule, link)
        return out
    finally:
        dist.destroy_process_group()
