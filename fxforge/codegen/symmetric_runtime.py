"""Symmetric-memory arenas and collectives at run time: what generated wrappers call.

A ``SymmetricArena`` stands for one symmetric arena of a compiled graph's plan
(passes/symmetric.py).  ``acquire(nbytes)`` gives its ``Handle``, made once (again only if a
larger size is asked for) and kept across calls:

* on CUDA, ``_SymmetricMemory.empty_strided_p2p`` with the plan's allocation id, then
  ``symm_mem.rendezvous`` with the group: the ``torch.ops.symm_mem`` collectives the wrapper
  calls find their inputs in it;
* on CPU, an emulation: each rank's arena is a shared-memory file that every rank of the group
  maps, so a rank reads its peers' arenas directly, as GPUs read each other's over NVLink, and
  the collectives are emulated from those reads (``one_shot_all_reduce``...), with the same
  hazard: a peer may still be reading a rank's buffer after the collective returned there.
  Barriers are gloo barriers.

When the handle is made, the ranks all-gather the plan's layout of the arena (buffer, offset,
bytes) and fail with ``SymmetricPlanError`` naming the first buffer that differs.  Later calls
start with a barrier when the plan says no fence protects the arena between calls.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from typing import Any

import torch

from ..core.collectives import group_rank, process_group


class SymmetricPlanError(RuntimeError):
    """The ranks' plans of a symmetric arena differ: they cannot share it."""


class Handle:
    """One rank's view of a made symmetric arena: its bytes (``local``), a barrier, and on CPU the
    peers' arenas."""

    def __init__(self, local: torch.Tensor, group_name: str, peers: list[torch.Tensor] | None = None,
                 symm: Any = None):
        self.local = local
        self.group_name = group_name
        self.pg = process_group(group_name)
        self.rank = group_rank(self.pg)
        self.world = self.pg.size()
        self.peers = peers  # CPU: every rank's arena, by group rank (this rank's is ``local``)
        self.symm = symm  # CUDA: the rendezvous handle

    def barrier(self) -> None:
        if self.symm is not None:
            self.symm.barrier()
        else:
            import torch.distributed as dist

            dist.barrier(group=self.pg)


class SymmetricArena:
    """The symmetric arena ``name`` of one compiled graph (see the module docstring)."""

    def __init__(self, name: str, device: torch.device, group_name: str, alloc_id: int, start_barrier: bool,
                 layout: list[tuple[str, int, int]]):
        self.name, self.device, self.group_name = name, torch.device(device), group_name
        self.alloc_id, self.start_barrier = alloc_id, start_barrier
        self.layout = layout  # (buffer, offset, bytes) at the traced sizes: what every rank must agree on
        self.handle: Handle | None = None
        self.nbytes = -1

    def acquire(self, nbytes: int) -> Handle:
        if self.handle is None or nbytes > self.nbytes:
            self.handle = self._make(max(int(nbytes), 1))
            self.nbytes = int(nbytes)
        elif self.start_barrier:
            self.handle.barrier()  # every rank is done with the previous call's reads
        return self.handle

    def _make(self, nbytes: int) -> Handle:
        self._check_plans(nbytes)
        if self.device.type == "cuda":
            return self._make_cuda(nbytes)
        return self._make_shared(nbytes)

    def _check_plans(self, nbytes: int) -> None:
        import torch.distributed as dist

        pg = process_group(self.group_name)
        mine = (nbytes, self.layout)
        every: list = [None] * pg.size()
        dist.all_gather_object(every, mine, group=pg)
        for r, theirs in enumerate(every):
            if theirs == mine:
                continue
            first = next((f"buffer {a[0]} at offset {a[1]}, {a[2]} bytes here; {b[0]} at offset {b[1]}, "
                          f"{b[2]} bytes on group rank {r}" for a, b in zip(self.layout, theirs[1]) if a != b),
                         f"{len(self.layout)} buffers here, {len(theirs[1])} on group rank {r}; arena {nbytes} "
                         f"bytes here, {theirs[0]} there")
            raise SymmetricPlanError(
                f"fxforge: the symmetric arena {self.name} of group {self.group_name!r} is planned differently "
                f"across ranks ({first}): every rank must compile the same graph with the same sizes (uneven "
                "shards feeding a symmetric-memory collective: pad them to one size, or use a functional collective)")

    def _make_cuda(self, nbytes: int) -> Handle:
        from torch._C._distributed_c10d import _SymmetricMemory
        import torch.distributed._symmetric_memory as symm_mem

        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:  # needed before a rendezvous on torch 2.11
            enable(self.group_name)
        local = _SymmetricMemory.empty_strided_p2p((nbytes,), (1,), torch.uint8, self.device, self.group_name,
                                                   self.alloc_id)
        return Handle(local, self.group_name, symm=symm_mem.rendezvous(local, self.group_name))

    def _make_shared(self, nbytes: int) -> Handle:
        """Every rank maps every rank's arena: files in shared memory, removed once all are mapped."""
        import torch.distributed as dist

        pg = process_group(self.group_name)
        world = pg.size()
        rank = group_rank(pg)
        token = [secrets.token_hex(8) if rank == 0 else None]
        dist.broadcast_object_list(token, src=dist.get_global_rank(pg, 0), group=pg)
        where = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
        paths = [os.path.join(where, f"fxforge-symm-{token[0]}-{self.alloc_id:x}-{r}") for r in range(world)]
        fd = os.open(paths[rank], os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, nbytes)
        finally:
            os.close(fd)
        try:
            dist.barrier(group=pg)
            peers = [torch.from_file(p, shared=True, size=nbytes, dtype=torch.uint8) for p in paths]
            dist.barrier(group=pg)
        finally:
            os.unlink(paths[rank])  # the mappings stay; nothing is left on disk
        return Handle(peers[rank], self.group_name, peers=peers)


# --------------------------------------------------------------------------- CPU emulation


def peer_view(h: Handle, rank: int, t: torch.Tensor) -> torch.Tensor:
    """``t`` (a tensor in this rank's arena) as it lies in group rank ``rank``'s arena."""
    if rank == h.rank:
        return t
    offset = t.data_ptr() - h.local.data_ptr()
    if not 0 <= offset <= h.local.numel():
        raise RuntimeError(f"fxforge: a symmetric-memory collective's input is not in arena memory (offset {offset})")
    item = t.element_size()
    return h.peers[rank].view(t.dtype).as_strided(t.size(), t.stride(), offset // item)


def _reduced(h: Handle, t: torch.Tensor, reduce_op: str) -> torch.Tensor:
    """The reduction of ``t`` over the group, read from every rank's arena in rank order."""
    if reduce_op != "sum":
        raise NotImplementedError(f"fxforge: symmetric-memory all-reduce {reduce_op!r} (only 'sum')")
    acc = None
    for r in range(h.world):
        x = peer_view(h, r, t)
        acc = x.clone(memory_format=torch.contiguous_format) if acc is None else acc.add_(x)
    return acc


def one_shot_all_reduce(h: Handle, input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    h.barrier()  # every rank's input is written
    return _reduced(h, input, reduce_op)  # no barrier after: peers may still read ``input``


def one_shot_all_reduce_out(h: Handle, input: torch.Tensor, reduce_op: str, group_name: str,
                            out: torch.Tensor) -> torch.Tensor:
    return out.copy_(one_shot_all_reduce(h, input, reduce_op, group_name))


def one_shot_all_reduce_copy(h: Handle, symm_buffer: torch.Tensor, local_input: torch.Tensor, reduce_op: str,
                             group_name: str) -> torch.Tensor:
    staged = symm_buffer.view(-1)[: local_input.numel()].view_as(local_input).copy_(local_input)
    return one_shot_all_reduce(h, staged, reduce_op, group_name)


def two_shot_all_reduce_(h: Handle, input: torch.Tensor, reduce_op: str, group_name: str) -> torch.Tensor:
    h.barrier()
    total = _reduced(h, input, reduce_op)
    h.barrier()  # every rank has read every input before any overwrites its own
    return input.copy_(total)


def two_shot_all_reduce_out(h: Handle, input: torch.Tensor, reduce_op: str, group_name: str,
                            output: torch.Tensor) -> torch.Tensor:
    return output.copy_(one_shot_all_reduce(h, input, reduce_op, group_name))


EMULATED = {
    "one_shot_all_reduce": one_shot_all_reduce,
    "one_shot_all_reduce_out": one_shot_all_reduce_out,
    "one_shot_all_reduce_copy": one_shot_all_reduce_copy,
    "two_shot_all_reduce_": two_shot_all_reduce_,
    "two_shot_all_reduce_out": two_shot_all_reduce_out,
    "multimem_all_reduce_": two_shot_all_reduce_,
    "multimem_one_shot_all_reduce": one_shot_all_reduce,
    "multimem_one_shot_all_reduce_out": one_shot_all_reduce_out,
}


def fused_all_gather_matmul(A: torch.Tensor, Bs: list, gather_dim: int, group_name: str, *,
                            return_A: bool = True):
    """``all_gather(A, gather_dim) @ B`` for each B (functional collectives over gloo)."""
    f = torch.ops._c10d_functional
    world = process_group(group_name).size()
    moved = A.movedim(gather_dim, 0).contiguous()
    gathered = f.wait_tensor(f.all_gather_into_tensor(moved, world, group_name))
    full = gathered.movedim(0, gather_dim)
    return (full if return_A else None), [torch.matmul(full, B) for B in Bs]


def fused_matmul_reduce_scatter(A: torch.Tensor, B: torch.Tensor, reduce_op: str, scatter_dim: int,
                                group_name: str) -> torch.Tensor:
    """``reduce_scatter(A @ B, scatter_dim)`` (functional collectives over gloo)."""
    f = torch.ops._c10d_functional
    world = process_group(group_name).size()
    out = torch.matmul(A, B).movedim(scatter_dim, 0).contiguous()
    return f.wait_tensor(f.reduce_scatter_tensor(out, reduce_op, world, group_name)).movedim(0, scatter_dim)


WORKSPACE_EMULATED = {
    "fused_all_gather_matmul": fused_all_gather_matmul,
    "fused_matmul_reduce_scatter": fused_matmul_reduce_scatter,
}
