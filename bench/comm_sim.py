"""The communication simulator: a profiled step replayed with its collectives under a cost model.

``simulate(trace, schedule, link)`` takes one step's top-level operations as the profiler saw
them on the rank's thread (``(name, start_us, duration_us)``), the compiled schedule's collectives
and waits in order (``("issue", kind, ranks, bytes)`` / ``("wait", k)``) and a
``fxforge.core.costs.CommModel`` (or its fields as a dict).  It keeps every measured duration
(kernels, fallbacks, the host time between them, the issue calls) and replaces each collective's
transfer by the model's time, on one stream per rank, in issue order; a wait stalls the thread
until its collective is done.  Returns ``wait_s`` (the stalls: the exposed communication),
``comm_s`` (the collectives' modelled time) and ``step_s``.

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
    model = _model(link)
    issues = [r for r in schedule if r[0] == "issue"]
    waits = [r[1] for r in schedule if r[0] == "wait"]
    clock = stream = comm = stalled = 0.0
    done: dict[int, float] = {}
    k_issue = k_wait = 0
    prev_end = trace[0][1] if trace else 0.0
    for name, start, dur in trace:
        clock += max(0.0, start - prev_end) * 1e-6  # host time between operations
        prev_end = max(prev_end, start + dur)
        if name == WAIT and k_wait < len(waits):
            c = waits[k_wait]
            k_wait += 1
            if c in done and done[c] > clock:
                stalled += done[c] - clock
                clock = done[c]
            continue
        clock += dur * 1e-6
        if name.startswith("_c10d_functional::") and k_issue < len(issues):
            _, kind, ranks, sent = issues[k_issue]
            t = model.time(kind, sent, ranks)
            comm += t
            stream = done[k_issue] = max(clock, stream) + t
            k_issue += 1
    return {"wait_s": stalled, "comm_s": comm, "step_s": clock, "matched": k_issue == len(issues) and k_wait == len(waits)}


# --------------------------------------------------------------------------- predictions


def predict(model: str, parallel: str, world: int, batch: int, links: dict, steps: int = 3) -> dict:
    """The exposed communication of one training step on ``world`` ranks, per link: this rank's
    part compiled by ``fxforge.partition`` against torch's fake process group (its collectives
    return at once), run and profiled here (the median of ``steps`` profiled steps, by step time),
    and replayed under each link's model; also the schedule's planned peak of live bytes with
    the collectives overlapped (prefetching) and without."""
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
        plain = fxforge.partition(joint, mesh, pl, config=fxforge.Config(comm_overlap=False), compute_placements=gathered)
        p = fxforge.partition(joint, mesh, pl, config=fxforge.Config(), compute_placements=gathered)
        shards = tuple(local_shard(t, mesh, pl[n]) for n, t in (("idx", idx), ("targets", tgt)))
        p(*shards)
        traces = sorted((_profile(lambda: p(*shards))[0] for _ in range(steps)),
                        key=lambda t: t[-1][1] + t[-1][2] - t[0][1])
        trace, schedule = traces[len(traces) // 2], _comm_schedule(p)
        out = {"world": world, "collectives": p.stats["comm"]["count"], "bytes": p.stats["comm"]["bytes"],
               "compute_s": (trace[-1][1] + trace[-1][2] - trace[0][1]) * 1e-6, "links": {},
               # the planned peak of live bytes (the schedule's) with prefetching, and without it
               "planned_peak": p.stats["schedule_peak_bytes"], "planned_peak_no_prefetch": plain.stats["schedule_peak_bytes"]}
        for name, link in links.items():
            out["links"][name] = simulate(trace, schedule, link)
        return out
    finally:
        dist.destroy_process_group()
