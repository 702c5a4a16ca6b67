"""Count per-layer FLOPs and bytes of a zoo model from one real forward pass.

Forward hooks on the leaf modules see the actual tensor shapes, so the counts
follow the graph as it runs (strides, groups, broadcasts) instead of a second
hand-written description of each architecture. The zoo makes every operation
that matters a module (residual adds, SE scaling, attention matmuls), so
nothing of weight is computed outside a hook, except the copies eager PyTorch
makes when a strided view must become contiguous (attention's transposed
heads before and after its batched matmuls). Those are invisible at batch 1
(merging a batch dimension of size 1 is a view), so a second forward at batch
2 records every such copy (under a dispatch mode: a matmul operand or a reshape that cannot be a view) and adds it as
a ``layout_copy`` layer that runs from batch 2 up.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from runners import zoo
from runners.profile import LayerProfile, ModelProfile

FP32 = 4

_ELEMENTWISE = {
    nn.BatchNorm2d: "batchnorm",
    nn.LayerNorm: "layernorm",
    nn.ReLU: "relu",
    nn.ReLU6: "relu6",
    nn.SiLU: "silu",
    nn.GELU: "gelu",
    nn.Sigmoid: "sigmoid",
    nn.Tanh: "tanh",
    nn.Softmax: "softmax",
    zoo.Add: "add",
    zoo.Mul: "mul",
    zoo.Scale: "scale",
}
# Identity at inference: no work, no traffic.
_SKIP = (nn.Dropout, nn.Identity, nn.Flatten)


def _bytes_per_sample(tensor: torch.Tensor, batch: int) -> float:
    """fp32 bytes (token ids keep their own width) of the part of a tensor one sample owns."""
    width = tensor.element_size() if not tensor.is_floating_point() else FP32
    per_sample = tensor.numel() / batch if tensor.shape[:1] == (batch,) else tensor.numel()
    return per_sample * width


def _param_bytes(module: nn.Module) -> float:
    return float(sum(p.numel() for p in module.parameters(recurse=False)) * FP32)


def _conv_class(conv: nn.Conv2d) -> str:
    """Depthwise (one filter per channel) and pointwise (1x1) convolutions run different kernels than dense ones."""
    if conv.groups > 1 and conv.groups == conv.in_channels:
        return "conv_depthwise"
    if math.prod(conv.kernel_size) == 1 and conv.groups == 1:
        return "conv_pointwise"
    return "conv_dense"


def _layer(
    name: str,
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    output: torch.Tensor,
    batch: int,
) -> LayerProfile | None:
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    act = sum(_bytes_per_sample(t, batch) for t in tensors) + _bytes_per_sample(output, batch)
    out_elems = output.numel() / batch
    if isinstance(module, nn.Conv2d):
        macs = out_elems * (module.in_channels // module.groups) * math.prod(module.kernel_size)
        return LayerProfile(
            name=name,
            op="conv2d",
            flops=2 * macs,
            weight_bytes=_param_bytes(module),
            act_bytes=act,
            matmul=True,
            op_class=_conv_class(module),
        )
    if isinstance(module, nn.Linear):
        macs = out_elems * module.in_features
        return LayerProfile(
            name=name,
            op="linear",
            flops=2 * macs,
            weight_bytes=_param_bytes(module),
            act_bytes=act,
            matmul=True,
            op_class="gemm",
        )
    if isinstance(module, zoo.MatMul):
        macs = out_elems * tensors[0].shape[-1]
        return LayerProfile(
            name=name, op="matmul", flops=2 * macs, weight_bytes=0.0, act_bytes=act, matmul=True, op_class="attention"
        )
    if isinstance(module, nn.Embedding):
        # A lookup reads only the gathered rows, which scale with the batch: they
        # are activation traffic, not a weight read once per batch.
        return LayerProfile(name=name, op="embedding", flops=0.0, weight_bytes=0.0, act_bytes=act)
    if isinstance(module, nn.MaxPool2d):
        window = module.kernel_size
        size = window * window if isinstance(window, int) else math.prod(window)
        return LayerProfile(name=name, op="maxpool", flops=out_elems * size, weight_bytes=0.0, act_bytes=act)
    if isinstance(module, nn.AdaptiveAvgPool2d):
        return LayerProfile(
            name=name,
            op="avgpool",
            flops=tensors[0].numel() / batch,
            weight_bytes=0.0,
            act_bytes=act,
        )
    broadcast = len(tensors) == 2 and tensors[0].shape != tensors[1].shape
    for cls, op in _ELEMENTWISE.items():
        if isinstance(module, cls):
            return LayerProfile(
                name=name,
                op=op,
                flops=out_elems,
                weight_bytes=_param_bytes(module),
                act_bytes=act,
                op_class="broadcast" if broadcast else "elementwise",
            )
    if isinstance(module, _SKIP):
        return None
    raise TypeError(f"no FLOP rule for {type(module).__name__} at {name}")


class _Copies(TorchDispatchMode):
    """Records every layout copy eager PyTorch makes, with the leaf layer that last completed before it."""

    def __init__(self, batch: int) -> None:
        super().__init__()
        self.batch = batch
        self.last_layer = ""
        self.copies: list[tuple[str, float]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.matmul.default:
            # matmul folds the leading dimensions of each operand into one batch for bmm: a copy where
            # that is not a view (the last two dimensions may stay transposed)
            for t in args:
                if isinstance(t, torch.Tensor) and t.dim() >= 3 and not _is_view(t, (-1, *t.shape[-2:])):
                    self._record(t)
        elif func is torch.ops.aten.reshape.default and not _is_view(args[0], tuple(args[1])):
            self._record(args[0])
        elif func is torch.ops.aten.clone.default:
            self._record(args[0])
        return func(*args, **(kwargs or {}))

    def _record(self, tensor: torch.Tensor) -> None:
        self.copies.append((self.last_layer, 2 * _bytes_per_sample(tensor, self.batch)))


def _is_view(tensor: torch.Tensor, shape: tuple) -> bool:
    try:
        tensor.view(shape)
    except RuntimeError:
        return False
    return True


def _layout_copies(model: nn.Module, model_name: str) -> list[tuple[str, float]]:
    """(leaf layer after which it runs, bytes read plus written per sample) of each copy at batch 2."""
    batch = 2
    mode = _Copies(batch)
    handles = []

    def done(name: str):
        def record(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            mode.last_layer = name

        return record

    for name, module in model.named_modules():
        if not any(True for _ in module.children()) and not isinstance(module, _SKIP):
            handles.append(module.register_forward_hook(done(name)))
    try:
        with torch.inference_mode(), mode:
            model(zoo.input_for(model_name, batch))
    finally:
        for handle in handles:
            handle.remove()
    return mode.copies


def profile_model(model_name: str, generated_by: str) -> ModelProfile:
    """Profile one zoo model at batch 1, fp32, on the CPU."""
    spec = zoo.spec(model_name)
    model = zoo.build_model(model_name)
    batch = 1
    layers: list[LayerProfile] = []
    handles = []

    def hook(name: str):
        def record(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            layer = _layer(name, module, inputs, output, batch)
            if layer is not None:
                layers.append(layer)

        return record

    for name, module in model.named_modules():
        if not any(True for _ in module.children()):
            handles.append(module.register_forward_hook(hook(name)))
    try:
        with torch.inference_mode():
            model(zoo.input_for(model_name, batch))
    finally:
        for handle in handles:
            handle.remove()
    copies: dict[str, list[float]] = {}
    for after, moved in _layout_copies(model, model_name):
        copies.setdefault(after, []).append(moved)
    with_copies: list[LayerProfile] = []
    for layer in layers:
        with_copies.append(layer)
        for i, moved in enumerate(copies.get(layer.name, [])):
            with_copies.append(
                LayerProfile(
                    name=f"{layer.name}.copy{i}",
                    op="copy",
                    flops=0.0,
                    weight_bytes=0.0,
                    act_bytes=moved,
                    op_class="layout_copy",
                    min_batch=2,
                )
            )
    layers = with_copies
    notes = "per sample at fp32, batch 1 forward on CPU; dropout counted as identity (inference)"
    if spec.tokens:
        notes += (
            f"; sequence length {zoo.BERT_SEQ_LEN}, vocab {zoo.BERT_VOCAB}, no attention mask;"
            " layout copies (transposed heads made contiguous, batch 2 and up) recorded at batch 2;"
            " embedding tables count as activation traffic (gathered rows), not weights"
        )
    return ModelProfile(
        model=model_name,
        task=spec.task,
        input_shape=list(spec.input_shape),
        generated_by=generated_by,
        torch_version=torch.__version__,
        notes=notes,
        layers=layers,
    )
