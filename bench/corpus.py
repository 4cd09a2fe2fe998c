"""The models: fxforge's demo GPT and transformers GPT-2, LLaMA and BERT from configs.

Everything is offline (random weights from configs, ``HF_HUB_OFFLINE=1``).  Batch 2, seq 128;
2-layer models have hidden 256 (4 heads), 12-layer ones hidden 768 (12 heads), the MLP is 4x
hidden (LLaMA: 8/3 x hidden, rounded to a multiple of 64).  ``use_cache=False``,
``attn_implementation="eager"`` (attention as matmul/softmax/matmul in the graph), dropout 0 so
every contender computes the same function and gradients can be compared.  Each case has an
inference step (``no_grad``, eval mode) and a training step (forward with labels, loss, backward;
gradients set to None first; no optimizer).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

BATCH, SEQ = 2, 128


@dataclass
class Model:
    name: str
    build: Callable[[], torch.nn.Module]  # seeded: same weights every call
    inputs: Callable[[str, bool], dict]  # (device, train) -> kwargs of forward
    loss: Callable[[Any], torch.Tensor]  # forward output (train=True) -> scalar loss
    output: Callable[[Any], Any]  # forward output (train=False) -> what is compared to eager
    layers: int
    hidden: int
    needs_transformers: bool = True


def _tokens(vocab: int, device: str, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, SEQ), generator=g).to(device)


def _demo(tiny: bool = False) -> Model:
    from fxforge.demo import GPT, GPTConfig

    cfg = GPTConfig(vocab=256, seq=32, d=64, heads=2, layers=1) if tiny else GPTConfig()

    def build():
        torch.manual_seed(0)
        return GPT(cfg)

    def inputs(device, train):
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, cfg.vocab, (BATCH, cfg.seq), generator=g).to(device)
        if not train:
            return {"idx": idx}
        return {"idx": idx, "targets": torch.randint(0, cfg.vocab, (BATCH, cfg.seq), generator=g).to(device)}

    return Model("demo-tiny" if tiny else "demo", build, inputs, lambda out: out, lambda out: out,
                 cfg.layers, cfg.d, needs_transformers=False)


def _hf(family: str, layers: int, hidden: int) -> Model:
    heads = hidden // 64

    def config():
        import transformers as tf

        if family == "gpt2":
            c = tf.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=SEQ, resid_pdrop=0.0,
                              embd_pdrop=0.0, attn_pdrop=0.0)
            cls, vocab = tf.GPT2LMHeadModel, c.vocab_size
        elif family == "llama":
            inter = (hidden * 8 // 3 + 63) // 64 * 64
            c = tf.LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                               num_key_value_heads=heads, intermediate_size=inter, max_position_embeddings=SEQ,
                               attention_dropout=0.0)
            cls, vocab = tf.LlamaForCausalLM, c.vocab_size
        elif family == "bert":
            c = tf.BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                              intermediate_size=4 * hidden, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)
            cls, vocab = tf.BertForMaskedLM, c.vocab_size
        else:
            raise ValueError(family)
        c.use_cache = False
        c._attn_implementation = "eager"
        return cls, c, vocab

    def build():
        cls, c, _ = config()
        torch.manual_seed(0)
        try:
            m = cls(c, attn_implementation="eager")
        except TypeError:
            m = cls(c)
        return m

    def inputs(device, train):
        _, _, vocab = config()
        ids = _tokens(vocab, device)
        kw = {"input_ids": ids}
        if train:
            kw["labels"] = ids
        return kw

    return Model(f"{family}-{layers}l", build, inputs, lambda out: out.loss, lambda out: out.logits, layers, hidden)


def all_models() -> dict[str, Model]:
    models = [_demo(tiny=True), _demo()]
    for layers, hidden in ((2, 256), (12, 768)):
        for family in ("gpt2", "llama", "bert"):
            models.append(_hf(family, layers, hidden))
    return {m.name: m for m in models}


def have_transformers() -> bool:
    try:
        import transformers  # noqa: F401

        return True
    except Exception:
        return False
