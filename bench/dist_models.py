"""The models of the distributed bench (bench/distributed.py) and their placements.

``gpt``: ``fxforge.entry.demo.GPT`` (learned positions, LayerNorm, GELU MLP, biases).
``llama``: a LLaMA-style decoder (RMSNorm, rotary positions, SwiGLU MLP, no biases).
Both return the cross-entropy loss of next-token targets.

Placements for ``fxforge.partition``: ``fsdp`` shards every parameter on dim 0 over the mesh (the
batch too); ``fsdp_tp`` runs on a (data, model) mesh: every parameter ``Shard(0)`` on the data
dim, and on the model dim the attention and MLP projections Megatron-style (into the block:
column-parallel, ``Shard(0)``; out of it: row-parallel, ``Shard(1)``), the rest replicated.
Either way a parameter is read whole on the data dim (``compute_placements``: FSDP gathers it
before use and reduce-scatters its gradient).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fxforge.entry.demo import GPT, GPTConfig

VOCAB, SEQ, D, HEADS, LAYERS = 512, 128, 256, 4, 4


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x, cos, sin):
    a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat([-b, a], dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(d, hidden, bias=False), nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (p(h).view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + self.o((att @ v).transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, vocab: int = VOCAB, seq: int = SEQ, d: int = D, heads: int = HEADS, layers: int = LAYERS):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads, 8 * d // 3 // 32 * 32) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        half = d // heads // 2
        freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
        ang = torch.arange(seq, dtype=torch.float32)[:, None] * freq[None]
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1), persistent=False)
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1), persistent=False)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.tok(idx)
        cos, sin = self.cos[:t], self.sin[:t]
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build(name: str) -> nn.Module:
    if name == "gpt":
        return GPT(GPTConfig(vocab=VOCAB, seq=SEQ, d=D, heads=HEADS, layers=LAYERS))
    if name == "llama":
        return Llama()
    raise ValueError(f"unknown model {name!r}: gpt or llama")


def batch(world_batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (world_batch, SEQ), generator=g),
            torch.randint(0, VOCAB, (world_batch, SEQ), generator=g))


# projections into a block (column-parallel) and out of it (row-parallel), by parameter name
_INTO = ("attn.qkv.", "mlp.0.", ".q.", ".k.", ".v.", ".gate.", ".up.")
_OUT = ("attn.proj.weight", "mlp.2.weight", ".o.weight", ".down.weight")


def placements(model: nn.Module, parallel: str) -> dict:
    """``in_placements`` for ``fxforge.partition``: every parameter and the batch."""
    from torch.distributed.tensor import Replicate, Shard

    out = {}
    for name, _ in model.named_parameters():
        if parallel == "fsdp":
            out[name] = [Shard(0)]
        else:
            tp = Shard(0) if any(k in name for k in _INTO) else Shard(1) if any(name.endswith(k) or k in name
                                                                               for k in _OUT) else Replicate()
            out[name] = [Shard(0), tp]
    data = [Shard(0)] if parallel == "fsdp" else [Shard(0), Replicate()]
    return {**out, "idx": data, "targets": data}


def compute_placements(model: nn.Module, parallel: str) -> dict:
    """``compute_placements`` for ``fxforge.partition``: FSDP reads every parameter whole on the
    data-parallel dim (all-gathered before it is read; its gradient reduce-scattered back),
    as ``placements`` on the model dim."""
    from torch.distributed.tensor import Replicate

    stored = placements(model, parallel)
    return {name: [Replicate(), *stored[name][1:]] for name, _ in model.named_parameters()}
