"""The models: fxforge's demo GPT, transformers GPT-2, LLaMA, BERT, T5 and ViT from configs, and
four models written here (a ResNet-style CNN with batch norm, a depthwise-separable CNN, an
MLP-mixer and one large activation block).

Everything is offline (random weights from configs, ``HF_HUB_OFFLINE=1``).  Batch 2, seq 128;
2-layer models have hidden 256 (4 heads), 12-layer ones hidden 768 (12 heads), the MLP is 4x
hidden (LLaMA: 8/3 x hidden, rounded to a multiple of 64).  ``use_cache=False``,
``attn_implementation="eager"`` (attention as matmul/softmax/matmul in the graph), dropout 0 so
every contender computes the same function and gradients can be compared.  Each case has an
inference step (``no_grad``, eval mode) and a training step (forward with labels, loss, backward;
gradients set to None first; no optimizer).

The model families (``FAMILIES``, what ``make bench`` runs) each stand for one kind of program:

* ``resnet``: basic blocks (3x3 conv, batch norm, ReLU, residual add; a strided 1x1 conv and batch
  norm on the shortcut where the shape changes), widths 32-64-128-256, one block a stage,
  global average pool, 10-class head; batch 8, 3 x 64 x 64 images;
* ``mobilenet``: inverted residual blocks (1x1 expand, 3x3 depthwise, 1x1 project, batch norm,
  ReLU6, residual where the shape allows), widths 16-24-32-64, a 1x1 conv to 256; batch 8,
  3 x 96 x 96 images;
* ``bert-2l``, ``gpt2-2l``, ``llama-2l``: as above (hidden 256, 2 layers, batch 2, seq 128);
* ``t5-2l``: T5 encoder-decoder, 2 + 2 layers, d_model 256, 4 heads, feed-forward 1024, the
  decoder reads the same token ids (training: ``labels``, shifted inside the model);
* ``vit-2l``: ViT image classifier, 2 layers, hidden 256, 4 heads, 224 x 224 images in 16 x 16
  patches (196 tokens + CLS), batch 8, 10 classes;
* ``mixer``: MLP-mixer, 8 x 8 patches of 64 x 64 images by a strided conv (64 tokens), 4 blocks,
  d 256 (token MLP 64->128->64, channel MLP 256->1024->256, GELU, pre-LayerNorm), batch 8;
* ``big-activation``: layer norm over a residual add, then ``relu(h * 2 + 1) - sigmoid(y)`` on a
  64 x 512 x 768 activation (inference only: no weights worth a gradient).

The held-out models (``HOLDOUT``, ``--models holdout``), never tuned on: ``distilbert-2l``
(DistilBERT masked LM), ``neox-2l`` (GPT-NeoX: rotary embeddings, parallel attention and MLP),
``bart-2l`` (BART encoder-decoder, a final logits bias, the embedding tied to the head),
``opt-2l`` (OPT: ReLU MLP, learned positions), ``phi-2l`` (Phi: partial rotary embeddings,
parallel attention and MLP), ``mistral-2l`` (Mistral: grouped-query attention, 2 key/value heads)
and ``convnext-2l`` (ConvNeXt image classifier: 7 x 7 depthwise convolutions, layer norm, GELU;
depths 2-2-2-2, widths 32-64-128-256, batch 8 of 3 x 64 x 64 images), each 2 (+ 2) layers,
hidden 256, 4 heads, feed-forward 1024 (Mistral 896).

The CNNs and the mixer take random images and, for training, random class labels with a
cross-entropy loss.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

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
    modes: tuple = ("inference", "train")


def _tokens(vocab: int, device: str, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (BATCH, SEQ), generator=g).to(device)


def _demo(tiny: bool = False) -> Model:
    from fxforge.entry.demo import GPT, GPTConfig

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
        elif family == "t5":
            c = tf.T5Config(num_layers=layers, num_decoder_layers=layers, d_model=hidden, d_kv=64, num_heads=heads,
                            d_ff=4 * hidden, dropout_rate=0.0, feed_forward_proj="relu",
                            decoder_start_token_id=0, pad_token_id=0)
            cls, vocab = tf.T5ForConditionalGeneration, c.vocab_size
        elif family == "vit":
            c = tf.ViTConfig(image_size=224, patch_size=16, hidden_size=hidden, num_hidden_layers=layers,
                             num_attention_heads=heads, intermediate_size=4 * hidden, hidden_dropout_prob=0.0,
                             attention_probs_dropout_prob=0.0, num_labels=CLASSES)
            cls, vocab = tf.ViTForImageClassification, None
        elif family == "bert":
            c = tf.BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                              intermediate_size=4 * hidden, max_position_embeddings=SEQ, hidden_dropout_prob=0.0,
                              attention_probs_dropout_prob=0.0)
            cls, vocab = tf.BertForMaskedLM, c.vocab_size
        elif family == "distilbert":
            c = tf.DistilBertConfig(n_layers=layers, dim=hidden, n_heads=heads, hidden_dim=4 * hidden, dropout=0.0,
                                    attention_dropout=0.0, max_position_embeddings=SEQ)
            cls, vocab = tf.DistilBertForMaskedLM, c.vocab_size
        elif family == "neox":
            c = tf.GPTNeoXConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                 intermediate_size=4 * hidden, max_position_embeddings=SEQ, hidden_dropout=0.0,
                                 attention_dropout=0.0)
            cls, vocab = tf.GPTNeoXForCausalLM, c.vocab_size
        elif family == "bart":
            c = tf.BartConfig(encoder_layers=layers, decoder_layers=layers, d_model=hidden, encoder_attention_heads=heads,
                              decoder_attention_heads=heads, encoder_ffn_dim=4 * hidden, decoder_ffn_dim=4 * hidden,
                              dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=SEQ)
            cls, vocab = tf.BartForConditionalGeneration, c.vocab_size
        elif family == "opt":
            c = tf.OPTConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                             ffn_dim=4 * hidden, word_embed_proj_dim=hidden, max_position_embeddings=SEQ,
                             dropout=0.0, attention_dropout=0.0)
            cls, vocab = tf.OPTForCausalLM, c.vocab_size
        elif family == "phi":
            c = tf.PhiConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                             intermediate_size=4 * hidden, max_position_embeddings=SEQ, resid_pdrop=0.0,
                             embd_pdrop=0.0, attention_dropout=0.0)
            cls, vocab = tf.PhiForCausalLM, c.vocab_size
        elif family == "mistral":
            inter = (hidden * 7 // 2 + 63) // 64 * 64
            c = tf.MistralConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                 num_key_value_heads=max(1, heads // 2), intermediate_size=inter,
                                 max_position_embeddings=SEQ, attention_dropout=0.0, sliding_window=None)
            cls, vocab = tf.MistralForCausalLM, c.vocab_size
        elif family == "convnext":
            c = tf.ConvNextConfig(image_size=IMAGE_SIZE, depths=[layers] * 4,
                                  hidden_sizes=[hidden // 8, hidden // 4, hidden // 2, hidden], num_labels=CLASSES,
                                  drop_path_rate=0.0)
            cls, vocab = tf.ConvNextForImageClassification, None
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
        if family in ("vit", "convnext"):
            kw = {"pixel_values": _images(IMAGE_BATCH, 224 if family == "vit" else IMAGE_SIZE, device)}
            if train:
                kw["labels"] = _labels(IMAGE_BATCH, device)
            return kw
        ids = _tokens(vocab, device)
        kw = {"input_ids": ids}
        if train:
            kw["labels"] = ids
        elif family in ("t5", "bart"):
            kw["decoder_input_ids"] = ids
        return kw

    return Model(f"{family}-{layers}l", build, inputs, lambda out: out.loss, lambda out: out.logits, layers, hidden)


# --------------------------------------------------------------------------------------------
# models written here: vision, mixer, one large activation

IMAGE_BATCH, CLASSES, IMAGE_SIZE = 8, 10, 64


def _images(batch: int, size: int, device: str, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, size, size, generator=g).to(device)


def _labels(batch: int, device: str, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, CLASSES, (batch,), generator=g).to(device)


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(cin, cout, 3, stride), nn.ReLU(), *_conv_bn(cout, cout, 3))
        self.shortcut = (nn.Sequential(*_conv_bn(cin, cout, 1, stride)) if stride != 1 or cin != cout
                         else nn.Identity())

    def forward(self, x):
        return F.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, widths=(32, 64, 128, 256), classes: int = CLASSES):
        super().__init__()
        layers, cin = [*_conv_bn(3, widths[0], 3), nn.ReLU()], widths[0]
        for i, w in enumerate(widths):
            layers.append(BasicBlock(cin, w, 1 if i == 0 else 2))
            cin = w
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(cin, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 6):
        super().__init__()
        mid = cin * expand
        self.body = nn.Sequential(*_conv_bn(cin, mid, 1), nn.ReLU6(), *_conv_bn(mid, mid, 3, stride, groups=mid),
                                  nn.ReLU6(), *_conv_bn(mid, cout, 1))
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


class MobileNet(nn.Module):
    # (output channels, stride) of each inverted residual block
    BLOCKS = ((16, 1), (24, 2), (24, 1), (32, 2), (32, 1), (64, 2), (64, 1))

    def __init__(self, classes: int = CLASSES):
        super().__init__()
        layers, cin = [*_conv_bn(3, 32, 3, 2), nn.ReLU6()], 32
        for cout, stride in self.BLOCKS:
            layers.append(InvertedResidual(cin, cout, stride))
            cin = cout
        layers += [*_conv_bn(cin, 256, 1), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(256, classes)

    def forward(self, x):
        return self.head(self.features(x).mean((2, 3)))


class MixerBlock(nn.Module):
    def __init__(self, d: int, tokens: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(d)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.norm2 = nn.LayerNorm(d)
        self.channel_mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    def __init__(self, d: int = 64, tokens: int = 16, blocks: int = 4, classes: int = CLASSES, patch: int = 0):
        super().__init__()
        # patch > 0: the input is an image, cut into patch x patch tokens by a strided conv
        self.embed = nn.Conv2d(3, d, patch, patch) if patch else None
        self.blocks = nn.Sequential(*[MixerBlock(d, tokens) for _ in range(blocks)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x, y=None):
        if self.embed is not None:
            x = self.embed(x).flatten(2).transpose(1, 2)
        logits = self.head(self.norm(self.blocks(x)).mean(1))
        return logits if y is None else F.cross_entropy(logits, y)


class Chain(nn.Module):
    """``n`` tiny pointwise ops in a row, values kept bounded: a graph whose time is all per-op
    and per-call overhead."""

    def __init__(self, n: int = 200):
        super().__init__()
        self.n = n

    def forward(self, x):
        for i in range(self.n):
            k = i % 8
            if k == 0:
                x = torch.sin(x)
            elif k == 1:
                x = x * 1.5
            elif k == 2:
                x = x + 0.25
            elif k == 3:
                x = torch.tanh(x)
            elif k == 4:
                x = torch.sigmoid(x)
            elif k == 5:
                x = x - 0.5
            elif k == 6:
                x = torch.relu(x) + x
            else:
                x = torch.abs(x) * 0.75
        return x


class BigActivation(nn.Module):
    def __init__(self, d: int = 768):
        super().__init__()
        self.norm = nn.LayerNorm(d)

    def forward(self, x, y):
        h = self.norm(x + y)
        return torch.relu(h * 2 + 1) - torch.sigmoid(y)


def _image_classifier(name: str, make: Callable[[], nn.Module], size: int, layers: int, hidden: int) -> Model:
    def build():
        torch.manual_seed(0)
        return make()

    def inputs(device, train):
        kw = {"x": _images(IMAGE_BATCH, size, device)}
        if train:
            kw["y"] = _labels(IMAGE_BATCH, device)
        return kw

    return Model(name, build, inputs, lambda out: out, lambda out: out, layers, hidden, needs_transformers=False)


class _WithLoss(nn.Module):
    """A classifier returning logits, with ``y`` given: cross entropy of its logits."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x, y=None):
        logits = self.inner(x)
        return logits if y is None else F.cross_entropy(logits, y)


def _mixer_small() -> Model:
    """The 4-block mixer at its defaults (d 64, 16 tokens, batch 8 of tokens): milliseconds a step."""
    def build():
        torch.manual_seed(0)
        return Mixer()

    def inputs(device, train):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(8, 16, 64, generator=g).to(device)
        return {"x": x, "y": torch.randint(0, CLASSES, (8,), generator=g).to(device)} if train else {"x": x}

    return Model("mixer-small", build, inputs, lambda out: out, lambda out: out, 4, 64, needs_transformers=False)


def _chain(n: int = 200) -> Model:
    def inputs(device, train):
        return {"x": torch.randn(8, 32, generator=torch.Generator().manual_seed(1)).to(device)}

    return Model("chain", lambda: Chain(n), inputs, lambda out: out.sum(), lambda out: out, n, 32,
                 needs_transformers=False, modes=("inference",))


def _big_activation(shape=(64, 512, 768)) -> Model:
    def build():
        torch.manual_seed(0)
        m = BigActivation(shape[-1])
        with torch.no_grad():  # not the identity affine: the weights matter to the result
            m.norm.weight.normal_()
            m.norm.bias.normal_()
        return m

    def inputs(device, train):
        g = torch.Generator().manual_seed(1)
        return {"x": torch.randn(*shape, generator=g).to(device), "y": torch.randn(*shape, generator=g).to(device)}

    return Model("big-activation", build, inputs, lambda out: out.float().square().mean(), lambda out: out, 1,
                 shape[-1], needs_transformers=False, modes=("inference",))


FAMILIES = ["resnet", "mobilenet", "bert-2l", "gpt2-2l", "llama-2l", "t5-2l", "vit-2l", "mixer", "big-activation"]
# Small models, where the time around the kernels counts (per-call overhead):
# ``python bench/run.py --models demo mixer-small chain gpt2-2l --threads 1 --tag overhead``.
OVERHEAD = ["demo", "mixer-small", "chain", "gpt2-2l"]
# Models nothing was tuned on, to check that what holds on the families holds elsewhere:
# ``python bench/run.py --models holdout``.
HOLDOUT_FAMILIES = ("distilbert", "neox", "bart", "opt", "phi", "mistral", "convnext")
HOLDOUT = [f"{family}-2l" for family in HOLDOUT_FAMILIES]


def all_models() -> dict[str, Model]:
    models = [_demo(tiny=True), _demo()]
    for layers, hidden in ((2, 256), (12, 768)):
        for family in ("gpt2", "llama", "bert", "t5", "vit"):
            models.append(_hf(family, layers, hidden))
    models += [_hf(family, 2, 256) for family in HOLDOUT_FAMILIES]
    models += [
        _image_classifier("resnet", lambda: _WithLoss(ResNet()), 64, 4, 256),
        _image_classifier("mobilenet", lambda: _WithLoss(MobileNet()), 96, len(MobileNet.BLOCKS), 256),
        _image_classifier("mixer", lambda: Mixer(d=256, tokens=64, blocks=4, patch=8), 64, 4, 256),
        _big_activation(),
        _mixer_small(),
        _chain(),
    ]
    return {m.name: m for m in models}


def have_transformers() -> bool:
    try:
        import transformers  # noqa: F401

        return True
    except Exception:
        return False
