"""The cost models' view of one training step's communication, on a fixed link and no ranks.

``python bench/comm_estimate.py gpt fsdp 4``: ``fxforge.partition`` of ``bench/dist_models.py``'s
step (batch 16 a data-parallel rank) against torch's fake process group, buckets cut for
``COMM_PRESETS[--link]`` (default ``loopback-1gbit``); prints ``stats["comm"]``: the collectives,
bytes sent, their estimated time and the part the compute does not hide (replayed under the
compute model), and each collective.  No calibration and no timing: two checkouts give
comparable figures on any machine (bench/results/distributed-ab.md).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=["gpt", "llama"])
    ap.add_argument("parallel", choices=["fsdp", "fsdp_tp"])
    ap.add_argument("world", type=int)
    ap.add_argument("--link", default="loopback-1gbit")
    args = ap.parse_args()
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.export.experimental import _export_forward_backward
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import fxforge
    from dist_models import batch, build, compute_placements, placements
    from fxforge.core.costs import COMM_PRESETS

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=args.world)
    fsdp = args.parallel == "fsdp"
    mesh = init_device_mesh("cpu", (args.world,) if fsdp else (args.world // 2, 2),
                            mesh_dim_names=("dp",) if fsdp else ("dp", "tp"))
    torch.manual_seed(0)
    model = build(args.model)
    idx, tgt = batch(16 * (args.world if fsdp else args.world // 2))
    joint = _export_forward_backward(torch.export.export(model, (idx, tgt)))
    p = fxforge.partition(joint, mesh, placements(model, args.parallel),
                          config=fxforge.Config(comm_model=COMM_PRESETS[args.link]),
                          compute_placements=compute_placements(model, args.parallel))
    c = p.stats["comm"]
    print(f"{args.model} {args.parallel} x{args.world} ({args.link}): {c['count']} collectives, "
          f"{c['bytes'] / 1e6:.1f} MB sent, estimated {c['estimated_s'] * 1e3:.0f} ms, exposed {c['exposed_s'] * 1e3:.0f} ms")
    for r in c["collectives"]:
        print(f"  {r['node']}: {r['collective']} x{r['ranks']}, {r['bytes']} B, "
              f"{r['estimated_s'] * 1e3:.2f} ms, exposed {r['exposed_s'] * 1e3:.2f} ms")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
