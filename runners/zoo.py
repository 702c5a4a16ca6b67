"""The model zoo: pure-torch definitions of the standard architectures.

torchvision and transformers are not dependencies, so the zoo writes the
architectures itself, following the reference layouts (torchvision ResNet-50
v1.5, MobileNetV2, EfficientNet-B0; Google's BERT encoder) closely enough that
MACs, parameters and activation sizes match. Weights are random: energy and
latency do not depend on their values. Operations that are not modules in the
usual definitions (residual adds, SE scaling, attention matmuls and softmax)
are small leaf modules here so that scripts/make_profiles.py can count them
with forward hooks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from tuner.errors import UserError

BERT_SEQ_LEN = 128
BERT_VOCAB = 30522


class Add(nn.Module):
    """Element-wise sum, a module so that residual adds are profiled."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class Mul(nn.Module):
    """Element-wise (broadcast) product, for squeeze-and-excitation scaling."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b


class MatMul(nn.Module):
    """Batched matmul, a module so that attention's QK^T and AV are profiled."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.matmul(a, b)


class Scale(nn.Module):
    """Multiplication by a constant (attention's 1/sqrt(d))."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class Softmax(nn.Softmax):
    """Softmax over the last dimension."""

    def __init__(self) -> None:
        super().__init__(dim=-1)


# --------------------------------------------------------------------- CNNs


def _conv_bn(
    cin: int,
    cout: int,
    kernel: int,
    stride: int = 1,
    groups: int = 1,
    act: type[nn.Module] | None = nn.ReLU,
    eps: float = 1e-5,
) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout, eps=eps),
    ]
    if act is not None:
        layers.append(act(inplace=True) if act in (nn.ReLU, nn.ReLU6, nn.SiLU) else act())
    return nn.Sequential(*layers)


class Bottleneck(nn.Module):
    """ResNet v1.5 bottleneck: the stride sits on the 3x3 conv, as in torchvision."""

    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu2 = nn.ReLU(inplace=True)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.add = Add()
        self.relu3 = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu3(self.add(out, identity))


class ResNet50(nn.Module):
    """ResNet-50 for 224x224 ImageNet: 4.09 GMAC, 25.6 M parameters."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        cin = 64
        stages = []
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            layers = []
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * Bottleneck.expansion
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand, 3x3 depthwise, linear 1x1 projection."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn(cin, hidden, 1, act=nn.ReLU6))
        layers.append(_conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6))
        layers.append(_conv_bn(hidden, cout, 1, act=None))
        self.conv = nn.Sequential(*layers)
        self.add = Add() if stride == 1 and cin == cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv(x)
        return out if self.add is None else self.add(x, out)


class MobileNetV2(nn.Module):
    """MobileNetV2, width 1.0, 224x224: 0.30 GMAC, 3.5 M parameters."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))  # fmt: skip

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        cin = 32
        for expand, cout, repeats, stride in self.SETTINGS:
            for i in range(repeats):
                layers.append(InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(_conv_bn(cin, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class SqueezeExcite(nn.Module):
    """Squeeze-and-excitation with SiLU and a sigmoid gate, as in EfficientNet."""

    def __init__(self, channels: int, squeeze: int) -> None:
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.act = nn.SiLU(inplace=True)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = nn.Sigmoid()
        self.mul = Mul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.gate(self.fc2(self.act(self.fc1(self.avgpool(x)))))
        return self.mul(x, scale)


class MBConv(nn.Module):
    """EfficientNet MBConv: expand, depthwise, SE, projection, residual."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(_conv_bn(cin, hidden, 1, act=nn.SiLU, eps=1e-3))
        layers.append(_conv_bn(hidden, hidden, kernel, stride, hidden, act=nn.SiLU, eps=1e-3))
        layers.append(SqueezeExcite(hidden, max(1, cin // 4)))
        layers.append(_conv_bn(hidden, cout, 1, act=None, eps=1e-3))
        self.block = nn.Sequential(*layers)
        self.add = Add() if stride == 1 and cin == cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return out if self.add is None else self.add(out, x)


class EfficientNetB0(nn.Module):
    """EfficientNet-B0, 224x224: 0.39 GMAC, 5.3 M parameters."""

    STAGES = ((1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2),
              (6, 3, 2, 40, 80, 3), (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4),
              (6, 3, 1, 192, 320, 1))  # fmt: skip

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2, act=nn.SiLU, eps=1e-3)]
        for expand, kernel, stride, cin, cout, repeats in self.STAGES:
            stage = [
                MBConv(cin if i == 0 else cout, cout, kernel, stride if i == 0 else 1, expand) for i in range(repeats)
            ]
            layers.append(nn.Sequential(*stage))
        layers.append(_conv_bn(320, 1280, 1, act=nn.SiLU, eps=1e-3))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class TinyCNN(nn.Module):
    """A few-kFLOP CNN on 32x32 images, so CPU LoadGen tests finish in seconds."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn(3, 16, 3),
            nn.MaxPool2d(2),
            _conv_bn(16, 32, 3, 2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.avgpool(self.features(x)), 1))


# --------------------------------------------------------------------- BERT


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with its matmuls and softmax as modules."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.scores = MatMul()
        self.scale = Scale(1.0 / math.sqrt(self.head_dim))
        self.softmax = Softmax()
        self.dropout = nn.Dropout(0.1)
        self.context = MatMul()

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        return x.view(b, s, self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        probs = self.dropout(self.softmax(self.scale(self.scores(q, k.transpose(-1, -2)))))
        ctx = self.context(probs, v).transpose(1, 2)
        return ctx.reshape(x.shape)


class BertLayer(nn.Module):
    """Post-LayerNorm transformer encoder layer, as in the original BERT."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_dropout = nn.Dropout(0.1)
        self.attn_add = Add()
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.gelu = nn.GELU()
        self.output = nn.Linear(intermediate, hidden)
        self.out_dropout = nn.Dropout(0.1)
        self.out_add = Add()
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn = self.attn_dropout(self.attn_out(self.attention(x)))
        x = self.attn_norm(self.attn_add(x, attn))
        ff = self.out_dropout(self.output(self.gelu(self.intermediate(x))))
        return self.out_norm(self.out_add(x, ff))


class Bert(nn.Module):
    """BERT encoder (embeddings, layers, pooler) on token ids [batch, seq_len].

    Every synthetic sequence is full length, so no attention mask is applied.
    """

    def __init__(self, hidden: int, layers: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(BERT_VOCAB, hidden)
        self.position_embeddings = nn.Embedding(512, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.embed_add_pos = Add()
        self.embed_add_type = Add()
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.embed_dropout = nn.Dropout(0.1)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, intermediate) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.pooler_act = nn.Tanh()
        self.apply(self._init)

    @staticmethod
    def _init(module: nn.Module) -> None:
        # BERT's truncated-normal(0.02) scale keeps random-weight activations finite in fp16.
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear):
            nn.init.zeros_(module.bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        types = torch.zeros_like(ids)
        x = self.embed_add_pos(self.word_embeddings(ids), self.position_embeddings(positions))
        x = self.embed_add_type(x, self.token_type_embeddings(types))
        x = self.embed_dropout(self.embed_norm(x))
        for layer in self.layers:
            x = layer(x)
        return self.pooler_act(self.pooler(x[:, 0]))


# ------------------------------------------------------------------ registry


@dataclass(frozen=True)
class ModelSpec:
    """What a runner needs to know about a zoo model besides its module."""

    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    task: str
    cnn: bool

    @property
    def tokens(self) -> bool:
        return not self.cnn


_IMAGE = (3, 224, 224)
_SPECS = {
    spec.name: spec
    for spec in (
        ModelSpec("resnet50", ResNet50, _IMAGE, "image-classification", True),
        ModelSpec("mobilenet_v2", MobileNetV2, _IMAGE, "image-classification", True),
        ModelSpec("efficientnet_b0", EfficientNetB0, _IMAGE, "image-classification", True),
        ModelSpec("bert-base", lambda: Bert(768, 12, 12, 3072), (BERT_SEQ_LEN,),
                  "language-encoding", False),
        ModelSpec("bert-large", lambda: Bert(1024, 24, 16, 4096), (BERT_SEQ_LEN,),
                  "language-encoding", False),
        ModelSpec("tiny-cnn", TinyCNN, (3, 32, 32), "image-classification", True),
    )
}  # fmt: skip


def model_names() -> list[str]:
    return sorted(_SPECS)


def spec(name: str) -> ModelSpec:
    """Look a model up; an unknown name lists the known ones."""
    try:
        return _SPECS[name]
    except KeyError:
        raise UserError(
            f"unknown model {name!r}: known models are {', '.join(model_names())} (or pass a path to an .onnx file)"
        ) from None


def build_model(name: str, seed: int = 0) -> nn.Module:
    """Build a zoo model in eval mode with seeded random weights.

    The seed makes two builds identical (weights files round trip, profiles
    reproduce) without touching the caller's global RNG state.
    """
    model_spec = spec(name)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_spec.build()
    return model.eval()


def input_for(
    name: str,
    batch_size: int,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """A synthetic batch of the model's input: images in ``dtype``, or int64 token ids."""
    if batch_size < 1:
        raise UserError(f"batch size must be at least 1, got {batch_size}")
    model_spec = spec(name)
    generator = torch.Generator().manual_seed(batch_size)
    shape = (batch_size, *model_spec.input_shape)
    if model_spec.tokens:
        batch = torch.randint(0, BERT_VOCAB, shape, generator=generator)
    else:
        batch = torch.randn(shape, generator=generator).to(dtype)
    return batch.to(device)
