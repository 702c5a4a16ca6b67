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
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from runners import zoo
from runners.profile import LayerProfile, ModelProfile
from tuner.errors import UserError

FP32 = 4
# The batch a user's module is profiled at: 2, so that the copies a batch of one makes as views are seen.
PROFILE_BATCH = 2

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


# What a user's module (``py:``) runs, counted per aten operator: a user's forward computes outside modules
# (functional calls, ``+`` on tensors), which forward hooks would not see.
_ATEN_NAMES = {
    "_native_batch_norm_legit_no_training": "batchnorm",
    "native_batch_norm": "batchnorm",
    "native_layer_norm": "layernorm",
    "_softmax": "softmax",
    "hardtanh": "relu6",
}
_POOLS = ("max_pool2d_with_indices", "max_pool2d", "avg_pool2d")
_MEANS = ("mean", "_adaptive_avg_pool2d", "adaptive_avg_pool2d")
_MATMULS = ("mm", "addmm", "bmm", "baddbmm")
_COPIES = ("clone", "_to_copy", "copy")
_NO_WORK = ("_unsafe_view", "empty", "zeros", "ones", "full", "arange", "scalar_tensor", "lift_fresh")


class _OpCounter(TorchDispatchMode):
    """One layer per aten operator that does work, with weights told apart from activations by their storage."""

    def __init__(self, batch: int, weights: set[int]) -> None:
        super().__init__()
        self.batch = batch
        self.weights = weights
        self.layers: list[LayerProfile] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.layers += self._layers(func, [a for a in args if isinstance(a, torch.Tensor)], args, out)
        return out

    def _is_weight(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self.weights

    def _act(self, tensor: torch.Tensor) -> float:
        width = tensor.element_size() if not tensor.is_floating_point() else FP32
        return tensor.numel() * width / self.batch

    def _layers(self, func, tensors: list[torch.Tensor], args: tuple, out) -> list[LayerProfile]:
        name = func._schema.name.removeprefix("aten::").rstrip("_")
        if name == "_native_multi_head_attention":
            return self._attention(tensors, args)
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
        if not outs or name in _NO_WORK or name.endswith("_like"):
            return []
        layer = self._layer(name, tensors, args, outs)
        return [] if layer is None else [layer]

    def _attention(self, tensors: list[torch.Tensor], args: tuple) -> list[LayerProfile]:
        """nn.MultiheadAttention's fused path: the input projection, the two attention products, the output one."""
        query, key = tensors[0], tensors[1]
        embed = int(args[3])
        rows, keys = query.numel() / self.batch / embed, key.numel() / self.batch / embed
        qkv_w, proj_w = (float(args[i].numel() * FP32) for i in (5, 7))
        act = rows * embed * FP32
        n = len(self.layers)
        return [
            LayerProfile(
                name=f"attention_{n}.in_proj",
                op="linear",
                flops=2 * rows * embed * 3 * embed,
                weight_bytes=qkv_w,
                act_bytes=4 * act,
                matmul=True,
                op_class="gemm",
            ),
            LayerProfile(
                name=f"attention_{n}.scores",
                op="matmul",
                flops=4 * rows * keys * embed,
                weight_bytes=0.0,
                act_bytes=4 * act + 2 * rows * keys * FP32,
                matmul=True,
                op_class="attention",
            ),
            LayerProfile(
                name=f"attention_{n}.out_proj",
                op="linear",
                flops=2 * rows * embed * embed,
                weight_bytes=proj_w,
                act_bytes=2 * act,
                matmul=True,
                op_class="gemm",
            ),
        ]

    def _layer(self, name: str, tensors: list[torch.Tensor], args: tuple, outs: list) -> LayerProfile | None:
        weights = [t for t in tensors if self._is_weight(t)]
        acts = [t for t in tensors if not self._is_weight(t)]
        w_bytes = float(sum(t.numel() * FP32 for t in weights))
        act = sum(self._act(t) for t in acts) + self._act(outs[0])
        elems = outs[0].numel() / self.batch
        label = f"{name}_{len(self.layers)}"
        if name == "convolution":
            kernel = tensors[1]
            groups = int(args[8]) if len(args) > 8 else 1
            cls = (
                "conv_depthwise"
                if groups > 1 and kernel.shape[1] == 1
                else "conv_pointwise"
                if groups == 1 and math.prod(kernel.shape[2:]) == 1
                else "conv_dense"
            )
            flops = 2 * elems * math.prod(kernel.shape[1:])
            return LayerProfile(
                name=label, op="conv2d", flops=flops, weight_bytes=w_bytes, act_bytes=act, matmul=True, op_class=cls
            )
        if name in _MATMULS:
            a = args[1] if name in ("addmm", "baddbmm") else args[0]
            cls = "gemm" if weights else "attention"
            return LayerProfile(
                name=label,
                op="linear" if weights else "matmul",
                flops=2 * elems * a.shape[-1],
                weight_bytes=w_bytes,
                act_bytes=act,
                matmul=True,
                op_class=cls,
            )
        if "scaled_dot_product" in name:
            q, k = tensors[0], tensors[1]
            flops = 4 * q.numel() * k.shape[-2] / self.batch
            return LayerProfile(
                name=label, op="matmul", flops=flops, weight_bytes=0.0, act_bytes=act, matmul=True, op_class="attention"
            )
        if name == "embedding":
            return LayerProfile(name=label, op="embedding", flops=0.0, weight_bytes=0.0, act_bytes=act)
        if name in _COPIES:
            # counted at batch 2, as the zoo's copies: at batch 1 most of them are views
            return LayerProfile(
                name=label,
                op="copy",
                flops=0.0,
                weight_bytes=0.0,
                act_bytes=act,
                op_class="layout_copy",
                min_batch=PROFILE_BATCH,
            )
        if not outs[0].is_floating_point():
            return None
        if name in _POOLS:
            window = args[1] if len(args) > 1 else [1]
            return LayerProfile(
                name=label, op="maxpool", flops=elems * math.prod(window), weight_bytes=0.0, act_bytes=act
            )
        if name in _MEANS:
            return LayerProfile(
                name=label, op="avgpool", flops=acts[0].numel() / self.batch, weight_bytes=0.0, act_bytes=act
            )
        broadcast = len(acts) == 2 and acts[0].shape != acts[1].shape
        scale = name == "mul" and len(acts) == 1
        return LayerProfile(
            name=label,
            op="scale" if scale else _ATEN_NAMES.get(name, name),
            flops=elems,
            weight_bytes=w_bytes,
            act_bytes=act,
            op_class="broadcast" if broadcast else "elementwise",
        )


def profile_module(
    name: str,
    module: nn.Module,
    make_batch: Callable[[int, torch.dtype], tuple[torch.Tensor, ...]],
    generated_by: str,
) -> ModelProfile:
    """Profile any module (a user's ``py:`` model) from one fp32 CPU forward at batch 2, per aten operator.

    The counting rules are the zoo's (2 x multiply-adds for convolutions and
    matrix products, one FLOP per output element for element-wise work,
    weights read once per batch, activations per sample at fp32); batch 2 so
    that the copies a batch of one makes as views are counted.
    """
    weights = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    inputs = make_batch(PROFILE_BATCH, torch.float32)
    counter = _OpCounter(PROFILE_BATCH, weights)
    with torch.no_grad(), counter:
        module(*inputs)
    if not counter.layers:
        raise UserError(f"{name}: its forward ran no operator that computes; nothing to model")
    return ModelProfile(
        model=name,
        task="user",
        input_shape=list(inputs[0].shape[1:]),
        generated_by=generated_by,
        torch_version=torch.__version__,
        notes="per sample at fp32, batch 2 forward on CPU, counted per aten operator",
        layers=counter.layers,
    )
