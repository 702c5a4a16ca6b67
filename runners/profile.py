"""Per-layer FLOP/byte profiles of the model zoo, the twin's and the roofline's view of a model.

Profiles are generated from the real model graphs by scripts/make_profiles.py
and committed as runners/profiles/<model>.json, so the twin needs no torch.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from tuner.errors import UserError

PROFILE_VERSION = 2
OP_CLASSES = (
    "conv_dense",
    "conv_depthwise",
    "conv_pointwise",
    "gemm",
    "attention",
    "elementwise",
    "broadcast",
    "layout_copy",
)


class LayerProfile(BaseModel):
    """One operator of the graph, counted per sample at fp32.

    ``flops``: 2 x multiply-accumulates for conv/linear/matmul, one per output
    element for element-wise ops. ``weight_bytes``: parameters read once per
    batch. ``act_bytes``: input plus output activations per sample.
    ``matmul``: True where tensor cores can run it (conv, linear, matmul).
    ``op_class``: the kernel family the twin times it as (OP_CLASSES): dense,
    depthwise or pointwise convolution, GEMM, attention matmul,
    elementwise/normalisation, a broadcast elementwise op (one operand smaller,
    as squeeze-and-excitation scaling: PyTorch runs it with a non-vectorized
    kernel) or a layout copy (a strided view made contiguous); each has its
    own achieved fraction of peak. ``min_batch``: the smallest batch at which
    the layer runs at all (eager attention's reshape of a transposed batch is
    a view at batch 1 and a copy above it).
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    op: str
    flops: float = Field(ge=0)
    weight_bytes: float = Field(ge=0)
    act_bytes: float = Field(ge=0)
    matmul: bool = False
    op_class: str = "elementwise"
    min_batch: int = Field(default=1, ge=1)


class ModelProfile(BaseModel):
    """A model's layers plus what produced them."""

    model_config = ConfigDict(extra="forbid")

    version: int = PROFILE_VERSION
    model: str
    task: str
    input_shape: list[int]
    generated_by: str
    torch_version: str = ""
    notes: str = ""
    layers: list[LayerProfile] = Field(min_length=1)

    @property
    def flops_per_sample(self) -> float:
        return sum(layer.flops for layer in self.layers)

    @property
    def weight_bytes(self) -> float:
        return sum(layer.weight_bytes for layer in self.layers)

    @property
    def act_bytes_per_sample(self) -> float:
        return sum(layer.act_bytes for layer in self.layers)


def profile_names() -> list[str]:
    folder = resources.files("runners") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


@cache
def load_profile(model: str) -> ModelProfile:
    """Load a committed profile; an unknown model lists the known ones."""
    resource = resources.files("runners") / "profiles" / f"{model}.json"
    if not resource.is_file():
        raise UserError(f"unknown model {model!r}: known models are {', '.join(profile_names())}")
    return ModelProfile.model_validate(json.loads(resource.read_text()))
